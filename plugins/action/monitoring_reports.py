"""Prune the controller's reports directory to the last runs of each kind, in the controller's own process.

It was a find and a file module delegated to localhost: two fresh Python interpreters on the
controller, about two seconds of every site.yml, for a listing and, usually, one removal.
"""

from __future__ import annotations

import os
import re
import shutil

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

REPORT_NAME = re.compile(r"^(?P<kind>[a-z][a-z0-9_]*)-(?P<stamp>\d{8}T\d{6}Z)(?P<rest>.*)$")


def runs_beyond(paths, kinds, keep):
    """The report files and directories of runs beyond the newest `keep` of each kind (kind-<UTC stamp>...).

    A run is every entry with the same kind and stamp (benchmark-<stamp>.json, .md and .png are one run);
    entries without a stamp (tune-record.json) and kinds not listed are never picked.
    """
    runs = {}
    for path in paths or []:
        match = REPORT_NAME.match(os.path.basename(str(path)))
        if match and match.group("kind") in (kinds or []):
            runs.setdefault(match.group("kind"), {}).setdefault(match.group("stamp"), []).append(str(path))
    doomed = []
    for stamps in runs.values():
        for stamp in sorted(stamps, reverse=True)[int(keep):]:
            doomed += sorted(stamps[stamp])
    return sorted(doomed)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("path", "kinds", "keep"))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        path = self._task.args.get("path")
        if not path:
            raise AnsibleActionFail("path is required: the reports directory on the controller")
        try:
            keep = int(self._task.args.get("keep"))
        except (TypeError, ValueError):
            raise AnsibleActionFail(f"keep = {self._task.args.get('keep')!r}: not a whole number of runs") from None
        entries = [os.path.join(path, name) for name in os.listdir(path)] if os.path.isdir(path) else []
        removed = runs_beyond(entries, self._task.args.get("kinds") or [], keep)
        for doomed in removed if not self._task.check_mode else []:
            if os.path.isdir(doomed) and not os.path.islink(doomed):
                shutil.rmtree(doomed)
            else:
                os.unlink(doomed)
        result.update(changed=bool(removed), removed=removed)
        if self._task.diff and removed:
            result["diff"] = [{"before_header": p, "after_header": p, "before": {"path": p, "state": "present"},
                               "after": {"path": p, "state": "absent"}} for p in removed]
        return result

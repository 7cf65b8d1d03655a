"""Write files on the controller in one task, in the controller's own process.

The collection's controller-side output (render.yml's files per node, verify's JSON report) used to
be template/copy tasks delegated to localhost: each file a stat and a copy module, each module a
fresh Python interpreter on the controller (close to a CPU-second apiece). Here the task templates
the content as usual and the files are written in-process. Every role loads this through its
dependency on the spark role.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


def _mode(value) -> int:
    try:
        return int(str(value), 8)
    except ValueError:
        raise AnsibleActionFail(f"mode = {value!r}: not an octal file mode; write it like '0644'") from None


def _write(path: str, content: str, mode: int) -> None:
    # Atomic, and never a moment with the final name and a wider mode than asked for.
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".spark-")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(content)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _state_diff(path: str, before: str, after: str) -> dict:
    return {"before_header": path, "after_header": path,
            "before": {"path": path, "state": before}, "after": {"path": path, "state": after}}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("dest", "files", "prune_except", "prune_marker"))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dest = self._task.args.get("dest")
        if not dest:
            raise AnsibleActionFail("dest is required: the directory that receives the files")
        files = self._task.args.get("files") or []
        keep = self._task.args.get("prune_except")
        marker = self._task.args.get("prune_marker")
        if keep is not None and not marker:
            raise AnsibleActionFail("prune_marker is required with prune_except: the file that marks a directory this task wrote")
        check = self._task.check_mode
        changed, diffs, written = False, [], []

        if files and not os.path.isdir(dest):
            changed = True
            diffs.append(_state_diff(dest, "absent", "directory"))
            if not check:
                os.makedirs(dest, mode=0o755, exist_ok=True)

        for item in files:
            name, content, mode = item["name"], str(item["content"]), _mode(item["mode"])
            if os.sep in name or name in ("", ".", ".."):
                raise AnsibleActionFail(f"files name = {name!r}: a file name in dest, without a directory")
            path = os.path.join(dest, name)
            before, before_mode = None, None
            if os.path.exists(path):
                with open(path) as current:
                    before = current.read()
                before_mode = os.stat(path).st_mode & 0o7777
            if before == content and before_mode == mode:
                continue
            changed = True
            written.append(path)
            diffs.append({"before_header": path, "after_header": path,
                          "before": before if before is not None else "", "after": content})
            if not check:
                _write(path, content, mode)

        # Subdirectories holding the marker file and not named in prune_except go (render.yml: a host that
        # left the inventory keeps no files that look like they would still be installed).
        pruned = []
        if keep is not None:
            for entry in sorted(os.listdir(dest)) if os.path.isdir(dest) else []:
                path = os.path.join(dest, entry)
                if entry not in keep and not os.path.islink(path) and os.path.isfile(os.path.join(path, marker)):
                    pruned.append(path)
                    diffs.append(_state_diff(path, "directory", "absent"))
                    if not check:
                        shutil.rmtree(path)
            changed = changed or bool(pruned)

        result.update(changed=changed, written=written, pruned=pruned)
        if self._task.diff and diffs:
            result["diff"] = diffs
        return result

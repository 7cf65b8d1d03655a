"""Write the doctor's diagnostics bundle in the controller's own process.

The bundle is written on the controller (bundle.yml delegates it to localhost): run as a module, that
is a fresh Python interpreter for one tar.gz, close to a CPU-second a run. This action plugin calls the
module's own code (plugins/modules/doctor_bundle.py: the same checks, the same file) in-process.
"""

from __future__ import annotations

import importlib.util
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "modules", "doctor_bundle.py")


def _bundle_module():
    spec = importlib.util.spec_from_file_location("doctor_bundle_module", _LIBRARY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("dest", "files"))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dest = self._task.args.get("dest")
        files = self._task.args.get("files")
        if not dest or not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
            raise AnsibleActionFail("dest (a path) and files (a list of {path, content}) are required")
        dest = os.path.expanduser(os.path.expandvars(str(dest)))
        bundle = _bundle_module()
        problem = bundle.invalid(files)
        if problem:
            raise AnsibleActionFail(problem)
        if not self._task.check_mode:
            bundle.write(dest, files)
        result.update(changed=True, dest=dest, count=len(files))
        return result

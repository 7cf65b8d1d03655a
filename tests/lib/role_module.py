"""Run a role's library module as Ansible runs it: a script reading its arguments file.

Ansible ships a module together with the module_utils it imports, the role's
own included (``roles/<role>/module_utils/<name>.py`` is importable as
``ansible.module_utils.<name>``). A module run here as a plain script gets the
same: a small bootstrap registers the role's module_utils under that name
before the module's own code runs, so the module file is tested unchanged.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_BOOTSTRAP = """
import importlib.util, pathlib, runpy, sys
utils, module = pathlib.Path(sys.argv[1]), sys.argv[2]
for path in sorted(utils.glob("*.py")) if utils.is_dir() else []:
    name = "ansible.module_utils." + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded
    spec.loader.exec_module(loaded)
sys.argv = [module] + sys.argv[3:]
runpy.run_path(module, run_name="__main__")
"""


def run_role_module(role: str, name: str, args: dict, tmp: Path, *, check: bool = False,
                    python: str = sys.executable, timeout: float = 300) -> dict:
    """The JSON result of roles/<role>/library/<name>.py run with ``args`` (``check``: check mode)."""
    argsfile = tmp / f"{name}-args.json"
    argsfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check}}))
    role_dir = REPO / "roles" / role
    proc = subprocess.run(
        [python, "-c", _BOOTSTRAP, str(role_dir / "module_utils"), str(role_dir / "library" / f"{name}.py"),
         str(argsfile)],
        capture_output=True, text=True, timeout=timeout, check=False)
    try:
        return json.loads(proc.stdout)
    except ValueError as err:
        raise AssertionError(f"{name} printed no JSON: {proc.stdout}\n{proc.stderr}") from err


def module_utils(role: str, name: str):
    """roles/<role>/module_utils/<name>.py imported as a module (the role's helpers are plain Python)."""
    path = REPO / "roles" / role / "module_utils" / f"{name}.py"
    module_name = f"{role}_module_utils_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]

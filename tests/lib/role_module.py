"""Run one of the collection's modules as Ansible runs it: a script reading its arguments file.

Ansible ships a module together with the module_utils it imports; the collection's own
(``plugins/module_utils/<name>.py``) are imported as
``ansible_collections.dgx_spark.llm_serving.plugins.module_utils.<name>``. A module run here as a plain
script gets the same: the checkout's ``.collections`` (where scripts/bootstrap links the collection's
name to the checkout) is on its import path, so the module file is tested unchanged.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULES = REPO / "plugins" / "modules"
MODULE_UTILS = REPO / "plugins" / "module_utils"
COLLECTIONS = REPO / ".collections"
COLLECTION_LINK = COLLECTIONS / "ansible_collections" / "dgx_spark" / "llm_serving"

_BOOTSTRAP = """
import runpy, sys
collections, module = sys.argv[1], sys.argv[2]
sys.path.insert(0, collections)
sys.argv = [module] + sys.argv[3:]
runpy.run_path(module, run_name="__main__")
"""


def module_path(name: str) -> Path:
    """plugins/modules/<name>.py"""
    return MODULES / f"{name}.py"


def module_command(name: str, argsfile: Path, python: str = sys.executable) -> list[str]:
    """The command that runs plugins/modules/<name>.py on the arguments file, as Ansible's wrapper would."""
    if COLLECTION_LINK.resolve() != REPO:
        raise AssertionError(f"{COLLECTION_LINK} does not lead to this checkout: run scripts/bootstrap")
    return [python, "-c", _BOOTSTRAP, str(COLLECTIONS), str(module_path(name)), str(argsfile)]


def run_module(name: str, args: dict, tmp: Path, *, check: bool = False, python: str = sys.executable,
               timeout: float = 300) -> dict:
    """The JSON result of plugins/modules/<name>.py run with ``args`` (``check``: check mode)."""
    argsfile = tmp / f"{name}-args.json"
    argsfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check}}))
    proc = subprocess.run(module_command(name, argsfile, python), capture_output=True, text=True,
                          timeout=timeout, check=False)
    try:
        return json.loads(proc.stdout)
    except ValueError as err:
        raise AssertionError(f"{name} printed no JSON: {proc.stdout}\n{proc.stderr}") from err


def collection_importable() -> None:
    """Lets this process import the collection's code by its package name, as Ansible ships it: a filter or a
    module_utils file loaded from its path imports the shared helpers as
    ``ansible_collections.dgx_spark.llm_serving.plugins.module_utils.<name>``."""
    if str(COLLECTIONS) not in sys.path:
        sys.path.insert(0, str(COLLECTIONS))


def module(name: str):
    """plugins/modules/<name>.py imported by its package name (its helpers and constants, without running it)."""
    collection_importable()
    return importlib.import_module(f"ansible_collections.dgx_spark.llm_serving.plugins.modules.{name}")


def module_utils(name: str):
    """plugins/module_utils/<name>.py imported as a module (the helpers are plain Python)."""
    collection_importable()
    module_name = f"module_utils_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, MODULE_UTILS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]

"""What the tests read from the roles' own files, each from the one place that knows where it lives.

The flag models live in the site role's vars (`spark_flag_models`, one per engine; `spark_flag_model`
selects the site's engine's). `flag_model()` reads one engine's, so no test names the file.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import yaml

from tests.lib.role_module import collection_importable

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"

# Where the engines' flag models live.
FLAG_MODELS_PLACE = (ROLES / "spark" / "vars" / "main.yml", "spark_flag_models")


@functools.cache
def _yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    return yaml.safe_load(path.read_text()) or {}


def role_vars(role: str) -> dict:
    """roles/<role>/vars/main.yml as YAML (Jinja expressions stay strings)."""
    return _yaml(ROLES / role / "vars" / "main.yml")


def role_defaults(role: str) -> dict:
    """roles/<role>/defaults/main.yml as YAML (Jinja expressions stay strings)."""
    return _yaml(ROLES / role / "defaults" / "main.yml")


def flag_models() -> dict:
    """Every engine's flag model, by engine."""
    path, key = FLAG_MODELS_PLACE
    models = _yaml(path).get(key)
    if not models:
        raise LookupError(f"no flag models found ({key} in {path.relative_to(REPO)})")
    return models


def flag_model(engine: str = "sglang") -> dict:
    """One engine's flag model (SGLang's unless asked otherwise: the engine every playbook deploys)."""
    return flag_models()[engine]


def keyed_launcher(engine: str = "sglang") -> str:
    """The `python3 -c` program the unit runs when an API key is set: instead of `-m sglang.launch_server`,
    or (engine vllm) of `vllm serve`."""
    return role_vars("server")["__server_vllm_keyed_launcher" if engine == "vllm" else "__server_keyed_launcher"]


@functools.cache
def filter_plugin(role: str, name: str | None = None) -> ModuleType:
    """plugins/filter/<name>.py (default: the concern's name), the collection's filter plugin, imported as a module."""
    return _load(REPO / "plugins" / "filter" / f"{name or role}.py", f"filter_{name or role}")


@functools.cache
def action_plugin(name: str) -> ModuleType:
    """plugins/action/<name>.py, the collection's action plugin, imported as a module."""
    return _load(REPO / "plugins" / "action" / f"{name}.py", f"action_{name}")


def _load(path: Path, module_name: str) -> ModuleType:
    collection_importable()
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up here
    spec.loader.exec_module(module)
    return module

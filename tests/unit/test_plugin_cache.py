"""callback_plugins/spark_plugin_cache.py: the roles' Jinja plugins loaded once, in the main process.

A worker forked after the callback ran finds them loaded; the test runs a forked child the way
Ansible's workers are made and asserts it imports nothing of the roles' filter plugins itself.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ansible.plugins.loader import filter_loader, test_loader

REPO = Path(__file__).resolve().parents[2]


def load_callback():
    path = REPO / "callback_plugins/spark_plugin_cache.py"
    spec = importlib.util.spec_from_file_location("spark_plugin_cache_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CallbackModule()


def role_filter_modules() -> set[str]:
    return {name for name, m in sys.modules.items()
            if str(getattr(m, "__file__", "") or "").startswith(str(REPO / "roles"))}


def test_a_role_added_at_run_time_is_loaded_before_the_next_task_forks():
    callback = load_callback()
    filter_loader.add_directory(str(REPO / "roles/fabric/filter_plugins"))  # what a role include does
    assert not filter_loader._cached_non_collection_wrappers  # the include cleared the cache  # noqa: SLF001
    callback.v2_playbook_on_task_start(task=None, is_conditional=False)
    wrappers = filter_loader._cached_non_collection_wrappers.values()  # noqa: SLF001
    assert any("roles/fabric/filter_plugins" in str(w._original_path) for w in wrappers)  # noqa: SLF001
    assert test_loader._cached_non_collection_wrappers  # noqa: SLF001
    loaded = role_filter_modules()
    assert any("fabric" in name for name in loaded), loaded

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a task worker: asks for every filter as a template would
        os.close(read)
        before = set(sys.modules)
        list(filter_loader.all())
        os.write(write, b"\n".join(n.encode() for n in set(sys.modules) - before))
        os._exit(0)
    os.close(write)
    imported = b""
    while chunk := os.read(read, 65536):
        imported += chunk
    os.waitpid(pid, 0)
    assert [n for n in imported.decode().split("\n") if n] == [], "the worker loaded plugins again"


def test_the_cache_left_alone_while_it_is_full():
    callback = load_callback()
    callback.v2_playbook_on_play_start(play=None)
    cached = dict(filter_loader._cached_non_collection_wrappers)  # noqa: SLF001
    callback.v2_playbook_on_task_start(task=None, is_conditional=False)
    assert filter_loader._cached_non_collection_wrappers == cached  # noqa: SLF001

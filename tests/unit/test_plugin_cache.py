"""callback_plugins/spark_plugin_cache.py: the Jinja plugins loaded once, in the main process.

A worker forked after the callback ran finds them loaded; the test runs a forked child the way
Ansible's workers are made and asserts it imports no filter plugin itself, and that without the
callback it would.
"""

from __future__ import annotations

import gc
import importlib.util
import subprocess
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


# A controller process as ansible-playbook makes it (the checkout's collections path), the callback called as at a
# play's start, then a task worker forked from it asking for one of the collection's filters and for every builtin
# one as a template would: it prints what it had to import itself.
WORKER = r"""
import os, sys
from ansible.plugins.loader import filter_loader, test_loader, init_plugin_loader
init_plugin_loader([sys.argv[1]])
import importlib.util
spec = importlib.util.spec_from_file_location("cache_under_test", sys.argv[2])
cache = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cache)
if sys.argv[3] == "callback":
    cache.CallbackModule().v2_playbook_on_play_start(play=None)
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    before = set(sys.modules)
    if sys.argv[4] == "listings":
        # Each directory a lookup lists to resolve a name: the collection's filters and Jinja's own ones.
        import pkgutil
        listed, iter_modules = [], pkgutil.iter_modules
        pkgutil.iter_modules = lambda *a, **k: listed.append(a) or iter_modules(*a, **k)
        found = filter_loader.get("dgx_spark.llm_serving.fabric_port")
        filter_loader.get("length")
        test_loader.get("defined")
        os.write(write, ("found " if found else "missing ").encode() + str(len(listed)).encode())
        os._exit(0)
    found = filter_loader.get("dgx_spark.llm_serving.fabric_port")
    list(filter_loader.all())
    new = sorted(n for n in set(sys.modules) - before if ".filter" in n)
    os.write(write, ("found " if found else "missing ").encode() + "\n".join(new).encode())
    os._exit(0)
os.close(write)
out = b""
while chunk := os.read(read, 65536):
    out += chunk
os.waitpid(pid, 0)
print(out.decode())
"""


def worker_imports(mode: str, measure: str = "imports") -> list[str]:
    done = subprocess.run([sys.executable, "-c", WORKER, str(REPO / ".collections"),
                           str(REPO / "callback_plugins/spark_plugin_cache.py"), mode, measure],
                          capture_output=True, text=True, check=True, timeout=120)
    status, *imported = done.stdout.split()
    assert status == "found", done.stdout + done.stderr
    return imported


def test_a_worker_forked_after_the_callback_imports_no_filter_plugin_itself():
    assert worker_imports("callback") == []


def test_without_the_callback_each_worker_imports_the_filter_plugins_again():
    # The control: the same worker, no callback before the fork, imports the collection's filter files itself.
    imported = worker_imports("none")
    assert "ansible_collections.dgx_spark.llm_serving.plugins.filter.fabric" in imported, imported
    assert any(name.startswith("ansible.plugins.filter") or "legacy" in name for name in imported), imported


def test_a_worker_forked_after_the_callback_resolves_the_collections_and_jinjas_names_without_a_listing():
    assert worker_imports("callback", "listings") == ["0"]
    # The control: without the callback, each of those lookups lists plugin directories again.
    assert int(worker_imports("none", "listings")[0]) > 0


# A controller process as above whose play then adds a plugin directory (an include of a role with plugins of its
# own) defining a filter named like one of Jinja's: the names were resolved before, yet the legacy plugin is used.
SHADOW = r"""
import sys
from ansible.plugins.loader import filter_loader, init_plugin_loader
init_plugin_loader([sys.argv[1]])
import importlib.util
spec = importlib.util.spec_from_file_location("cache_under_test", sys.argv[2])
cache = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cache)
callback = cache.CallbackModule()
callback.v2_playbook_on_play_start(play=None)
filter_loader.add_directory(sys.argv[3])
callback.v2_playbook_on_task_start(task=None, is_conditional=False)
print(filter_loader.get("length").j2_function("abc"))
"""


def test_a_legacy_filter_named_like_a_jinja_builtin_still_wins_after_the_names_were_resolved(tmp_path):
    (tmp_path / "spark_probe_length.py").write_text(
        "class FilterModule:\n    def filters(self):\n        return {'length': lambda value: 'shadowed'}\n")
    done = subprocess.run([sys.executable, "-c", SHADOW, str(REPO / ".collections"),
                           str(REPO / "callback_plugins/spark_plugin_cache.py"), str(tmp_path)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.stdout.strip() == "shadowed", done.stdout + done.stderr


def test_a_role_added_at_run_time_is_loaded_before_the_next_task_forks(tmp_path):
    callback = load_callback()
    role_plugins = tmp_path / "filter_plugins"
    role_plugins.mkdir()
    (role_plugins / "spark_probe_filter.py").write_text(
        "class FilterModule:\n    def filters(self):\n        return {'spark_probe_shout': str.upper}\n")
    filter_loader.add_directory(str(role_plugins))  # what the include of a role with plugins of its own does
    assert not filter_loader._cached_non_collection_wrappers  # the include cleared the cache  # noqa: SLF001
    callback.v2_playbook_on_task_start(task=None, is_conditional=False)
    assert "spark_probe_shout" in filter_loader._cached_non_collection_wrappers  # noqa: SLF001
    assert test_loader._cached_non_collection_wrappers  # noqa: SLF001


def test_the_cache_left_alone_while_it_is_full():
    callback = load_callback()
    callback.v2_playbook_on_play_start(play=None)
    cached = dict(filter_loader._cached_non_collection_wrappers)  # noqa: SLF001
    callback.v2_playbook_on_task_start(task=None, is_conditional=False)
    assert filter_loader._cached_non_collection_wrappers == cached  # noqa: SLF001


def test_the_main_process_heap_is_frozen_before_every_task_and_handler_is_handed_out():
    # What a worker inherits must be left out of its garbage collections (copied page by page otherwise).
    callback = load_callback()
    try:
        for start in (lambda: callback.v2_playbook_on_task_start(task=None, is_conditional=False),
                      lambda: callback.v2_playbook_on_handler_task_start(task=None)):
            gc.unfreeze()
            inherited = [[n] for n in range(10_000)]
            assert gc.get_freeze_count() == 0
            start()
            assert gc.get_freeze_count() >= len(inherited)
    finally:
        gc.unfreeze()

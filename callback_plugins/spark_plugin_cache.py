"""Loads the Jinja filter and test plugins once in the controller's main process.

Ansible runs every task on every host in a forked worker, and each worker that renders a filter
loads the plugins from scratch: every legacy filter plugin (ansible.builtin's), and each of the
collection's plugins/filter files at the first of its filters a worker meets. That is a cost paid
hundreds of times a run, by the controller's CPU, for modules that do not change during the run.
Imported here, before the workers fork, they are inherited by every worker (the plugin loader
finds them in sys.modules). A directory added to the legacy search path (an include of a role with
plugins of its own) clears the legacy cache, so it is filled again, in this process, before the
next task is handed to the workers.

Importing is not all a worker pays: ansible-core resolves a collection's filter name (every
`dgx_spark.llm_serving.*` filter the roles call) by listing the collection's plugins/filter directory and
looking up each of its files again, at each use, keeping nothing: about 1,400 resolutions and half a CPU
second of a no-change site.yml. Jinja's own filters and tests (`length`, `default`, `defined`) cost the
same: each use looks for them as ansible.builtin plugins file by file, finds none, and Jinja's are used.
Those names and the collection's filters are resolved here once, by ansible-core itself, and the workers
get the results. A legacy plugin of the same short name, which ansible-core looks at first, still wins: such
a name is asked of ansible-core again. Any other name goes to ansible-core as before.

The same workers are why the main process's objects are frozen (gc.freeze) before each task is handed
out. A worker inherits the main process's heap page by page, copy on write; a full garbage collection in
the worker walks every tracked object it inherited and writes to each one's header, copying the pages
they lie on, and spends its time on objects the worker never uses. Frozen objects are left out of every
collection, in the workers and in the main process: 3-11% of the controller's CPU in a no-change
site.yml, 12% in verify.yml. What is not frozen yet is collected first: only the objects made since the
last freeze are walked (no CPU-s to measure in a no-change server.yml), and no cyclic garbage is frozen for the
rest of the run: before, 2.6 MB of a no-change server.yml's 78, and 7 MB once the tasks that reach no node ran
in this process (callback_plugins/spark_inline_tasks.py).
"""

from __future__ import annotations

import contextlib
import gc
import sys
from pathlib import Path

import yaml
from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader
from jinja2.defaults import DEFAULT_FILTERS, DEFAULT_TESTS

# The checkout this callback ships in is the collection (galaxy.yml beside callback_plugins/).
_GALAXY = yaml.safe_load((Path(__file__).resolve().parents[1] / "galaxy.yml").read_text())
COLLECTION = f"{_GALAXY['namespace']}.{_GALAXY['name']}"

DOCUMENTATION = """
    name: spark_plugin_cache
    type: aggregate
    short_description: load the Jinja plugins once in the controller's main process
    description:
      - Fills the filter and test plugin caches before the task workers fork, so they inherit them.
      - Freezes the main process's objects before each task, so that no garbage collection in a worker walks them.
      - Has no output and changes nothing; it needs no enabling.
"""


def _collection_filter_names() -> list[str]:
    """The FQCN of every filter the collection's plugins/filter files define (imported by the lookup above)."""
    package = f"ansible_collections.{COLLECTION}.plugins.filter."
    names = []
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith(package) and hasattr(module, "FilterModule"):
            with contextlib.suppress(Exception):  # a file ansible-core skipped with a warning: left to it
                names += [f"{COLLECTION}.{name}" for name in module.FilterModule().filters()]
    return names


def _keep_resolved(loader, names: list[str]) -> None:
    """Resolve names once through the loader and answer later lookups of exactly those from what it gave."""
    original = loader.get_with_context
    if getattr(original, "spark_resolved", False):  # this process did it already (another load of this plugin)
        return
    resolved = {}
    for name in names:
        with contextlib.suppress(Exception):  # ansible-core will say why when a template uses it
            resolved[name] = original(name)
    if not resolved:
        return

    def get_with_context(name, *args, **kwargs):
        if not args and not kwargs and (result := resolved.get(name)) is not None:
            loader._ensure_non_collection_wrappers()  # noqa: SLF001 - what ansible-core itself looks at first
            if name not in loader._cached_non_collection_wrappers:  # noqa: SLF001
                return result
        return original(name, *args, **kwargs)

    get_with_context.spark_resolved = True
    loader.get_with_context = get_with_context


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "spark_plugin_cache"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self):
        super().__init__()
        self._collection_loaded = False

    def _fill(self) -> None:
        if not self._collection_loaded:
            # Looking up one of the collection's filters imports every file of its plugins/filter; a name that
            # no file defines costs the same and finds nothing.
            with contextlib.suppress(KeyError):  # the collection is not on the collections path: nothing to load
                filter_loader.get(f"{COLLECTION}.__spark_plugin_cache__")
            _keep_resolved(filter_loader, [*DEFAULT_FILTERS, *_collection_filter_names()])
            _keep_resolved(test_loader, list(DEFAULT_TESTS))
            self._collection_loaded = True
        for loader in (filter_loader, test_loader):
            # Empty after a plugin directory was added (a role loaded); filling it imports what is new.
            if not loader._cached_non_collection_wrappers:  # noqa: SLF001 - the loader keeps no public flag
                for _plugin in loader.all():
                    pass

    def v2_playbook_on_play_start(self, play):
        self._fill()

    def _before_the_workers_fork(self) -> None:
        self._fill()
        gc.collect()
        gc.freeze()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._before_the_workers_fork()

    def v2_playbook_on_handler_task_start(self, task):
        self._before_the_workers_fork()

"""Loads the Jinja filter and test plugins once in the controller's main process.

Ansible runs every task on every host in a forked worker, and each worker that renders a filter
loads the plugins from scratch: every legacy filter plugin (ansible.builtin's), and each of the
collection's plugins/filter files at the first of its filters a worker meets. That is a cost paid
hundreds of times a run, by the controller's CPU, for modules that do not change during the run.
Imported here, before the workers fork, they are inherited by every worker (the plugin loader
finds them in sys.modules). A directory added to the legacy search path (an include of a role with
plugins of its own) clears the legacy cache, so it is filled again, in this process, before the
next task is handed to the workers.

The same workers are why the main process's objects are frozen (gc.freeze) before each task is handed
out. A worker inherits the main process's heap page by page, copy on write; a full garbage collection in
the worker walks every tracked object it inherited and writes to each one's header, copying the pages
they lie on, and spends its time on objects the worker never uses. Frozen objects are left out of every
collection, in the workers and in the main process: 3-11% of the controller's CPU in a no-change
site.yml, 12% in verify.yml. The price is that cyclic garbage made before a freeze is not reclaimed
until the run ends: about 2 MB in a no-change site.yml.
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path

import yaml
from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader

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
        gc.freeze()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._before_the_workers_fork()

    def v2_playbook_on_handler_task_start(self, task):
        self._before_the_workers_fork()

"""Loads the Jinja filter and test plugins once in the controller's main process.

Ansible runs every task on every host in a forked worker, and each worker that renders a filter
loads every legacy filter plugin (the roles' filter_plugins) from scratch: a cost paid hundreds
of times a run, by the controller's CPU, for modules that do not change during the run. Imported
here, before the workers fork, they are inherited by every worker (the plugin loader finds them
in sys.modules). A role added to the search path by an include clears the loaders' caches, so the
cache is filled again, in this process, before the next task is handed to the workers.
"""

from __future__ import annotations

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader

DOCUMENTATION = """
    name: spark_plugin_cache
    type: aggregate
    short_description: load the Jinja plugins once in the controller's main process
    description:
      - Fills the filter and test plugin caches before the task workers fork, so they inherit them.
      - Has no output and changes nothing; it needs no enabling.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "spark_plugin_cache"
    CALLBACK_NEEDS_ENABLED = False

    def _fill(self) -> None:
        for loader in (filter_loader, test_loader):
            # Empty after a plugin directory was added (a role loaded); filling it imports what is new.
            if not loader._cached_non_collection_wrappers:  # noqa: SLF001 - the loader keeps no public flag
                for _plugin in loader.all():
                    pass

    def v2_playbook_on_play_start(self, play):
        self._fill()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._fill()

    def v2_playbook_on_handler_task_start(self, task):
        self._fill()

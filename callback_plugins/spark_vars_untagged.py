"""Keeps ansible-core from tagging every variable for the deprecated `vars` dictionary, per host and task.

ansible-core 2.19 deprecated the `vars` magic variable (to be removed in 2.24). To warn whoever reads it,
VariableManager.get_vars builds that dictionary again for every host of every task with each variable in it
wrapped in a deprecation tag: a tagged copy of every value in scope (hundreds here: every role of the play
brings its defaults and vars), which the worker then carries into its templating. In a no-change site.yml on
the simulated pair that was about a twelfth of the controller's CPU (1.3 of 17 CPU-s, and 1.2 s of wall time
in alternating runs).

Nothing in this collection reads `vars`. The dictionary stays, with the same values, so content that still
reads it keeps working; only the tag goes, and with it the deprecation warning such content would get. The
option below puts the tag back, to find content that still reads `vars` before ansible-core drops it.
"""

from __future__ import annotations

from ansible.plugins.callback import CallbackBase
from ansible.vars import manager

try:
    from ansible.module_utils._internal._datatag._tags import Deprecated
except ImportError:  # another ansible-core: leave its variables alone rather than guess its internals
    Deprecated = None

DOCUMENTATION = """
    name: spark_vars_untagged
    type: aggregate
    short_description: no per-task deprecation tag on every variable of the deprecated vars dictionary
    description:
      - ansible-core builds the deprecated C(vars) dictionary for every host of every task with each variable
        wrapped in a deprecation tag. This plugin keeps the dictionary and its values, without the tag.
      - Has no output and changes nothing on any host; it needs no enabling.
    options:
      warn_on_vars:
        description:
          - Keep ansible-core's tag, and the deprecation warning for content that reads C(vars), at its cost.
        type: bool
        default: false
        env:
          - name: SPARK_WARN_ON_VARS
        ini:
          - section: spark_vars_untagged
            key: warn_on_vars
"""


class _Untagged:
    """Stands in for the Deprecated tag get_vars applies to `vars` and to each value put into it."""

    @staticmethod
    def tag(value):
        return value


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "spark_vars_untagged"
    CALLBACK_NEEDS_ENABLED = False

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        # Set in the main process before any task: the workers it forks inherit the module as it is then.
        if (not self.get_option("warn_on_vars") and Deprecated is not None
                and isinstance(getattr(manager, "_DEPRECATE_VARS", None), Deprecated)):
            manager._DEPRECATE_VARS = _Untagged()  # noqa: SLF001 - the only handle ansible-core offers

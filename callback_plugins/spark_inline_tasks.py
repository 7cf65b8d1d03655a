"""Runs the tasks that never reach a node in the controller's main process instead of a forked worker.

ansible-core forks a worker process for every host of every task. For a task that reaches a node the fork
is a small part of the work; for one that only decides on the controller (set_fact, assert, fail, debug,
an include, an argument-spec check) or that its `when` skips, the fork is most of it: the child's first
writes copy the pages of the main process it touches (about 2,800 page faults a worker here), and its
exit frees them again. Half the task results of a playbook run in this collection are of that kind (the
inventory check, the roles' plans and refusals, the facts they publish, the includes, the skips): up to
14,000 in the playbook runs of a CI run.

Those tasks are run here, in the main process, by ansible-core's own TaskExecutor, on a copy of the task
(which it changes as it runs, as a worker does its own), and their results go through the queue a worker's
do; the callbacks, the strategy and the output see no difference. A task is run here only when it can neither
reach a node nor block: one of the actions below, or one whose `when` is already false for the host
without a loop, and in either case with no `until`, `timeout`, `async` or loop pause. Anything else is
forked as before. A no-change server.yml on the simulated pair took the controller 2.2 CPU-s instead of 3.2, and
the 286 playbook runs of a CI run 938 CPU-s instead of 1186 (docs/testing.md).
"""

from __future__ import annotations

import traceback

from ansible import constants as C

# From its own module, which is never patched (the strategy's name for it is): a second load of this plugin
# still finds ansible-core's class.
from ansible.executor.process.worker import WorkerProcess as _ForkedWorker
from ansible.plugins import loader as plugin_loader
from ansible.plugins import strategy
from ansible.plugins.callback import CallbackBase

try:
    from ansible._internal import _task
    from ansible.executor.task_executor import TaskExecutor
except ImportError:  # another ansible-core: leave its workers alone rather than guess its internals
    _task = None

DOCUMENTATION = """
    name: spark_inline_tasks
    type: aggregate
    short_description: run controller-only and skipped tasks without forking a worker
    description:
      - Runs the tasks that cannot reach a node (set_fact, assert, fail, debug, includes, argument-spec checks,
        and tasks whose condition is false) in the controller's main process with ansible-core's own
        TaskExecutor, instead of a forked worker per host.
      - Has no output and changes nothing on any host; it needs no enabling.
    options:
      fork_every_task:
        description:
          - Fork a worker for every task, as ansible-core does.
        type: bool
        default: false
        env:
          - name: SPARK_FORK_EVERY_TASK
        ini:
          - section: spark_inline_tasks
            key: fork_every_task
"""

# Actions that decide on the controller alone: no connection, no module, no RPC to the main process
# (add_host and group_by ask the main process over RPC, so they stay in workers).
CONTROLLER_ACTIONS = frozenset(
    f"{prefix}{name}"
    for prefix in ("", "ansible.builtin.", "ansible.legacy.")
    for name in ("set_fact", "assert", "fail", "debug", "include_tasks", "include_role", "validate_argument_spec")
)


# The connection's variables a worker adds before it evaluates `when` (PlayContext.update_vars). A condition
# that names one may be false here and true there, and the task would then run its module in this process:
# it goes to a worker.
_WORKER_ONLY_NAMES = tuple(sorted({name for names in C.MAGIC_VARIABLE_MAPPING.values() for name in names}))


def _could_block(task) -> bool:
    """A task that may wait (retries, a timeout's alarm, async, a pause between items) keeps its worker."""
    loop_control = task.loop_control
    return bool(task.until or task.timeout or task.async_val or (loop_control and loop_control.pause))


def _skipped_here(task, task_vars, host_name: str) -> bool:
    """Whether the task's `when` is false for this host already (a task without a loop or delegation only).

    This decides where the task runs, not whether: the TaskExecutor evaluates the condition again, with the
    connection's variables a worker adds. A condition that names one of those, fails to evaluate here, or is
    true leaves the task to a worker.
    """
    when = task.when
    if not when or task.loop or task.loop_with or task.delegate_to:
        return False
    if any(isinstance(item, str) and any(name in item for name in _WORKER_ONLY_NAMES) for item in when):
        return False
    try:
        with _task.TaskContext.create(task=task, task_vars=task_vars, host_name=host_name):
            return not task._resolve_conditional_with_item(when, task_vars)[0]  # noqa: SLF001
    except Exception:  # noqa: BLE001 - the worker reports the error as ansible-core always did
        return False


class _InlineWorker:
    """Takes a worker's slot for a task run in this process: never alive, nothing to close or stop."""

    exitcode = None

    def __init__(self, **kwargs) -> None:
        self._kwargs = kwargs
        self.worker_id = kwargs["worker_id"]

    @staticmethod
    def is_alive() -> bool:
        return False

    def close(self) -> None:
        pass

    def terminate(self) -> None:
        pass

    def start(self) -> None:
        """Run at the point a worker would start: after the strategy's v2_runner_on_start."""
        kwargs, self._kwargs = self._kwargs, None
        _run_inline(**kwargs)


def _run_inline(*, final_q, task_vars, host, task, play_context, loader, variable_manager, **_ignored) -> None:
    """What WorkerProcess.run does, without the fork: the result goes to the queue the worker's would."""
    # TaskExecutor changes the task as it runs it (squash, delegation, post_validate): a worker's is its own
    # forked copy, and so is this one.
    task = task.copy()
    try:
        with _task.TaskContext.create(task=task, task_vars=task_vars, host_name=host.name):
            task.squash()
            executor = TaskExecutor(host, play_context, loader, plugin_loader.get_plugin_loader_namespace(),
                                    final_q, variable_manager)
            result = executor.run()
            result.finalize_registered_values()
    except Exception as ex:  # noqa: BLE001 - a worker would have reported it the same way
        try:
            raise RuntimeError(f"Task failed in the controller's main process:\n{traceback.format_exc()}") from ex
        except RuntimeError as wrapped:
            result = _task.UnifiedTaskResult.create_from_action_exception(wrapped)
            result.finalize_registered_values()
    task.ignore_errors = result.ignore_errors
    task.ignore_unreachable = result.ignore_unreachable
    final_q.send_task_result(host, task, result)




def _worker(**kwargs):
    """Stands in for WorkerProcess in the strategy: a real worker, or a task run here and an empty slot."""
    task = kwargs["task"]
    if _could_block(task) or (task.action not in CONTROLLER_ACTIONS
                              and not _skipped_here(task, kwargs["task_vars"], kwargs["host"].name)):
        return _ForkedWorker(**kwargs)
    return _InlineWorker(**kwargs)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "spark_inline_tasks"
    CALLBACK_NEEDS_ENABLED = False

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        if _task is not None and not self.get_option("fork_every_task"):
            strategy.WorkerProcess = _worker

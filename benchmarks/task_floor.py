"""The floor under the no-change figure: what one task costs under each configuration.

A no-change site.yml is a sequence of tasks of two kinds: a read-only module on each node (a round
trip and a module start per host) and a step that never leaves the controller. Connection settings
(pipelining, ControlPersist, forks) can only change the first kind. Timing twenty of each under the
project's ansible.cfg and under Ansible's defaults, side by side in the same rounds, gives the best
ratio that any playbook built of such tasks can reach by configuration alone: if even a task that is
nothing but a round trip is not twice as fast, no no-change run is.
"""

from __future__ import annotations

import datetime

from tests.lib.playbook import run_playbook

from .context import RUNNER_ENV, Context, defaults_config, no_inherited_ansible_env, rounds, task_seconds
from .nodes import REPO, BenchError, close_masters
from .report import Figure, median

PLAYBOOK = "benchmarks/playbooks/task_floor.yml"
NODE_STEP = "-: Read one file's status on every node"
CONTROLLER_STEP = "-: Set a fact on the controller"
TASKS_EACH = 20


def task_floor(ctx: Context, runs: int) -> list[Figure]:
    configs = {"project": REPO / "ansible.cfg", "defaults": defaults_config(ctx)}
    per_task: dict[str, dict[str, list[float]]] = {k: {"node": [], "controller": []} for k in configs}
    counter = iter(range(10_000))

    def one(which: str):
        def step() -> float:
            cp = ctx.control_dir / f"floor-{which}-{next(counter)}"
            cp.mkdir()
            try:
                with no_inherited_ansible_env():
                    r = run_playbook(PLAYBOOK, ctx.inventory, timeout=600,
                                     envvars={"ANSIBLE_CONFIG": str(configs[which]),
                                              "ANSIBLE_SSH_CONTROL_PATH_DIR": str(cp)})
            finally:
                close_masters(cp)
            if r.rc != 0:
                raise BenchError(f"{PLAYBOOK} with {which} config failed (rc {r.rc}): {r.failure_messages()[-800:]}")
            seconds = task_seconds(r.events)
            # The first node task also opens the SSH connections: left out, both sides alike.
            node = (seconds[NODE_STEP] - _first(r.events, NODE_STEP)) / (TASKS_EACH - 1)
            per_task[which]["node"].append(node)
            per_task[which]["controller"].append(seconds[CONTROLLER_STEP] / TASKS_EACH)
            return node
        return step

    s = rounds(ctx, "per-task floor", runs, [("project", one("project")), ("defaults", one("defaults"))])
    ctl = {k: median(v["controller"]) for k, v in per_task.items()}
    fig = Figure(
        key="task_floor", name="one read-only task on 2 nodes, after the connection is open (wall per task)",
        unit="s", measured=s["project"], baseline_name="the same task under Ansible's defaults", baseline=s["defaults"],
        target_op="<=", target=0.5,
        target_text="<= 0.5x would be needed for the no-change target to be reachable by configuration",
        notes=[f"{TASKS_EACH} separate ansible.builtin.stat tasks on both nodes, then {TASKS_EACH} set_fact tasks, "
               f"through ansible-runner ({', '.join(f'{k}={v}' for k, v in RUNNER_ENV.items())}); the first stat "
               "task (which opens the connections) is left out",
               "a controller-only task costs "
               + (f"{ctl['project']:.3f} s (project) vs {ctl['defaults']:.3f} s (defaults)"
                  if None not in ctl.values() else "? (a side failed)"),
               "configs: the same two files as the site.yml no-change figure"],
        extra={"per_task": per_task},
    )
    return [fig]


def _first(events: list[dict], name: str) -> float:
    """Seconds of the first task called `name` (its start to the next task's start)."""
    marks = [(e["created"], f"{e['event_data'].get('role') or '-'}: {e['event_data'].get('task')}")
             for e in events if e.get("event") in ("playbook_on_task_start", "playbook_on_stats")]
    for (a, n), (b, _) in zip(marks, marks[1:], strict=False):
        if n == name:
            return (datetime.datetime.fromisoformat(b) - datetime.datetime.fromisoformat(a)).total_seconds()
    return 0.0

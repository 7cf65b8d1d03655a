"""Run the project's real playbooks through ansible-runner and read their events.

Tests assert on per-task events, e.g. that a run failed at the validation task
and that no task before it reported a change.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import ansible_runner

from tests.harness import cluster as sim

REPO = Path(__file__).resolve().parents[2]
# The inventory check's one refusal of bad settings (playbooks/tasks/inventory_check.yml), before any play that
# contacts a node: every concern's plan (server, firewall, supervisor, monitoring) in one task per host.
SITE_CHECK = ("Refuse settings the checkpoint build, server, firewall, supervisor, monitoring, guard, gateway or verify "
              "plan finds wrong, before any change")

# ansible-runner finds ansible-playbook on PATH: use the one beside this Python.
_BIN = str(Path(sys.executable).parent)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")


@dataclass
class Result:
    rc: int
    status: str
    events: list[dict] = field(default_factory=list)
    stdout: str = ""

    def task_events(self, event: str | None = None) -> list[dict]:
        return [
            e for e in self.events
            if e.get("event", "").startswith("runner_on_") and (event is None or e["event"] == event)
        ]

    @property
    def failed(self) -> list[dict]:
        """Failed task results that were not ignored, as event_data dicts."""
        return [
            e["event_data"] for e in self.task_events("runner_on_failed")
            if not e["event_data"].get("ignore_errors")
        ] + [e["event_data"] for e in self.task_events("runner_on_unreachable")]

    @property
    def changed(self) -> list[dict]:
        return [
            e["event_data"] for e in self.task_events("runner_on_ok")
            if e["event_data"].get("res", {}).get("changed")
        ]

    def changed_before_first_failure(self) -> list[dict]:
        out = []
        for e in self.task_events():
            data = e["event_data"]
            if e["event"] == "runner_on_failed" and not data.get("ignore_errors"):
                break
            if e["event"] == "runner_on_ok" and data.get("res", {}).get("changed"):
                out.append(data)
        return out

    def results(self, task: str) -> dict[str, dict]:
        """Per-host results of the task named `task` (last occurrence wins)."""
        return {
            e["event_data"]["host"]: e["event_data"].get("res", {})
            for e in self.task_events()
            if e["event_data"].get("task") == task
        }

    def failure_messages(self) -> str:
        """Each failed task's message; for a loop, each failed item's too (its own message, or stderr)."""
        lines = []
        for d in self.failed:
            res = d.get("res", {})
            lines.append(str(res.get("msg", "")))
            lines += [f"  {d.get('host')}: {d.get('task')} [{item.get('item')}]: {item.get('msg') or item.get('stderr', '')}"
                      for item in res.get("results") or [] if isinstance(item, dict) and item.get("failed")]
        return "\n".join(lines)


def run_playbook(
    playbook: str,
    inventory: str | os.PathLike,
    *,
    extravars: dict | None = None,
    limit: str | None = None,
    check: bool = False,
    diff: bool = False,
    tags: str | None = None,
    envvars: dict | None = None,
    timeout: int = 1800,
) -> Result:
    """Run `playbook` (a path relative to the repository root) like an operator would."""
    private = Path(tempfile.mkdtemp(prefix="runner-"))
    started, cpu_before, nodes_before = time.monotonic(), children_cpu_seconds(), nodes_cpu_seconds(inventory)
    cmdline = []
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    env = {
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        # ansible-runner sets ANSIBLE_CALLBACK_PLUGINS (for its event callback), which outranks
        # ansible.cfg's callback_plugins: name the project's own plugin directory here too.
        "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "callback_plugins"),
        **(envvars or {}),
    }
    # The events kept in memory as they come, not written to the run's artifacts and read back (each one a file).
    events: list[dict] = []

    def keep(event: dict) -> bool:
        events.append(event)
        return False

    try:
        r = ansible_runner.run(
            private_data_dir=str(private),
            project_dir=str(REPO),
            playbook=str(REPO / playbook),
            inventory=str(inventory),
            extravars=extravars or {},
            limit=limit,
            tags=tags,
            cmdline=" ".join(cmdline) or None,
            envvars=env,
            quiet=True,
            timeout=timeout,
            event_handler=keep,
        )
        stdout = r.stdout.read() if r.stdout else ""
        result = Result(rc=r.rc, status=r.status, events=events, stdout=stdout)
        log_run(playbook, check, result, time.monotonic() - started, children_cpu_seconds() - cpu_before,
                nodes=nodes_cpu_seconds(inventory) - nodes_before)
        return result
    finally:
        shutil.rmtree(private, ignore_errors=True)


# ---- where CI's budget goes, per playbook run (tests/conftest.py's summary reads it) ----------
# Also used by tests/lib/checkpoint_site.py for the runs it starts itself, to interrupt them.
RUN_LOG = Path(tempfile.gettempdir()) / "spark-test-runs"


def children_cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime


def nodes_cpu_seconds(inventory: str | os.PathLike) -> float:
    """CPU seconds the simulated nodes behind a harness inventory used so far (0 for any other inventory)."""
    path = Path(inventory)
    return sim.instance_cpu_seconds(path.parent.name) if path.parent.parent == sim.STATE_ROOT else 0.0


def log_run(playbook: str, check: bool, result: Result, wall: float, cpu: float, *, nodes: float = 0.0) -> None:
    run = os.environ.get("SPARK_TEST_RUN")
    if not run:
        return
    remote = [e for e in result.task_events() if e["event"] != "runner_on_start"
              and e["event_data"].get("host") not in ("localhost", None)]
    line = {"test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0], "playbook": playbook,
            "check": check, "rc": result.rc, "wall": round(wall, 2), "cpu": round(cpu, 2), "nodes": round(nodes, 2),
            "host_results": len(remote)}
    with open(f"{RUN_LOG}-{run}.jsonl", "a") as log:
        log.write(json.dumps(line) + "\n")

"""The TP group's supervisor (roles/supervisor/files/spark_llm_supervisor.py) on a simulated pair.

No real command runs in-process: the supervisor's injectable runner is a model of the two nodes
(each rank's systemd unit, the processes holding each GPU, SSH reachability, the head's HTTP
endpoint) and its injectable clock moves only when the supervisor sleeps or a request times out,
so every scenario is deterministic and takes milliseconds. The model is strict where the real
pair is: a generation needs every rank (a dead or frozen peer stalls it), and a rank started
while its GPU still holds the old rank's process fails to load. A few tests run the real file as
a subprocess (status, pause, resume; a refused config) on a temporary state directory.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import random
import shlex
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.lib.role_module import collection_importable

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "roles" / "supervisor" / "files" / "spark_llm_supervisor.py"
# The nodes run the program with their own python3 (>= 3.11); the suite's venv may be newer.
NODE_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def load_program():
    spec = importlib.util.spec_from_file_location("supervisor_under_test", PROGRAM)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


S = load_program()

KEY = "sk-spark-5f0c3e9a71d24b88"
MODEL_ID = "/models/glm53"  # what /v1/models lists (the container's model dir)
HEAD, WORKER = "spark-0", "spark-1"
ACTIONS = ("stop", "start", "reset-failed")


class FakeClock:
    """Wall and monotonic time that move only when asked; callbacks fire when their time comes."""

    def __init__(self):
        self.wall = 1_790_000_000.0
        self.mono = 10_000.0
        self.pending: list[tuple[float, int, object]] = []

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.wall += max(seconds, 0)
        self.mono += max(seconds, 0)
        due = sorted(p for p in self.pending if p[0] <= self.mono)
        self.pending = [p for p in self.pending if p[0] > self.mono]
        for _at, _seq, fn in due:
            fn()

    def after(self, seconds: float, fn) -> None:
        self.pending.append((self.mono + seconds, len(self.pending), fn))


@dataclass
class FakeNode:
    name: str
    address: str
    local: bool
    active: str = "inactive"
    sub: str = "dead"
    result: str = "success"
    enter_us: int = 0
    started: float | None = None
    reachable: bool = True
    gpu_pids: list = field(default_factory=list)
    release_at: float | None = None
    gpu_release: float = 3.0  # seconds a dead rank's GPU takes to hold no process
    dies_after: float | None = None  # a start that fails this long after (e.g. the driver is gone)
    dies_at: float | None = None
    frozen: bool = False
    pid: int = 4000


class FakeCluster:
    """The runner: two nodes' units, GPUs and SSH, and the head's HTTP endpoint."""

    def __init__(self, clock: FakeClock):
        self.clock = clock
        self.nodes = [FakeNode(HEAD, "192.168.100.10", True), FakeNode(WORKER, "192.168.100.11", False, pid=5000)]
        self.load_seconds = 40.0
        self.key = KEY
        self.hang = False
        self.hang_until_restart = False  # a hang that the head's next start clears (a wedged scheduler)
        self.stops_while_serving: list[tuple[float, str]] = []  # a stop that broke a serving group: never allowed
        self.alert_rc = 0
        self.argvs: list[list[str]] = []  # every argv the supervisor ran, ssh included
        self.commands: list[tuple[float, str, list[str]]] = []  # (monotonic time, node, command on that node)
        self.requests: list[tuple[str, str, dict, bytes | None]] = []
        self.alerts: list[tuple[str, str]] = []

    def node(self, name: str) -> FakeNode:
        return next(n for n in self.nodes if n.name == name)

    def clear(self) -> None:
        self.argvs.clear()
        self.commands.clear()
        self.requests.clear()

    # -- what happens to the pair --

    def start_rank(self, node: FakeNode) -> None:
        now = self.clock.mono
        node.active, node.sub, node.result = "active", "running", "success"
        node.started, node.enter_us = now, int(now * 1e6)
        node.frozen = False
        if node is self.nodes[0]:
            self.hang_until_restart = False
        node.dies_at = now + node.dies_after if node.dies_after is not None else None
        if node.gpu_pids:
            # The old rank's memory is not free yet: the new one cannot load its weights.
            node.dies_at = now + 2
        node.pid += 1
        node.gpu_pids = [*node.gpu_pids, node.pid]

    def end_rank(self, node: FakeNode, active: str, sub: str, result: str) -> None:
        node.active, node.sub, node.result = active, sub, result
        node.started = node.dies_at = None
        if node.gpu_pids and node.release_at is None:
            node.release_at = self.clock.mono + node.gpu_release

    def kill(self, name: str) -> None:
        """SIGKILL of the rank: its unit waits RestartSec to restart it alone (Restart=on-failure)."""
        self.end_rank(self.node(name), "activating", "auto-restart", "signal")

    def power_off(self, name: str) -> None:
        node = self.node(name)
        node.reachable = False
        node.active, node.sub, node.result, node.started, node.dies_at = "inactive", "dead", "success", None, None
        node.gpu_pids, node.release_at = [], None

    def power_on(self, name: str) -> None:
        self.node(name).reachable = True  # the rank's unit is not enabled at boot: it stays inactive

    def refresh(self) -> None:
        for node in self.nodes:
            if node.dies_at is not None and self.clock.mono >= node.dies_at:
                self.end_rank(node, "failed", "failed", "exit-code")
            if node.release_at is not None and self.clock.mono >= node.release_at:
                live = node.pid if node.active == "active" else None
                node.gpu_pids = [p for p in node.gpu_pids if p == live]
                node.release_at = None

    def serving(self) -> bool:
        head = self.nodes[0]
        return head.active == "active" and self.clock.mono >= head.started + self.load_seconds

    def answers_generations(self) -> bool:
        """What a client sees: every rank up, none frozen, the head loaded and not hung."""
        self.refresh()
        return (self.serving() and not (self.hang or self.hang_until_restart)
                and all(n.reachable and n.active == "active" and not n.frozen for n in self.nodes))

    # -- the runner's interface --

    def run(self, argv, timeout, stdin=None):
        self.argvs.append(list(argv))
        self.refresh()
        if argv[:2] == ["/bin/sh", "-c"]:
            self.alerts.append((argv[2], stdin))
            return S.Result(self.alert_rc, "", "" if self.alert_rc == 0 else "curl: (7) Failed to connect")
        if argv[0] == "ssh":
            target = next(a for a in argv if "@" in a)
            node = next(n for n in self.nodes if n.address == target.split("@", 1)[1])
            assert not node.local
            if not node.reachable:
                return S.Result(255, "", f"ssh: connect to host {node.address} port 22: No route to host")
            command = shlex.split(argv[-1])
        else:
            node, command = self.nodes[0], list(argv)
        self.commands.append((self.clock.mono, node.name, command))
        return self.execute(node, command)

    def execute(self, node: FakeNode, command: list[str]):
        match command:
            case ["systemctl", "show", "-p", props, "spark-llm.service"]:
                assert props.split(",")[:3] == ["ActiveState", "SubState", "Result"]
                return S.Result(0, f"ActiveState={node.active}\nSubState={node.sub}\nResult={node.result}\n"
                                   f"ActiveEnterTimestampMonotonic={node.enter_us if node.started is not None else 0}\n")
            case ["systemctl", "stop", "spark-llm.service"]:
                if self.answers_generations():
                    self.stops_while_serving.append((self.clock.mono, node.name))
                if node.active in ("active", "activating"):
                    self.end_rank(node, "inactive", "dead", "success")
                return S.Result(0)
            case ["systemctl", "reset-failed", "spark-llm.service"]:
                if node.active == "failed":
                    node.active, node.sub, node.result = "inactive", "dead", "success"
                return S.Result(0)
            case ["systemctl", "start", "spark-llm.service"]:
                if node.active != "active":
                    self.start_rank(node)
                return S.Result(0)
            case ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"]:
                return S.Result(0, "".join(f"{pid}\n" for pid in node.gpu_pids))
            case ["journalctl", "-u", "spark-llm.service", "-n", "30", "--no-pager"]:
                lines = [f"{node.name} sglang[{i}]: line {i}" for i in range(40)]
                lines[35] = f"{node.name} sglang[35]: launch_server --api-key {KEY}"
                return S.Result(0, "\n".join(lines) + "\n")
        raise AssertionError(f"unexpected command on {node.name}: {command}")

    def http(self, method, url, *, headers, body, timeout, cafile=None):
        self.refresh()
        assert url.startswith("http://127.0.0.1:30000/")
        path = url.removeprefix("http://127.0.0.1:30000")
        self.requests.append((method, path, dict(headers), body))
        if not self.serving():
            raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
        if self.key and headers.get("Authorization") != f"Bearer {self.key}":
            return 401, b'{"error": "Unauthorized"}'
        if (method, path) == ("GET", "/v1/models"):
            return 200, json.dumps({"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]}).encode()
        if (method, path) == ("POST", "/v1/chat/completions"):
            if self.hang or self.hang_until_restart or any(n.active != "active" or n.frozen for n in self.nodes):
                # Every token needs a collective across the ranks: a dead or frozen peer stalls it.
                self.clock.advance(timeout)
                raise TimeoutError("timed out")
            assert json.loads(body)["model"] == MODEL_ID
            return 200, json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "OK"},
                                                 "finish_reason": "length"}]}).encode()
        return 404, b'{"detail": "Not Found"}'


def settings(tmp_path: Path, **overrides) -> Path:
    key_file = tmp_path / "spark-llm.key"
    key_file.write_text(f"{KEY}\n")
    key_file.chmod(0o600)
    config = {
        "unit": "spark-llm.service",
        "nodes": [{"name": HEAD, "address": "192.168.100.10", "local": True}, {"name": WORKER, "address": "192.168.100.11"}],
        "ssh": {"user": "root", "key": "/root/.ssh/id_spark_fabric", "known_hosts": "/root/.ssh/known_hosts",
                "connect_timeout": 5},
        "endpoint": "http://127.0.0.1:30000",
        "model": "glm53",  # the role passes a basename; /v1/models lists the full id
        "key_file": str(key_file),
        "tls_ca": None,
        "interval": 30, "failures": 3, "probe_timeout": 20, "max_restarts": 3, "window": 21600,
        "readiness_timeout": 3600, "gpu_release_timeout": 180, "node_wait_report": 600,
        "alert_command": "", "state_dir": str(tmp_path / "state"),
    }
    config.update(overrides)
    path = tmp_path / "supervisor.json"
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


@dataclass
class World:
    path: Path
    clock: FakeClock
    cluster: FakeCluster
    sup: object
    lines: list

    @property
    def state_dir(self) -> Path:
        return Path(self.sup.cfg.state_dir)

    def state(self) -> dict:
        return json.loads((self.state_dir / "state.json").read_text())

    def tick(self, count: int = 1) -> None:
        """What the daemon loop does: a check, then the interval (or less, up to a backed-off attempt)."""
        for _ in range(count):
            self.sup.tick()
            self.clock.advance(self.sup.next_wait())

    def boot(self) -> None:
        """A pair that serves, and a supervisor that has seen it serve."""
        for node in self.cluster.nodes:
            self.cluster.start_rank(node)
        self.clock.advance(self.cluster.load_seconds + 1)
        self.tick()
        assert self.state()["state"] == "healthy", self.state()
        self.cluster.clear()
        self.lines.clear()

    def actions(self) -> list[tuple[str, str]]:
        """(node, verb) of every systemctl stop/start/reset-failed, in order."""
        return [(node, cmd[1]) for _t, node, cmd in self.cluster.commands
                if cmd[0] == "systemctl" and cmd[1] in ACTIONS]

    def logged(self, event: str) -> list[str]:
        return [line for line in self.lines if line.startswith(f"spark-llm-supervisor: {event}")]


ORDERED_RESTART = [(HEAD, "stop"), (WORKER, "stop"), (HEAD, "reset-failed"), (WORKER, "reset-failed"),
                   (WORKER, "start"), (HEAD, "start")]


def assert_no_key(world: World) -> None:
    """The API key is read from the key file and sent as a header: nowhere else."""
    places = {
        "log lines": "\n".join(world.lines),
        "argv": json.dumps(world.cluster.argvs),
        "commands": json.dumps([c for _t, _n, c in world.cluster.commands]),
        "alert stdin": json.dumps(world.cluster.alerts),
    }
    if world.state_dir.exists():
        for path in world.state_dir.iterdir():
            places[str(path)] = path.read_text()
    for where, text in places.items():
        assert KEY not in text, f"the API key leaked into {where}"


@pytest.fixture
def new_world(tmp_path):
    made = []

    def make(**overrides) -> World:
        clock = FakeClock()
        cluster = FakeCluster(clock)
        lines: list[str] = []
        path = settings(tmp_path, **overrides)
        sup = S.Supervisor(S.load_config(str(path)), runner=cluster, clock=clock, log=lines.append)
        world = World(path, clock, cluster, sup, lines)
        made.append(world)
        return world

    yield make
    for world in made:
        assert_no_key(world)
        assert world.cluster.stops_while_serving == [], "the supervisor stopped a rank of a group that served"
        for line in world.lines:
            assert "\n" not in line  # one journal line per event


# ---- a healthy pair -----------------------------------------------------------------------------

def test_a_healthy_pair_costs_one_generation_per_interval(new_world):
    w = new_world()
    w.boot()
    w.tick(5)
    commands = [c for _t, _n, c in w.cluster.commands]
    assert len(commands) == 10 and all(c[:2] == ["systemctl", "show"] for c in commands)
    assert [(m, p) for m, p, _h, _b in w.cluster.requests] == [("POST", "/v1/chat/completions")] * 5
    for _m, _p, headers, body in w.cluster.requests:
        assert headers["Authorization"] == f"Bearer {KEY}"
        sent = json.loads(body)
        assert sent["max_tokens"] == 1 and sent["model"] == MODEL_ID
    st = w.state()
    assert st["state"] == "healthy" and st["failures"] == 0 and st["restarts"] == []
    assert st["ranks"] == {HEAD: "active/running", WORKER: "active/running"}
    assert w.lines == []  # nothing happened, nothing is logged


def test_workers_are_reached_over_ssh_with_the_pinned_host_keys(new_world):
    w = new_world()
    w.boot()
    w.tick()
    ssh = [argv for argv in w.cluster.argvs if argv[0] == "ssh"]
    local = [argv for argv in w.cluster.argvs if argv[0] != "ssh"]
    assert len(ssh) == 1 and len(local) == 1
    argv = ssh[0]
    for option in ("BatchMode=yes", "StrictHostKeyChecking=yes", "UserKnownHostsFile=/root/.ssh/known_hosts",
                   "ConnectTimeout=5"):
        assert argv[argv.index(option) - 1] == "-o", option
    assert argv[argv.index("-i") + 1] == "/root/.ssh/id_spark_fabric"
    assert "root@192.168.100.11" in argv


def test_boot_with_every_rank_inactive_starts_the_group(new_world):
    """After a power cycle of the pair the rank units are not enabled: the supervisor starts the group."""
    w = new_world()
    w.tick()
    assert w.actions() == ORDERED_RESTART
    st = w.state()
    assert st["state"] == "healthy" and len(st["restarts"]) == 1
    assert "every rank is down" in st["history"][0]["reason"]
    assert len(w.logged("restart:")) == 1 and len(w.logged("restarted:")) == 1
    # A boot is no failure: once the group serves stable_after (600 s) the start no longer counts.
    assert st["streak"] == 1
    w.tick(20)
    assert w.state()["streak"] == 0 and len(w.logged("stable:")) == 1


# ---- a rank dies --------------------------------------------------------------------------------

@pytest.mark.parametrize("killed", [WORKER, HEAD])
def test_sigkill_of_a_rank_restarts_the_whole_group_once(new_world, killed):
    w = new_world()
    w.boot()
    w.cluster.kill(killed)
    w.tick()
    assert w.actions() == ORDERED_RESTART
    # The start came only once both GPUs held no process (the model fails a start on a held GPU).
    smi = [(i, node) for i, (_t, node, cmd) in enumerate(w.cluster.commands) if cmd[0] == "nvidia-smi"]
    first_start = next(i for i, (_t, _n, cmd) in enumerate(w.cluster.commands) if cmd[:2] == ["systemctl", "start"])
    assert len([1 for _i, node in smi if node == killed]) >= 2
    assert max(i for i, _n in smi) < first_start
    st = w.state()
    assert st["state"] == "healthy" and len(st["restarts"]) == 1 and st["failures"] == 0
    assert f"{killed} activating/auto-restart (Result=signal)" in w.logged("restart:")[0]
    w.cluster.clear()
    w.tick(10)
    assert w.actions() == [] and len(w.state()["restarts"]) == 1  # one incident, one restart
    assert len(w.logged("restart:")) == 1


def test_a_hang_restarts_the_group_after_the_failures_in_a_row(new_world):
    """A frozen rank: every unit stays active/running, generation stalls."""
    w = new_world()
    w.boot()
    w.cluster.node(WORKER).frozen = True
    w.tick(2)
    st = w.state()
    assert st["state"] == "probing-failed" and st["failures"] == 2 and w.actions() == []
    assert [line.split(": ", 2)[1] for line in w.logged("probe-failed")] == ["probe-failed", "probe-failed"]
    w.tick()
    assert w.actions() == ORDERED_RESTART
    st = w.state()
    assert st["state"] == "healthy" and st["failures"] == 0 and len(st["restarts"]) == 1
    assert "3 generations failed in a row" in w.logged("restart:")[0]
    w.cluster.clear()
    w.tick(5)
    assert w.actions() == []


def test_a_group_still_loading_is_not_taken_for_a_hang(new_world):
    """The supervisor (re)started while the group loads: refused generations are not failures."""
    w = new_world()
    for node in w.cluster.nodes:
        w.cluster.start_rank(node)
    w.tick()
    st = w.state()
    assert st["state"] == "probing-failed" and st["failures"] == 0 and st["starting"] is True
    assert len(w.logged("starting")) == 1
    w.clock.advance(w.cluster.load_seconds)
    w.tick()
    assert w.state()["state"] == "healthy" and w.actions() == []
    assert len(w.logged("starting")) == 1 and len(w.logged("healthy")) == 1


def test_a_group_that_never_serves_is_restarted_after_the_readiness_timeout(new_world):
    """The loading grace is bounded; the restart's own readiness wait is bounded too."""
    w = new_world(readiness_timeout=600)
    w.cluster.load_seconds = 10_000
    for node in w.cluster.nodes:
        w.cluster.start_rank(node)
    w.tick(20)  # 600 s of grace
    assert w.actions() == [] and w.state()["failures"] == 0
    w.tick(3)
    # The failed attempt leaves no started group behind.
    assert w.actions() == [*ORDERED_RESTART, (HEAD, "stop"), (WORKER, "stop")]
    st = w.state()
    assert st["state"] == "stopped" and "not serving within 600s" in st["last_reason"]
    assert "3 generations failed in a row" in w.logged("restart:")[0]
    assert all(n.active != "active" for n in w.cluster.nodes)


# ---- bounded ------------------------------------------------------------------------------------

def events(world: World, *names: str) -> list[tuple[float, dict]]:
    """(wall time, event) of the supervisor's history, only `names` when given."""
    return [(S.from_iso(e["time"]), e) for e in world.state()["history"] if not names or e["event"] in names]


def test_spaced_incidents_heal_however_many_there_are(new_world):
    """Five kills, more than max_restarts (3), each followed by stable_after (600 s) of healthy
    generations: each restart is a recovery, the failing streak ends each time, no give-up."""
    w = new_world()
    w.boot()
    for incident in range(1, 6):
        w.cluster.kill(WORKER if incident % 2 else HEAD)
        w.tick()
        st = w.state()
        assert st["state"] == "healthy" and len(st["restarts"]) == incident
        assert st["streak"] == 1 and st["backoff"] == 60 and st["next_attempt"] == ""  # not stable yet
        w.tick(19)
        assert w.state()["streak"] == 1  # 570 s of healthy generations since the restart's first
        w.tick()
        st = w.state()
        assert st["streak"] == 0 and st["backoff"] == 0 and st["next_attempt"] == ""
        assert st["history"][-1]["event"] == "stable" and st["history"][-1]["streak"] == 1
    assert len(w.logged("restart:")) == 5 and len(w.logged("stable:")) == 5
    assert not w.logged("backing-off") and not w.logged("GAVE UP")
    assert [line.split(": ", 2)[2].split(" (")[0] for line in w.logged("restart:")] == ["attempt 1/3 in a row"] * 5


def test_a_failed_generation_starts_the_stable_period_over(new_world):
    """Stable service is healthy generations without a break."""
    w = new_world()
    w.boot()
    w.cluster.kill(WORKER)
    w.tick(10)
    w.cluster.hang = True
    w.tick()  # one failed generation (1/3): no restart, but the 300 s served so far no longer count
    w.cluster.hang = False
    assert w.state()["streak"] == 1 and w.state()["healthy_since"] == ""
    w.tick(19)
    assert w.state()["streak"] == 1
    w.tick(2)
    assert w.state()["streak"] == 0 and len(w.state()["restarts"]) == 1


def test_a_crash_loop_gives_up_after_the_streak_backing_off_between_attempts(new_world):
    """A worker rank that dies 2 s into every start: the group never serves. Attempt 1 at once,
    then 60 s and 120 s of back-off from each failure, every rank stopped meanwhile; the third
    failed attempt completes the streak (max_restarts 3): it gives up, loudly, and then does nothing."""
    w = new_world(alert_command="/usr/local/bin/page-oncall")
    w.boot()
    w.cluster.node(WORKER).dies_after = 2
    w.cluster.kill(WORKER)
    w.tick()
    st = w.state()
    assert st["state"] == "stopped" and st["streak"] == 1 and st["backoff"] == 60 and st["next_attempt"]
    assert all(n.active != "active" for n in w.cluster.nodes)
    w.cluster.clear()
    w.tick()  # a check 30 s into the back-off: nothing
    assert w.actions() == [] and w.state()["streak"] == 1
    w.tick()  # the next check comes at the attempt's time (the interval shortened to it), not later
    assert w.actions()[:len(ORDERED_RESTART)] == ORDERED_RESTART
    w.tick(10)
    restarts = events(w, "restart")
    failed = events(w, "restart-failed")
    backing = events(w, "backing-off")
    assert [e["attempt"] for _t, e in restarts] == [1, 2, 3] and [e["attempt"] for _t, e in failed] == [1, 2, 3]
    assert [(e["streak"], e["backoff"]) for _t, e in backing] == [(1, 60), (2, 120)]
    # Each back-off runs from the failure to the next attempt, to the second.
    assert [restarts[i + 1][0] - failed[i][0] for i in range(2)] == [60, 120]
    assert [backing[i][0] for i in range(2)] == [failed[i][0] for i in range(2)]
    gave_up = w.logged("GAVE UP")
    assert len(gave_up) == 1
    assert "restart attempt 3 failed: a rank died during start-up: spark-1 failed/failed" in gave_up[0]
    assert "3 group restart(s) in a row did not reach stable service (limit 3): a crash loop" in gave_up[0]
    assert all(n.active != "active" for n in w.cluster.nodes)  # no half group holding memory
    marker = json.loads((w.state_dir / "gave-up.json").read_text())
    assert marker["event"] == "gave-up" and marker["streak"] == 3 and len(marker["restarts"]) == 3
    assert marker["max_restarts"] == 3 and marker["stable_after"] == 600 and marker["window_max_restarts"] == 20
    assert marker["stopped"] == {HEAD: "stopped", WORKER: "stopped"}
    for name in (HEAD, WORKER):
        assert len(marker["journal"][name]) == 30
        assert marker["journal"][name][25] == f"{name} sglang[35]: launch_server --api-key <redacted>"
    [(command, stdin)] = w.cluster.alerts
    assert command == "/usr/local/bin/page-oncall" and json.loads(stdin) == marker
    assert w.logged("alert-sent")
    st = w.state()
    assert st["state"] == "gave-up" and st["history"][-1]["event"] == "gave-up" and st["next_attempt"] == ""
    # Everything after: nothing at all until `resume`.
    w.cluster.clear()
    w.cluster.node(WORKER).dies_after = None
    w.cluster.start_rank(w.cluster.node(WORKER))
    w.tick(10)
    assert w.cluster.commands == [] and w.cluster.requests == [] and w.cluster.alerts == [(command, stdin)]
    assert len(w.logged("GAVE UP")) == 1 and w.state()["state"] == "gave-up"


def test_a_group_that_dies_soon_after_serving_is_a_streak_too(new_world):
    """The worker's rank serves, then dies 60 s into each start (20 s after the group serves): each
    restart succeeds but none reaches stable service. While backing off the head's rank, alone, is
    stopped; the fourth incident finds the streak complete and gives up."""
    w = new_world()
    w.boot()
    w.cluster.node(WORKER).dies_after = 60
    w.cluster.kill(WORKER)
    w.tick()
    assert w.state()["state"] == "healthy" and w.logged("restarted")
    w.cluster.clear()
    w.tick()  # the worker died 20 s after the group served
    st = w.state()
    assert st["state"] == "stopped" and st["streak"] == 1 and st["backoff"] == 60
    assert w.actions() == [(HEAD, "stop")] and w.logged("stopped: spark-0 while backing off")
    seen = S.from_iso(st["history"][-2]["time"])
    assert st["history"][-2]["event"] == "backing-off" and S.from_iso(st["next_attempt"]) == seen + 60
    w.tick(30)
    restarts = events(w, "restart")
    backing = events(w, "backing-off")
    assert [e["attempt"] for _t, e in restarts] == [1, 2, 3]
    assert [e["backoff"] for _t, e in backing] == [60, 120]
    assert [restarts[i + 1][0] - backing[i][0] for i in range(2)] == [60, 120]
    gave_up = w.logged("GAVE UP")
    assert len(gave_up) == 1 and "rank down while spark-0 runs alone" in gave_up[0]
    assert "3 group restart(s) in a row did not reach stable service (600s of healthy generations) (limit 3)" in gave_up[0]
    assert w.state()["state"] == "gave-up" and len(w.logged("restarted")) == 3


def test_a_slow_loop_is_alerted_once_per_window_and_healed_every_time_never_given_up(new_world, capsys):
    """Each restart serves stable_after and more, then the group dies again: no streak. At window_max_restarts
    restarts within the window it alerts (a FLAPPING line, the alert command with "event": "flapping") and keeps
    restarting: every one of those incidents healed. The next restart in the same window restarts without a
    second alert; once the window has passed the last alert, the ceiling alerts again."""
    w = new_world(window_max_restarts=3, window=3600, stable_after=60, alert_command="/usr/local/bin/page-oncall")

    def status(world):
        assert S.main(["status", "--config", str(world.path)], clock=world.clock) == 0
        return json.loads(capsys.readouterr().out)

    w.boot()
    for _ in range(2):
        w.cluster.kill(WORKER)
        w.tick(4)
        assert w.state()["streak"] == 0 and w.state()["state"] == "healthy"
    assert not w.logged("FLAPPING") and w.cluster.alerts == []
    w.cluster.kill(WORKER)
    w.tick(4)
    st = w.state()
    assert st["state"] == "healthy" and st["streak"] == 0 and len(st["restarts"]) == 3, st
    [line] = w.logged("FLAPPING")
    assert "3 group restarts within 3600s (alert at 3), 2 of them healed (served 60s again): still restarting" in line
    [(command, stdin)] = w.cluster.alerts
    summary = json.loads(stdin)
    assert command == "/usr/local/bin/page-oncall" and summary["event"] == "flapping" and len(summary["restarts"]) == 3
    assert [e["event"] for e in st["history"]].count("flapping") == 1
    # The monitoring's collector reports it as flapping for a window from the alert (spark_supervisor_flapping).
    [alerted] = [e for e in st["history"] if e["event"] == "flapping"]
    assert S.from_iso(st["flapping_until"]) == S.from_iso(alerted["time"]) + 3600
    assert not w.logged("GAVE UP") and not (w.path / "state" / "gave-up.json").exists()
    # A fourth and a fifth within the window: restarted, served again, no second alert.
    for _ in range(2):
        w.cluster.kill(WORKER)
        w.tick(4)
        assert w.state()["state"] == "healthy" and w.state()["streak"] == 0
    assert len(w.logged("FLAPPING")) == 1 and len(w.cluster.alerts) == 1 and len(w.logged("restart:")) == 5
    shown = status(w)
    assert shown["flapping"] is True and shown["gave_up"] is None
    # A window after the alert (older restarts leave it): the count is back under the ceiling, so no alert...
    w.clock.advance(3600)
    assert status(w)["flapping"] is False
    w.cluster.kill(WORKER)
    w.tick(4)
    assert len(w.logged("FLAPPING")) == 1 and len(w.state()["restarts"]) == 1
    # ...until three restarts lie within the window again.
    for _ in range(2):
        w.cluster.kill(WORKER)
        w.tick(4)
    assert len(w.logged("FLAPPING")) == 2 and len(w.cluster.alerts) == 2 and w.state()["state"] == "healthy"


def test_the_back_off_doubles_up_to_its_cap():
    cfg = S.Config(path="", unit="u", nodes=(S.Node("h", "", True),), ssh_user="root", ssh_key=None,
                   ssh_known_hosts=None, connect_timeout=5, endpoint="http://x", model="m", key_file="", tls_ca=None,
                   interval=30, failures=3, probe_timeout=20, max_restarts=9, window=21600, readiness_timeout=60,
                   gpu_release_timeout=60, node_wait_report=600, alert_command="", state_dir="/nonexistent",
                   backoff_initial=10, backoff_max=100)
    assert [S.backoff_for(cfg, n) for n in range(8)] == [0, 10, 20, 40, 80, 100, 100, 100]
    assert S.backoff_for(cfg, 10_000) == 100


def test_an_alert_command_that_fails_is_logged_not_fatal(new_world):
    w = new_world(max_restarts=0, alert_command="curl -fsS --data-binary @- https://hooks.example/x")
    w.cluster.alert_rc = 7
    w.boot()
    w.cluster.kill(HEAD)
    w.tick()
    assert len(w.cluster.alerts) == 1
    assert w.logged("alert-failed") == ["spark-llm-supervisor: alert-failed: the alert command exited 7: "
                                        "curl: (7) Failed to connect"]
    assert w.state()["state"] == "gave-up" and w.state()["history"][-1]["alert"] == "failed: exit 7"


def test_resume_clears_a_give_up_and_the_next_check_starts_the_group(new_world, capsys):
    w = new_world(max_restarts=0)
    w.boot()
    w.cluster.kill(WORKER)
    w.tick()
    assert w.state()["state"] == "gave-up" and (w.state_dir / "gave-up.json").exists()
    assert S.main(["resume", "--config", str(w.path)], clock=w.clock) == 0
    assert json.loads(capsys.readouterr().out) == {"changed": True, "state": "stopped", "cleared": ["give-up"]}
    assert not (w.state_dir / "gave-up.json").exists()
    st = w.state()
    assert st["state"] == "stopped" and st["failures"] == 0 and st["restarts"] == []
    assert st["history"][-1]["event"] == "resume"
    # max_restarts 0 would give up again at once: resume makes the operator's fix count, not the budget.
    w.sup.cfg = S.load_config(str(settings(w.path.parent, max_restarts=1)))
    w.cluster.clear()
    w.tick()
    assert w.actions() == ORDERED_RESTART and w.state()["state"] == "healthy"
    assert w.logged("resumed: no longer gave-up")
    # Every deployment that finds the group serving resumes it: with nothing to clear that changes
    # nothing, and the restart it just made stays counted in the window.
    assert S.main(["resume", "--config", str(w.path)], clock=w.clock) == 0
    assert json.loads(capsys.readouterr().out) == {"changed": False, "state": "healthy", "cleared": []}
    assert len(w.state()["restarts"]) == 1


# ---- restart attempts that fail -----------------------------------------------------------------

def test_the_streak_and_its_back_off_survive_a_supervisor_restart_and_a_head_reboot(new_world, capsys):
    """Mid back-off the supervisor is restarted (systemd: Restart=always), then the head reboots: the
    next supervisor reads the streak and the next attempt's time from disk and keeps to them."""
    w = new_world()
    w.boot()
    w.cluster.node(WORKER).dies_after = 2
    w.cluster.kill(WORKER)
    w.tick()
    st = w.state()
    due = S.from_iso(st["next_attempt"])
    assert st["streak"] == 1 and due == S.from_iso(events(w, "restart-failed")[-1][1]["time"]) + 60
    assert S.main(["status", "--config", str(w.path)], clock=w.clock) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["streak"] == 1 and shown["backoff"] == 60 and shown["next_attempt_in"] == 30  # one check later
    assert shown["limits"] == {"max_restarts": 3, "window_max_restarts": 20, "window": 21600, "stable_after": 600,
                               "backoff_initial": 60, "backoff_max": 900}

    def new_supervisor():
        w.sup = S.Supervisor(S.load_config(str(w.path)), runner=w.cluster, clock=w.clock, log=w.lines.append)
        w.sup.announce()

    new_supervisor()  # the process restarted at once
    assert w.logged("resumed-state") == [
        f"spark-llm-supervisor: resumed-state: failing streak 1/3, back-off 60s, next attempt {st['next_attempt']} "
        f"(from {w.state_dir / 'state.json'})"]
    w.cluster.clear()
    w.sup.tick()
    assert w.actions() == [] and w.state()["streak"] == 1
    w.cluster.power_off(HEAD)  # 30 s into the back-off the head goes down, and the supervisor with it
    w.clock.advance(20)
    w.cluster.power_on(HEAD)
    new_supervisor()
    assert w.sup.next_wait() == due - w.clock.wall == 10
    w.tick()
    assert w.actions() == [] and w.state()["streak"] == 1  # still backing off: every rank is down, 10 s to go
    assert "backing off: attempt 2/3 in 10s" in w.state()["last_reason"]
    w.tick()
    [(at, attempt)] = events(w, "restart")[-1:]
    assert at == due and attempt["attempt"] == 2 and w.state()["streak"] == 2


def test_status_without_usable_settings_still_shows_the_state(new_world, capsys):
    w = new_world()
    w.boot()
    broken = json.loads(w.path.read_text())
    broken["backoff_max"] = 1  # below backoff_initial: the daemon would refuse it
    w.path.write_text(json.dumps(broken))
    assert S.main(["status", "--config", str(w.path)], clock=w.clock) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["state"] == "healthy" and shown["limits"] is None and shown["next_attempt_in"] is None


def test_a_state_dir_on_tmpfs_is_reported_at_start(new_world, tmp_path, monkeypatch):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:2 / / rw,relatime shared:1 - ext4 /dev/vda2 rw\n"
        "25 22 0:21 / /run rw,nosuid shared:5 - tmpfs tmpfs rw,size=1600000k\n"
        "26 22 0:22 / /var/lib/spark-llm-supervisor rw shared:6 - tmpfs tmpfs rw\n"
        "27 22 0:23 / /var/lib/spare\\040disk rw shared:7 - xfs /dev/vdb1 rw\n")
    assert S.filesystem_type("/var/lib/spark-llm-supervisor", str(mountinfo)) == "tmpfs"
    assert S.filesystem_type("/var/lib/spark-llm-supervisor/state.json", str(mountinfo)) == "tmpfs"
    assert S.filesystem_type("/var/lib/spark-llm-supervisor-old", str(mountinfo)) == "ext4"
    assert S.filesystem_type("/var/lib/spare disk/x", str(mountinfo)) == "xfs"
    assert S.filesystem_type("/run/x", str(mountinfo)) == "tmpfs"
    assert S.filesystem_type("/x", str(tmp_path / "absent")) == ""
    w = new_world()
    monkeypatch.setattr(S, "filesystem_type", lambda path: "tmpfs")
    w.sup.announce()
    assert w.logged("warning") == [
        f"spark-llm-supervisor: warning: state_dir {w.state_dir} is on tmpfs: the failing streak, the back-off and a "
        "give-up would not survive a reboot of the head; keep it on disk (/var/lib)"]
    monkeypatch.setattr(S, "filesystem_type", lambda path: "ext4")
    w.lines.clear()
    w.sup.announce()
    assert not w.logged("warning") and w.logged("start")


def test_a_gpu_not_released_in_time_fails_the_attempt_and_counts(new_world):
    w = new_world()
    w.boot()
    w.cluster.node(WORKER).gpu_release = 100_000  # leaked unified memory: the process never goes
    w.cluster.kill(WORKER)
    w.tick()
    assert (WORKER, "start") not in w.actions() and (HEAD, "start") not in w.actions()
    st = w.state()
    assert st["state"] == "stopped" and len(st["restarts"]) == 1 and st["streak"] == 1
    assert "GPU not released within 180s: spark-1 still holds processes 5001" in st["last_reason"]
    assert len(w.logged("restart-failed")) == 1 and len(w.logged("backing-off")) == 1
    assert all(n.active != "active" for n in w.cluster.nodes)
    # Each later attempt waits its back-off; the third failure completes the streak: it gives up.
    w.tick(12)
    assert len(w.logged("restart-failed")) == 3 and len(w.logged("GAVE UP")) == 1
    assert w.state()["state"] == "gave-up" and len(w.state()["restarts"]) == 3


def test_a_rank_that_dies_during_start_up_fails_the_attempt_at_once(new_world):
    w = new_world()
    w.boot()
    w.cluster.node(WORKER).dies_after = 4  # e.g. the driver is not loaded
    w.cluster.kill(WORKER)
    t0 = w.clock.mono
    w.tick()
    st = w.state()
    assert st["state"] == "stopped" and len(st["restarts"]) == 1
    assert "a rank died during start-up: spark-1 failed/failed (Result=exit-code)" in st["last_reason"]
    failed_at = next(t for t, _n, cmd in reversed(w.cluster.commands) if cmd[:2] == ["systemctl", "stop"])
    assert failed_at - t0 < 60  # not the 3600 s readiness timeout
    assert w.actions()[-2:] == [(HEAD, "stop"), (WORKER, "stop")]


# ---- a node that does not answer ---------------------------------------------------------------

def test_an_unreachable_worker_is_waited_for_and_the_group_restarts_when_it_is_back(new_world):
    w = new_world()
    w.boot()
    w.cluster.power_off(WORKER)
    w.tick()
    st = w.state()
    assert st["state"] == "waiting-for-node" and st["waiting_for"] == [WORKER]
    assert w.actions() == [(HEAD, "stop")]  # the head alone would hold its memory and serve nothing
    assert len(w.logged("waiting-for-node")) == 1 and "No route to host" in w.logged("waiting-for-node")[0]
    w.tick(44)  # 22 minutes
    st = w.state()
    assert st["state"] == "waiting-for-node" and st["waited_seconds"] >= 1300
    assert len(w.logged("waiting-for-node")) == 1 and len(w.logged("still-waiting")) == 2
    assert w.actions() == [(HEAD, "stop")] and st["restarts"] == []
    w.cluster.power_on(WORKER)
    w.cluster.clear()
    w.tick()
    assert w.actions() == ORDERED_RESTART
    st = w.state()
    assert st["state"] == "healthy" and len(st["restarts"]) == 1 and st["waiting_for"] == []
    assert "spark-1 answers again after" in w.logged("node-back")[0]


# ---- the operator -------------------------------------------------------------------------------

def test_paused_it_only_watches(new_world, capsys):
    w = new_world()
    w.boot()
    assert S.main(["pause", "--config", str(w.path), "--reason", "deliberate stop.yml"], clock=w.clock) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["changed"] is True and printed["state"] == "paused"
    assert printed["paused"]["reason"] == "deliberate stop.yml"
    w.cluster.kill(WORKER)
    w.tick(4)
    assert S.main(["pause", "--config", str(w.path), "--reason", "again"], clock=w.clock) == 0
    assert json.loads(capsys.readouterr().out) == {**printed, "changed": False}  # still the same pause
    assert w.logged("paused") == ["spark-llm-supervisor: paused: paused by the operator: deliberate stop.yml; watching only"]
    assert w.actions() == [] and w.cluster.requests == []
    assert {cmd[1] for _t, _n, cmd in w.cluster.commands} == {"show"}
    st = w.state()
    assert st["state"] == "paused" and "deliberate stop.yml" in st["last_reason"]
    assert st["ranks"][WORKER] == "activating/auto-restart (Result=signal)"


def test_a_pause_during_a_restart_abandons_it(new_world):
    w = new_world()
    w.boot()
    w.cluster.kill(WORKER)
    # 20 s into the restart (the group loads for 40 s), the operator pauses.
    w.clock.after(20, lambda: S.cmd_pause(str(w.state_dir), w.clock, "operator takes over"))
    w.tick()
    actions = w.actions()
    assert actions == ORDERED_RESTART  # nothing after the pause: not even a stop
    st = w.state()
    assert st["state"] == "paused" and st["history"][-1]["event"] == "restart-abandoned"
    assert w.logged("restart-abandoned")


def test_sigterm_ends_the_loop_without_touching_the_ranks(new_world, capsys):
    w = new_world()
    w.boot()
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    w.clock.after(100, lambda: os.kill(os.getpid(), signal.SIGTERM))
    try:
        assert S.main(["run", "--config", str(w.path)], runner=w.cluster, clock=w.clock) == 0
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("spark-llm-supervisor: start: watching spark-llm.service on spark-0 (local), spark-1 every 30s")
    assert out[-1] == "spark-llm-supervisor: exit: stopped by SIGTERM; the ranks are left as they are"
    assert KEY not in "\n".join(out)
    assert 3 <= len(w.cluster.requests) <= 5 and w.actions() == []
    assert all(n.active == "active" for n in w.cluster.nodes)


def test_a_supervisor_killed_mid_restart_loses_nothing_and_does_not_restart_twice(new_world):
    """SIGTERM (or a crash) while the group loads; systemd starts the supervisor again."""
    w = new_world()
    w.boot()
    w.cluster.kill(WORKER)
    w.clock.after(15, lambda: setattr(w.sup, "stopping", True))
    w.sup.run()
    assert w.actions() == ORDERED_RESTART and all(n.active == "active" for n in w.cluster.nodes)
    assert w.state()["state"] == "restarting" and len(w.state()["restarts"]) == 1
    assert not [p for p in w.state_dir.iterdir() if p.name.endswith(".tmp")]
    # The next supervisor reads the same state: the group is loading, which is no new incident.
    w.sup = S.Supervisor(S.load_config(str(w.path)), runner=w.cluster, clock=w.clock, log=w.lines.append)
    w.cluster.clear()
    w.tick(4)
    st = w.state()
    assert w.actions() == [] and st["state"] == "healthy" and len(st["restarts"]) == 1


def test_a_corrupt_state_file_is_not_fatal(new_world):
    w = new_world()
    w.boot()
    (w.state_dir / "state.json").write_text('{"state": "healthy", "restarts": [')
    w.tick()
    assert w.state()["state"] == "healthy"


def test_history_keeps_the_last_50_events(new_world):
    w = new_world(failures=1000)
    w.boot()
    w.cluster.hang = True
    w.tick(60)
    st = w.state()
    assert len(st["history"]) == 50 and st["history"][-1]["failures"] == 60


# ---- a month in compressed time -----------------------------------------------------------------

DAY = 86_400
# Every kind of incident on either node or both; each comes three times in the month.
INCIDENTS = [("kill", (HEAD,)), ("kill", (WORKER,)), ("freeze", (HEAD,)), ("freeze", (WORKER,)), ("hang", (HEAD,)),
             ("power", (HEAD,)), ("power", (WORKER,)), ("power", (HEAD, WORKER))]
HUNG = ["probe-failed"] * 3 + ["restart", "restarted", "stable"]
# What the supervisor logs, decision by decision, from a fault to stable service again. A power
# cycle of the head takes the supervisor down with it: a new one starts from the state on disk.
DECISIONS = {
    ("kill", (HEAD,)): ["restart", "restarted", "stable"],
    ("kill", (WORKER,)): ["restart", "restarted", "stable"],
    ("freeze", (HEAD,)): HUNG,
    ("freeze", (WORKER,)): HUNG,
    ("hang", (HEAD,)): HUNG,
    ("power", (HEAD,)): ["start", "restart", "restarted", "stable"],
    ("power", (WORKER,)): ["waiting-for-node", "node-back", "restart", "restarted", "stable"],
    ("power", (HEAD, WORKER)): ["start", "restart", "restarted", "stable"],
}


class Month:
    """The pair and its supervisor, run as the daemon loop runs it (a check, then next_wait) on the
    fake clock. Between incidents, once the group is stable, the checks come hourly instead of every
    interval: a healthy check decides nothing more by then (stability is counted in wall time), and
    a month of 30 s checks would take minutes."""

    def __init__(self, state_root: Path, seed: int, **overrides):
        self.rng = random.Random(seed)  # noqa: S311 - a reproducible schedule, not a secret
        self.clock = FakeClock()
        self.cluster = FakeCluster(self.clock)
        self.lines: list[tuple[float, str]] = []
        self.path = settings(state_root, **overrides)
        self.sup = None
        self.restarts_seen = 0

    def start_supervisor(self) -> None:
        """A supervisor process starts (the unit at boot, or systemd after a crash): settings and state from disk."""
        self.sup = S.Supervisor(S.load_config(str(self.path)), runner=self.cluster, clock=self.clock,
                                log=lambda line: self.lines.append((self.clock.wall, line)))
        self.sup.announce()

    def step(self) -> None:
        self.sup.tick()
        self.clock.advance(self.sup.next_wait())

    def state(self) -> dict:
        return json.loads((Path(self.sup.cfg.state_dir) / "state.json").read_text())

    def decisions(self, since: int) -> list[str]:
        return [line.split(": ", 2)[1] for _t, line in self.lines[since:]]

    def logged_at(self, since: int, event: str) -> list[float]:
        return [t for t, line in self.lines[since:] if line.startswith(f"spark-llm-supervisor: {event}:")]

    def healthy_for(self, seconds: int) -> None:
        """The group serves and nothing is done: every check is a healthy one and acts on no rank."""
        end = self.clock.wall + seconds
        while self.clock.wall < end:
            self.cluster.clear()
            self.sup.tick()
            assert [c[1] for _t, _n, c in self.cluster.commands] == ["show", "show"], self.cluster.commands
            st = self.state()
            assert st["state"] == "healthy" and st["streak"] == 0 and self.cluster.answers_generations()
            self.clock.advance(min(3600, end - self.clock.wall))

    def power_cycle(self, nodes: tuple[str, ...], off: int) -> None:
        for name in nodes:
            self.cluster.power_off(name)
        if HEAD in nodes:
            self.sup = None  # the supervisor runs on the head: it goes down with it, mid-wait
            self.clock.advance(off)
            for name in nodes:
                self.cluster.power_on(name)
            self.start_supervisor()
        else:
            self.clock.after(off, lambda: [self.cluster.power_on(name) for name in nodes])

    def incident(self, kind: str, nodes: tuple[str, ...]) -> int:
        mark = len(self.lines)
        if kind == "kill":
            self.cluster.kill(nodes[0])
        elif kind == "freeze":
            self.cluster.node(nodes[0]).frozen = True  # SIGSTOP: the unit stays active/running
        elif kind == "hang":
            self.cluster.hang_until_restart = True  # /v1/models answers, generation never does
        else:
            self.power_cycle(nodes, self.rng.randint(30, 500))
        for _ in range(200):
            if self.logged_at(mark, "stable"):
                break
            self.step()
        return mark


def test_a_month_of_incidents_then_a_crash_loop(tmp_path, monkeypatch):
    """30 days, compressed: 24 random incidents (kills, freezes, hangs, power cycles of either node or
    both), spaced by 20 to 40 hours of healthy service, each healed by one group restart made at once
    (attempt 1: the streak had ended) and followed by stable service; then a rank that dies 2 s into
    every start, given up on after exactly max_restarts (6) attempts, the back-off doubling from 60 s
    to its 300 s cap between them, a reboot of the head in the middle changing nothing. No rank of a
    serving group is ever stopped. Runs in seconds."""
    # The state directory in memory where there is one (speed); the supervisor would warn on tmpfs.
    root = Path(tempfile.mkdtemp(dir="/dev/shm")) if Path("/dev/shm").is_dir() else tmp_path
    monkeypatch.setattr(S, "filesystem_type", lambda path: "ext4")
    try:
        month = Month(root, seed=20260901, max_restarts=6, backoff_initial=60, backoff_max=300)
        run_a_month(month)
    finally:
        if root != tmp_path:
            for path in sorted(root.rglob("*"), reverse=True):
                path.rmdir() if path.is_dir() else path.unlink()
            root.rmdir()


def run_a_month(m: Month) -> None:
    m.start_supervisor()
    assert m.decisions(0) == ["start"]
    m.step()  # the pair is off: the first check starts it (a boot is a start like any other)
    for _ in range(25):
        m.step()
    assert m.decisions(1) == ["restart", "restarted", "stable"]
    t0 = m.clock.wall
    schedule = INCIDENTS * 3
    m.rng.shuffle(schedule)
    for number, (kind, nodes) in enumerate(schedule, 1):
        m.healthy_for(m.rng.randint(20 * 3600, 40 * 3600))
        mark = m.incident(kind, nodes)
        what = f"incident {number} ({kind} {'+'.join(nodes)})"
        assert m.decisions(mark) == DECISIONS[(kind, nodes)], what
        [restart] = [line for _t, line in m.lines[mark:] if line.startswith("spark-llm-supervisor: restart:")]
        assert restart.startswith("spark-llm-supervisor: restart: attempt 1/6 in a row"), what
        st = m.state()
        assert st["state"] == "healthy" and st["streak"] == 0 and st["backoff"] == 0 and st["next_attempt"] == ""
        assert m.cluster.answers_generations(), what
    assert m.clock.wall - t0 >= 28 * DAY
    assert len(m.state()["restarts"]) < 20  # spaced hours apart: never near the window's ceiling

    # The crash loop: every start of the worker's rank dies 2 s in.
    m.healthy_for(6 * 3600)
    m.cluster.node(WORKER).dies_after = 2
    mark = len(m.lines)
    m.cluster.kill(WORKER)
    rebooted = False
    for _ in range(200):
        st = m.state()
        if st["state"] == "gave-up":
            break
        if not rebooted and len(m.logged_at(mark, "backing-off")) == 2:
            assert S.from_iso(st["next_attempt"]) - m.clock.wall > 45
            m.power_cycle((HEAD,), 45)  # the head reboots mid back-off (and with it the supervisor)
            rebooted = True
        m.step()
    expected = []
    for attempt in range(1, 7):
        expected += ["restart", "restart-failed", "backing-off" if attempt < 6 else "GAVE UP"]
        if attempt == 2:
            expected += ["start", "resumed-state"]
    assert m.decisions(mark) == expected
    starts = m.logged_at(mark, "restart")
    failures = m.logged_at(mark, "restart-failed")
    assert [starts[i + 1] - failures[i] for i in range(5)] == [60, 120, 240, 300, 300]
    assert [line.split(": ", 2)[2].split(" (")[0] for t, line in m.lines[mark:] if t in starts
            and "restart:" in line] == [f"attempt {n}/6 in a row" for n in range(1, 7)]
    [gave_up] = [line for _t, line in m.lines[mark:] if "GAVE UP" in line]
    assert "6 group restart(s) in a row did not reach stable service (limit 6): a crash loop" in gave_up
    st = m.state()
    assert st["state"] == "gave-up" and st["streak"] == 6
    assert all(n.active != "active" for n in m.cluster.nodes)
    # Given up: a whole day passes with nothing done.
    m.cluster.clear()
    for _ in range(48):
        m.sup.tick()
        m.clock.advance(1800)
    assert m.cluster.commands == [] and len([1 for _t, line in m.lines if "GAVE UP" in line]) == 1
    assert m.cluster.stops_while_serving == []


# ---- the API key --------------------------------------------------------------------------------

def test_the_api_key_travels_only_in_the_authorization_header(new_world):
    """It is read at each probe (a new key is used at once) and redacted from the journal lines kept."""
    w = new_world(max_restarts=1, alert_command="cat >/dev/null")
    w.boot()
    w.cluster.kill(WORKER)
    w.tick(2)
    w.cluster.kill(HEAD)
    w.tick()  # gives up: the journal lines hold the key
    assert w.state()["state"] == "gave-up"
    assert {h.get("Authorization") for _m, _p, h, _b in w.cluster.requests} == {f"Bearer {KEY}"}
    key_file = Path(w.sup.cfg.key_file)
    key_file.write_text("sk-rotated\n")
    w.cluster.key = "sk-rotated"
    assert w.sup.generate(MODEL_ID).detail.startswith("generation: ")
    assert w.cluster.requests[-1][2]["Authorization"] == "Bearer sk-rotated"
    key_file.write_text(f"{KEY}\n")  # assert_no_key (teardown) looks for the original key


def test_without_a_key_no_authorization_header_is_sent(new_world):
    w = new_world()
    Path(w.sup.cfg.key_file).unlink()
    w.cluster.key = ""
    w.boot()
    w.tick()
    assert all("Authorization" not in h for _m, _p, h, _b in w.cluster.requests)


# ---- settings -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("change", "message"), [
    ({"nodes": []}, "nodes must be a non-empty list"),
    ({"nodes": [{"name": "spark-1", "address": "192.168.100.11"}]}, "must be the local node"),
    ({"nodes": [{"name": "a", "local": True}, {"name": "a", "address": "x"}]}, "node names repeat"),
    ({"interval": 0}, "interval must be a number >= 1"),
    ({"endpoint": "127.0.0.1:30000"}, "endpoint must be an http:// or https:// URL"),
    ({"model": ""}, "model must be a non-empty string"),
    ({"max_restarts": 2.5}, "max_restarts must be a whole number >= 0, not 2.5"),
    ({"stable_after": 0}, "stable_after must be a number >= 1"),
    ({"backoff_initial": True}, "backoff_initial must be a number >= 1"),
    ({"backoff_initial": 120, "backoff_max": 60}, r"backoff_max \(60\) is below backoff_initial \(120\)"),
])
def test_bad_settings_are_refused(tmp_path, change, message):
    with pytest.raises(S.ConfigError, match=message):
        S.load_config(str(settings(tmp_path, **change)))


def load_filter():
    collection_importable()
    path = REPO / "plugins" / "filter" / "supervisor.py"
    spec = importlib.util.spec_from_file_location("supervisor_filter_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PLAN = load_filter().supervisor_plan
ROLE_DEFAULTS = yaml.safe_load((REPO / "roles" / "supervisor" / "defaults" / "main.yml").read_text())


def test_the_role_defaults_pass_the_plan_and_match_the_program():
    assert PLAN(ROLE_DEFAULTS) == {"errors": []}
    for key in ("interval", "failures", "probe_timeout", "max_restarts", "window", "window_max_restarts", "stable_after",
                "backoff_initial", "backoff_max", "gpu_release_timeout", "node_wait_report", "readiness_timeout"):
        assert ROLE_DEFAULTS[f"supervisor_{key}"] == S.DEFAULTS[key], key


@pytest.mark.parametrize(("change", "message"), [
    ({"supervisor_stable_after": 0},
     "supervisor_stable_after = 0: must be a whole number >= 1 (seconds of healthy generations after which a "
     "restart no longer counts). Fix: e.g. supervisor_stable_after: 600."),
    ({"supervisor_backoff_initial": "1m"}, "supervisor_backoff_initial = '1m': must be a whole number >= 1"),
    ({"supervisor_max_restarts": -1}, "supervisor_max_restarts = -1: must be a whole number >= 0"),
    ({"supervisor_window_max_restarts": True}, "supervisor_window_max_restarts = true: must be a whole"),
    ({"supervisor_interval": 2.5}, "supervisor_interval = 2.5: must be a whole number >= 1"),
    ({"supervisor_backoff_initial": 120, "supervisor_backoff_max": 60},
     "supervisor_backoff_max = 60: below supervisor_backoff_initial (120); the back-off starts at the one "
     "and doubles up to the other. Fix: set supervisor_backoff_max >= 120, or lower "
     "supervisor_backoff_initial."),
    ({"supervisor_alert_command": ["curl"]}, "supervisor_alert_command = ['curl']: must be a shell command"),
    ({"supervisor_enabled": "maybe"}, "supervisor_enabled = 'maybe': must be true or false. Fix:"),
])
def test_the_plan_refuses_settings_that_cannot_work(change, message):
    [error] = PLAN({**ROLE_DEFAULTS, **change})["errors"]
    assert error.startswith(message) and "Fix:" in error, error


def test_the_plan_takes_numbers_given_as_text_and_checks_nothing_more_when_off():
    assert PLAN({**ROLE_DEFAULTS, "supervisor_stable_after": "120", "supervisor_max_restarts": 0}) == \
        {"errors": []}
    assert PLAN({**ROLE_DEFAULTS, "supervisor_enabled": "false", "supervisor_stable_after": 0}) == \
        {"errors": []}


def cli(*args: str, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([NODE_PYTHON, "-I", str(PROGRAM), *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_cli_status_pause_resume_on_a_state_directory(tmp_path):
    config = settings(tmp_path)
    state_dir = tmp_path / "state"
    res = cli("status", config=config)
    assert res.returncode == 0, res.stderr
    st = json.loads(res.stdout)
    assert st["state"] == "stopped" and st["paused"] is None and st["gave_up"] is None and st["restarts"] == []

    res = cli("pause", "--reason", "deliberate stop.yml", config=config)
    assert res.returncode == 0 and json.loads(res.stdout)["changed"] is True
    assert json.loads(cli("pause", "--reason", "x", config=config).stdout)["changed"] is False
    marker = json.loads((state_dir / "paused").read_text())
    assert marker["reason"] == "deliberate stop.yml" and marker["time"].endswith("+00:00")
    st = json.loads(cli("status", config=config).stdout)
    assert st["state"] == "paused" and st["paused"]["reason"] == "deliberate stop.yml"

    # A give-up left by the daemon, with a spent window.
    (state_dir / "gave-up.json").write_text(json.dumps({"event": "gave-up", "reason": "rank down", "time": "t"}))
    state = json.loads((state_dir / "state.json").read_text())
    state.update(state="gave-up", failures=2, restarts=["2026-09-01T00:00:00+00:00"] * 3)
    (state_dir / "state.json").write_text(json.dumps(state))
    assert json.loads(cli("status", config=config).stdout)["gave_up"] == {"reason": "rank down", "time": "t"}

    res = cli("resume", config=config)
    assert res.returncode == 0 and json.loads(res.stdout) == {"changed": True, "state": "stopped",
                                                              "cleared": ["pause", "give-up"]}
    assert json.loads(cli("resume", config=config).stdout)["changed"] is False
    assert not (state_dir / "paused").exists() and not (state_dir / "gave-up.json").exists()
    st = json.loads(cli("status", config=config).stdout)
    assert st["state"] == "stopped" and st["failures"] == 0 and st["restarts"] == []
    assert st["paused"] is None and st["gave_up"] is None
    assert [e["event"] for e in st["history"]] == ["pause", "resume"]
    for path in state_dir.iterdir():
        if path.name != ".lock":
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_cli_refuses_bad_settings_before_doing_anything(tmp_path):
    config = tmp_path / "supervisor.json"
    config.write_text(json.dumps({"model": "glm53", "state_dir": str(tmp_path / "state")}))
    res = cli("run", config=config)
    assert res.returncode == 2 and "config error" in res.stderr and "nodes must be a non-empty list" in res.stderr
    assert not (tmp_path / "state").exists()


# ---- the real runner (subprocess and urllib, on this machine) -----------------------------------

def test_the_real_runner_runs_commands_with_a_deadline():
    runner = S.Runner()
    assert runner.run(["sh", "-c", "echo out; echo err >&2; exit 3"], 10) == S.Result(3, "out\n", "err\n")
    assert runner.run(["cat"], 10, stdin='{"event": "gave-up"}').out == '{"event": "gave-up"}'
    assert runner.run(["cat"], 10).out == ""  # no stdin: not the supervisor's own
    assert runner.run(["sleep", "5"], 0.3).rc == S.TIMED_OUT
    assert runner.run(["/nonexistent/nvidia-smi"], 10).rc == 127


@pytest.fixture
def endpoint(monkeypatch):
    """A local stand-in of the head's endpoint that wants the key; a proxy in the environment is ignored."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_args):
            pass

        def answer(self, code, payload):
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 - BaseHTTPRequestHandler's naming
            if self.headers.get("Authorization") != f"Bearer {KEY}":
                self.answer(401, {"error": "Unauthorized"})
            else:
                self.answer(200, {"data": [{"id": MODEL_ID}]})

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            if body["messages"][0]["content"] == "stall":
                threading.Event().wait(2)
            self.answer(200, {"choices": [{"message": {"content": "OK"}}], "model": body["model"]})

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("http_proxy", "http://192.0.2.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://192.0.2.1:9")
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_real_runner_probes_the_endpoint(tmp_path, endpoint, monkeypatch):
    sup = S.Supervisor(S.load_config(str(settings(tmp_path, endpoint=endpoint, probe_timeout=1))), log=print)
    assert sup.models() == S.Probe(True, f"serving {MODEL_ID}", [MODEL_ID])
    assert sup.generate(MODEL_ID).ok
    monkeypatch.setattr(S, "PROBE_PROMPT", "stall")
    assert sup.generate(MODEL_ID) == S.Probe(False, "generation: no answer within 1s")
    Path(sup.cfg.key_file).write_text("wrong\n")
    assert sup.models() == S.Probe(False, "/v1/models: HTTP 401", status=401)
    Path(sup.cfg.key_file).write_text(f"{KEY}\n")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    closed = S.Supervisor(S.load_config(str(settings(tmp_path, endpoint=f"http://127.0.0.1:{free}"))), log=print)
    assert closed.generate() == S.Probe(False, "generation: connection refused (nothing listens yet)")

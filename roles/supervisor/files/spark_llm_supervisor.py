#!/usr/bin/python3
"""Group supervisor of the TP group (either engine): one rank per node, rank 0 on the head serves HTTP.

A TP group lives or dies as one: a rank alone cannot serve and holds its GPU memory, and a
frozen rank stalls every generation while /health stays green. This program runs on the head
(a systemd service) and keeps the group serving with no playbook run:

    spark_llm_supervisor.py run    --config /etc/spark-llm/supervisor.json   # the daemon loop, one log line per event
    spark_llm_supervisor.py status --config ...                           # prints the state JSON
    spark_llm_supervisor.py pause  --config ... [--reason TEXT]           # watch only, never act
    spark_llm_supervisor.py resume --config ...                           # clears pause and give-up, resets counts

status prints state.json plus "paused" (the marker, or null), "gave_up" ({reason, time}, or
null), "next_attempt_in" (seconds until a pending attempt, 0 when it is due, null when none is
pending) and "limits" (max_restarts, window_max_restarts, window, stable_after, backoff_initial,
backoff_max; null when the settings do not load). pause and resume print one JSON object with
"changed" (false when already paused, or nothing to clear or reset) and "state"; pause adds
"paused" (the marker), resume "cleared".
Exit status: 0, 2 for unusable settings, 1 for a file that cannot be written.

Every `interval` seconds it reads every rank's unit (the head's locally, the workers' over
SSH) and asks the endpoint for a one-token generation. It restarts the WHOLE group, in the
server role's order (stop all, head first; wait for each GPU to hold no process; reset the
start limits; start the workers, then the head; wait until /v1/models lists the model):
  - after `failures` failed generations in a row while every rank is active (a hang);
  - at once when a rank is down while another runs (a rank alone cannot serve);
  - when every rank is down (boot: the rank units are not enabled when this runs; or both died).
A node that does not answer stops the group (no half group holding memory) and is waited for,
however long; the group restarts when every node answers again.

Bounded by failures, not by incidents: a group restart followed by `stable_after` seconds of
healthy generations is a recovery and no longer counts. `streak` counts the restarts since the
group last served that long (the current one included until it does); the first restart of a
streak is made at once, each further one waits a back-off from the moment the failure is seen
(`backoff_initial`, doubling, at most `backoff_max`), with every rank stopped meanwhile. It gives
up when a restart would be needed with `max_restarts` restarts in a row behind it that did not
reach stable service (a crash loop: the group dies soon after each start, or never serves), and
only then: a restart that reached stable service healed its incident, and no number of healed
incidents is a reason to leave the group down. When `window_max_restarts` group restarts (of any
cause, a boot's start included) lie within `window` seconds (a slow loop, or a bad day), it keeps
restarting and says so loudly: one log line "spark-llm-supervisor: FLAPPING ...", a "flapping"
event, `alert_command` run with a JSON summary ("event": "flapping") on stdin; once per window. Giving up:
every rank stopped, gave-up.json written, one log line "spark-llm-supervisor: GAVE UP ...",
`alert_command` run with the JSON summary on stdin; then nothing until `resume`. The streak, the
back-off and the next attempt's time live in state.json on disk, so neither a restart of the
supervisor nor a reboot of the head resets them (a crash loop stays one).

Files in state_dir (all written atomically, 0600; on disk: a state_dir on tmpfs is reported at start):
  state.json    {"state", "since", "restarts" (within the window), "streak", "backoff", "next_attempt",
                 "healthy_since", "failures", "last_reason", "waiting_for", "history", ...}
  paused        marker: {"reason", "time"}
  gave-up.json  {"reason", "time", "restarts", "journal": {node: [last 30 lines]}, ...}

The API key is the content of key_file (the rank's 0600 key file), read at each probe and sent only
as an HTTP header: never logged, never on a command line. Standard library only (Python >= 3.11).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import http.client
import json
import math
import os
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

PREFIX = "spark-llm-supervisor:"
STATES = ("healthy", "probing-failed", "restarting", "waiting-for-node", "stopped", "paused", "gave-up")
HISTORY = 50
JOURNAL_LINES = 30
# A read (unit state, nvidia-smi, journal) beyond the SSH connect timeout.
READ_TIMEOUT = 30
# systemctl stop/start wait for the unit's own timeouts (TimeoutStopSec, ExecStartPre); this
# only keeps a wedged client from blocking the loop forever.
ACTION_TIMEOUT = 900
ALERT_TIMEOUT = 60
GPU_POLL = 2
READY_POLL = 5
# How often the idle loop looks at the pause and give-up markers, so that pause/resume take
# effect within a second instead of an interval.
MARKER_POLL = 1
# ssh exits 255 when it could not reach (or authenticate to) the node; the runner reports 124
# for a command that outlived its deadline.
SSH_FAILED = 255
TIMED_OUT = 124
PROBE_PROMPT = "Reply with one word: OK"

DEFAULTS = {
    "unit": "spark-llm.service",
    "endpoint": "http://127.0.0.1:30000",
    "model": "",
    "key_file": "",
    "tls_ca": None,
    "interval": 30,
    "failures": 3,
    "probe_timeout": 20,
    "max_restarts": 3,
    "window": 21600,
    "window_max_restarts": 20,
    "stable_after": 600,
    "backoff_initial": 60,
    "backoff_max": 900,
    "readiness_timeout": 3600,
    "gpu_release_timeout": 180,
    "node_wait_report": 600,
    "alert_command": "",
    "state_dir": "/var/lib/spark-llm-supervisor",
}
SSH_DEFAULTS = {"user": "root", "key": None, "known_hosts": None, "connect_timeout": 5}
POSITIVE = ("interval", "failures", "probe_timeout", "window", "readiness_timeout", "gpu_release_timeout",
            "node_wait_report", "stable_after", "backoff_initial", "backoff_max")
# What status shows beside the state: the rule's figures as the daemon reads them.
LIMITS = ("max_restarts", "window_max_restarts", "window", "stable_after", "backoff_initial", "backoff_max")
# Filesystems whose content a reboot loses: the state must not live there.
VOLATILE_FS = ("tmpfs", "ramfs")


class ConfigError(Exception):
    pass


class Terminated(Exception):
    """SIGTERM: leave the loop at once, the ranks as they are."""


class Paused(Exception):
    """The operator paused the supervisor while it was about to act."""


class AttemptFailed(Exception):
    """One group restart attempt failed (the reason is the message)."""


# ---- configuration ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Node:
    name: str
    address: str
    local: bool = False


@dataclass(frozen=True)
class Config:
    path: str
    unit: str
    nodes: tuple[Node, ...]
    ssh_user: str
    ssh_key: str | None
    ssh_known_hosts: str | None
    connect_timeout: float
    endpoint: str
    model: str
    key_file: str
    tls_ca: str | None
    interval: float
    failures: int
    probe_timeout: float
    max_restarts: int
    window: float
    readiness_timeout: float
    gpu_release_timeout: float
    node_wait_report: float
    alert_command: str
    state_dir: str
    window_max_restarts: int = 20
    stable_after: float = 600
    backoff_initial: float = 60
    backoff_max: float = 900
    unknown_keys: tuple[str, ...] = ()

    @property
    def head(self) -> Node:
        return self.nodes[0]


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            raw = json.load(f)
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror or err}") from err
    except ValueError as err:
        raise ConfigError(f"{path}: not JSON ({err})") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the settings must be a JSON object")
    return raw


def state_dir_of(path: str) -> str:
    """Only the state directory: enough for status, pause and resume even if the rest is wrong."""
    value = _read_json(path).get("state_dir", DEFAULTS["state_dir"])
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{path}: state_dir must be a directory path, not {value!r}")
    return value


def _number(raw: dict, key: str, minimum: float) -> float:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ConfigError(f"{key} must be a number >= {minimum}, not {value!r}")
    return value


def _count(raw: dict, key: str, minimum: int) -> int:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key} must be a whole number >= {minimum}, not {value!r}")
    return value


def load_config(path: str) -> Config:
    raw = _read_json(path)
    merged = {**DEFAULTS, **raw}
    ssh = {**SSH_DEFAULTS, **(raw.get("ssh") or {})}
    nodes_raw = raw.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ConfigError(f"{path}: nodes must be a non-empty list in rank order, the head first")
    nodes = []
    for i, n in enumerate(nodes_raw):
        if not isinstance(n, dict) or not isinstance(n.get("name"), str) or not n["name"]:
            raise ConfigError(f"{path}: nodes[{i}] needs a name")
        if not n.get("local") and (not isinstance(n.get("address"), str) or not n["address"]):
            raise ConfigError(f"{path}: nodes[{i}] ({n['name']}) needs an address")
        nodes.append(Node(n["name"], str(n.get("address") or ""), bool(n.get("local", False))))
    if len({n.name for n in nodes}) != len(nodes):
        raise ConfigError(f"{path}: node names repeat: {[n.name for n in nodes]}")
    if not nodes[0].local:
        raise ConfigError(f"{path}: the head ({nodes[0].name}, rank 0) must be the local node: the supervisor runs on it")
    for key in POSITIVE:
        _number(merged, key, 1)
    _count(merged, "max_restarts", 0)
    _count(merged, "window_max_restarts", 0)
    if merged["backoff_max"] < merged["backoff_initial"]:
        raise ConfigError(f"{path}: backoff_max ({merged['backoff_max']!r}) is below backoff_initial "
                          f"({merged['backoff_initial']!r}): the back-off starts at the one and is capped at the other")
    _number(ssh, "connect_timeout", 1)
    for key in ("unit", "endpoint", "model"):
        if not isinstance(merged[key], str) or not merged[key]:
            raise ConfigError(f"{path}: {key} must be a non-empty string, not {merged[key]!r}")
    if not merged["endpoint"].startswith(("http://", "https://")):
        raise ConfigError(f"{path}: endpoint must be an http:// or https:// URL, not {merged['endpoint']!r}")
    if not isinstance(merged["alert_command"] or "", str):
        raise ConfigError(f"{path}: alert_command must be a shell command string")
    return Config(
        path=path, unit=merged["unit"], nodes=tuple(nodes),
        ssh_user=str(ssh["user"]), ssh_key=ssh["key"] or None, ssh_known_hosts=ssh["known_hosts"] or None,
        connect_timeout=ssh["connect_timeout"],
        endpoint=merged["endpoint"].rstrip("/"), model=merged["model"], key_file=merged["key_file"] or "",
        tls_ca=merged["tls_ca"] or None,
        interval=merged["interval"], failures=int(merged["failures"]), probe_timeout=merged["probe_timeout"],
        max_restarts=int(merged["max_restarts"]), window=merged["window"],
        readiness_timeout=merged["readiness_timeout"], gpu_release_timeout=merged["gpu_release_timeout"],
        node_wait_report=merged["node_wait_report"], alert_command=merged["alert_command"] or "",
        state_dir=merged["state_dir"], window_max_restarts=merged["window_max_restarts"],
        stable_after=merged["stable_after"], backoff_initial=merged["backoff_initial"],
        backoff_max=merged["backoff_max"],
        unknown_keys=tuple(sorted(set(raw) - set(DEFAULTS) - {"nodes", "ssh"})),
    )


# ---- effects: commands, HTTP, time (injectable) -----------------------------------------------

@dataclass
class Result:
    rc: int
    out: str = ""
    err: str = ""
    unreachable: bool = False

    def brief(self) -> str:
        lines = [line.strip() for line in (self.err + "\n" + self.out).splitlines() if line.strip()]
        return lines[-1][:300] if lines else f"exit status {self.rc}"


class Runner:
    """Every effect on the world: commands (with a deadline) and HTTP requests."""

    def run(self, argv: list[str], timeout: float, stdin: str | None = None) -> Result:
        io = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **io)
        except subprocess.TimeoutExpired:
            return Result(TIMED_OUT, "", f"{argv[0]}: no result within {timeout:.0f}s")
        except OSError as err:
            return Result(127, "", f"{argv[0]}: {err.strerror or err}")
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def http(self, method: str, url: str, *, headers: dict, body: bytes | None, timeout: float,
             cafile: str | None = None) -> tuple[int, bytes]:
        """(status, body); OSError when no HTTP answer came (refused, reset, timed out)."""
        # The endpoint is the head's own: a proxy from the environment must not be asked.
        handlers: list = [urllib.request.ProxyHandler({})]
        if url.startswith("https:"):
            handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=cafile)))
        opener = urllib.request.build_opener(*handlers)
        request = urllib.request.Request(url, data=body, headers=headers, method=method)  # noqa: S310 - http(s) only, checked
        try:
            with opener.open(request, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read() if err.fp else b""
        except http.client.HTTPException as err:
            raise OSError(f"broken HTTP answer: {err!r}") from err


class Clock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat(timespec="seconds")


def from_iso(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except (TypeError, ValueError):
        return None


def one_line(text: str, limit: int = 600) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# ---- state files ------------------------------------------------------------------------------

def write_json_atomic(path: str, obj) -> None:
    """A crash at any point leaves either the old file or the new one, never a torn one."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def fresh_state(now: float) -> dict:
    # "" rather than null for an absent time: Store.load keeps a value only when it has the default's type.
    return {"state": "stopped", "since": iso(now), "restarts": [], "failures": 0,
            "streak": 0, "backoff": 0, "next_attempt": "", "healthy_since": "",
            "last_reason": "no check has run yet", "waiting_for": [], "history": []}


def backoff_for(cfg: Config, streak: int) -> float:
    """The wait before the next attempt once `streak` restarts in a row have not reached stable
    service: none for the first restart of a streak, then backoff_initial doubling, capped."""
    if streak <= 0:
        return 0
    return min(cfg.backoff_initial * 2 ** min(streak - 1, 62), cfg.backoff_max)


def filesystem_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The type of the filesystem holding path (the longest mount point that contains it), "" when unknown."""
    path = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open(mountinfo) as f:
            for line in f:
                fields = line.split()
                if " - " not in line or len(fields) < 5:
                    continue
                point = fields[4].replace("\\040", " ")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, line.split(" - ", 1)[1].split()[0]
    except OSError:
        return ""
    return kind


class Store:
    """state.json (read-modify-write under a lock, so the CLI and the daemon never lose each
    other's changes), the pause marker and the give-up marker."""

    def __init__(self, state_dir: str, clock):
        self.dir = state_dir
        self.clock = clock
        self.state_path = os.path.join(state_dir, "state.json")
        self.pause_path = os.path.join(state_dir, "paused")
        self.gave_up_path = os.path.join(state_dir, "gave-up.json")
        self.lock_path = os.path.join(state_dir, ".lock")

    def ensure(self) -> None:
        os.makedirs(self.dir, mode=0o700, exist_ok=True)

    def load(self) -> dict:
        now = self.clock.time()
        try:
            with open(self.state_path) as f:
                st = json.load(f)
            if not isinstance(st, dict):
                raise ValueError("not an object")
        except FileNotFoundError:
            return fresh_state(now)
        except (OSError, ValueError) as err:
            st = fresh_state(now)
            st["last_reason"] = f"state.json was unreadable ({one_line(err, 200)}); started afresh"
            return st
        base = fresh_state(now)
        for key, value in base.items():
            if not isinstance(st.get(key), type(value)):
                st[key] = value
        return st

    @contextlib.contextmanager
    def update(self):
        self.ensure()
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            st = self.load()
            yield st
            write_json_atomic(self.state_path, st)
        finally:
            os.close(fd)

    def _marker(self, path: str) -> dict | None:
        try:
            with open(path) as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {"reason": str(data)}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            # Its existence is what counts (an operator may `touch` it).
            return {"reason": "(marker unreadable)"}

    def paused(self) -> dict | None:
        return self._marker(self.pause_path)

    def gave_up(self) -> dict | None:
        return self._marker(self.gave_up_path)

    def markers(self) -> tuple[bool, bool]:
        return os.path.exists(self.pause_path), os.path.exists(self.gave_up_path)


def add_event(st: dict, now: float, event: str, reason: str, **extra) -> dict:
    entry = {"time": iso(now), "event": event, "reason": reason, **extra}
    st["history"] = [*st.get("history", []), entry][-HISTORY:]
    return entry


# ---- what a rank's unit says ------------------------------------------------------------------

@dataclass
class Rank:
    name: str
    active_state: str = "unknown"
    sub_state: str = ""
    result: str = ""
    enter: str = ""  # ActiveEnterTimestampMonotonic (µs), comparable with the head's monotonic clock
    unreachable: bool = False
    detail: str = ""

    @property
    def active(self) -> bool:
        return self.active_state == "active"

    @property
    def alive(self) -> bool:
        # Starting counts as alive (a start in progress); waiting to restart after a crash does not.
        return self.active or (self.active_state == "activating" and self.sub_state != "auto-restart")

    def describe(self) -> str:
        if self.unreachable:
            return "unreachable"
        text = f"{self.active_state}/{self.sub_state}" if self.sub_state else self.active_state
        if self.result and self.result != "success":
            text += f" (Result={self.result})"
        return text


def parse_show(name: str, res: Result) -> Rank:
    props = dict(line.split("=", 1) for line in res.out.splitlines() if "=" in line)
    if res.rc != 0 or "ActiveState" not in props:
        return Rank(name, detail=res.brief())
    return Rank(name, props["ActiveState"], props.get("SubState", ""), props.get("Result", ""),
                props.get("ActiveEnterTimestampMonotonic", ""))


# ---- the supervisor ---------------------------------------------------------------------------

@dataclass
class Probe:
    ok: bool
    detail: str
    models: list = field(default_factory=list)
    status: int = 0  # the HTTP status, 0 when no HTTP answer came


class Supervisor:
    def __init__(self, cfg: Config, runner=None, clock=None, log=None):
        self.cfg = cfg
        self.runner = runner or Runner()
        self.clock = clock or Clock()
        self._log = log or (lambda line: print(line, flush=True))
        self.store = Store(cfg.state_dir, self.clock)
        self.stopping = False
        self._secret = ""
        # What the last readiness wait learned: the served model's id and the head's start time.
        self._served_model = ""
        self._head_enter = ""
        # "paused" or "gave-up" while this process holds off, so the journal shows each change once.
        self._held = ""

    # -- plumbing --

    def log(self, line: str) -> None:
        self._log(self.redact(line))

    def redact(self, text: str) -> str:
        return text.replace(self._secret, "<redacted>") if self._secret else text

    def api_key(self) -> str:
        """Read at each use: a key rotated by a deployment is picked up without a restart."""
        key = ""
        if self.cfg.key_file:
            try:
                with open(self.cfg.key_file) as f:
                    key = f.read().strip()
            except OSError:
                key = ""
        if key:
            self._secret = key
        return key

    def note(self, st: dict, state: str, reason: str, event: str | None = None, quiet: bool = False, **extra) -> None:
        """Set the state (since changes only with it); an event goes to history and, unless quiet, the log."""
        now = self.clock.time()
        reason = self.redact(one_line(reason))
        if st.get("state") != state:
            st["since"] = iso(now)
        st["state"] = state
        st["last_reason"] = reason
        if state != "waiting-for-node":
            st["waiting_for"] = []
            st.pop("waiting_since", None)
            st.pop("waited_seconds", None)
            st.pop("waiting_reported", None)
        if event:
            add_event(st, now, event, reason, **extra)
            if not quiet:
                self.log(f"{PREFIX} {event}: {reason}")

    def guard(self) -> None:
        if self.stopping:
            raise Terminated
        if self.store.paused() is not None:
            raise Paused

    def sleep(self, seconds: float) -> None:
        """Sleep in short steps: SIGTERM and a pause take effect within a second."""
        end = self.clock.monotonic() + seconds
        while (left := end - self.clock.monotonic()) > 0:
            self.guard()
            self.clock.sleep(min(MARKER_POLL, left))
        self.guard()

    def node_cmd(self, node: Node, argv: list[str], timeout: float) -> Result:
        if node.local:
            return self.runner.run(argv, timeout)
        ssh = ["ssh", "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
               "-o", f"ConnectTimeout={int(self.cfg.connect_timeout)}"]
        if self.cfg.ssh_key:
            ssh += ["-i", self.cfg.ssh_key, "-o", "IdentitiesOnly=yes"]
        if self.cfg.ssh_known_hosts:
            ssh += ["-o", f"UserKnownHostsFile={self.cfg.ssh_known_hosts}"]
        ssh += [f"{self.cfg.ssh_user}@{node.address}", "--", shlex.join(argv)]
        res = self.runner.run(ssh, timeout + self.cfg.connect_timeout)
        res.unreachable = res.rc in (SSH_FAILED, TIMED_OUT)
        return res

    def read_ranks(self) -> dict[str, Rank]:
        ranks = {}
        for node in self.cfg.nodes:
            res = self.node_cmd(node, ["systemctl", "show", "-p", "ActiveState,SubState,Result,ActiveEnterTimestampMonotonic",
                                       self.cfg.unit], READ_TIMEOUT)
            ranks[node.name] = Rank(node.name, unreachable=True, detail=res.brief()) if res.unreachable \
                else parse_show(node.name, res)
        return ranks

    # -- HTTP probes --

    def _request(self, method: str, path: str, body: dict | None, timeout: float) -> tuple[int, bytes]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        key = self.api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode() if body is not None else None
        return self.runner.http(method, self.cfg.endpoint + path, headers=headers, body=data, timeout=timeout,
                                cafile=self.cfg.tls_ca)

    def _http_error(self, err: Exception, timeout: float) -> str:
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        if isinstance(reason, TimeoutError):
            return f"no answer within {timeout:.0f}s"
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused (nothing listens yet)"
        return self.redact(one_line(reason, 200))

    def generate(self, model: str = "") -> Probe:
        """One real one-token generation: the only check that needs every rank to compute.

        `model` is the id /v1/models lists (a server with strict model names refuses another)."""
        model = model or self.cfg.model
        body = {"model": model, "messages": [{"role": "user", "content": PROBE_PROMPT}], "max_tokens": 1,
                "temperature": 0, "stream": False}
        timeout = self.cfg.probe_timeout
        t0 = self.clock.monotonic()
        try:
            status, data = self._request("POST", "/v1/chat/completions", body, timeout)
        except (OSError, ValueError) as err:
            return Probe(False, f"generation: {self._http_error(err, timeout)}")
        took = self.clock.monotonic() - t0
        if status != 200:
            return Probe(False, f"generation: HTTP {status}: {self.redact(one_line(data.decode(errors='replace'), 200))}",
                         status=status)
        try:
            choices = json.loads(data)["choices"]
            if not isinstance(choices, list) or not choices:
                raise ValueError("no choices")
        except (ValueError, KeyError, TypeError) as err:
            return Probe(False, f"generation: not a chat completion ({one_line(err, 100)})")
        if took > timeout:
            return Probe(False, f"generation: answered after {took:.0f}s, beyond the {timeout:.0f}s deadline")
        return Probe(True, f"one token in {took:.1f}s")

    def model_matches(self, served: str) -> bool:
        want = self.cfg.model
        return served == want or os.path.basename(served.rstrip("/")) == os.path.basename(want.rstrip("/"))

    def models(self) -> Probe:
        """Readiness: /v1/models lists the model (full id or basename)."""
        timeout = min(self.cfg.probe_timeout, 10)
        try:
            status, data = self._request("GET", "/v1/models", None, timeout)
        except (OSError, ValueError) as err:
            return Probe(False, f"/v1/models: {self._http_error(err, timeout)}")
        if status != 200:
            return Probe(False, f"/v1/models: HTTP {status}", status=status)
        try:
            served = [str(m.get("id")) for m in json.loads(data).get("data", []) if isinstance(m, dict)]
        except (ValueError, AttributeError, TypeError):
            return Probe(False, "/v1/models: not a model list")
        matching = [m for m in served if self.model_matches(m)]
        if matching:
            return Probe(True, f"serving {matching[0]}", matching)
        return Probe(False, f"/v1/models lists {served}, not {self.cfg.model}")

    # -- the loop --

    def announce(self) -> None:
        """What a (re)started supervisor says first: its rule, and the streak it resumes from disk."""
        self.store.ensure()
        nodes = ", ".join(f"{n.name}{' (local)' if n.local else ''}" for n in self.cfg.nodes)
        cfg = self.cfg
        self.log(f"{PREFIX} start: watching {cfg.unit} on {nodes} every {cfg.interval:g}s "
                 f"(restart after {cfg.failures} failed generations; give up after {cfg.max_restarts} group "
                 f"restarts in a row that do not serve {cfg.stable_after:g}s, backing off {cfg.backoff_initial:g}s "
                 f"doubling to {cfg.backoff_max:g}s between them; never for restarts that healed: an alert at "
                 f"{cfg.window_max_restarts} group restarts within {cfg.window:g}s)")
        if self.cfg.unknown_keys:
            self.log(f"{PREFIX} config: ignoring unknown settings {list(self.cfg.unknown_keys)}")
        kind = filesystem_type(self.cfg.state_dir)
        if kind in VOLATILE_FS:
            self.log(f"{PREFIX} warning: state_dir {self.cfg.state_dir} is on {kind}: the failing streak, the "
                     "back-off and a give-up would not survive a reboot of the head; keep it on disk (/var/lib)")
        resumed = self.store.load()
        if resumed["streak"] or resumed["next_attempt"]:
            self.log(f"{PREFIX} resumed-state: failing streak {resumed['streak']}/{cfg.max_restarts}, back-off "
                     f"{resumed['backoff']:g}s, next attempt {resumed['next_attempt'] or 'at once when needed'} "
                     f"(from {self.store.state_path})")

    def run(self) -> int:
        self.announce()
        while not self.stopping:
            try:
                self.tick()
                self.idle(self.next_wait())
            except Terminated:
                break
            except Exception as err:  # noqa: BLE001 - a bug in one check must not end the watch
                self.log(f"{PREFIX} error: {one_line(repr(err), 400)}")
                try:
                    self.idle(self.cfg.interval)
                except Terminated:
                    break
        self.log(f"{PREFIX} exit: stopped by SIGTERM; the ranks are left as they are")
        return 0

    def next_wait(self) -> float:
        """The interval, or less when a backed-off attempt falls due before the next check."""
        due = from_iso(self.store.load().get("next_attempt") or "")
        now = self.clock.time()
        if due is not None and now < due:
            return min(self.cfg.interval, due - now)
        return self.cfg.interval

    def idle(self, seconds: float) -> None:
        """Wait for the next check; a pause or resume (a marker that changes) ends the wait early."""
        seen = self.store.markers()
        end = self.clock.monotonic() + seconds
        while (left := end - self.clock.monotonic()) > 0:
            if self.stopping:
                raise Terminated
            self.clock.sleep(min(MARKER_POLL, left))
            if self.store.markers() != seen:
                return
        if self.stopping:
            raise Terminated

    def tick(self) -> None:
        """One check, and whatever it calls for."""
        if self.stopping:
            raise Terminated
        now = self.clock.time()
        gave_up = self.store.gave_up()
        if gave_up is not None:
            # Nothing until `resume`: not even a read.
            with self.store.update() as st:
                if st["state"] != "gave-up":
                    self.note(st, "gave-up", str(gave_up.get("reason", "gave up")))
                st["checked"] = iso(now)
            if self._held != "gave-up":
                self.log(f"{PREFIX} held: gave up at {gave_up.get('time', '?')} ({one_line(gave_up.get('reason', '?'), 300)}); "
                         "nothing is done until `resume`")
                self._held = "gave-up"
            return
        try:
            if self.store.paused() is not None:
                raise Paused
            if self._held:
                self.log(f"{PREFIX} resumed: no longer {self._held}; watching and acting again")
                self._held = ""
            ranks = self.read_ranks()
            self.check(ranks)
        except Paused:
            self.record_paused()

    def record_paused(self, event: str = "paused", extra: str = "") -> None:
        ranks = self.read_ranks()  # watch only
        marker = self.store.paused() or {}
        with self.store.update() as st:
            st["ranks"] = {name: r.describe() for name, r in ranks.items()}
            st["checked"] = iso(self.clock.time())
            reason = f"paused by the operator: {marker.get('reason', 'no reason given')}{extra}"
            if st["state"] != "paused" or extra:
                self.note(st, "paused", reason, event=event)
            elif self._held != "paused":
                self.log(f"{PREFIX} paused: {self.redact(one_line(reason))}; watching only")
        self._held = "paused"

    def check(self, ranks: dict[str, Rank]) -> None:
        names = [n.name for n in self.cfg.nodes]
        with self.store.update() as st:
            st["ranks"] = {name: r.describe() for name, r in ranks.items()}
            st["checked"] = iso(self.clock.time())
            previous = dict(st)
        unreachable = [n for n in names if ranks[n].unreachable]
        if unreachable:
            self.wait_for_nodes(ranks, unreachable, previous)
            return
        if previous["state"] == "waiting-for-node":
            waited = self.clock.time() - (from_iso(previous.get("waiting_since", "")) or self.clock.time())
            back = ", ".join(previous.get("waiting_for") or []) or "every node"
            reason = f"{back} answers again after {waited:.0f}s unreachable"
            with self.store.update() as st:
                add_event(st, self.clock.time(), "node-back", reason)
            self.log(f"{PREFIX} node-back: {reason}; restarting the group")
            self.incident(reason, ranks)
            return
        alive = [n for n in names if ranks[n].alive]
        down = [n for n in names if not ranks[n].alive]
        if not alive:
            states = ", ".join(f"{n} {ranks[n].describe()}" for n in names)
            self.incident(f"every rank is down ({states}): boot, or the whole group died", ranks)
            return
        if down:
            states = ", ".join(f"{n} {ranks[n].describe()}" for n in down)
            self.incident(f"rank down while {', '.join(alive)} runs alone: {states}", ranks)
            return
        served_model = previous.get("served_model") or ""
        if not served_model:
            listed = self.models()  # once, then kept in the state: a healthy check stays one request
            served_model = listed.models[0] if listed.ok else ""
        probe = self.generate(served_model)
        head = ranks[self.cfg.head.name]
        if probe.ok:
            with self.store.update() as st:
                st["failures"] = 0
                st["served_model"] = served_model
                st["served_enter"] = head.enter
                st.pop("starting", None)
                st["next_attempt"] = ""  # serving (an operator's restart meanwhile): no attempt is pending
                if st["state"] != "healthy":
                    self.note(st, "healthy", f"serving: {probe.detail}", event="healthy")
                else:
                    st["last_reason"] = f"serving: {probe.detail}"
                self.count_stable(st)
            return
        starting = self.still_starting(head, previous)
        if starting:
            with self.store.update() as st:
                first = not st.get("starting")
                st["starting"] = True
                # Stable service is healthy generations without a break: anything else starts it over.
                st["healthy_since"] = ""
                self.note(st, "probing-failed", f"{starting}; {probe.detail}", event="starting" if first else None)
            return
        with self.store.update() as st:
            st.pop("starting", None)
            st["healthy_since"] = ""
            if probe.status in (400, 404):
                st.pop("served_model", None)  # a refused model name: ask /v1/models again next time
            st["failures"] = failures = int(st.get("failures", 0)) + 1
            reason = f"{failures}/{self.cfg.failures} while every rank is active: {probe.detail}"
            if failures < self.cfg.failures:
                self.note(st, "probing-failed", reason, event="probe-failed", failures=failures)
                return
            add_event(st, self.clock.time(), "probe-failed", reason, failures=failures)
        self.log(f"{PREFIX} probe-failed: {self.redact(reason)}")
        self.incident(f"{failures} generations failed in a row while every rank is active (hung or frozen rank): "
                      f"{probe.detail}", ranks)

    def still_starting(self, head: Rank, st: dict) -> str | None:
        """A group that has not served since its head started, within readiness_timeout, is loading,
        not hung (a supervisor restarted during a start-up, or a deployment it did not pause for):
        its failed generations do not count. A group that served once in this life always counts."""
        if head.active_state == "activating":
            return "the head's unit is still starting"
        try:
            entered = int(head.enter) / 1e6
        except ValueError:
            return None
        if not entered or st.get("served_enter") == head.enter:
            return None
        age = self.clock.monotonic() - entered
        if not 0 <= age < self.cfg.readiness_timeout:
            return None
        listed = self.models()
        if listed.ok:
            return None  # it is ready: a generation that fails now is a real failure
        return f"the group started {age:.0f}s ago and does not serve yet ({listed.detail})"

    # -- a node that does not answer --

    def wait_for_nodes(self, ranks: dict[str, Rank], unreachable: list[str], previous: dict) -> None:
        stopped = []
        for node in self.cfg.nodes:  # the head first
            rank = ranks[node.name]
            if rank.unreachable or rank.active_state in ("inactive", "failed"):
                continue
            self.guard()
            res = self.node_cmd(node, ["systemctl", "stop", self.cfg.unit], ACTION_TIMEOUT)
            stopped.append(node.name if res.rc == 0 else f"{node.name} (stop failed: {res.brief()})")
        now = self.clock.time()
        detail = "; ".join(f"{n}: {ranks[n].detail}" for n in unreachable if ranks[n].detail)
        with self.store.update() as st:
            if previous["state"] != "waiting-for-node":
                reason = (f"{', '.join(unreachable)} unreachable ({detail}): the group cannot form; "
                          f"{'stopped ' + ', '.join(stopped) if stopped else 'no rank runs'}; waiting for it")
                self.note(st, "waiting-for-node", reason, event="waiting-for-node", nodes=unreachable)
                st["waiting_since"] = st["waiting_reported"] = iso(now)
            else:
                since = from_iso(st.get("waiting_since", "")) or now
                reported = from_iso(st.get("waiting_reported", "")) or since
                if stopped:
                    add_event(st, now, "stopped", f"stopped {', '.join(stopped)} while waiting for {', '.join(unreachable)}")
                    self.log(f"{PREFIX} stopped: {', '.join(stopped)} while waiting for {', '.join(unreachable)}")
                if sorted(unreachable) != sorted(st.get("waiting_for") or []):
                    self.note(st, "waiting-for-node", f"now waiting for {', '.join(unreachable)} ({detail})",
                              event="waiting-for-node", nodes=unreachable)
                    st["waiting_since"] = iso(since)
                    st["waiting_reported"] = iso(reported)
                if now - reported >= self.cfg.node_wait_report:
                    add_event(st, now, "still-waiting", f"{', '.join(unreachable)} unreachable for {now - since:.0f}s")
                    self.log(f"{PREFIX} still-waiting: {', '.join(unreachable)} unreachable for {now - since:.0f}s")
                    st["waiting_reported"] = iso(now)
            st["waiting_for"] = unreachable
            st["healthy_since"] = ""
            st["waited_seconds"] = int(now - (from_iso(st["waiting_since"]) or now))
            st["failures"] = 0

    # -- restarts --

    def incident(self, reason: str, ranks: dict[str, Rank] | None = None) -> None:
        """The group needs a restart: make it now, hold it off (back-off), or give up.

        Gives up when max_restarts restarts in a row have not reached stable service (a crash
        loop), never for restarts that did (restart() alerts when they come often). Otherwise the
        first restart of a streak is made at once; a further one waits its back-off, counted from
        the moment this failure is seen, with every rank stopped meanwhile."""
        now = self.clock.time()
        cfg = self.cfg
        with self.store.update() as st:
            st["restarts"] = within_window(st["restarts"], now, cfg.window)
            st["healthy_since"] = ""
            streak = st["streak"]
            verdict, why = "restart", ""
            if streak >= cfg.max_restarts:
                verdict = "give-up"
                why = (f"{reason}; {streak} group restart(s) in a row did not reach stable service ({cfg.stable_after:g}s "
                       f"of healthy generations) (limit {cfg.max_restarts}): a crash loop")
            elif streak > 0:
                due = from_iso(st["next_attempt"])
                if due is None:
                    due = self.back_off(st, now, reason)
                if now < due:
                    verdict = "hold"
                    st["last_reason"] = self.redact(one_line(
                        f"backing off: attempt {streak + 1}/{cfg.max_restarts} in {due - now:.0f}s "
                        f"(at {st['next_attempt']}): {reason}"))
        if verdict == "give-up":
            self.give_up(why)
        elif verdict == "hold":
            self.stop_running(ranks or {}, "while backing off")
        else:
            self.restart(reason)

    def back_off(self, st: dict, now: float, reason: str) -> float:
        """Schedule the streak's next attempt (st["streak"] restarts in a row have not reached stable
        service); returns its time. Whole seconds, so that the time written is the time kept."""
        wait = backoff_for(self.cfg, st["streak"])
        due = float(math.ceil(now + wait))
        st["backoff"] = wait
        st["next_attempt"] = iso(due)
        self.note(st, "stopped", f"failing streak {st['streak']}/{self.cfg.max_restarts}: attempt {st['streak'] + 1} "
                  f"waits a back-off of {wait:g}s, until {iso(due)}: {reason}", event="backing-off",
                  streak=st["streak"], backoff=wait, next_attempt=iso(due))
        return due

    def stop_running(self, ranks: dict[str, Rank], why: str) -> None:
        """No half group holds memory while nothing serves: stop every rank that still runs, the head first."""
        stopped = []
        for node in self.cfg.nodes:
            rank = ranks.get(node.name)
            if rank is None or rank.unreachable or rank.active_state in ("inactive", "failed"):
                continue
            self.guard()
            res = self.node_cmd(node, ["systemctl", "stop", self.cfg.unit], ACTION_TIMEOUT)
            stopped.append(node.name if res.rc == 0 else f"{node.name} (stop failed: {res.brief()})")
        if stopped:
            with self.store.update() as st:
                add_event(st, self.clock.time(), "stopped", f"stopped {', '.join(stopped)} {why}")
            self.log(f"{PREFIX} stopped: {', '.join(stopped)} {why}")

    def count_stable(self, st: dict) -> None:
        """A healthy check: once the group has served stable_after seconds without a break, the
        restarts behind it were a recovery and the failing streak is over."""
        now = self.clock.time()
        if not st["healthy_since"]:
            st["healthy_since"] = iso(now)
        served = now - (from_iso(st["healthy_since"]) or now)
        if st["streak"] and served >= self.cfg.stable_after:
            was = st["streak"]
            st["streak"], st["backoff"], st["next_attempt"] = 0, 0, ""
            reason = (f"serving for {served:.0f}s since {st['healthy_since']}: the restart recovered, the failing "
                      f"streak ({was}) is reset")
            add_event(st, now, "stable", reason, streak=was)
            self.log(f"{PREFIX} stable: {reason}")

    def restart(self, reason: str) -> None:
        now = self.clock.time()
        cfg = self.cfg
        with self.store.update() as st:
            st["restarts"] = [*st["restarts"], iso(now)]
            st["failures"] = 0
            st.pop("starting", None)
            # Counted as failing until it has served stable_after seconds (count_stable).
            st["streak"] = attempt = st["streak"] + 1
            st["backoff"] = backoff_for(cfg, attempt)
            st["next_attempt"] = st["healthy_since"] = ""
            self.note(st, "restarting", f"attempt {attempt}/{cfg.max_restarts} in a row ({len(st['restarts'])}/"
                      f"{cfg.window_max_restarts} within {cfg.window:g}s): {reason}",
                      event="restart", attempt=attempt)
            flapping = self.flapping_due(st, now)
        if flapping:
            self.flapping(flapping, attempt, reason)
        try:
            try:
                took = self.ordered_restart()
            except AttemptFailed as failed:
                failure = self.redact(str(failed))
                self.log(f"{PREFIX} restart-failed: {failure}; stopping every rank")
                self.guard()  # paused meanwhile: the operator has the ranks now
                stopped = self.stop_all()
                with self.store.update() as st:
                    ranks = ", ".join(f"{name} {what}" for name, what in stopped.items())
                    self.note(st, "stopped", f"restart failed: {failure}; ranks: {ranks}", event="restart-failed",
                              quiet=True, attempt=attempt)
                    complete = st["streak"] >= cfg.max_restarts
                    if not complete:
                        self.back_off(st, self.clock.time(), f"attempt {attempt} failed: {failure}")
                if complete:
                    self.give_up(f"restart attempt {attempt} failed: {failure}; {attempt} group restart(s) in a row "
                                 f"did not reach stable service (limit {cfg.max_restarts}): a crash loop")
                return
        except Paused:
            self.record_paused("restart-abandoned", "; a group restart was abandoned, the ranks are left as they are")
            return
        probe = self.generate(self._served_model)
        with self.store.update() as st:
            add_event(st, self.clock.time(), "restarted", f"the group serves again after {took:.0f}s", attempt=attempt)
            self.log(f"{PREFIX} restarted: the group serves again after {took:.0f}s")
            st["served_model"] = self._served_model
            if probe.ok:
                st["served_enter"] = self._head_enter
                st["healthy_since"] = iso(self.clock.time())
                self.note(st, "healthy", f"serving after a group restart: {probe.detail}")
            else:
                st["failures"] = 1
                self.note(st, "probing-failed", f"1/{self.cfg.failures} after a group restart: {probe.detail}",
                          event="probe-failed", failures=1)

    def ordered_restart(self) -> float:
        """The Ansible role's order: returns the seconds from the first start to readiness."""
        unit = self.cfg.unit
        for node in self.cfg.nodes:  # the head first: clients stop getting answers before the group breaks
            self.guard()
            res = self.node_cmd(node, ["systemctl", "stop", unit], ACTION_TIMEOUT)
            if res.rc != 0:
                raise AttemptFailed(f"{node.name}: {'unreachable' if res.unreachable else 'systemctl stop failed'}: "
                                    f"{res.brief()}")
        self.wait_gpu_release()
        for node in self.cfg.nodes:
            self.guard()
            # The unit's StartLimitBurst must not refuse a deliberate start; "nothing to reset" is fine.
            res = self.node_cmd(node, ["systemctl", "reset-failed", unit], READ_TIMEOUT)
            if res.unreachable:
                raise AttemptFailed(f"{node.name}: unreachable: {res.brief()}")
        t0 = self.clock.monotonic()
        for node in [*self.cfg.nodes[1:], self.cfg.nodes[0]]:  # workers first: they wait for the head's rendezvous
            self.guard()
            res = self.node_cmd(node, ["systemctl", "start", unit], ACTION_TIMEOUT)
            if res.rc != 0:
                raise AttemptFailed(f"{node.name}: {'unreachable' if res.unreachable else 'systemctl start failed'}: "
                                    f"{res.brief()}")
        self.wait_ready(t0)
        return self.clock.monotonic() - t0

    def wait_gpu_release(self) -> None:
        """A rank's memory outlives its process for a while; a start before it is free fails to load."""
        deadline = self.clock.monotonic() + self.cfg.gpu_release_timeout
        pending = {n.name: "not read yet" for n in self.cfg.nodes}
        by_name = {n.name: n for n in self.cfg.nodes}
        while True:
            for name in list(pending):
                res = self.node_cmd(by_name[name], ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                                    READ_TIMEOUT)
                if res.unreachable:
                    raise AttemptFailed(f"{name}: unreachable while waiting for its GPU: {res.brief()}")
                pids = [p.strip() for p in res.out.splitlines() if p.strip()]
                if res.rc == 0 and not pids:
                    del pending[name]
                else:
                    pending[name] = f"processes {', '.join(pids)}" if res.rc == 0 else f"nvidia-smi: {res.brief()}"
            if not pending:
                return
            if self.clock.monotonic() >= deadline:
                held = "; ".join(f"{n} still holds {what}" for n, what in pending.items())
                raise AttemptFailed(f"GPU not released within {self.cfg.gpu_release_timeout:g}s: {held}")
            self.sleep(GPU_POLL)

    def wait_ready(self, t0: float) -> None:
        deadline = t0 + self.cfg.readiness_timeout
        while True:
            self.guard()
            ranks = self.read_ranks()
            down = [r for r in ranks.values() if not r.alive]
            if down:
                states = ", ".join(f"{r.name} {r.describe()}" for r in down)
                raise AttemptFailed(f"a rank died during start-up: {states}")
            listed = self.models()
            if listed.ok:
                self._served_model = listed.models[0]
                self._head_enter = ranks[self.cfg.head.name].enter
                return
            if self.clock.monotonic() >= deadline:
                raise AttemptFailed(f"not serving within {self.cfg.readiness_timeout:g}s: {listed.detail}")
            self.sleep(READY_POLL)

    def stop_all(self) -> dict[str, str]:
        """Best effort, the head first: no half group may hold memory."""
        out = {}
        for node in self.cfg.nodes:
            res = self.node_cmd(node, ["systemctl", "stop", self.cfg.unit], ACTION_TIMEOUT)
            out[node.name] = "stopped" if res.rc == 0 else \
                ("unreachable: " if res.unreachable else "stop failed: ") + res.brief()
        return out

    def journal(self, node: Node) -> list[str]:
        res = self.node_cmd(node, ["journalctl", "-u", self.cfg.unit, "-n", str(JOURNAL_LINES), "--no-pager"],
                            READ_TIMEOUT)
        if res.rc != 0:
            return [f"(journal not read: {'unreachable: ' if res.unreachable else ''}{res.brief()})"]
        return [self.redact(line) for line in res.out.splitlines()[-JOURNAL_LINES:]]

    def flapping_due(self, st: dict, now: float) -> list[str]:
        """The restarts within the window when they reached window_max_restarts and the last flapping alert's
        window is over (one alert per window, however often the group restarts in it); else []."""
        cfg = self.cfg
        until = from_iso(st.get("flapping_until") or "")
        if len(st["restarts"]) < cfg.window_max_restarts or (until is not None and now < until):
            return []
        # Until then no second alert, and the monitoring's collector reports the group as flapping
        # (spark_supervisor_flapping).
        st["flapping_until"] = iso(now + cfg.window)
        return list(st["restarts"])

    def flapping(self, restarts: list[str], streak: int, reason: str) -> None:
        """Loud, and nothing stops: each of these restarts but the streak's current ones served stable_after
        seconds again. Someone should find out why the group keeps dying; leaving it down would not."""
        cfg = self.cfg
        why = (f"{len(restarts)} group restarts within {cfg.window:g}s (alert at {cfg.window_max_restarts}), "
               f"{len(restarts) - streak} of them healed (served {cfg.stable_after:g}s again): still restarting; "
               f"this one: {reason}")
        summary = {
            "event": "flapping",
            "reason": self.redact(why),
            "time": iso(self.clock.time()),
            "host": socket.gethostname(),
            "unit": cfg.unit,
            "nodes": [n.name for n in cfg.nodes],
            "restarts": restarts,
            "streak": streak,
            "window_max_restarts": cfg.window_max_restarts,
            "window": cfg.window,
            "history": f"{os.path.abspath(sys.argv[0])} status --config {cfg.path} (or playbooks/doctor.yml)",
        }
        self.log(f"{PREFIX} FLAPPING: {one_line(self.redact(why))}; the causes are in the history (status, "
                 f"playbooks/doctor.yml)")
        alert = self.alert(summary)
        with self.store.update() as st:
            add_event(st, self.clock.time(), "flapping", self.redact(one_line(why)), alert=alert,
                      restarts=len(restarts))

    def give_up(self, reason: str) -> None:
        self.guard()
        self.api_key()  # the journal is redacted with the key as it is now
        stopped = self.stop_all()
        now = self.clock.time()
        with self.store.update() as st:
            restarts = list(st["restarts"])
            streak = st["streak"]
            st["next_attempt"] = ""
        summary = {
            "event": "gave-up",
            "reason": self.redact(reason),
            "time": iso(now),
            "host": socket.gethostname(),
            "unit": self.cfg.unit,
            "nodes": [n.name for n in self.cfg.nodes],
            "restarts": restarts,
            "streak": streak,
            "max_restarts": self.cfg.max_restarts,
            "stable_after": self.cfg.stable_after,
            "window_max_restarts": self.cfg.window_max_restarts,
            "window": self.cfg.window,
            "stopped": stopped,
            "journal": {n.name: self.journal(n) for n in self.cfg.nodes},
            "resume": f"{os.path.abspath(sys.argv[0])} resume --config {self.cfg.path}",
        }
        self.store.ensure()
        write_json_atomic(self.store.gave_up_path, summary)
        self.log(f"{PREFIX} GAVE UP: {one_line(reason)}; every rank stopped ({one_line(json.dumps(stopped), 200)}); "
                 f"the reason and each rank's last {JOURNAL_LINES} journal lines are in {self.store.gave_up_path}; "
                 f"nothing more is done until `resume`")
        self._held = "gave-up"
        alert = self.alert(summary)
        with self.store.update() as st:
            self.note(st, "gave-up", reason, event="gave-up", quiet=True, alert=alert)

    def alert(self, summary: dict) -> str:
        if not self.cfg.alert_command:
            return "none configured"
        res = self.runner.run(["/bin/sh", "-c", self.cfg.alert_command], ALERT_TIMEOUT, stdin=json.dumps(summary))
        if res.rc != 0:
            self.log(f"{PREFIX} alert-failed: the alert command exited {res.rc}: {self.redact(res.brief())}")
            return f"failed: exit {res.rc}"
        self.log(f"{PREFIX} alert-sent: the alert command ran")
        return "sent"


def within_window(restarts: list[str], now: float, window: float) -> list[str]:
    """The restart times (ISO) that lie within the window before now."""
    return [t for t in restarts if (from_iso(t) or 0) > now - window]


# ---- CLI --------------------------------------------------------------------------------------

def cmd_status(state_dir: str, clock, cfg: Config | None = None) -> int:
    store = Store(state_dir, clock)
    st = store.load()
    st["paused"] = store.paused()
    gave_up = store.gave_up()
    st["gave_up"] = None if gave_up is None else {"reason": gave_up.get("reason"), "time": gave_up.get("time")}
    # On the head's own clock, the one the daemon decides by.
    due = from_iso(st.get("next_attempt") or "")
    st["next_attempt_in"] = None if due is None or gave_up is not None else max(0, math.ceil(due - clock.time()))
    st["limits"] = None if cfg is None else {key: getattr(cfg, key) for key in LIMITS}
    # Restarting often, healed each time: the alert's ceiling reached within the window as it is now (the daemon
    # prunes the list at its next incident only).
    st["flapping"] = None if cfg is None else len(
        within_window(st.get("restarts") or [], clock.time(), cfg.window)) >= cfg.window_max_restarts
    print(json.dumps(st, indent=2))
    return 0


def cmd_pause(state_dir: str, clock, reason: str) -> int:
    """Prints one JSON object; "changed" is false when it was paused already (the first pause's
    reason and time stay: it is still the same pause)."""
    store = Store(state_dir, clock)
    store.ensure()
    now = clock.time()
    reason = one_line(reason)
    with store.update() as st:
        marker = store.paused()
        changed = marker is None
        if changed:
            marker = {"reason": reason, "time": iso(now)}
            write_json_atomic(store.pause_path, marker)
            add_event(st, now, "pause", reason)
        if st["state"] != "paused" and store.gave_up() is None:
            st["state"], st["since"] = "paused", iso(now)
            st["last_reason"] = f"paused by the operator: {marker.get('reason', reason)}"
            st["waiting_for"] = []
            changed = True
    print(json.dumps({"changed": changed, "state": st["state"], "paused": marker}))
    return 0


def cmd_resume(state_dir: str, clock) -> int:
    """Prints one JSON object; "changed" is false when there was nothing to clear or reset."""
    store = Store(state_dir, clock)
    store.ensure()
    now = clock.time()
    with store.update() as st:
        cleared = [name for name, path in (("pause", store.pause_path), ("give-up", store.gave_up_path))
                   if os.path.exists(path)]
        for path in (store.pause_path, store.gave_up_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        # The budget starts afresh only when an operator cleared something: a deployment that
        # merely confirms a serving group (every no-change run resumes) must not reset it.
        if cleared:
            st["failures"] = 0
            st["restarts"] = []
            st["streak"], st["backoff"], st["next_attempt"], st["healthy_since"] = 0, 0, "", ""
            st.pop("starting", None)
        changed = bool(cleared)
        if changed:
            reason = (f"resumed by the operator (cleared: {', '.join(cleared) or 'nothing'}); failures, restarts, "
                      "the failing streak and the back-off reset")
            if st["state"] == "gave-up":
                st["state"], st["since"] = "stopped", iso(now)
                reason += "; the ranks were left stopped, the next check starts the group"
            st["last_reason"] = reason
            add_event(st, now, "resume", reason)
    print(json.dumps({"changed": changed, "state": st["state"], "cleared": cleared}))
    return 0


def install_signal_handlers(sup: Supervisor) -> None:
    def stop(_signum, _frame):
        sup.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def main(argv: list[str] | None = None, runner=None, clock=None) -> int:
    parser = argparse.ArgumentParser(prog="spark_llm_supervisor.py", description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("run", "the daemon loop"), ("status", "print the state JSON"),
                       ("pause", "watch only, never act"), ("resume", "clear a pause and a give-up")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", required=True)
        if name == "pause":
            p.add_argument("--reason", default="paused by the operator")
    args = parser.parse_args(argv)
    clock = clock or Clock()
    try:
        if args.command == "run":
            sup = Supervisor(load_config(args.config), runner=runner, clock=clock)
            install_signal_handlers(sup)
            return sup.run()
        state_dir = state_dir_of(args.config)
        if args.command == "status":
            try:
                cfg = load_config(args.config)
            except ConfigError:
                cfg = None  # the state still shows; only the limits do not
            return cmd_status(state_dir, clock, cfg)
        if args.command == "pause":
            return cmd_pause(state_dir, clock, args.reason)
        return cmd_resume(state_dir, clock)
    except ConfigError as err:
        print(f"{PREFIX} config error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"{PREFIX} {args.command}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""A TP group under its supervisor on simulated nodes: the faults and the waits that the supervisor
tests and the recovery benchmark share (both wait on events, neither sleeps a guessed time)."""

from __future__ import annotations

import hashlib
import json
import shlex
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.harness import cluster as sim

UNIT = "spark-llm.service"
MODEL_DIR = "/opt/models/glm53"
REVISION = "0123456789abcdef0123456789abcdef01234567"
STATE_DIR = "/var/lib/spark-llm-supervisor"
ALERT = f"{STATE_DIR}/alert.json"
# A fast watch for the stand-in's one-second loads; the alert command keeps what it is given. A
# restart is a recovery after two healthy checks (stable_after), and a failing streak backs off
# 2 s, then 4 s, at most 8 s.
SUPERVISOR = {
    "supervisor_enabled": True,
    "supervisor_interval": 2,
    "supervisor_failures": 2,
    "supervisor_probe_timeout": 3,
    "supervisor_max_restarts": 20,
    "supervisor_stable_after": 4,
    "supervisor_backoff_initial": 2,
    "supervisor_backoff_max": 8,
    "supervisor_window_max_restarts": 20,
    "supervisor_window": 3600,
    "supervisor_gpu_release_timeout": 60,
    "supervisor_alert_command": f"cat > {ALERT}",
    "server_readiness_timeout": 300,
    "server_stop_timeout": 10,
}
# What the modules that freeze a rank (SIGSTOP) add to SUPERVISOR: a frozen rank never acts on docker
# stop's SIGTERM, so every stop of it waits the whole grace before the SIGKILL, 10 s above. The stand-in ranks
# end within milliseconds of a SIGTERM, so 2 s changes nothing else those tests see; the recovery benchmark
# keeps SUPERVISOR's grace, part of the time a frozen rank's recovery takes.
SHORT_STOP_GRACE = {"server_stop_timeout": 2}
# Long enough for a group restart and a node's boot on a loaded 2-core machine; waits end on the event.
RECOVERY = 420
# How often the waits below look: the supervisor's state file is read through the node's root
# filesystem as the controller mounts it (no SSH round trip), so looking often costs next to nothing
# and a wait ends within a fraction of a second of the event.
POLL = 0.2


def checkpoint_files(revision: str = REVISION) -> str:
    """What checkpoint.yml leaves behind, in the smallest form the server role and the stand-in accept."""
    files = {"processor_config.json": {"size": 2}, "config.json": {"size": 2}}
    record = {"repo_id": "LibertAIDAI/GLM-5.3-Flash-NVFP4", "revision": revision, "files": files}
    stamp = {"mode": "deep", "repo_id": record["repo_id"], "revision": revision, "model_dir": MODEL_DIR,
             "record_sha256": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()}
    return (f"mkdir -p {MODEL_DIR} && echo '{{}}' > {MODEL_DIR}/processor_config.json && echo '{{}}' > {MODEL_DIR}/config.json"
            f" && echo {shlex.quote(json.dumps(record))} > {MODEL_DIR}.record.json"
            f" && echo {shlex.quote(json.dumps(stamp))} > {MODEL_DIR}.verified")


def node_file(node, path: str) -> Path:
    """A file of the node's root filesystem, as the controller mounts it (tests/harness: the node's
    overlay, the same disk its systemd and sshd see; it stays mounted while the node is off)."""
    return Path(node.dir) / "merged" / path.lstrip("/")


def read_node_file(node, path: str) -> str:
    """The file's text on the node ("" while there is none), read without an SSH round trip."""
    try:
        return node_file(node, path).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return ""


def state(cluster) -> dict:
    """The supervisor's state.json on the head ({} while there is none). The supervisor replaces it
    atomically (a rename), so a read sees one whole state; a power cycle
    (tests/harness power_cycle) returns only once the node is on again."""
    try:
        return json.loads(read_node_file(cluster.nodes[0], f"{STATE_DIR}/state.json") or "{}")
    except (ValueError, OSError):
        return {}


def api_key_header(cluster) -> dict:
    """What a client sends: the API key the server role generated beside the inventory (secure by default)."""
    key_file = cluster.inventory / ".credentials" / "spark_llm_api_key"
    return {"Authorization": f"Bearer {key_file.read_text().strip()}"} if key_file.exists() else {}


def lists_model(cluster, timeout: float = 2, model: str = "/models/glm53") -> bool:
    """The head's /v1/models lists the model, with the client's key: both engines' readiness answer."""
    req = urllib.request.Request(f"http://{cluster.nodes[0].mgmt_ip}:30000/v1/models", headers=api_key_header(cluster))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the simulated head's address
            return resp.status == 200 and any(m.get("id") == model for m in json.loads(resp.read())["data"])
    except (OSError, urllib.error.URLError, ValueError, KeyError, AttributeError):
        return False


def generate(cluster, timeout: float = 10, model: str = "/models/glm53") -> bool:
    """One real generation through the head's endpoint, as a client on the management network asks it."""
    body = json.dumps({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "17 × 23 = ?"}]}).encode()
    req = urllib.request.Request(f"http://{cluster.nodes[0].mgmt_ip}:30000/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", **api_key_header(cluster)})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the simulated head's address
            return resp.status == 200 and bool(json.loads(resp.read())["choices"])
    except (OSError, urllib.error.URLError, ValueError, KeyError):
        return False


def wait_for(predicate, what: str, timeout: float = RECOVERY, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_serving(cluster, timeout: float = RECOVERY) -> None:
    """Until the group answers a generation and the supervisor calls it healthy (its state first,
    a file read; the generation, a request to the head, only once the state says healthy)."""
    wait_for(lambda: state(cluster).get("state") == "healthy" and generate(cluster), "the group to serve again",
             timeout, every=POLL)


def wait_stable(cluster, timeout: float = RECOVERY) -> dict:
    """Until the supervisor counts the last restart as a recovery (stable_after of healthy checks:
    its failing streak back to 0, serving); returns its state. A fault injected before then would be
    the next attempt of a failing streak, held off by the back-off."""
    def stable():
        st = state(cluster)
        return st if st.get("state") == "healthy" and st.get("streak") == 0 else None

    return wait_for(stable, "the supervisor to count the restart as stable service", timeout, every=POLL)


def wait_checks(cluster, count: int, timeout: float = RECOVERY) -> dict:
    """Until the supervisor has made `count` more checks (each stamps its state's "checked"); returns
    its state then. A wait on the supervisor's own events, not on a guessed time."""
    seen = {state(cluster).get("checked")}
    found = {}

    def checked():
        st = state(cluster)
        if st.get("checked") and st["checked"] not in seen:
            seen.add(st["checked"])
            found.update(st)
        return len(seen) > count

    wait_for(checked, f"{count} checks of the supervisor", timeout, every=POLL)
    return found


def signal_rank(node, signal: str) -> None:
    """Signal the rank itself, the process the driver lists on the GPU (not the docker client that started it)."""
    sim.ssh(node, f'pids=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader); test -n "$pids" && kill -{signal} $pids',
            timeout=60)


def ranks_active(cluster) -> list[str]:
    return [sim.ssh(n, f"systemctl is-active {UNIT}", check=False, timeout=30).strip() for n in cluster.nodes]


def restarts(cluster) -> int:
    return len(state(cluster).get("restarts", []))


def inject_hang(cluster, timeout: float = 120, while_hanging=None, engine: str = "sglang") -> None:
    """Make the head's generation hang (health and model list still answer) until the supervisor acts,
    then let the next start serve again: the knob is read at each request. `while_hanging` runs once
    the hang is set, before the supervisor can act on it. `engine` is the stand-in's knob section
    (`sglang` or `vllm`: both stand-ins hang alike, lib/engine_standin.py)."""
    before = restarts(cluster)
    sim.set_knobs(cluster.instance, cluster.nodes[0].name, {engine: {"hang": True}})
    try:
        if while_hanging:
            while_hanging()
        wait_for(lambda: restarts(cluster) > before or state(cluster).get("state") == "restarting",
                 "the supervisor to act on the hang", timeout, every=POLL)
    finally:
        sim.set_knobs(cluster.instance, cluster.nodes[0].name, {engine: {"hang": False}})

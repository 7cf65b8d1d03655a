"""Preflight on a site that is already serving: the deployment's own rank is expected, anything else is not.

A re-run of site.yml (an operator re-converging, Molecule's idempotence step)
finds the SGLang rank of `spark-llm.service` holding the GPU and most of the
unified memory. The rank here is the stand-in server, started by the docker
stand-in inside a transient unit named like the server's, exactly as the
unit's ExecStart does (with or without an API key); the nvidia-smi stand-in
then lists the processes holding the GPU as compute apps, as the real driver
does: the rank, not the docker client.
"""

from __future__ import annotations

import json
import re
import shlex
import time

import pytest

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook
from tests.lib.roles import keyed_launcher

PLAYBOOK = "playbooks/preflight.yml"
IMAGE = "lmsysorg/sglang:glm-5.3-flash-arm64"
UNIT = "spark-llm.service"
SUMMARY_TASK = "Print the preflight summary of every node"
STOP_TASK = "Stop when any node has a fatal finding"
REFUSE_TASK = "Refuse a server unit name that systemd and docker cannot both use"
MODEL_PARENT = "/opt/models"
MODEL_DIR = f"{MODEL_PARENT}/glm53"
SCRATCH_MODEL_DIR = "/var/tmp/preflight-rank-model"
SCRATCH_KEY_FILE = "/var/tmp/preflight-rank.key"
MIB = 1024 * 1024
# Far above any test machine's MemAvailable: the memory floor fails wherever it is applied.
HUGE_FLOOR = {"preflight_memory_available_min_mib": 64 * 1024 * 1024}


def node(cluster, name):
    return next(n for n in cluster.nodes if n.name == name)


def summary(result) -> str:
    results = result.results(SUMMARY_TASK)
    assert results, f"no summary was printed:\n{result.stdout[-3000:]}"
    return next(iter(results.values()))["msg"]


def findings(result) -> set[tuple[str, str, str]]:
    """(host, severity, check) of every row in the summary, notes included."""
    return set(re.findall(r"^(spark-\d+)\s+(FATAL|WARN|INFO)\s+(\S+)\s", summary(result), re.MULTILINE))


def row(result, host, severity, check) -> str:
    found = re.findall(rf"^{host}\s+{severity}\s+{check}\s+(.*)$", summary(result), re.MULTILINE)
    assert len(found) == 1, f"expected one {severity} {check} row for {host}:\n{summary(result)}"
    return found[0]


def pids_in(text: str) -> set[int]:
    return {int(p) for p in re.findall(r"\bpid (\d+)\b", text)}


def gpu_pids(n) -> set[int]:
    out = sim.ssh(n, "nvidia-smi --query-compute-apps=pid --format=csv,noheader")
    return {int(line) for line in out.split()}


def cgroup_pids(n, cgroup: str) -> set[int]:
    """The processes the kernel has in a cgroup (the oracle, independent of the role's probe)."""
    out = sim.ssh(n, f"cat /sys/fs/cgroup{cgroup}/cgroup.procs 2>/dev/null || :")
    return {int(line) for line in out.split()}


def wait_for(predicate, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def rank(sim_cluster):
    """Start a serving stand-in rank in a transient unit on a node: `docker run ... sglang.launch_server`.

    Returns the PIDs of the unit's processes that hold the GPU. Every unit and
    container started is stopped and removed afterwards.
    """
    started = []

    def start(name, unit=UNIT, container="spark-llm", port=30999, model_dir=SCRATCH_MODEL_DIR, *, api_key=None):
        n = node(sim_cluster, name)
        started.append((n, unit, container))
        sim.ssh(n, f"mkdir -p {model_dir} && touch {model_dir}/processor_config.json")
        # With an API key the unit runs the keyed launcher (`python3 -c ...`) instead of the module.
        launch, env = "python3 -m sglang.launch_server", ""
        if api_key:
            sim.ssh(n, f"umask 077 && echo {api_key} > {SCRATCH_KEY_FILE}")
            launch = f"python3 -c {shlex.quote(keyed_launcher())} /run/spark-llm/api-key"
            env = f"--volume {SCRATCH_KEY_FILE}:/run/spark-llm/api-key:ro "
        sim.ssh(n, f"systemd-run --unit {unit} --collect --quiet /usr/bin/docker run --rm --name {container} "
                   f"--gpus all --volume {model_dir}:/model:ro {env}{IMAGE} {launch} "
                   f"--model-path /model --host 127.0.0.1 --port {port} --context-length 4096 "
                   "--max-running-requests 2")
        # This start's own journal lines: the unit's name also holds an earlier test's rank, which served.
        invocation = sim.ssh(n, f"systemctl show -p InvocationID --value {unit}").strip()
        assert invocation, f"{unit} on {name} did not start"
        wait_for(lambda: "fired up" in sim.ssh(n, f"journalctl _SYSTEMD_INVOCATION_ID={invocation} --no-pager -q -o cat",
                                                check=False),
                 f"the stand-in rank in {unit} on {name} to serve")
        held = gpu_pids(n) & cgroup_pids(n, f"/system.slice/{unit}")
        assert held, f"nvidia-smi does not list the processes of {unit} on {name}: the test would prove nothing"
        return held

    yield start
    for n, unit, container in reversed(started):
        sim.ssh(n, f"systemctl stop {unit}; systemctl reset-failed {unit}; docker rm -f {container}", check=False)
        sim.ssh(n, f"rm -rf {SCRATCH_MODEL_DIR} {SCRATCH_KEY_FILE}", check=False)
        wait_for(lambda n=n, unit=unit: sim.ssh(n, f"systemctl is-active {unit}", check=False).strip() != "active",
                 f"{unit} to stop")



@pytest.fixture
def small_fs(sim_cluster):
    """A real 64 MiB tmpfs at the model directory's parent holding a complete 48 MiB checkpoint."""
    mounted = []

    def mount(name):
        n = node(sim_cluster, name)
        sim.ssh(n, f"mkdir -p {MODEL_PARENT} && mount -t tmpfs -o size=64m spark-test {MODEL_PARENT}")
        mounted.append(n)
        sim.ssh(n, f"mkdir -p {MODEL_DIR} && head -c {48 * MIB} /dev/zero > {MODEL_DIR}/model-00001.safetensors")
        avail = int(sim.ssh(n, f"df -B1 --output=avail {MODEL_PARENT} | tail -n 1"))
        assert avail == 16 * MIB, "the tmpfs is not the size the test relies on"

    yield mount
    for n in mounted:
        sim.ssh(n, f"umount {MODEL_PARENT}", check=False)


def test_running_rank_passes_and_says_why(sim_inventory, small_fs, rank):
    # The rank serves the complete checkpoint from a filesystem with 16 MiB free: less than a download of the
    # 48 MiB checkpoint plus 8 MiB headroom would need, nothing for a checkpoint that is all there.
    small_fs("spark-0")
    held = rank("spark-0", model_dir=MODEL_DIR)
    disk = {"preflight_checkpoint_bytes": 48 * MIB, "preflight_disk_headroom_bytes": 8 * MIB}

    result = run_playbook(PLAYBOOK, sim_inventory, extravars=disk)
    assert result.rc == 0, summary(result)
    assert result.changed == []
    assert findings(result) == {("spark-0", "INFO", "gpu-busy")}
    assert re.search(r"^spark-0\s+ok$", summary(result), re.MULTILINE)
    assert re.search(r"^spark-1\s+ok$", summary(result), re.MULTILINE)
    note = row(result, "spark-0", "INFO", "gpu-busy")
    assert note.startswith("the GPU is held by the running SGLang rank (expected on a re-run)"), note
    assert pids_in(note) == held
    assert "0 fatal, 0 warning(s), 1 note(s)" in summary(result)

    # Memory: the floor is not applied on the node whose rank runs (and the summary says so), but still is on
    # the node without one, in the same run. Check mode answers the same.
    result = run_playbook(PLAYBOOK, sim_inventory, extravars={**disk, **HUGE_FLOOR}, check=True)
    assert result.rc != 0
    # The node whose memory is short fails, not the serving head the summary runs on.
    assert [(d["host"], d["task"]) for d in result.failed] == [("spark-1", STOP_TASK)]
    assert result.changed == []
    assert findings(result) == {
        ("spark-0", "INFO", "gpu-busy"),
        ("spark-0", "INFO", "memory"),
        ("spark-1", "FATAL", "memory"),
    }
    note = row(result, "spark-0", "INFO", "memory")
    assert f"which is not applied while {UNIT} is active" in note, note
    assert f"needs {HUGE_FLOOR['preflight_memory_available_min_mib']} MiB" in row(result, "spark-1", "FATAL", "memory")


def test_a_rank_started_with_an_api_key_is_the_units_own(sim_inventory, sim_cluster, rank):
    # server_api_key set: the unit's rank is `python3 -c <launcher>`, which names no sglang.launch_server.
    held = rank("spark-0", api_key="sk-PreflightKeyed0123")
    n = node(sim_cluster, "spark-0")
    assert len(held) == 1 and sim.ssh(n, f"tr '\\0' ' ' < /proc/{min(held)}/cmdline").split()[1] == "-c"
    # The docker client, the unit's main process, holds no GPU and is not listed, as with the real driver.
    client = int(sim.ssh(n, f"systemctl show --property=MainPID --value {UNIT}"))
    assert client not in gpu_pids(n) and client in cgroup_pids(n, f"/system.slice/{UNIT}")

    result = run_playbook(PLAYBOOK, sim_inventory)
    assert result.rc == 0, summary(result)
    assert result.changed == []
    assert findings(result) == {("spark-0", "INFO", "gpu-busy")}
    note = row(result, "spark-0", "INFO", "gpu-busy")
    assert note.startswith("the GPU is held by the running SGLang rank (expected on a re-run)"), note
    assert pids_in(note) == held


def test_foreign_gpu_processes_stay_fatal_beside_the_rank(sim_inventory, rank, knobs):
    held = rank("spark-0")
    # A second SGLang started by hand in another unit and container: same command line, not ours.
    stray = rank("spark-0", unit="preflight-stray.service", container="stray", port=30998)
    knobs("spark-0", {"gpu": {"processes": [{"pid": 4242, "name": "ollama"}]}})

    result = run_playbook(PLAYBOOK, sim_inventory)
    assert result.rc != 0
    assert [d["task"] for d in result.failed] == [STOP_TASK], "a probe failed instead of being reported"
    assert findings(result) == {("spark-0", "FATAL", "gpu-busy"), ("spark-0", "INFO", "gpu-busy")}
    fatal = row(result, "spark-0", "FATAL", "gpu-busy")
    assert pids_in(fatal) == stray | {4242}, fatal
    assert "pid 4242 (ollama)" in fatal
    assert "in /system.slice/preflight-stray.service" in fatal
    assert f"(outside {UNIT} and its container spark-llm)" in fatal
    assert pids_in(row(result, "spark-0", "INFO", "gpu-busy")) == held
    assert "spark-0  ok" not in summary(result)
    assert "spark-0  FATAL  gpu-busy" in result.failure_messages()


def test_a_rank_of_another_unit_is_foreign(sim_inventory, rank):
    # The same serving rank, but the site's server unit is another one (inactive): nothing vouches for it.
    held = rank("spark-0")
    result = run_playbook(PLAYBOOK, sim_inventory, extravars={"preflight_server_unit": "glm.service", **HUGE_FLOOR},
                          limit="spark-0")
    assert result.rc != 0
    assert findings(result) == {("spark-0", "FATAL", "gpu-busy"), ("spark-0", "FATAL", "memory")}
    fatal = row(result, "spark-0", "FATAL", "gpu-busy")
    assert pids_in(fatal) == held
    assert "(glm.service is not active)" in fatal


def test_processes_in_the_units_container_scope_are_the_rank(sim_inventory, sim_cluster):
    """On DGX OS the rank runs in docker-<id>.scope, outside the unit's cgroup: the container's ID ties it to the unit.

    The docker stand-in runs containers inside the calling unit and does not answer
    `docker inspect --type container`, so this test builds the real layout itself: the unit holds only
    a placeholder for the docker CLI, the GPU process lives in a scope named like dockerd's, and the
    container ID docker would print is given to the role.
    """
    n = node(sim_cluster, "spark-0")
    container_id = "5bd1e0c2" * 8
    scope = f"docker-{container_id}.scope"
    # A process holding the GPU: the nvidia-smi stand-in lists what has the GPU's device open.
    engine = "sh -c 'mkdir -p /var/lib/spark-sim/gpu && exec sleep 600 3<>/var/lib/spark-sim/gpu/nvidia0'"
    sim.ssh(n, f"systemd-run --unit {UNIT} --collect --quiet sleep 600")
    sim.ssh(n, f"setsid -f systemd-run --scope --unit {scope} --collect --quiet {engine} </dev/null >/dev/null 2>&1")
    try:
        wait_for(lambda: cgroup_pids(n, f"/system.slice/{scope}") & gpu_pids(n), f"a GPU process in {scope}")
        in_scope = cgroup_pids(n, f"/system.slice/{scope}") & gpu_pids(n)
        forged = {"__preflight_server_container_id": container_id}

        result = run_playbook(PLAYBOOK, sim_inventory, extravars=forged, limit="spark-0")
        assert result.rc == 0, summary(result)
        assert findings(result) == {("spark-0", "INFO", "gpu-busy")}
        note = row(result, "spark-0", "INFO", "gpu-busy")
        assert pids_in(note) == in_scope
        assert "in container spark-llm" in note

        # Without the unit, the container's ID vouches for nothing.
        sim.ssh(n, f"systemctl stop {UNIT}")
        result = run_playbook(PLAYBOOK, sim_inventory, extravars=forged, limit="spark-0")
        assert result.rc != 0
        assert findings(result) == {("spark-0", "FATAL", "gpu-busy")}
        assert pids_in(row(result, "spark-0", "FATAL", "gpu-busy")) == in_scope
        assert f"in /system.slice/{scope}" in row(result, "spark-0", "FATAL", "gpu-busy")
    finally:
        sim.ssh(n, f"systemctl stop {UNIT} {scope}; systemctl reset-failed {UNIT} {scope}", check=False)


BAD_UNITS = ["sglang", "../spark-llm.service", "sglang .service"]
# The refusal is each node's own (one assert a node, naming its value): two bad names share a run, one a node,
# given as host variables; the third is given to both nodes (-e).
_bad_unit_runs: dict[str, object] = {}


def bad_unit_run(sim_cluster, tmp_path_factory, unit: str):
    """The preflight run that is given the bad server unit `unit` (made once for the names it holds)."""
    key = "per-node" if unit in BAD_UNITS[:2] else unit
    if key not in _bad_unit_runs:
        if key == "per-node":
            inv = tmp_path_factory.mktemp("inventory")
            data = json.loads((sim_cluster.inventory / "hosts.json").read_text())
            data["spark"]["children"]["spark_head"]["hosts"]["spark-0"]["preflight_server_unit"] = BAD_UNITS[0]
            data["spark"]["children"]["spark_workers"]["hosts"]["spark-1"]["preflight_server_unit"] = BAD_UNITS[1]
            (inv / "hosts.json").write_text(json.dumps(data))
            (inv / "group_vars").symlink_to((sim_cluster.inventory / "group_vars").resolve())
            _bad_unit_runs[key] = run_playbook(PLAYBOOK, inv)
        else:
            _bad_unit_runs[key] = run_playbook(PLAYBOOK, sim_cluster.inventory, extravars={"preflight_server_unit": unit})
    return _bad_unit_runs[key]


@pytest.mark.parametrize("unit", BAD_UNITS)
def test_a_bad_server_unit_is_refused_up_front(sim_cluster, tmp_path_factory, unit):
    result = bad_unit_run(sim_cluster, tmp_path_factory, unit)
    assert result.rc != 0
    assert {d["task"] for d in result.failed} == {REFUSE_TASK}
    assert result.changed_before_first_failure() == []
    message = result.failure_messages()
    assert f'preflight_server_unit is "{unit}"' in message, message
    assert "Set it (or spark_unit_name)" in message

"""Preflight on the simulated nodes: passes on good nodes, reports every planted fault by node in one run.

Faults are planted through the stand-in knobs (GPU, Docker) and, for the disk,
a real size-limited tmpfs mounted over SSH at the model directory's parent.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.harness import cluster as sim
from tests.lib.checkpoint_site import hub_stats
from tests.lib.playbook import run_playbook

# Preflight reads the nodes and changes nothing; what a test plants is put back (tests/conftest.py checks).
pytestmark = pytest.mark.shared_nodes

PLAYBOOK = "playbooks/preflight.yml"
MODEL_PARENT = "/opt/models"
MODEL_DIR = f"{MODEL_PARENT}/glm53"
MIB = 1024 * 1024
SUMMARY_TASK = "Print the preflight summary of every node"
STOP_TASK = "Stop when any node has a fatal finding"


def node(cluster, name):
    return next(n for n in cluster.nodes if n.name == name)


def findings(result) -> set[tuple[str, str, str]]:
    """(host, severity, check) of every finding row in the summary."""
    report = next(iter(result.results(SUMMARY_TASK).values()))["msg"]
    rows = re.findall(r"^(spark-\d+)\s+(FATAL|WARN)\s+(\S+)\s", report, re.MULTILINE)
    return set(rows)


def summary(result) -> str:
    return next(iter(result.results(SUMMARY_TASK).values()))["msg"]


def failures(result) -> dict[str, int]:
    """The play recap's failed= count of each node."""
    stats = next(e["event_data"] for e in result.events if e.get("event") == "playbook_on_stats")
    return {host: stats.get("failures", {}).get(host, 0) for host in ("spark-0", "spark-1")}



@pytest.fixture
def small_fs(sim_cluster):
    """Mount a real tmpfs of the given size at the model directory's parent on a node."""
    mounted = []

    def mount(name, size_mib, present_mib=0):
        n = node(sim_cluster, name)
        sim.ssh(n, f"mkdir -p {MODEL_PARENT} && mount -t tmpfs -o size={size_mib}m spark-test {MODEL_PARENT}")
        mounted.append(n)
        if present_mib:
            sim.ssh(n, f"mkdir -p {MODEL_DIR} && head -c {present_mib * MIB} /dev/zero > {MODEL_DIR}/model-00001.safetensors")
        avail = int(sim.ssh(n, f"df -B1 --output=avail {MODEL_PARENT} | tail -n 1"))
        assert avail == (size_mib - present_mib) * MIB, "the tmpfs is not the size the test relies on"

    yield mount
    for n in mounted:
        # The directory the mount point needed goes too: the nodes are shared with other reading modules.
        sim.ssh(n, f"umount {MODEL_PARENT} && rmdir {MODEL_PARENT}", check=False)


def test_preflight_passes_on_good_nodes_and_changes_nothing(sim_cluster, sim_inventory):
    # Recorded per node: its kernel (this machine's: the nodes are containers) and the nvidia-smi stand-in's driver.
    kernel = {n.name: sim.ssh(n, "uname -r").strip() for n in sim_cluster.nodes}
    driver = {n.name: sim.ssh(n, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").strip()
              for n in sim_cluster.nodes}
    for check in (False, True):
        result = run_playbook(PLAYBOOK, sim_inventory, check=check)
        assert result.rc == 0, summary(result) if result.results(SUMMARY_TASK) else result.stdout[-3000:]
        assert result.changed == []
        assert findings(result) == set()
        assert re.search(r"^spark-0\s+ok$", summary(result), re.MULTILINE)
        assert re.search(r"^spark-1\s+ok$", summary(result), re.MULTILINE)
        assert "0 fatal" in summary(result)
        for name, release in kernel.items():
            assert re.search(rf"^{name}\s+kernel {re.escape(release)}, NVIDIA driver {re.escape(driver[name])}$",
                             summary(result), re.MULTILINE), summary(result)


def test_a_kernel_reported_to_break_roce_is_a_warning_with_the_fix(sim_cluster, sim_inventory):
    # The nodes' own kernel named in the table of releases reported to break RoCE: a warning on each node, with
    # what was reported and the fix; the run still passes.
    running = sim.ssh(sim_cluster.nodes[0], "uname -r").strip()
    result = run_playbook(PLAYBOOK, sim_inventory, extravars={
        "preflight_roce_broken_kernels": {running: "ibv_reg_mr_iova2 fails with ENOMEM at NCCL init"}})
    assert result.rc == 0, summary(result)
    assert findings(result) == {("spark-0", "WARN", "kernel"), ("spark-1", "WARN", "kernel")}
    text = summary(result)
    assert f"kernel {running} is reported to break RoCE: ibv_reg_mr_iova2 fails with ENOMEM at NCCL init" in text
    assert "add kho=off to GRUB_CMDLINE_LINUX" in text and "0 fatal, 2 warning(s)" in text


def test_preflight_reports_every_fault_of_every_node_in_one_run(sim_inventory, knobs, small_fs):
    knobs("spark-0", {"gpu": {"present": False}, "docker": {"running": False}})
    knobs("spark-1", {"gpu": {"name": "NVIDIA H100 80GB HBM3", "driver_version": "550.54.15",
                              "processes": [{"pid": 4242, "name": "ollama"}]},
                      "docker": {"nvidia_runtime": False}})
    small_fs("spark-1", 64)
    result = run_playbook(PLAYBOOK, sim_inventory, extravars={
        # The real site's expectation: the x86_64 test nodes are the wrong architecture.
        "preflight_expected_arch": "aarch64",
        # Default size (1 GiB in the test site) cannot fit the 64 MiB filesystem.
        "preflight_fabric_interfaces": ["enp1s0f1np1", "enp1s0f0np0"],
    })
    assert result.rc != 0
    # Each node fails on its own account.
    assert sorted((d["host"], d["task"]) for d in result.failed) == [("spark-0", STOP_TASK), ("spark-1", STOP_TASK)], \
        "a probe failed instead of being reported"
    assert result.changed == []
    assert findings(result) == {
        ("spark-0", "FATAL", "arch"),
        ("spark-0", "FATAL", "gpu"),
        ("spark-0", "FATAL", "docker"),
        ("spark-0", "FATAL", "fabric"),
        ("spark-1", "FATAL", "arch"),
        ("spark-1", "FATAL", "gpu-name"),
        ("spark-1", "FATAL", "gpu-driver"),
        ("spark-1", "FATAL", "gpu-busy"),
        ("spark-1", "FATAL", "docker"),
        ("spark-1", "FATAL", "disk"),
        ("spark-1", "FATAL", "fabric"),
    }
    text = summary(result)
    for fragment in (
        "nvidia-smi cannot talk to the NVIDIA driver (exit 9)",
        "Cannot connect to the Docker daemon at unix:///var/run/docker.sock",
        'GPU 0 is "NVIDIA H100 80GB HBM3", expected "NVIDIA GB10"',
        "NVIDIA driver 550.54.15 is older than 580.95.05",
        "pid 4242 (ollama)",
        "Docker has no nvidia runtime",
        f"{MODEL_PARENT} (holds {MODEL_DIR}) has 64.00 MB free",
        "CPU architecture is x86_64, expected aarch64",
        "fabric interface(s) enp1s0f0np0 not present",
    ):
        assert fragment in text, f"{fragment!r} missing from:\n{text}"
    # Every finding names its fix.
    assert text.count("fix: ") == 11
    # The failure message is the same table, so a CI log shows it without the debug output.
    assert "spark-1  FATAL  disk" in result.failure_messages()


def test_preflight_gpu_missing_driver_and_count(sim_inventory, knobs):
    knobs("spark-0", {"gpu": {"installed": False}})
    knobs("spark-1", {"gpu": {"count": 2}})
    result = run_playbook(PLAYBOOK, sim_inventory, check=True)
    assert result.rc != 0
    assert findings(result) == {("spark-0", "FATAL", "gpu"), ("spark-1", "FATAL", "gpu-count")}
    assert "nvidia-smi is not installed" in summary(result)
    assert "nvidia-smi lists 2 GPU(s), expected 1" in summary(result)


# Checkpoint 48 MiB, headroom 8 MiB: an empty 64 MiB filesystem has room (56 MiB needed); a complete or a
# half checkpoint on it leaves less free space than the checkpoint's size, yet needs nothing / the other half.
DISK_VARS = {"preflight_checkpoint_bytes": 48 * MIB, "preflight_disk_headroom_bytes": 8 * MIB}


DISK_CASES = [
    (64, 0, True),  # 56 MiB needed, 64 free
    (64, 48, True),  # complete: nothing needed, 16 free
    (64, 24, True),  # half: 24 + 8 needed, 40 free
    (32, 0, False),  # 56 needed, 32 free
    (32, 24, False),  # half: 24 + 8 needed, 8 free
]
DISK_IDS = ["empty-fits", "complete-needs-nothing", "half-needs-other-half", "empty-too-small", "half-too-small"]
# The disk rule and the summary are per node: two cases that both pass share one run, the first on the head
# (spark-0), the second on spark-1. A failing case keeps a run of its own, on spark-1 beside a healthy head.
DISK_RUN_OF = {"empty-fits": "passing", "complete-needs-nothing": "passing"}
DISK_HOST_OF = {"empty-fits": "spark-0"}
_disk_runs: dict[str, object] = {}


def disk_run(request, sim_inventory):
    """The preflight run that holds the calling test's disk case (made by the first of its cases, read by the others)."""
    case = request.node.callspec.id
    key = DISK_RUN_OF.get(case, case)
    if key not in _disk_runs:
        small_fs = request.getfixturevalue("small_fs")
        for other, (size_mib, present_mib, _) in zip(DISK_IDS, DISK_CASES, strict=True):
            if DISK_RUN_OF.get(other, other) == key:
                small_fs(DISK_HOST_OF.get(other, "spark-1"), size_mib, present_mib)
        _disk_runs[key] = run_playbook(PLAYBOOK, sim_inventory, extravars=DISK_VARS)
    return _disk_runs[key]


@pytest.mark.parametrize(("size_mib", "present_mib", "ok"), DISK_CASES, ids=DISK_IDS)
def test_preflight_disk_counts_bytes_already_present(request, sim_inventory, size_mib, present_mib, ok):
    result = disk_run(request, sim_inventory)
    if ok:
        assert result.rc == 0, summary(result)
        assert findings(result) == set()
    else:
        assert result.rc != 0
        assert findings(result) == {("spark-1", "FATAL", "disk")}
        # Only the node with the fault is failed: the healthy head is not, and the run stops all the same.
        assert failures(result) == {"spark-0": 0, "spark-1": 1}
        missing = 48 - present_mib
        assert f"{missing:.2f} MB of the 48.00 MB checkpoint still missing, plus 8.00 MB headroom" in summary(result)


IFACE = "enp1s0f1np1"


def test_a_fabric_port_down_or_without_carrier_is_reported(sim_cluster, sim_inventory):
    """Set down by hand on the worker: a warning there (fabric.yml brings it up), and the head's lost carrier is
    explained by it; with the worker outside the run, the head's missing carrier has no explanation and is fatal."""
    head, worker = node(sim_cluster, "spark-0"), node(sim_cluster, "spark-1")
    sim.ssh(worker, f"ip link set {IFACE} down")
    try:
        result = run_playbook(PLAYBOOK, sim_inventory)
        assert result.rc == 0, summary(result)
        assert findings(result) == {("spark-0", "WARN", "fabric-link"), ("spark-1", "WARN", "fabric-link")}
        text = summary(result)
        assert f"fabric interface(s) {IFACE} down (administratively: set down by hand" in text
        assert f"fabric interface(s) {IFACE} up but without carrier: the fabric port of spark-1 is down" in text
        alone = run_playbook(PLAYBOOK, sim_inventory, limit="spark-0")
        assert alone.rc != 0
        assert findings(alone) == {("spark-0", "FATAL", "fabric-link")}
        assert "the cable is not in this port" in summary(alone)
    finally:
        sim.ssh(worker, f"ip link set {IFACE} up")
    deadline = time.monotonic() + 30
    while "NO-CARRIER" in sim.ssh(head, f"ip link show {IFACE}"):
        assert time.monotonic() < deadline, "the head's carrier never came back"
        time.sleep(0.2)


def test_checkpoint_is_refused_before_any_hub_byte_when_a_workers_disk_is_short(sim_cluster, sim_inventory, small_fs):
    """checkpoint.yml measures every node's room before the head fetches anything; only the short node fails."""
    small_fs("spark-1", 64)
    before = hub_stats(sim_cluster)
    result = run_playbook("playbooks/checkpoint.yml", sim_inventory)
    assert result.rc != 0
    assert [(d["host"], d["task"]) for d in result.failed] == [("spark-1", STOP_TASK)]
    assert failures(result) == {"spark-0": 0, "spark-1": 1}
    assert result.changed == []
    assert "spark-1  FATAL  disk" in result.failure_messages()
    assert "Room for the checkpoint before anything is fetched of 2 node(s)" in summary(result)
    # Not one byte, not one request for a file, left the hub; the checkpoint role never began.
    assert hub_stats(sim_cluster) == before
    assert not [e for e in result.task_events() if e["event_data"].get("role") == "checkpoint"]

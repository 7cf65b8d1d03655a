"""playbooks/doctor.yml names each start-up fingerprint from a real start of the rendered unit.

Read-only on the worker's shared pair (tests/conftest.py): nothing is deployed. What server.yml
would install (playbooks/render.yml: the same templates and flag model) is planted on the nodes
with the smallest part of what fabric.yml and checkpoint.yml leave behind (the fabric address at
MTU 9000, the checkpoint's files, the image), each fault caused the way it is on a DGX Spark (a
file missing from the checkpoint, a hub repo id in the unit, a drafter the image's TileLang tile
cannot serve, an interface name or SGLANG_HOST_IP in the env file), `systemctl start` runs docker
run -> the stand-in SGLang server (tests/standins/README.md), and the doctor reads the nodes like
on DGX OS: the current start of each rank, from the deployed unit, env file and server-args.json,
with the inventory alone. Everything planted is taken away again at the end.

The container memory cap (exit 137), the hybrid state cache and the redaction of logged requests
are tests/integration/test_doctor.py's, on a deployed group.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from tests.harness import cluster as sim
from tests.lib.doctor import (
    BUNDLE,
    drift,
    findings,
    node,
    run_doctor,
    sh,
    shown,
    stop,
    unit_state,
    wait_down,
    wait_journal,
)
from tests.lib.playbook import run_playbook
from tests.lib.supervised import MODEL_DIR, UNIT, checkpoint_files

pytestmark = pytest.mark.shared_nodes

UNIT_PATH = f"/etc/systemd/system/{UNIT}"
ENV_FILE = "/etc/spark-llm/spark-llm.env"
KEY_FILE = "/etc/spark-llm/spark-llm.key"
ARGS_FILE = "/etc/spark-llm/server-args.json"
IMAGE = "lmsysorg/sglang:glm-5.3-flash-arm64"
REPO_ID = "LibertAIDAI/GLM-5.3-Flash-NVFP4"
FABRIC = "enp1s0f1np1"
API_KEY = "sk-DoctorPlant3dKey0123456789abcdefXYZ"  # noqa: S105 - planted on purpose
# Short waits where the real ones are minutes: rank 0 gives up on a missing peer after 6 s; the worker,
# started first, waits long enough for the head's start on a loaded machine.
KNOBS = {"spark-0": {"sglang": {"rendezvous_timeout": 6, "load_seconds": 0.2}},
         "spark-1": {"sglang": {"rendezvous_timeout": 30, "load_seconds": 0.2}}}
# What a start may bring up that the freshly booted pair does not run (the unit wants the network online).
PULLED_IN = ("network-online.target", "systemd-networkd-wait-online.service")
HEAD, WORKER = "spark-0", "spark-1"


def put(n, path, text, mode="0644"):
    data = base64.b64encode(text.encode()).decode()
    sh(n, f"mkdir -p {Path(path).parent} && echo {data} | base64 -d > {path}.new && chmod {mode} {path}.new"
          f" && mv {path}.new {path}")


def edited(text, *changes):
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    return text


@pytest.fixture(scope="module")
def rendered(sim_cluster, tmp_path_factory):
    """The rendered unit and env file of each node ({name: {unit, env}}), and the nodes ready to start them.

    On the nodes: the fabric port's address at MTU 9000 (as netplan sets it, with ip: the port stays
    unmanaged), the checkpoint's files, the image, /dev/infiniband, the recorded server-args.json.
    Afterwards every one of them is taken away and the port is back at MTU 1500 without an address.
    """
    out = tmp_path_factory.mktemp("rendered")
    result = run_playbook("playbooks/render.yml", sim_cluster.inventory, extravars={
        "server_render_dir": str(out), "server_api_key": API_KEY})
    assert result.rc == 0, result.stdout[-3000:]
    files, before = {}, {}
    for n in sim_cluster.nodes:
        # The unit mounts the rank's key file (install() puts it beside the env file, as server.yml does).
        files[n.name] = {"unit": (out / n.name / "spark-llm.service").read_text(),
                         "env": (out / n.name / "spark-llm.env").read_text()}
        assert f"--volume {KEY_FILE}:/run/spark-llm/api-key:ro" in files[n.name]["unit"]
        before[n.name] = sh(n, f"systemctl is-active {' '.join(PULLED_IN)}; ls -A /run/spark-sim 2>/dev/null",
                            check=False).split()
    try:
        for n in sim_cluster.nodes:
            sim.set_knobs(sim_cluster.instance, n.name, KNOBS[n.name])
            put(n, ARGS_FILE, (out / n.name / "server-args.json").read_text())
            sh(n, f"chmod 0700 /etc/spark-llm && {checkpoint_files()} && mkdir -p /dev/infiniband"
                  f" && ip addr add {n.fabric_ip}/24 dev {FABRIC} && ip link set {FABRIC} mtu 9000"
                  f" && docker pull -q {IMAGE} >/dev/null")
        yield files
    finally:
        for n in sim_cluster.nodes:
            was = before[n.name]
            pulled = [u for u, state in zip(PULLED_IN, was, strict=False) if state != "active"]
            runtime = " ".join(f"/run/spark-sim/{f}" for f in sh(n, "ls -A /run/spark-sim 2>/dev/null", check=False).split()
                               if f not in was[len(PULLED_IN):])
            sh(n, f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}; rm -rf {UNIT_PATH} /etc/spark-llm {MODEL_DIR}*"
                  f" /opt/models /var/lib/spark-sim /dev/infiniband /root/processor_config.json {runtime};"
                  f" systemctl daemon-reload; ip addr del {n.fabric_ip}/24 dev {FABRIC}; ip link set {FABRIC} mtu 1500;"
                  f" {'systemctl stop ' + ' '.join(pulled) if pulled else 'true'}; true", check=False)


def install(cluster, files, name, unit=None, env=None):
    """The unit, env file and key file as server.yml installs them (or as edited by hand), no start pending."""
    n = node(cluster, name)
    put(n, UNIT_PATH, unit or files[name]["unit"])
    put(n, ENV_FILE, env or files[name]["env"], mode="0600")
    put(n, KEY_FILE, API_KEY, mode="0600")
    sh(n, f"systemctl daemon-reload && (systemctl reset-failed {UNIT} 2>/dev/null; true)")


def start(cluster, *names):
    """Start the ranks in this order (workers first, as server.yml does)."""
    for name in names:
        sh(node(cluster, name), f"systemctl start {UNIT}")


def test_a_missing_processor_config_and_a_hub_repo_id_each_ask_for_the_local_checkpoint(sim_cluster, rendered, tmp_path):
    """The worker's checkpoint lacks processor_config.json (the model code's file-missing error, kept as the
    evidence after the file is back); the head's unit was edited by hand to a hub repo id, its env file
    without offline mode: the engine goes to the hub, which a node cannot reach."""
    install(sim_cluster, rendered, WORKER)
    install(sim_cluster, rendered, HEAD,
            unit=edited(rendered[HEAD]["unit"], ("--model-path /models/glm53 ", f"--model-path {REPO_ID} ")),
            env=edited(rendered[HEAD]["env"], ("HF_HUB_OFFLINE=1\n", "")))
    worker = node(sim_cluster, WORKER)
    sh(worker, f"mv {MODEL_DIR}/processor_config.json /root/processor_config.json")
    try:
        start(sim_cluster, WORKER, HEAD)
        wait_down(sim_cluster, WORKER, HEAD)
    finally:
        sh(worker, f"mv /root/processor_config.json {MODEL_DIR}/processor_config.json")
        stop(sim_cluster, WORKER, HEAD)

    result, files, _ = run_doctor(sim_cluster, tmp_path)
    on_worker, on_head = findings(files, WORKER), findings(files, HEAD)
    assert set(on_worker) == {"processor_config_missing"}, sorted(on_worker)
    f = on_worker["processor_config_missing"]
    assert "No such file or directory: '/models/glm53/processor_config.json'" in f["evidence"]
    assert "(/models/glm53/processor_config.json)" in f["cause"]
    for part in ("LOCAL directory", "server_model_dir", f"now {MODEL_DIR}", "playbooks/checkpoint.yml"):
        assert part in f["remedy"], (part, f["remedy"])

    assert set(on_head) == {"download_at_boot", "env_offline"}, sorted(on_head)
    f = on_head["download_at_boot"]
    assert "LocalEntryNotFoundError: An error happened while trying to locate the file on the Hub" in f["evidence"]
    # Read from the env file the node has, not from the inventory (which writes HF_HUB_OFFLINE=1).
    assert "env file HF_HUB_OFFLINE=unset" in f["cause"]
    for part in ("HF_HUB_OFFLINE=1", "playbooks/checkpoint.yml", "verified stamp on this node: present"):
        assert part in f["remedy"], (part, f["remedy"])
    assert "HF_HUB_OFFLINE=<unset> in the env file" in on_head["env_offline"]["evidence"]

    text = shown(result)
    assert f"{WORKER}: processor_config.json not found under the model path" in text
    assert f"{HEAD}: The engine tried to reach the Hugging Face hub at start" in text
    assert "the unit runs what server-args.json does not record: --model-path (edited by hand)" in text
    # Read-only on the nodes: the only change is the bundle on the controller.
    assert {e["task"] for e in result.changed} <= {BUNDLE}
    for host in (HEAD, WORKER):
        for name in ("journal.log", "unit.service", "unit.env", "server-args.json", "facts.json", "flags.json"):
            assert f"{host}/{name}" in files, name
    assert API_KEY not in result.stdout and not [p for p, text in files.items() if API_KEY in text]


def test_a_drafter_hits_the_gb10_tilelang_tile_on_both_ranks(sim_cluster, rendered, tmp_path):
    """An EAGLE drafter: its verify shapes need the GB10 tile, which the per-model image lacks for them."""
    for name in (WORKER, HEAD):
        install(sim_cluster, rendered, name, unit=edited(rendered[name]["unit"], (
            "--max-running-requests 2 \\\n", "--max-running-requests 2 \\\n    --speculative-algorithm EAGLE \\\n")))
    start(sim_cluster, WORKER, HEAD)
    try:
        wait_down(sim_cluster, WORKER, HEAD)
    finally:
        stop(sim_cluster, WORKER, HEAD)

    _, files, _ = run_doctor(sim_cluster, tmp_path)
    for host in (HEAD, WORKER):
        found = findings(files, host)
        assert set(found) == {"tilelang_shared_memory"}, (host, sorted(found))
        f = found["tilelang_shared_memory"]
        assert ("Capture draft cuda graph failed: Failed to set the allowed dynamic shared memory size to 169984"
                in f["evidence"]), f["evidence"]
        assert "asks for 169984 bytes" in f["cause"] and "allows 101376" in f["cause"]
        for part in ("block_I=32, num_stages=1, threads=128", "lower threads to 128 before block_I to 32",
                     "block_I=16 trips an MMA assertion", f"(now {IMAGE})", "A speculative-decoding drafter",
                     "drop the speculative-* keys"):
            assert part in f["remedy"], (host, part, f["remedy"])
        assert drift(files, host)["flag speculative-algorithm"] == ("unset", "EAGLE")


def test_nccl_and_gloo_on_a_missing_interface_fail_the_worker_and_the_head_waits_for_it_in_vain(
        sim_cluster, rendered, tmp_path):
    """The worker's env file names NCCL/Gloo interfaces the node does not have: Gloo fails on the worker at
    once; the head waits for it until its rendezvous timeout. The cause is the worker's env file, not the head's
    fabric."""
    install(sim_cluster, rendered, HEAD)
    install(sim_cluster, rendered, WORKER, env=edited(
        rendered[WORKER]["env"], (f"NCCL_SOCKET_IFNAME={FABRIC}", "NCCL_SOCKET_IFNAME=ib9"),
        (f"GLOO_SOCKET_IFNAME={FABRIC}", "GLOO_SOCKET_IFNAME=ib9")))
    start(sim_cluster, WORKER, HEAD)
    try:
        wait_down(sim_cluster, WORKER, HEAD)
    finally:
        stop(sim_cluster, WORKER, HEAD)

    result, files, _ = run_doctor(sim_cluster, tmp_path)
    on_worker, on_head = findings(files, WORKER), findings(files, HEAD)
    assert set(on_worker) == {"env_ifname", "distributed_timeout"}, sorted(on_worker)
    assert on_worker["env_ifname"]["evidence"] == (f"NCCL_SOCKET_IFNAME=ib9, GLOO_SOCKET_IFNAME=ib9 but the fabric "
                                                   f"interface is {FABRIC}")
    assert "server_fabric_interface" in on_worker["env_ifname"]["remedy"]
    f = on_worker["distributed_timeout"]
    assert "Unable to find address for: ib9" in f["evidence"], f["evidence"]
    assert "Fabric problems on this node: NCCL_SOCKET_IFNAME=ib9, GLOO_SOCKET_IFNAME=ib9" in f["cause"], f["cause"]
    assert f"server_fabric_interface (spark_fabric_interface, now {FABRIC})" in f["remedy"]

    assert set(on_head) == {"peer_absent"}, sorted(on_head)
    f = on_head["peer_absent"]
    assert "Gloo connectFullMesh failed with" in f["evidence"], f["evidence"]
    assert f"{WORKER} (rank 1): its start at " in f["cause"] and ", before this rank gave up" in f["cause"], f["cause"]
    assert "NCCL/Gloo rendezvous or collective timed out" in f["cause"]
    assert f"This node's fabric shows no fault (interface {FABRIC}, MTU 9000" in f["cause"]
    assert "Re-running playbooks/fabric.yml does not help here" in f["remedy"]
    text = shown(result)
    assert f"{HEAD}: A peer rank was not running when this rank waited for it" in text
    assert f"{WORKER}: NCCL/Gloo are bound to another interface" in text


def test_a_wrong_sglang_host_ip_hangs_both_ranks_after_init(sim_cluster, rendered, tmp_path):
    """The head's SGLANG_HOST_IP is the worker's address: rank 0 advertises it, every rank waits forever after
    init began; a hang once nothing is logged for doctor_stall_seconds, not before."""
    head, worker = node(sim_cluster, HEAD), node(sim_cluster, WORKER)
    install(sim_cluster, rendered, WORKER)
    install(sim_cluster, rendered, HEAD, env=edited(
        rendered[HEAD]["env"], (f"SGLANG_HOST_IP={head.fabric_ip}", f"SGLANG_HOST_IP={worker.fabric_ip}")))
    start(sim_cluster, WORKER, HEAD)
    try:
        wait_journal(sim_cluster, HEAD, f"Rank 1 joined from {worker.fabric_ip}")
        # Freshly started: not (yet) a hang; the wrong address is a finding already.
        _, files, _ = run_doctor(sim_cluster, tmp_path / "fresh")
        assert set(findings(files, HEAD)) == {"env_host_ip"}, sorted(findings(files, HEAD))
        assert findings(files, WORKER) == {}

        # Silent past the stall time since "Init torch distributed begin": both ranks hang.
        result, files, _ = run_doctor(sim_cluster, tmp_path / "stalled", doctor_stall_seconds=1)
        for host in (HEAD, WORKER):
            found = findings(files, host)
            assert set(found) == ({"init_hang", "env_host_ip"} if host == HEAD else {"init_hang"}), (host, sorted(found))
            f = found["init_hang"]
            assert "Init torch distributed begin" in f["evidence"]
            assert "every peer's rank was running then" in f["cause"], f["cause"]
            assert "playbooks/restart.yml" in f["remedy"]
            # The rank is still running: the doctor only read it.
            assert unit_state(node(sim_cluster, host))["SubState"] == "running", host
        assert f"SGLANG_HOST_IP {worker.fabric_ip} (must be spark_fabric_ip {head.fabric_ip})" in \
            findings(files, HEAD)["init_hang"]["remedy"]
        assert "fabric problems on this node: SGLANG_HOST_IP=" in findings(files, HEAD)["init_hang"]["cause"]
        assert findings(files, HEAD)["env_host_ip"]["evidence"] == (
            f"SGLANG_HOST_IP={worker.fabric_ip} but spark_fabric_ip is {head.fabric_ip}")
        assert "Init torch distributed ends" not in files[f"{HEAD}/journal.log"]
        assert {e["task"] for e in result.changed} <= {BUNDLE}
    finally:
        stop(sim_cluster, HEAD, WORKER)


def test_a_rank_that_found_no_rdma_device_serves_over_sockets_and_is_named(sim_cluster, rendered, knobs, tmp_path):
    """The worker's RoCE device has no RoCE v2 GID: its NCCL (NCCL_DEBUG=INFO, as server.yml writes it) finds no
    device, falls back to sockets without failing, and the group serves; the doctor names it on the worker, with
    the way back to RDMA, and nothing on the head (which logs IB)."""
    worker = node(sim_cluster, WORKER)
    knobs(WORKER, {"roce": {"roce_v2": False}})
    sh(worker, "systemctl reload spark-sim-roce")
    install(sim_cluster, rendered, WORKER)
    install(sim_cluster, rendered, HEAD)
    try:
        start(sim_cluster, WORKER, HEAD)
        wait_journal(sim_cluster, HEAD, "The server is fired up and ready to roll!")
        wait_journal(sim_cluster, WORKER, "NCCL INFO Using network Socket")
        _, files, _ = run_doctor(sim_cluster, tmp_path / "sockets")
        assert set(findings(files, WORKER)) == {"nccl_socket_fallback"}, sorted(findings(files, WORKER))
        f = findings(files, WORKER)["nccl_socket_fallback"]
        assert "NCCL INFO Using network Socket" in f["evidence"]
        assert f"fell back to its socket transport on {FABRIC}" in f["cause"]
        assert "playbooks/fabric.yml" in f["remedy"] and "playbooks/restart.yml" in f["remedy"]
        assert findings(files, HEAD) == {}
        assert "NCCL INFO Using network IB" in files[f"{HEAD}/journal.log"]
    finally:
        stop(sim_cluster, HEAD, WORKER)
        knobs(WORKER, {"roce": {"roce_v2": True}})
        sh(worker, "systemctl reload spark-sim-roce")

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

The same for vLLM (spark_engine: vllm) at the end, its units rendered and started the same way: a
worker's loopback --master-addr, NCCL's init hang with the HCA not pinned, the broadcast block lost
to RemoveIPC, the glm45 parser in the units, a context x concurrency the KV cache cannot hold.

The container memory cap (exit 137), the hybrid state cache and the redaction of logged requests
are tests/integration/test_doctor.py's, on a deployed group; vLLM's missing sm_121 kernel is
test_vllm.py's, in the rollback of a failed change.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from tests.harness import cluster as sim
from tests.lib import node_state
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


# --- vLLM (spark_engine: vllm) on the same pair -------------------------------------------------------------
# The units server.yml would install for vLLM (its upstream image, the stand-in told that the image carries the
# sparse-MLA fix: no kernel image for sm_121 is test_vllm.py's, through the rollback a failed change runs), started
# as the SGLang ones above; the doctor run for the site's engine (-e spark_engine=vllm).

VLLM = {"spark_engine": "vllm", "server_image": "vllm/vllm-openai:glm51-cu130"}
VLLM_KNOBS = {"spark-0": {"vllm": {"rendezvous_timeout": 6, "load_seconds": 0.2, "sparse_mla_sm121": True}},
              "spark-1": {"vllm": {"rendezvous_timeout": 30, "load_seconds": 0.2, "sparse_mla_sm121": True}}}
RAIL2 = "enP2p1s0f1np1"
LOGIND_DROPIN = "/etc/systemd/logind.conf.d/90-doctor-test.conf"


@pytest.fixture(scope="module")
def rendered_vllm(sim_cluster, rendered, tmp_path_factory):
    """The vLLM units, env files and server-args.json of each node ({name: {unit, env, args}}), the vLLM image
    pulled; the nodes' knobs as they were afterwards (the rest goes with `rendered`)."""
    out = tmp_path_factory.mktemp("rendered-vllm")
    result = run_playbook("playbooks/render.yml", sim_cluster.inventory, extravars={
        "server_render_dir": str(out), "server_api_key": API_KEY, **VLLM})
    assert result.rc == 0, result.stdout[-3000:]
    files = {n.name: {name: (out / n.name / f"spark-llm.{name}").read_text() for name in ("service", "env")}
             for n in sim_cluster.nodes}
    files = {name: {"unit": f["service"], "env": f["env"], "args": (out / name / "server-args.json").read_text()}
             for name, f in files.items()}
    before = node_state.knobs_of(sim_cluster)
    try:
        for n in sim_cluster.nodes:
            sim.set_knobs(sim_cluster.instance, n.name, VLLM_KNOBS[n.name])
            sh(n, f"docker pull -q {VLLM['server_image']} >/dev/null")
        yield files
    finally:
        node_state.restore_knobs(sim_cluster, before)


def install_vllm(cluster, files, name, unit=None, env=None):
    put(node(cluster, name), ARGS_FILE, files[name]["args"])
    install(cluster, files, name, unit=unit or files[name]["unit"], env=env or files[name]["env"])


def test_vllm_a_workers_loopback_master_address_times_out_rank_0s_store(sim_cluster, rendered_vllm, tmp_path):
    """The worker's unit edited to vLLM's default --master-addr 127.0.0.1: it looks for the store on its own node,
    the head's store gives up (`DistStoreError ... 1/2 clients joined`); the doctor names the worker's address."""
    head = node(sim_cluster, HEAD)
    install_vllm(sim_cluster, rendered_vllm, HEAD)
    install_vllm(sim_cluster, rendered_vllm, WORKER, unit=edited(
        rendered_vllm[WORKER]["unit"], (f"--master-addr {head.fabric_ip} ", "--master-addr 127.0.0.1 ")))
    start(sim_cluster, WORKER, HEAD)
    try:
        wait_down(sim_cluster, HEAD)
        result, files, _ = run_doctor(sim_cluster, tmp_path, **VLLM)
    finally:
        stop(sim_cluster, HEAD, WORKER)
    on_head, on_worker = findings(files, HEAD), findings(files, WORKER)
    assert set(on_head) == {"rendezvous_store_timeout"}, sorted(on_head)
    f = on_head["rendezvous_store_timeout"]
    assert "DistStoreError: Timed out after 7 seconds waiting for clients. 1/2 clients joined." in f["evidence"]
    assert f"--master-addr {head.fabric_ip}:20000" in f["cause"] and "spark-1 (rank 1) joins at 127.0.0.1" in f["cause"]
    assert "playbooks/server.yml" in f["remedy"] and "playbooks/restart.yml" in f["remedy"]
    assert set(on_worker) == {"rendezvous_address"}, sorted(on_worker)
    assert on_worker["rendezvous_address"]["evidence"] == (
        f"--master-addr 127.0.0.1 in the unit: rank 0 (the head) listens on its fabric address {head.fabric_ip}; a "
        "loopback address points this rank at its own node")
    text = shown(result)
    assert f"{HEAD}: Rank 0's store timed out waiting for the other nodes" in text
    assert "the unit runs what server-args.json does not record: --master-addr (edited by hand)" in text
    assert "deployed vLLM: max-num-seqs 2, max-model-len 65536, gpu-memory-utilization 0.84, --memory 120g" in text
    assert {e["task"] for e in result.changed} <= {BUNDLE}


def test_vllm_nccl_hangs_at_init_on_a_node_whose_hcas_are_not_pinned(sim_cluster, rendered_vllm, tmp_path):
    """The worker's second rail has an address too, so NCCL finds two RoCE devices, and the rendered env file (no
    fabric.yml ran) pins none: its communicator setup spins for ever; a hang once silent for the stall time."""
    worker = node(sim_cluster, WORKER)
    rail2 = f"{'.'.join(sim_cluster.rail2_subnet.split('.')[:3])}.{11 + worker.rank}/24"
    install_vllm(sim_cluster, rendered_vllm, HEAD)
    install_vllm(sim_cluster, rendered_vllm, WORKER)
    sh(worker, f"ip addr add {rail2} dev {RAIL2} && systemctl reload spark-sim-roce")
    try:
        start(sim_cluster, WORKER, HEAD)
        wait_journal(sim_cluster, WORKER, "vLLM is using nccl==")
        # Freshly begun: not (yet) a hang.
        _, files, _ = run_doctor(sim_cluster, tmp_path / "fresh", **VLLM)
        assert findings(files, WORKER) == {} and findings(files, HEAD) == {}
        # Silent past the stall time since NCCL's setup began (the node's clock is read in whole seconds).
        result, files, _ = run_doctor(sim_cluster, tmp_path / "stalled", doctor_stall_seconds=1, **VLLM)
    finally:
        stop(sim_cluster, HEAD, WORKER)
        sh(worker, f"ip addr del {rail2} dev {RAIL2}; systemctl reload spark-sim-roce", check=False)
    on_worker = findings(files, WORKER)
    assert set(on_worker) == {"nccl_init_hang"}, (sorted(on_worker), files[f"{WORKER}/journal.log"][-2500:],
                                                  files[f"{WORKER}/facts.json"][:1500])
    f = on_worker["nccl_init_hang"]
    assert "vLLM is using nccl==" in f["evidence"]
    assert "env file: NCCL_IB_HCA unset" in f["cause"] and "every peer's rank was running then" in f["cause"]
    assert "NCCL_IB_HCA" in f["remedy"] and "playbooks/fabric.yml" in f["remedy"]
    assert findings(files, HEAD) == {}
    assert f"{WORKER}: NCCL's communicator setup hangs (the RoCE HCA not pinned)" in shown(result)


def test_vllm_a_worker_loses_its_broadcast_block_to_remove_ipc_and_glm45_drops_replies(
        sim_cluster, rendered_vllm, tmp_path):
    """The worker's systemd-logind removes IPC objects (a drop-in sets RemoveIPC=yes): its rank waits for a
    broadcast block for ever (vLLM's warning every second here, every 60 s by default). Both units were edited to
    vLLM's glm45 reasoning parser, which the doctor names from the units (its drop is silent)."""
    worker = node(sim_cluster, WORKER)
    glm45 = ("--reasoning-parser deepseek_r1 ", "--reasoning-parser glm45 ")
    install_vllm(sim_cluster, rendered_vllm, HEAD, unit=edited(rendered_vllm[HEAD]["unit"], glm45))
    install_vllm(sim_cluster, rendered_vllm, WORKER, unit=edited(rendered_vllm[WORKER]["unit"], glm45),
                 env=rendered_vllm[WORKER]["env"] + "VLLM_RINGBUFFER_WARNING_INTERVAL=1\n")
    had_dropins = sh(worker, f"test -d {Path(LOGIND_DROPIN).parent} && echo yes; true").strip() == "yes"
    put(worker, LOGIND_DROPIN, "[Login]\nRemoveIPC=yes\n")
    try:
        start(sim_cluster, WORKER, HEAD)
        wait_journal(sim_cluster, WORKER, "No available shared memory broadcast block found in 1 seconds")
        result, files, _ = run_doctor(sim_cluster, tmp_path, **VLLM)
    finally:
        stop(sim_cluster, HEAD, WORKER)
        sh(worker, f"rm -f {LOGIND_DROPIN}" + ("" if had_dropins else f" && rmdir {Path(LOGIND_DROPIN).parent}"))
    on_head, on_worker = findings(files, HEAD), findings(files, WORKER)
    assert set(on_worker) == {"shm_broadcast_block", "flag_refused"}, sorted(on_worker)
    f = on_worker["shm_broadcast_block"]
    assert "No available shared memory broadcast block found in 1 seconds" in f["evidence"]
    assert "RemoveIPC=yes" in f["cause"] and "RemoveIPC=no" in f["remedy"]
    assert set(on_head) == {"flag_refused"}, sorted(on_head)
    for found in (on_head, on_worker):
        assert found["flag_refused"]["evidence"].startswith(
            "--reasoning-parser glm45: vLLM's glm45 reasoning parser silently drops the whole reply")
    assert drift(files, HEAD)["flag reasoning-parser"] == ("deepseek_r1", "glm45")
    assert f"{HEAD}: The rank runs a flag value the flag model refuses" in shown(result)


def test_vllm_a_context_the_kv_cache_cannot_hold_asks_for_fewer_sequences_first(sim_cluster, rendered_vllm, tmp_path):
    """Both units edited to 8 sequences at 64k: node 0's engine core finds the KV cache too small for one request
    (vLLM's max_model_len check) and the worker goes down with it."""
    eight = ("--max-num-seqs 2 ", "--max-num-seqs 8 ")
    for name in (WORKER, HEAD):
        install_vllm(sim_cluster, rendered_vllm, name, unit=edited(rendered_vllm[name]["unit"], eight))
    start(sim_cluster, WORKER, HEAD)
    try:
        wait_down(sim_cluster, WORKER, HEAD)
    finally:
        stop(sim_cluster, WORKER, HEAD)
    _, files, _ = run_doctor(sim_cluster, tmp_path, **VLLM)
    on_head, on_worker = findings(files, HEAD), findings(files, WORKER)
    assert set(on_head) == {"kv_cache_too_small"}, sorted(on_head)
    f = on_head["kv_cache_too_small"]
    assert "The model's max seq len (65536) is larger than the maximum number of tokens that can be stored in KV cache" \
        in f["evidence"]
    assert f["apply"] == {"server_flag_overrides": {"max-num-seqs": 4}}
    assert "lower max-num-seqs 8 -> 4 and keep max-model-len 65536" in f["remedy"]
    assert set(on_worker) == {"peer_exited"}, sorted(on_worker)
    assert f"{HEAD} (rank 0) ended at" in on_worker["peer_exited"]["cause"]
    assert "The KV cache cannot hold the context" in on_worker["peer_exited"]["cause"]

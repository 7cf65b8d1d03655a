"""playbooks/doctor.yml on simulated nodes: failed starts -> their remedies, a bundle without secrets.

Every fingerprint comes from a real start: the unit and env file playbooks/render.yml writes for
this inventory are installed on the nodes, and `systemctl start sglang.service` runs docker run ->
the stand-in SGLang server (tests/standins/README.md). Each failure is caused the way it is on a
DGX Spark: flags in the unit, a file missing from the checkpoint, an interface name in the env
file, SGLANG_HOST_IP, the container's memory cap, a drafter the image's TileLang tile cannot
serve. The doctor then reads the nodes over SSH like on DGX OS.
"""

from __future__ import annotations

import base64
import json
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook

pytestmark = pytest.mark.slow

UNIT = "sglang.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
ENV_PATH = "/etc/sglang/sglang.env"
MODEL_DIR = "/opt/models/glm53"
IMAGE = "lmsysorg/sglang:glm-5.3-flash-arm64"
REPO_ID = "LibertAIDAI/GLM-5.3-Flash-NVFP4"
# Short waits where the real ones are minutes: the head gives up on a missing peer after 6 s; the
# worker, started first, waits long enough for the head to come up on a loaded machine.
KNOBS = {"spark-0": {"sglang": {"rendezvous_timeout": 6, "load_seconds": 0.2}},
         "spark-1": {"sglang": {"rendezvous_timeout": 30, "load_seconds": 0.2}}}
BUNDLE_TASKS = {
    "Create the bundle's directories",
    "Write every node's redacted files",
    "Write the summary of all nodes",
    "Pack the bundle",
}
SHOW = "Show the node's state, last lines and findings"
API_KEY = "sk-DoctorPlant3dKey0123456789abcdef"  # noqa: S105 - planted on purpose
HF_TOKEN = "hf_PlantedTokenAbCdEfGh0123456789xyz"  # noqa: S105 - planted on purpose
# Known to the doctor by neither value nor variable: only its shape can give it away.
STRAY = "hf_StrayTokenQwErTy9876543210AbCdEf"  # noqa: S105 - planted on purpose


def node(cluster, name):
    return next(n for n in cluster.nodes if n.name == name)


def sh(n, command, check=True):
    return sim.ssh(n, command, timeout=120, check=check)


def put(n, path, text, mode="0644"):
    data = base64.b64encode(text.encode()).decode()
    sh(n, f"mkdir -p {Path(path).parent} && echo {data} | base64 -d > {path}.new && chmod {mode} {path}.new"
          f" && mv {path}.new {path}")


@pytest.fixture(scope="module")
def rendered(sim_cluster, tmp_path_factory):
    """What server.yml would install on each node (render.yml: the same templates and flag model).

    The nodes get what fabric.yml and checkpoint.yml leave behind, in the smallest form the unit
    and the stand-in need: the fabric link configured (networkd, as netplan renders it: the
    address, MTU 9000, so network-online.target, which the unit waits for, is reached), a
    checkpoint directory, the image, /dev/infiniband.
    """
    out = tmp_path_factory.mktemp("rendered")
    result = run_playbook("playbooks/render.yml", sim_cluster.inventory, extravars={
        "sglang_server_render_dir": str(out), "sglang_server_api_key": API_KEY})
    assert result.rc == 0, result.stdout[-3000:]
    files = {}
    for n in sim_cluster.nodes:
        # The render redacts the key; the installed env file holds it, as server.yml writes it.
        env = (out / n.name / "sglang.env").read_text().replace("<redacted>", API_KEY)
        files[n.name] = {"unit": (out / n.name / "sglang.service").read_text(), "env": env + f"HF_TOKEN={HF_TOKEN}\n"}
        assert "python3 -c" in files[n.name]["unit"] and f"SGLANG_API_KEY={API_KEY}" in files[n.name]["env"]
        sim.set_knobs(sim_cluster.instance, n.name, KNOBS[n.name])
        put(n, "/etc/systemd/network/10-netplan-enp1s0f1np1.network",
            f"[Match]\nName=enp1s0f1np1\n\n[Link]\nMTUBytes=9000\n\n[Network]\nAddress={n.fabric_ip}/24\n")
        sh(n, f"networkctl reload && systemctl start network-online.target && mkdir -p /dev/infiniband {MODEL_DIR}"
              f" && echo '{{}}' > {MODEL_DIR}/processor_config.json && echo '{{}}' > {MODEL_DIR}/config.json"
              f" && docker pull -q {IMAGE} >/dev/null")
    for n in sim_cluster.nodes:
        deadline = time.monotonic() + 30
        while f" {n.fabric_ip}/24 " not in sh(n, "ip -o -4 addr show dev enp1s0f1np1", check=False):
            assert time.monotonic() < deadline, f"{n.name}: the fabric address never came up"
            time.sleep(0.2)
    return files


def install(cluster, files, name, unit=None, env=None):
    n = node(cluster, name)
    put(n, UNIT_PATH, unit or files[name]["unit"])
    put(n, ENV_PATH, env or files[name]["env"], mode="0600")
    # Enabled, as server.yml leaves it: an enabled unit keeps its last exit status after it stops.
    sh(n, f"chmod 0700 /etc/sglang && systemctl daemon-reload && systemctl enable --quiet {UNIT} && "
          f"(systemctl reset-failed {UNIT} 2>/dev/null; true)")


def start(cluster, *names):
    """Start the ranks in this order (workers first, as server.yml does)."""
    for name in names:
        sh(node(cluster, name), f"systemctl reset-failed {UNIT} 2>/dev/null; systemctl start {UNIT}")


def unit_state(n):
    out = sh(n, f"systemctl show {UNIT} -p ActiveState,SubState,Result,ExecMainStatus")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_down(cluster, *names, timeout=60):
    """Until each rank's main process has exited (failed, waiting to restart, or inactive)."""
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            state = unit_state(node(cluster, name))
            if state["ActiveState"] in ("failed", "inactive") or state["SubState"] == "auto-restart":
                break
            assert time.monotonic() < deadline, f"{name}: {UNIT} still {state}"
            time.sleep(0.3)


def wait_journal(cluster, name, text, timeout=60):
    deadline = time.monotonic() + timeout
    while text not in sh(node(cluster, name), f"journalctl -u {UNIT} -o cat --no-pager", check=False):
        assert time.monotonic() < deadline, f"{name}: {text!r} never in the journal"
        time.sleep(0.3)


def stop(cluster):
    """Stop every rank; no restart pending (Restart=on-failure would start a failed one again)."""
    for n in cluster.nodes:
        sh(n, f"systemctl stop {UNIT}; systemctl reset-failed {UNIT} 2>/dev/null; true", check=False)


def clear(cluster):
    """No unit, no env file, an empty journal: each test starts from a node that never ran a rank."""
    for n in cluster.nodes:
        sh(n, f"systemctl disable --now {UNIT}; systemctl reset-failed {UNIT}; rm -f {UNIT_PATH}; rm -rf /etc/sglang; "
              "systemctl daemon-reload; docker rm -f sglang >/dev/null 2>&1; journalctl --rotate >/dev/null 2>&1; "
              "journalctl --vacuum-time=1s >/dev/null 2>&1; true", check=False)


def edited(text, *changes):
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    return text


def run_doctor(inventory, tmp_path, check=False, **extravars):
    result = run_playbook("playbooks/doctor.yml", inventory, check=check,
                          extravars={"sglang_doctor_bundle_dir": str(tmp_path), **extravars})
    assert result.rc == 0, result.stdout[-4000:]
    bundles = sorted(tmp_path.glob("doctor-*.tar.gz"))
    assert len(bundles) == (0 if check else 1), list(tmp_path.iterdir())
    return result, (bundles[0] if bundles else None)


def bundle_files(bundle: Path) -> dict[str, str]:
    with tarfile.open(bundle) as tar:
        return {
            m.name.split("/", 1)[1]: tar.extractfile(m).read().decode("utf-8", errors="replace")
            for m in tar.getmembers() if m.isfile()
        }


def findings(files, host):
    return {f["id"]: f for f in json.loads(files[f"{host}/findings.json"])}


def shown(result):
    return "\n".join(str(r.get("msg")) for r in result.results(SHOW).values())


@pytest.fixture
def cluster(sim_cluster, rendered):
    clear(sim_cluster)
    yield sim_cluster
    clear(sim_cluster)


def test_each_failed_start_maps_to_its_remedy(cluster, rendered, tmp_path):
    head, worker = "spark-0", "spark-1"
    units = {name: files["unit"] for name, files in rendered.items()}
    envs = {name: files["env"] for name, files in rendered.items()}

    # The checkpoint lacks processor_config.json on the worker: the model code's file-missing error.
    install(cluster, rendered, worker)
    sh(node(cluster, worker), f"mv {MODEL_DIR}/processor_config.json /root/pc.json")
    start(cluster, worker)
    wait_down(cluster, worker)
    sh(node(cluster, worker), f"mv /root/pc.json {MODEL_DIR}/processor_config.json")
    stop(cluster)

    # A hub repo id as the model path and no offline mode: the engine goes to the hub, which a node cannot reach.
    install(cluster, rendered, worker,
            unit=edited(units[worker], ("--model-path /models/glm53 ", f"--model-path {REPO_ID} ")),
            env=edited(envs[worker], ("HF_HUB_OFFLINE=1\n", "")))
    start(cluster, worker)
    wait_down(cluster, worker)
    stop(cluster)

    # Both units ask for 8 concurrent requests: both ranks fail at the hybrid state cache.
    for name in (worker, head):
        install(cluster, rendered, name,
                unit=edited(units[name], ("--max-running-requests 2 ", "--max-running-requests 8 ")))
    start(cluster, worker, head)
    wait_down(cluster, worker, head)
    stop(cluster)

    # An EAGLE drafter: its verify shapes need the GB10 TileLang tile, which the per-model image lacks for them.
    for name in (worker, head):
        install(cluster, rendered, name, unit=edited(
            units[name], ("--max-running-requests 2 ", "--max-running-requests 2 \\\n    --speculative-algorithm EAGLE ")))
    start(cluster, worker, head)
    wait_down(cluster, worker, head)
    stop(cluster)

    # The worker's env file names NCCL/Gloo interfaces the node does not have: Gloo fails on the worker,
    # the head waits for it until the rendezvous timeout.
    install(cluster, rendered, head)
    bad_env = edited(envs[worker], ("NCCL_SOCKET_IFNAME=enp1s0f1np1", "NCCL_SOCKET_IFNAME=ib9"),
                     ("GLOO_SOCKET_IFNAME=enp1s0f1np1", "GLOO_SOCKET_IFNAME=ib9"))
    install(cluster, rendered, worker, env=bad_env)
    start(cluster, worker, head)
    wait_down(cluster, worker, head)
    stop(cluster)
    # The seed's unit is back on the worker (its env file still names ib9).
    install(cluster, rendered, worker, env=bad_env)

    result, bundle = run_doctor(cluster.inventory, tmp_path)
    files = bundle_files(bundle)
    on_worker, on_head = findings(files, worker), findings(files, head)

    expected_worker = {
        "processor_config_missing": ("No such file or directory: '/models/glm53/processor_config.json'",
                                     ["LOCAL directory", "sglang_server_model_dir"]),
        "download_at_boot": ("LocalEntryNotFoundError: An error happened while trying to locate the file on the Hub",
                             ["HF_HUB_OFFLINE=1", "playbooks/checkpoint.yml"]),
        "hybrid_state_cache": ("Hybrid (mamba/linear-attention) state cache is too small",
                               ["lower max-running-requests 2 -> 1",
                                "sglang_server_flag_overrides: {max-running-requests: 1}"]),
        "tilelang_shared_memory": ("Capture draft cuda graph failed: Failed to set the allowed dynamic shared memory "
                                   "size to 169984", ["block_I=32, num_stages=1, threads=128",
                                                      "threads to 128 before block_I", "block_I=16", "drafter"]),
        "env_ifname": ("NCCL_SOCKET_IFNAME=ib9, GLOO_SOCKET_IFNAME=ib9", ["sglang_server_fabric_interface"]),
    }
    expected_head = {
        "hybrid_state_cache": ("Hybrid (mamba/linear-attention) state cache is too small",
                               ["lower max-running-requests 2 -> 1"]),
        "tilelang_shared_memory": ("size to 169984", ["block_I=32, num_stages=1, threads=128", "drafter"]),
        "distributed_timeout": ("Gloo connectFullMesh failed with", ["sglang_server_fabric_interface",
                                                                     "MTU must be 9000", "SGLANG_HOST_IP",
                                                                     "playbooks/restart.yml"]),
    }
    for host, found, expected in ((worker, on_worker, expected_worker), (head, on_head, expected_head)):
        for finding_id, (evidence, remedy_parts) in expected.items():
            assert finding_id in found, f"{host}: {finding_id} not in {sorted(found)}"
            f = found[finding_id]
            assert evidence in f["evidence"], f"{host} {finding_id}: evidence {f['evidence']!r}"
            for part in remedy_parts:
                assert part in f["remedy"], f"{host} {finding_id}: {part!r} not in {f['remedy']!r}"
    # What only the worker met is not blamed on the head, and no OOM is seen where none happened.
    assert {"processor_config_missing", "download_at_boot", "env_ifname", "out_of_memory"} & set(on_head) == set()
    assert "out_of_memory" not in on_worker
    # The remedy speaks of the unit installed now (the seed's 2 requests), and the image it runs.
    assert "max-running-requests 2" in on_worker["hybrid_state_cache"]["cause"]
    assert IMAGE in on_worker["tilelang_shared_memory"]["remedy"]

    # The same findings are printed for the operator, per node.
    text = shown(result)
    assert "spark-1: Hybrid (mamba/linear-attention) state cache too small" in text
    assert "spark-0: NCCL/Gloo rendezvous or collective timed out" in text
    assert "spark-1: The engine tried to reach the Hugging Face hub at start" in text

    # Read-only on the nodes: the only changes are the bundle's files on the controller.
    changed = {e["task"] for e in result.changed}
    assert changed <= BUNDLE_TASKS, changed
    for host in (head, worker):
        for name in ("journal.log", "unit.service", "unit.env", "server-args.json", "facts.json", "flags.json"):
            assert f"{host}/{name}" in files
    assert "Hybrid (mamba/linear-attention) state cache is too small" in files["spark-1/journal.log"]
    assert "summary.txt" in files


def test_an_oom_killed_rank_in_check_mode(cluster, rendered, tmp_path):
    """The head's container is capped below what the rank holds: killed like the kernel does, docker run exits 137."""
    head, worker = "spark-0", "spark-1"
    install(cluster, rendered, worker)
    install(cluster, rendered, head, unit=edited(rendered[head]["unit"],
                                                 ("--memory 120g --memory-swap 120g", "--memory 96g --memory-swap 96g")))
    start(cluster, worker, head)
    wait_down(cluster, head, worker)
    # What server.yml does when a rank dies during its readiness wait: stop them all.
    stop(cluster)
    state = unit_state(node(cluster, head))
    # 137 is a failure of the unit, not a success: systemd keeps it (failed, or inactive once reset).
    assert state["ExecMainStatus"] == "137" and state["ActiveState"] in ("failed", "inactive"), state
    journal = sh(node(cluster, head), f"journalctl -u {UNIT} -o cat --no-pager")
    assert "Main process exited, code=exited, status=137" in journal, journal
    assert "Failed with result 'exit-code'" in journal, journal

    result, _ = run_doctor(cluster.inventory, tmp_path, check=True, sglang_server_container_memory="96g")
    assert list(tmp_path.iterdir()) == []
    text = shown(result)
    assert "spark-0: Rank killed for lack of memory (OOM / exit 137)" in text
    # The evidence is systemd's own line now that 137 is no success of the unit.
    assert "Main process exited, code=exited, status=137" in text
    assert "capped at 96g (sglang_server_container_memory" in text
    assert "spark-1: Rank killed for lack of memory" not in text


def test_a_start_that_hangs_after_init_points_at_the_fabric(cluster, rendered, tmp_path):
    """The head's SGLANG_HOST_IP is the worker's address: the ranks wait forever after init began."""
    head, worker = "spark-0", "spark-1"
    worker_ip = node(cluster, worker).fabric_ip
    install(cluster, rendered, worker)
    install(cluster, rendered, head, env=edited(rendered[head]["env"], (
        f"SGLANG_HOST_IP={node(cluster, head).fabric_ip}", f"SGLANG_HOST_IP={worker_ip}")))
    start(cluster, worker, head)
    wait_journal(cluster, head, f"Rank 1 joined from {worker_ip}")

    # Freshly started: not (yet) a hang.
    _, bundle = run_doctor(cluster.inventory, tmp_path / "fresh", sglang_doctor_stall_seconds=3600)
    assert "init_hang" not in findings(bundle_files(bundle), head)

    # Past the stall time, with nothing logged since "Init torch distributed begin": both ranks hang.
    _, bundle = run_doctor(cluster.inventory, tmp_path / "stalled", sglang_doctor_stall_seconds=1)
    files = bundle_files(bundle)
    for host in (head, worker):
        found = findings(files, host)
        assert "init_hang" in found, (host, sorted(found))
        assert "playbooks/restart.yml" in found["init_hang"]["remedy"]
        assert "SGLANG_HOST_IP" in found["init_hang"]["remedy"]
        assert unit_state(node(cluster, host))["SubState"] == "running", host
    # The wrong address is itself a finding on the head.
    assert worker_ip in findings(files, head)["env_host_ip"]["evidence"]
    assert "Init torch distributed ends" not in files[f"{head}/journal.log"]


def test_the_bundle_and_the_output_hold_no_secret(cluster, rendered, tmp_path):
    """A serving group with an API key and request logging; a prompt carries a token-shaped string."""
    head, worker = cluster.nodes
    for n in (worker, head):
        install(cluster, rendered, n.name, unit=edited(
            rendered[n.name]["unit"], ("--max-running-requests 2 ", "--max-running-requests 2 \\\n    --log-requests ")))
    start(cluster, worker.name, head.name)
    wait_journal(cluster, head.name, "The server is fired up")
    ask = {"model": "glm53", "max_tokens": 64,
           "messages": [{"role": "user", "content": f"my keys: {STRAY} {HF_TOKEN} {API_KEY}"}]}
    request = urllib.request.Request(f"http://{head.mgmt_ip}:30000/v1/chat/completions", data=json.dumps(ask).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 - the simulated head
        assert resp.status == 200
    wait_journal(cluster, head.name, STRAY)

    result, bundle = run_doctor(cluster.inventory, tmp_path)
    files = bundle_files(bundle)
    # The rank's lines and the env file are in the bundle...
    journal = files["spark-0/journal.log"]
    assert "Receive: obj=GenerateReqInput(" in journal and "my keys: <redacted> <redacted> <redacted>" in journal
    assert "SGLANG_API_KEY=<redacted>" in files["spark-0/unit.env"] and "HF_TOKEN=<redacted>" in files["spark-0/unit.env"]
    assert f"SGLANG_HOST_IP={head.fabric_ip}" in files["spark-0/unit.env"]
    # ...and no secret is, in any file (grep the raw tarball too: names and compressed bytes aside).
    raw = subprocess.run(["tar", "-xzOf", str(bundle)], capture_output=True, check=True).stdout
    for secret in (API_KEY, HF_TOKEN, STRAY):
        assert secret.encode() not in raw
        assert secret not in result.stdout
        assert secret not in json.dumps(result.events)
    # A serving group has no log fingerprint.
    log_ids = {"hybrid_state_cache", "tilelang_shared_memory", "processor_config_missing", "distributed_timeout",
               "init_hang", "out_of_memory", "download_at_boot"}
    for host in ("spark-0", "spark-1"):
        assert log_ids & set(findings(files, host)) == set(), host

"""playbooks/doctor.yml on simulated nodes: planted failures -> their remedies, a bundle without secrets.

Failures are planted in the journal of the rank's unit (tests/standins/lib/sglang_faults.py)
exactly where a real rank's output lands; the doctor reads them over SSH like on DGX OS.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook
from tests.standins.lib import sglang_faults as faults

pytestmark = pytest.mark.slow

BUNDLE_TASKS = {
    "Create the bundle's directories",
    "Write every node's redacted files",
    "Write the summary of all nodes",
    "Pack the bundle",
}
API_KEY = "sk-DoctorPlant3dKey0123456789"  # noqa: S105 - planted on purpose
HF_TOKEN = "hf_PlantedTokenAbCdEfGh0123456789xyz"  # noqa: S105 - planted on purpose
# Known to the doctor by neither value nor variable: only its shape can give it away.
STRAY = "hf_StrayTokenQwErTy9876543210AbCdEf"  # noqa: S105 - planted on purpose


def node(cluster, name):
    return next(n for n in cluster.nodes if n.name == name)


def sh(cluster, name, command):
    return sim.ssh(node(cluster, name), command, timeout=120)


def plant(cluster, name, fault, extra_lines=None):
    sh(cluster, name, faults.plant_command(fault, extra_lines=extra_lines))


def clear(cluster):
    # An installed unit (another module's deployment) would stop the transient unit of the same name.
    for n in cluster.nodes:
        sim.ssh(n, "systemctl disable --now sglang.service; rm -f /etc/systemd/system/sglang.service; "
                   "systemctl daemon-reload; " + faults.clear_command() + "; rm -rf /etc/sglang", check=False)


def run_doctor(inventory, tmp_path, **extravars):
    result = run_playbook("playbooks/doctor.yml", inventory,
                          extravars={"sglang_doctor_bundle_dir": str(tmp_path), **extravars})
    assert result.rc == 0, result.stdout[-4000:]
    bundles = sorted(tmp_path.glob("doctor-*.tar.gz"))
    assert len(bundles) == 1, list(tmp_path.iterdir())
    return result, bundles[0]


def bundle_files(bundle: Path) -> dict[str, str]:
    with tarfile.open(bundle) as tar:
        return {
            m.name.split("/", 1)[1]: tar.extractfile(m).read().decode("utf-8", errors="replace")
            for m in tar.getmembers() if m.isfile()
        }


def findings(files, host):
    return {f["id"]: f for f in json.loads(files[f"{host}/findings.json"])}


@pytest.fixture
def cluster(sim_cluster):
    clear(sim_cluster)
    yield sim_cluster
    clear(sim_cluster)


def test_each_planted_failure_maps_to_its_remedy(cluster, tmp_path):
    planted_worker = ["hybrid_cache", "tilelang_smem_drafter", "processor_config_repo_id", "nccl_timeout",
                      "download_at_boot"]
    for fault in planted_worker:
        plant(cluster, "spark-1", fault)
    plant(cluster, "spark-0", "oom_137")

    result, bundle = run_doctor(cluster.inventory, tmp_path)
    files = bundle_files(bundle)
    worker = findings(files, "spark-1")
    head = findings(files, "spark-0")

    expected = {
        "hybrid_cache": ("hybrid_state_cache", ["lower max-running-requests 2 -> 1",
                                                "sglang_server_flag_overrides: {max-running-requests: 1}"]),
        "tilelang_smem_drafter": ("tilelang_shared_memory", ["block_I=32, num_stages=1, threads=128",
                                                             "threads to 128 before block_I", "block_I=16", "drafter"]),
        "processor_config_repo_id": ("processor_config_missing", ["LOCAL directory", "sglang_server_model_dir"]),
        "nccl_timeout": ("distributed_timeout", ["sglang_server_fabric_interface", "MTU must be 9000",
                                                 "SGLANG_HOST_IP"]),
        "download_at_boot": ("download_at_boot", ["HF_HUB_OFFLINE=1", "playbooks/checkpoint.yml"]),
    }
    for fault, (finding_id, remedy_parts) in expected.items():
        assert finding_id in worker, f"{fault}: {sorted(worker)}"
        f = worker[finding_id]
        assert f["evidence"] in faults.LINES[fault][0], f"{fault}: evidence {f['evidence']!r}"
        for part in remedy_parts:
            assert part in f["remedy"], f"{fault}: {part!r} not in {f['remedy']!r}"
    assert "out_of_memory" not in worker
    assert set(head) & {finding_id for finding_id, _ in expected.values()} == set()
    assert "out_of_memory" in head
    assert "status=137" in head["out_of_memory"]["evidence"]
    assert "sglang_server_container_memory" in head["out_of_memory"]["cause"]

    # The same findings are printed for the operator, per node.
    shown = "\n".join(str(r.get("msg")) for r in result.results("Show the node's state, last lines and findings").values())
    assert "spark-1: Hybrid (mamba/linear-attention) state cache too small" in shown
    assert "spark-0: Rank killed for lack of memory (OOM / exit 137)" in shown

    # Read-only on the nodes: the only changes are the bundle's files on the controller.
    changed = {e["task"] for e in result.changed}
    assert changed <= BUNDLE_TASKS, changed
    for host in ("spark-0", "spark-1"):
        for name in ("journal.log", "unit.service", "unit.env", "server-args.json", "facts.json", "flags.json"):
            assert f"{host}/{name}" in files
    assert "Hybrid (mamba/linear-attention) state cache is too small" in files["spark-1/journal.log"]
    assert "summary.txt" in files


def test_a_start_that_hangs_after_init_points_at_the_fabric(cluster, tmp_path):
    plant(cluster, "spark-0", "init_hang")
    _, bundle = run_doctor(cluster.inventory, tmp_path, sglang_doctor_stall_seconds=1)
    head = findings(bundle_files(bundle), "spark-0")
    assert "init_hang" in head, sorted(head)
    assert "playbooks/restart.yml" in head["init_hang"]["remedy"]
    assert "SGLANG_HOST_IP" in head["init_hang"]["remedy"]


def test_a_fresh_start_is_not_called_a_hang(cluster, tmp_path):
    plant(cluster, "spark-0", "init_hang")
    _, bundle = run_doctor(cluster.inventory, tmp_path, sglang_doctor_stall_seconds=3600)
    assert "init_hang" not in findings(bundle_files(bundle), "spark-0")


def test_the_bundle_and_the_output_hold_no_secret(cluster, tmp_path):
    sh(cluster, "spark-0", "install -d -m 0700 /etc/sglang && umask 077 && printf '%s\\n' "
       "'NCCL_SOCKET_IFNAME=enp1s0f1np1' 'SGLANG_HOST_IP=10.0.0.1' 'HF_HUB_OFFLINE=1' "
       f"'SGLANG_API_KEY={API_KEY}' 'HF_TOKEN={HF_TOKEN}' > /etc/sglang/sglang.env")
    plant(cluster, "spark-0", "healthy", extra_lines=[
        f"server_args=ServerArgs(model_path='/models/glm53', api_key='{API_KEY}', port=30000)",
        f"request headers: Authorization: Bearer {API_KEY}",
        f"huggingface_hub: token {STRAY} is invalid",
    ])
    result, bundle = run_doctor(cluster.inventory, tmp_path, sglang_server_api_key=API_KEY)
    files = bundle_files(bundle)

    # The planted lines and the env file are in the bundle...
    assert "server_args=ServerArgs(model_path='/models/glm53', api_key='<redacted>'" in files["spark-0/journal.log"]
    assert "SGLANG_API_KEY=<redacted>" in files["spark-0/unit.env"]
    assert "SGLANG_HOST_IP=10.0.0.1" in files["spark-0/unit.env"]
    # ...and no secret is, in any file (grep the raw tarball too: names and compressed bytes aside).
    raw = subprocess.run(["tar", "-xzOf", str(bundle)], capture_output=True, check=True).stdout
    for secret in (API_KEY, HF_TOKEN, STRAY):
        assert secret.encode() not in raw
        assert secret not in result.stdout
        assert secret not in json.dumps(result.events)
    # The wrong SGLANG_HOST_IP in the planted env file is itself a finding.
    assert "env_host_ip" in findings(files, "spark-0")


def test_check_mode_runs_and_writes_nothing(cluster, tmp_path):
    plant(cluster, "spark-1", "hybrid_cache")
    result = run_playbook("playbooks/doctor.yml", cluster.inventory, check=True,
                          extravars={"sglang_doctor_bundle_dir": str(tmp_path)})
    assert result.rc == 0, result.stdout[-3000:]
    assert list(tmp_path.iterdir()) == []
    assert "spark-1: Hybrid (mamba/linear-attention) state cache too small" in result.stdout

"""What site.yml leaves on every simulated Spark node, observed over SSH."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.lib.seed import SEED_FLAGS
from tests.lib.unit_file import launch_args as unit_launch_args

HARNESS_INVENTORY = Path(os.environ.get("SPARK_SIM_STATE", "/run/spark-sim")) / os.environ.get(
    "SPARK_SIM_INSTANCE", "molecule") / "inventory" / "hosts.json"



def hostvars(host):
    return host.ansible.get_variables()


def fabric_ip_of(name):
    """Another node's fabric address, from the inventory the harness wrote."""
    inventory = json.loads(HARNESS_INVENTORY.read_text())["spark"]["children"]
    for group in inventory.values():
        if name in group["hosts"]:
            return group["hosts"][name]["spark_fabric_ip"]
    raise KeyError(name)


def head_name(host):
    return hostvars(host)["groups"]["spark_head"][0]


def launch_args(host):
    """The arguments after sglang.launch_server in the installed unit's ExecStart."""
    return unit_launch_args(host.file("/etc/systemd/system/spark-llm.service").content_string)


def test_node_runs_real_systemd(host):
    assert host.run("ps -o comm= -p 1").stdout.strip() == "systemd"
    assert host.run("systemctl is-system-running").stdout.strip() in ("running", "degraded")


def test_fabric_netplan_file(host):
    f = host.file("/etc/netplan/40-cx7.yaml")
    assert f.exists and f.user == "root" and f.mode == 0o600
    v = hostvars(host)
    assert f"{v['spark_fabric_ip']}/{v['spark_fabric_prefix']}" in f.content_string
    assert "mtu: 9000" in f.content_string
    # A one-rail site names no further rail, whatever ports the node has.
    assert "spark_fabric_extra_rails" not in v and "-rail" not in f.content_string


def test_fabric_live_mtu_and_address(host):
    v = hostvars(host)
    iface = v["spark_fabric_interface"]
    link = json.loads(host.check_output(f"ip -j link show {iface}"))[0]
    assert link["mtu"] == 9000
    addrs = json.loads(host.check_output(f"ip -j -4 addr show dev {iface}"))[0]["addr_info"]
    assert v["spark_fabric_ip"] in [a["local"] for a in addrs]


def test_head_trusts_workers_over_the_fabric(host):
    v = hostvars(host)
    if host.backend.get_hostname() != head_name(host):
        pytest.skip("trust goes from the head to the workers")
    for worker in v["groups"]["spark_workers"]:
        ip = fabric_ip_of(worker)
        out = host.run(
            "ssh -i /root/.ssh/id_spark_fabric -o BatchMode=yes -o StrictHostKeyChecking=yes "
            f"root@{ip} hostname"
        )
        assert out.rc == 0, out.stderr
        assert out.stdout.strip() == worker


def test_checkpoint_is_complete_and_stamped(host):
    # The inventory names no build and pins no directory: the site role's default (README, Checkpoint builds).
    model_dir = hostvars(host).get("spark_model_dir", "/opt/models/glm53")
    shards = host.run(f"ls {model_dir} | grep -c '^model-.*-of-00120.safetensors$'").stdout.strip()
    assert shards == "120"
    assert host.file(f"{model_dir}/processor_config.json").exists
    stamp = json.loads(host.file(f"{model_dir}.verified").content_string)
    assert stamp["mode"] == "deep"
    assert stamp["revision"] == hostvars(host)["checkpoint_revision"]


def test_env_file_is_private(host):
    f = host.file("/etc/spark-llm/spark-llm.env")
    assert f.exists and f.mode == 0o600
    v = hostvars(host)
    assert f"SGLANG_HOST_IP={v['spark_fabric_ip']}" in f.content_string
    assert f"NCCL_SOCKET_IFNAME={v['spark_fabric_interface']}" in f.content_string
    assert "HF_HUB_OFFLINE=1" in f.content_string
    settings = [line for line in f.content_string.splitlines() if line and not line.startswith("#")]
    # A one-rail site: the RoCE device behind the fabric port only, and the index of the RoCE v2 GID of its address.
    assert "NCCL_IB_HCA=rocep1s0f1" in settings
    assert "NCCL_IB_GID_INDEX=3" in settings


@pytest.mark.parametrize(("flag", "value"), SEED_FLAGS, ids=[f for f, _ in SEED_FLAGS])
def test_unit_carries_each_seed_flag(host, flag, value):
    args = launch_args(host)
    assert flag in args
    if value is not None:
        assert args[args.index(flag) + 1] == value


def test_unit_topology_flags(host):
    v = hostvars(host)
    args = launch_args(host)
    order = [head_name(host), *v["groups"]["spark_workers"]]
    me = host.backend.get_hostname()
    assert args[args.index("--node-rank") + 1] == str(order.index(me))
    assert args[args.index("--nnodes") + 1] == str(len(order))
    assert args[args.index("--tp-size") + 1] == str(len(order))
    assert args[args.index("--dist-init-addr") + 1] == f"{fabric_ip_of(order[0])}:20000"
    assert args[args.index("--model-path") + 1].startswith("/")


def test_rank_unit_is_active_and_enabled(host):
    svc = host.service("spark-llm")
    assert svc.is_running
    assert svc.is_enabled


def test_head_serves_the_model(host):
    if host.backend.get_hostname() != head_name(host):
        pytest.skip("only rank 0 serves HTTP")
    # With the key from the rank's key file (secure by default), through stdin: never on a command line.
    models = json.loads(host.check_output(
        "sed -n 's/^/Authorization: Bearer /p' /etc/spark-llm/spark-llm.key"
        " | curl -sf -H @- http://127.0.0.1:30000/v1/models"))
    assert len(models["data"]) == 1

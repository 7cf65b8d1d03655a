"""The simulated Spark nodes are real enough to test the playbooks on, and contained.

Nodes are observed over SSH, like an operator would, never through nsenter
(which would carry this machine's capabilities and give false passes).
"""

from __future__ import annotations

import ipaddress
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.harness import cluster as sim
from tests.lib import node_state

# These tests look at freshly booted nodes and change nothing (tests/conftest.py checks).
pytestmark = pytest.mark.shared_nodes


def sh(node, command, check=True):
    return sim.ssh(node, command, check=check)


def test_nodes_boot_real_systemd_with_own_identity(sim_cluster):
    ids = set()
    for node in sim_cluster.nodes:
        assert sh(node, "ps -o comm= -p 1").strip() == "systemd"
        state = sh(node, "systemctl is-system-running", check=False).strip()
        assert state in ("running", "degraded"), state
        assert sim.power_state(sim_cluster.instance, node.name) == "on"
        assert sh(node, "hostname").strip() == node.name
        ids.add(sh(node, "cat /etc/machine-id").strip())
        # The node's own cgroup v2 tree, not the host's.
        assert "0::/" in sh(node, "cat /proc/self/cgroup")
    assert len(ids) == len(sim_cluster.nodes)


def test_no_housekeeping_timer_changes_a_node_on_the_clock(sim_cluster):
    # dpkg-db-backup at midnight once wrote /var/backups/*.0 on every shared node mid-run and the
    # drift check blamed the module that happened to hold the pair.
    for node in sim_cluster.nodes:
        listed = sh(node, "systemctl list-timers --no-legend --plain").strip()
        assert listed == "", f"{node.name} schedules timers of its own:\n{listed}"


def test_host_keys_differ_and_are_pinned(sim_cluster):
    known = (sim_cluster.state_dir / "known_hosts").read_text().splitlines()
    ed = [line.split()[2] for line in known if "ssh-ed25519" in line]
    assert len(set(ed)) == len(sim_cluster.nodes)
    key, _ = sim.key_paths()
    node = sim_cluster.nodes[0]
    strict = subprocess.run(
        ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={sim_cluster.state_dir / 'known_hosts'}", f"root@{node.mgmt_ip}", "true"],
        capture_output=True, text=True, timeout=30,
    )
    assert strict.returncode == 0, strict.stderr


def test_fabric_port_is_unconfigured_like_a_fresh_dgx(sim_cluster):
    for node in sim_cluster.nodes:
        link = sh(node, f"ip -o link show {sim.FABRIC_IFACE}")
        assert "mtu 1500" in link
        assert sh(node, f"ip -4 -o addr show dev {sim.FABRIC_IFACE}").strip() == ""
        assert sh(node, f"test -d /sys/class/net/{sim.MGMT_IFACE} && echo yes").strip() == "yes"


def test_test_networks_never_leave_this_machine(sim_cluster):
    # From this machine the fabric subnet is refused locally, not routed out.
    probe = sim_cluster.nodes[1].fabric_ip
    out = subprocess.run(["ip", "route", "get", probe], capture_output=True, text=True)
    assert out.returncode != 0 or "unreachable" in out.stdout, out.stdout
    for node in sim_cluster.nodes:
        assert sh(node, "ip route show default").strip() == ""
        # Without a default route the kernel refuses before a packet is sent.
        r = sh(node, "ip route get 198.51.100.7 2>&1; echo rc=$?", check=False)
        assert "unreachable" in r and "rc=2" in r, r


def test_harness_changes_no_global_network_setting(sim_cluster):
    # Brought up by the fixture already; forwarding must still be as the host had it.
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == _IP_FORWARD_AT_IMPORT


_IP_FORWARD_AT_IMPORT = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()


def test_nodes_reach_each_other_and_the_bridge_only(sim_cluster):
    head, worker = sim_cluster.nodes[:2]
    assert "1 received" in sh(head, f"ping -c1 -W2 {worker.mgmt_ip}")
    assert "1 received" in sh(head, f"ping -c1 -W2 {sim_cluster.bridge_ip}")


def test_nvidia_smi_standin_answers_like_a_gb10_and_fails_like_one(sim_cluster):
    node = sim_cluster.nodes[1]
    q = "nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader"
    assert sh(node, q).strip() == "NVIDIA GB10, 12.1, 580.95.05"
    try:
        sim.set_knobs(sim_cluster.instance, node.name, {"gpu": {"present": False}})
        out = sh(node, q + "; echo rc=$?", check=False)
        assert "couldn't communicate with the NVIDIA driver" in out and "rc=9" in out
        sim.set_knobs(sim_cluster.instance, node.name, {"gpu": {"present": True, "installed": False}})
        assert "rc=127" in sh(node, q + " 2>/dev/null; echo rc=$?", check=False)
    finally:
        sim.set_knobs(sim_cluster.instance, node.name, {"gpu": {"present": True, "installed": True}})
    assert sh(node, q).startswith("NVIDIA GB10")


def until(node, path, expected, timeout=10.0):
    """What `path` on the node reads once it reads `expected`, or at the deadline (polled on the node)."""
    want, f = shlex.quote(expected), shlex.quote(path)
    script = (f"end=$(($(date +%s%N) + {int(timeout * 1e9)})); while :; do v=$(cat {f} 2>&1); "
              f'[ "$v" = {want} ] || [ $(date +%s%N) -gt $end ] && break; sleep 0.05; done; printf %s "$v"')
    return sh(node, script, check=False)


def test_roce_standin_follows_the_fabric_port_and_its_knobs(sim_cluster):
    node, dev = sim_cluster.nodes[0], sim.FABRIC_IFACE
    hca = f"/sys/class/infiniband/{sim.ROCE_HCA}"
    port = f"{hca}/ports/1"
    devinfo = f"ibv_devinfo -d {sim.ROCE_HCA} -i 1"
    # The product's own discovery: each HCA with its netdev, both rails of the cabled cage.
    assert set(sh(node, "ls -d /sys/class/infiniband/*/device/net/*").split()) == {
        f"{hca}/device/net/{dev}", f"/sys/class/infiniband/{sim.RAIL2_HCA}/device/net/{sim.RAIL2_IFACE}"}
    assert sh(node, f"cat {port}/state {port}/phys_state {port}/link_layer").splitlines() == [
        "4: ACTIVE", "5: LinkUp", "Ethernet"]
    gid = "0000:0000:0000:0000:0000:ffff:" + ipaddress.IPv4Address(node.fabric_ip).packed.hex(":", 2)
    saved = node_state.knobs_of(sim_cluster)
    try:
        sh(node, f"ip addr add {node.fabric_ip}/24 dev {dev}")
        assert until(node, f"{port}/gids/3", gid) == gid
        assert sh(node, f"cat {port}/gid_attrs/types/3 {port}/gid_attrs/ndevs/3").split("\n")[:2] == ["RoCE v2", dev]
        sh(node, f"ip link set {dev} down")
        assert until(node, f"{port}/state", "1: DOWN") == "1: DOWN"
        assert sh(node, f"cat {port}/phys_state").strip() == "3: Disabled"
        assert "state:\t\t\tPORT_DOWN (1)" in sh(node, devinfo)
        sh(node, f"ip link set {dev} up")
        assert until(node, f"{port}/state", "4: ACTIVE") == "4: ACTIVE"
        assert "\t\t\tactive_mtu:\t\t1024 (3)\n" in sh(node, devinfo)
        sh(node, f"ip link set {dev} mtu 9000")
        out = sh(node, devinfo)
        assert "\t\t\tmax_mtu:\t\t4096 (5)\n\t\t\tactive_mtu:\t\t4096 (5)\n" in out, out
        # A reload (Type=notify-reload) returns once the tree follows the knobs: nothing to wait for.
        sim.set_knobs(sim_cluster.instance, node.name, {"roce": {"roce_v2": False}})
        sh(node, "systemctl reload spark-sim-roce")
        types = sh(node, f"cat {port}/gid_attrs/types/*")
        assert "RoCE v2" not in types and types.count("IB/RoCE v1") == 2, types
        assert sh(node, f"cat {port}/gids/1").strip() == gid
        sim.set_knobs(sim_cluster.instance, node.name, {"roce": {"hcas": {}}})
        sh(node, "systemctl reload spark-sim-roce")
        assert sh(node, "test -e /sys/class/infiniband; echo $?").strip() == "1"
        out = sh(node, "ibv_devinfo 2>&1; echo rc=$?", check=False)
        assert out == "Failed to get IB devices list: Function not implemented\nrc=255\n", out
    finally:
        sh(node, f"ip addr del {node.fabric_ip}/24 dev {dev}; ip link set {dev} mtu 1500 up", check=False)
        node_state.restore_knobs(sim_cluster, saved)
        sh(node, "systemctl reload spark-sim-roce")
    assert until(node, f"{port}/state", "4: ACTIVE") == "4: ACTIVE"
    assert sh(node, f"ls {port}/gid_attrs/types").split() == ["0", "1"]


@pytest.mark.timeout_hint(120)
def test_three_nodes_on_a_switch_and_complete_teardown():
    """A larger site needs only more hosts; teardown leaves nothing behind."""
    c = sim.up("tdown", 3)
    index = c.index
    try:
        assert [n.name for n in c.nodes] == ["spark-0", "spark-1", "spark-2"]
        # Fabric through the switch: give two nodes addresses by hand and ping.
        for n in c.nodes:
            sim.ssh(n, f"ip addr add {n.fabric_ip}/24 dev {sim.FABRIC_IFACE}")
        assert "1 received" in sim.ssh(c.nodes[0], f"ping -c1 -W2 {c.nodes[2].fabric_ip}")
        # The second rail through its own bridge of the switch: unplugging one node's cable takes its carrier.
        rail2 = c.rail2_subnet.rsplit(".", 1)[0]
        for n in c.nodes:
            sim.ssh(n, f"ip addr add {rail2}.{10 + n.rank}/24 dev {sim.RAIL2_IFACE}")
        assert "1 received" in sim.ssh(c.nodes[0], f"ping -c1 -W2 {rail2}.12")
        sim.unplug_rail("tdown", "spark-2")
        assert "NO-CARRIER" in sim.ssh(c.nodes[2], f"ip link show {sim.RAIL2_IFACE}")
        sim.unplug_rail("tdown", "spark-2", plugged=True)
        assert "NO-CARRIER" not in sim.ssh(c.nodes[2], f"ip link show {sim.RAIL2_IFACE}")
        # Keep an SSH master open, as Ansible's ControlPersist does, across the shutdown.
        key, _ = sim.key_paths()
        master = subprocess.Popen(
            ["ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
             "-o", "LogLevel=ERROR", f"root@{c.nodes[1].mgmt_ip}", "sleep 600"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    finally:
        sim.down("tdown")
    master.wait(timeout=30)
    assert sim.leftovers("tdown", index) == []

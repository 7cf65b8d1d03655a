"""Power cycles of simulated nodes keep their disks, as a real machine's do.

`power_off` pulls the plug (the machine is killed, no shutdown runs), `power_on` boots the same
root filesystem on the same network, `power_cycle` does both for one node or several at once; a
reboot from inside (`systemctl reboot`) comes back by itself. Power cycling changes node state,
so this module has a pair of its own (no shared_nodes mark). Nodes are observed over SSH.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.harness import cluster as sim

BOOT_PROBE = "/var/lib/spark-sim-boot-probe"
STOP_PROBE = "/var/lib/spark-sim-stop-probe"
# Enabled like any service: it records each boot it starts in, and each orderly stop.
PROBE_UNIT = f"""[Unit]
Description=Records each boot and each orderly stop (test of the harness's power cycles)

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'cat /proc/sys/kernel/random/boot_id >> {BOOT_PROBE}'
ExecStop=/bin/sh -c 'cat /proc/sys/kernel/random/boot_id >> {STOP_PROBE}'

[Install]
WantedBy=multi-user.target
"""


def sh(node, command, check=True, timeout=60):
    return sim.ssh(node, command, check=check, timeout=timeout)


def boot_id(node):
    return sh(node, "cat /proc/sys/kernel/random/boot_id").strip()


def booted(node):
    """The node's boot has finished (enabled units started), and its boot id."""
    state = sh(node, "systemctl is-system-running --wait", check=False, timeout=180).strip()
    assert state in ("running", "degraded"), state
    return boot_id(node)


def lines(node, path):
    return sh(node, f"cat {path} 2>/dev/null || true").split()


def fabric_ping(node, peer):
    """The peer answers on the fabric: waits for the first reply (up to 30 s), not a fixed time."""
    out = sh(node, f"ping -c1 -w30 {peer.fabric_ip}", check=False, timeout=60)
    return "1 received" in out


def fabric_ping_once(node, peer):
    return "1 received" in sh(node, f"ping -c1 -W1 {peer.fabric_ip}", check=False)


def facts(node):
    """What must survive a power cycle: a file on the disk, the machine's identity, its host keys."""
    return {
        "marker": sh(node, "cat /root/power-marker").strip(),
        "machine_id": sh(node, "cat /etc/machine-id").strip(),
        "host_keys": sh(node, "cat /etc/ssh/ssh_host_*_key.pub"),
    }


@pytest.fixture(scope="module")
def pair(sim_cluster):
    """Both nodes as an operator leaves them: a file on the disk, the fabric configured in their own
    netplan (so each boot brings it back), and an enabled unit."""
    head, worker = sim_cluster.nodes
    for node in (head, worker):
        sh(node, f"echo {uuid.uuid4()} > /root/power-marker")
        netplan = (f"network:\n  version: 2\n  renderer: networkd\n  ethernets:\n    {sim.FABRIC_IFACE}:\n"
                   f"      addresses: [{node.fabric_ip}/24]\n")
        sh(node, f"umask 077 && printf '%s' {shlex.quote(netplan)} > /etc/netplan/60-fabric.yaml && netplan apply")
        sh(node, f"printf '%s' {shlex.quote(PROBE_UNIT)} > /etc/systemd/system/spark-sim-probe.service && "
                 "systemctl daemon-reload && systemctl enable --now spark-sim-probe.service")
    assert fabric_ping(head, worker)
    return sim_cluster


def test_a_power_cycle_keeps_the_disk_identity_and_host_keys(pair):
    worker = pair.nodes[1]
    before, old_boot = facts(worker), boot_id(worker)
    sim.power_cycle(pair.instance, [worker.name])
    # sshd answers when power_cycle returns.
    assert sh(worker, "true", timeout=10) == ""
    assert sim.power_state(pair.instance, worker.name) == "on"
    assert facts(worker) == before
    assert boot_id(worker) != old_boot
    # The host keys pinned in the inventory still match: strict checking passes.
    key, _ = sim.key_paths()
    strict = subprocess.run(
        ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={pair.state_dir / 'known_hosts'}", f"root@{worker.mgmt_ip}", "true"],
        capture_output=True, text=True, timeout=30,
    )
    assert strict.returncode == 0, strict.stderr


def test_after_a_power_cycle_the_fabric_link_works_and_enabled_units_ran_again(pair):
    head, worker = pair.nodes
    sim.power_cycle(pair.instance, [worker.name])
    boot = booted(worker)
    # The enabled unit started in this boot; the plug was pulled, so it never stopped.
    assert lines(worker, BOOT_PROBE)[-1] == boot
    assert len(lines(worker, BOOT_PROBE)) >= 3
    assert lines(worker, STOP_PROBE) == []
    # The node's own netplan brought its fabric address back; the head reaches it and back.
    assert fabric_ping(head, worker)
    assert fabric_ping(worker, head)


def test_a_powered_off_node_is_gone_and_its_peer_loses_the_fabric_link(pair):
    head, worker = pair.nodes
    carrier = f"cat /sys/class/net/{sim.FABRIC_IFACE}/carrier"
    assert sh(head, carrier).strip() == "1"
    sim.power_off(pair.instance, worker.name)
    try:
        assert sim.power_state(pair.instance, worker.name) == "off"
        assert sh(head, carrier, check=False).strip() in ("0", "")
        assert not fabric_ping_once(head, worker)
        probe = subprocess.run(sim.ssh_base(worker) + ["true"], capture_output=True, timeout=30)
        assert probe.returncode != 0
        with pytest.raises(RuntimeError, match="is on"):
            sim.power_on(pair.instance, head.name)
    finally:
        sim.power_on(pair.instance, worker.name)
    assert sh(head, carrier).strip() == "1"
    assert fabric_ping(head, worker)


def test_both_nodes_power_cycle_at_once(pair):
    before = {node.name: (facts(node), boot_id(node)) for node in pair.nodes}
    nodes = sim.power_cycle(pair.instance, None, off_seconds=1.0)
    assert [n.name for n in nodes] == [n.name for n in pair.nodes]
    for node in pair.nodes:
        assert sim.power_state(pair.instance, node.name) == "on"
        assert facts(node) == before[node.name][0]
        boot = booted(node)
        assert boot != before[node.name][1]
        assert lines(node, BOOT_PROBE)[-1] == boot
    head, worker = pair.nodes
    assert fabric_ping(head, worker)


def test_the_cli_power_cycles_all_nodes_or_the_named_ones(pair):
    harness = [sys.executable, "-m", "tests.harness"]
    old = {node.name: boot_id(node) for node in pair.nodes}
    cli = subprocess.run([*harness, "power-cycle", "-i", pair.instance, "--all"], capture_output=True, text=True,
                         timeout=300, cwd=sim.REPO)
    assert cli.returncode == 0, cli.stderr
    assert all(boot_id(node) != old[node.name] for node in pair.nodes)
    worker = pair.nodes[1]
    for command in ("power-off", "power-on"):
        cli = subprocess.run([*harness, command, "-i", pair.instance, worker.name], capture_output=True, text=True,
                             timeout=300, cwd=sim.REPO)
        assert cli.returncode == 0, cli.stderr
    assert sim.power_state(pair.instance, worker.name) == "on"
    status = subprocess.run([*harness, "status"], capture_output=True, text=True, timeout=60, cwd=sim.REPO)
    assert f"{worker.name}={worker.mgmt_ip} (on)" in status.stdout
    # Nodes are named or --all, not both, not neither.
    for wrong in ([], ["--all", worker.name]):
        cli = subprocess.run([*harness, "power-cycle", "-i", pair.instance, *wrong], capture_output=True, text=True,
                             timeout=60, cwd=sim.REPO)
        assert cli.returncode == 2 and "name the nodes or give --all" in cli.stderr


def wait_for_new_boot(node, old, timeout=120):
    """The node went down and came back: its boot id changed (polled over SSH until it answers)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            now = sim.ssh(node, "cat /proc/sys/kernel/random/boot_id", timeout=10).strip()
            if now != old:
                return now
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        assert time.monotonic() < deadline, f"{node.name} did not come back within {timeout} s"
        time.sleep(0.5)


def test_a_reboot_from_inside_comes_back_by_itself(pair):
    head, worker = pair.nodes
    old = booted(worker)
    stops = len(lines(worker, STOP_PROBE))
    sh(worker, "systemctl reboot", check=False)
    boot = wait_for_new_boot(worker, old)
    assert sim.power_state(pair.instance, worker.name) == "on"
    assert booted(worker) == boot
    assert lines(worker, BOOT_PROBE)[-1] == boot
    # An orderly reboot: the unit was stopped this time.
    assert len(lines(worker, STOP_PROBE)) == stops + 1
    assert fabric_ping(head, worker)
    assert "the node rebooted itself" in (Path(worker.dir) / "console.log").read_text()


def test_a_poweroff_from_inside_is_seen_and_power_on_boots_the_same_disk(pair):
    worker = pair.nodes[1]
    before = facts(worker)
    sh(worker, "systemctl poweroff", check=False)
    deadline = time.monotonic() + 60
    while sim.power_state(pair.instance, worker.name) == "on":
        assert time.monotonic() < deadline, "the node did not go off"
        time.sleep(0.2)
    sim.power_on(pair.instance, worker.name)
    assert facts(worker) == before
    assert fabric_ping(pair.nodes[0], worker)

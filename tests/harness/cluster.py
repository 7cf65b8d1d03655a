"""Simulated DGX Spark clusters: N booted systemd-nspawn nodes on one machine.

Each node is a Debian system with systemd as PID 1 in a network namespace of
its own. Nodes reach this machine over a management bridge and each other over
two fabric rails named like the ConnectX-7 ports of a DGX Spark's cabled QSFP
cage (the second through a bridge in the cluster's switch namespace). No test address is routable from
the root namespace except through the harness's own bridge, and nothing here
touches a global network setting of the machine.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import image
from .util import log, run

REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "tests" / "standins"
TEST_GROUP_VARS = REPO / "tests" / "inventory" / "group_vars"

STATE_ROOT = Path(os.environ.get("SPARK_SIM_STATE", "/run/spark-sim"))
WORK_ROOT = Path(os.environ.get("SPARK_SIM_WORK", "/var/tmp/spark-sim"))
CACHE_ROOT = Path(os.environ.get("SPARK_SIM_CACHE", "/var/cache/spark-sim"))

MGMT_IFACE = "enP7s7"  # the DGX Spark's onboard 10GbE port
FABRIC_IFACE = "enp1s0f1np1"  # the ConnectX-7 port NVIDIA's two-Spark guide cables
# Its RDMA device, as mlx5 names it (the RoCE stand-in: tests/standins/units/spark-sim-roce.service).
ROCE_HCA = "rocep1s0f1"
# The same QSFP cage's second rail (its own PCIe link, netdev and RDMA device), cabled through a
# bridge in the cluster's switch namespace so that a test can unplug one node's end (unplug_rail).
RAIL2_IFACE = "enP2p1s0f1np1"
RAIL2_HCA = "roceP2p1s0f1"
# A ring of three or four nodes without a switch (up(ring=True)): each node's two QSFP ports, the first cabled to
# the next node's second, their RDMA devices, the device the node address lives on, and the cables' subnet.
RING_PORTS = ("enp1s0f0np0", "enp1s0f1np1")
RING_HCAS = {"rocep1s0f0": "enp1s0f0np0", "rocep1s0f1": "enp1s0f1np1"}
RING_NODE_IFACE = "fabric0"
RING_BASE = "10.234"
# Two /16s no ordinary site uses; one /24 of each per cluster instance.
MGMT_BASE = "10.231"
FABRIC_BASE = "10.232"
RAIL2_BASE = "10.233"  # the second rail's subnet, one /24 per instance like the fabric's
MAX_INSTANCES = 200
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")


@dataclass
class Node:
    name: str
    rank: int
    mgmt_ip: str
    fabric_ip: str
    netns: str
    host_veth: str
    pid: int = 0
    dir: str = ""


@dataclass
class Cluster:
    instance: str
    index: int
    bridge: str
    bridge_ip: str
    fabric_subnet: str
    switch_netns: str | None
    # How many rails the inventory names (the nodes always have both): 1 is a one-rail site.
    site_rails: int = 2
    # How many TP groups the inventory makes of the nodes (the child groups replica_a, replica_b, ... of
    # spark_tp_groups, equal in size, in node order); 1 is today's one-group inventory.
    tp_groups: int = 1
    # A ring: the nodes (in this order of ranks) cabled around it, each one's first port to the next's second.
    ring: list[int] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    hub_pid: int = 0
    hub_url: str = ""
    hub_revision: str = ""

    @property
    def state_dir(self) -> Path:
        return STATE_ROOT / self.instance

    @property
    def rail2_subnet(self) -> str:
        return f"{RAIL2_BASE}.{self.index}.0/24"

    @property
    def ring_subnet(self) -> str:
        return f"{RING_BASE}.{self.index}.0/24"

    @property
    def inventory(self) -> Path:
        return self.state_dir / "inventory"

    def save(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "cluster.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, instance: str) -> Cluster | None:
        path = STATE_ROOT / instance / "cluster.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        data["nodes"] = [Node(**n) for n in data["nodes"]]
        return cls(**data)


def _cgroup_root() -> Path:
    # Pure cgroup v2 hosts mount it at /sys/fs/cgroup; hybrid hosts under unified/.
    for candidate in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (candidate / "cgroup.procs").exists() and (candidate / "cgroup.subtree_control").exists():
            return candidate
    raise RuntimeError("harness: no cgroup v2 hierarchy found under /sys/fs/cgroup")


def _node_cgroup(instance: str, node: str) -> Path:
    return _cgroup_root() / "spark-sim" / instance / node


# On a hybrid host nspawn also files each node in the named v1 hierarchy.
_V1_SYSTEMD = Path("/sys/fs/cgroup/systemd")


def _cgroup_dirs(instance: str, node: str | None = None) -> list[Path]:
    """The node's (or the instance's) cgroup directories in every hierarchy they appear in."""
    tail = Path("spark-sim") / instance / (node or "")
    return [root / tail for root in (_cgroup_root(), _V1_SYSTEMD) if (root / "cgroup.procs").exists()]


def _allocate_index(instance: str) -> int:
    used = set()
    if STATE_ROOT.exists():
        for d in STATE_ROOT.iterdir():
            path = d / "cluster.json"
            if d.name != instance and path.exists():
                used.add(json.loads(path.read_text())["index"])
    for i in range(1, MAX_INSTANCES):
        if i not in used:
            return i
    raise RuntimeError("harness: no free cluster index; tear down old instances")


def key_paths() -> tuple[Path, Path]:
    keydir = CACHE_ROOT / "keys"
    key = keydir / "id_ed25519"
    if not key.exists():
        keydir.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "spark-sim", "-f", str(key)])
    return key, key.with_suffix(".pub")


def _lock():
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    f = open(STATE_ROOT / ".lock", "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def up(instance: str = "sim", nodes: int = 2, knobs: dict[str, dict] | None = None, hub: bool = False,
       site_rails: int = 2, *, tp_groups: int = 1, ring: bool = False) -> Cluster:
    """`ring`: the nodes (three or four, one TP group) cabled in a ring without a switch, each one's first QSFP port
    to the next node's second (recable() changes the order), with the RoCE devices of both ports."""
    if ring and (nodes not in (3, 4) or tp_groups != 1):
        raise SystemExit("harness: a ring is one TP group of three or four nodes")
    if not NAME_RE.match(instance):
        raise SystemExit(f"harness: instance name {instance!r} must match {NAME_RE.pattern}")
    if nodes < 2:
        raise SystemExit("harness: a TP cluster needs at least 2 nodes")
    if tp_groups < 1 or nodes % tp_groups or nodes // tp_groups < 2:
        raise SystemExit(f"harness: {nodes} nodes make no {tp_groups} TP groups of at least 2 nodes each")
    rootfs = image.ensure_image(CACHE_ROOT)
    wheels = image.ensure_wheelhouse(CACHE_ROOT, rootfs)
    with _lock():
        existing = Cluster.load(instance)
        if existing:
            log(f"instance {instance} exists; tearing it down first")
            _down(existing)
        index = _allocate_index(instance)
        cluster = Cluster(
            instance=instance,
            index=index,
            bridge=f"spsim{index}br",
            bridge_ip=f"{MGMT_BASE}.{index}.1",
            fabric_subnet=f"{FABRIC_BASE}.{index}.0/24",
            switch_netns=f"spsim-{instance}-sw",
            site_rails=site_rails,
            tp_groups=tp_groups,
            ring=list(range(nodes)) if ring else [],
        )
        for rank in range(nodes):
            cluster.nodes.append(
                Node(
                    name=f"spark-{rank}",
                    rank=rank,
                    mgmt_ip=f"{MGMT_BASE}.{index}.{10 + rank}",
                    fabric_ip=f"{FABRIC_BASE}.{index}.{10 + rank}",
                    netns=f"spsim-{instance}-{rank}",
                    host_veth=f"spsim{index}m{rank}",
                    dir=str(WORK_ROOT / instance / f"spark-{rank}"),
                )
            )
        cluster.save()  # saved early so that a failed bring-up can still be torn down
        try:
            _network_up(cluster)
            for node in cluster.nodes:
                node_knobs = (knobs or {}).get(node.name, {})
                if ring:
                    node_knobs = {**node_knobs, "roce": {"hcas": RING_HCAS, **node_knobs.get("roce", {})}}
                _prepare_node(cluster, node, rootfs, wheels, node_knobs)
            for node in cluster.nodes:
                _boot(cluster, node)
                cluster.save()
            for node in cluster.nodes:
                _wait_ready(node)
            if hub:
                _start_hub(cluster)
            _write_inventory(cluster)
        except BaseException:
            log("bring-up failed; tearing down what was created")
            _down(cluster)
            raise
        cluster.save()
    log(f"instance {instance}: {nodes} nodes up; inventory {cluster.inventory}")
    return cluster


def regroup(instance: str, tp_groups: int) -> Cluster:
    """Write the instance's inventory again for `tp_groups` TP groups (equal in size, in node order), as an
    operator regroups the same Sparks: the nodes, their state and the controller's .credentials stay."""
    with _lock():
        c = _load(instance)
        if tp_groups < 1 or len(c.nodes) % tp_groups or len(c.nodes) // tp_groups < 2:
            raise SystemExit(f"harness: {len(c.nodes)} nodes make no {tp_groups} TP groups of at least 2 nodes each")
        c.tp_groups = tp_groups
        _write_inventory(c)
        c.save()
    return c


def reinstall(instance: str, node: str, knobs: dict | None = None) -> Node:
    """Re-provision one node like a fresh OS install: same name, addresses and cabling;
    new root filesystem, machine-id and SSH host keys; fabric port back to MTU 1500
    with no address and no firewall rules. The other nodes keep running."""
    rootfs = image.ensure_image(CACHE_ROOT)
    wheels = image.ensure_wheelhouse(CACHE_ROOT, rootfs)
    with _lock():
        c, n = _find_node(instance, node)
        _halt(c, n)
        # The namespace outlives the node: undo what the old OS configured in it.
        run(["ip", "-n", n.netns, "addr", "flush", "dev", FABRIC_IFACE])
        run(["ip", "-n", n.netns, "link", "set", FABRIC_IFACE, "mtu", "1500"])
        run(["nsenter", f"--net=/run/netns/{n.netns}", f"--root={rootfs}", "nft", "flush", "ruleset"])
        _prepare_node(c, n, rootfs, wheels, knobs or {})
        _boot(c, n)
        c.save()
        _wait_ready(n)
        _write_inventory(c)
        c.save()
    log(f"instance {instance}: {node} reinstalled")
    return n


def power_off(instance: str, node_name: str) -> Node:
    """Pull the node's plug: its machine is killed at once, no shutdown runs. Its disk (the root
    filesystem overlay: machine-id, SSH host keys, /etc, the knobs file) stays, as do its namespace
    and cabling; its NICs lose their links, addresses and runtime firewall (_nic_off). A node that
    is off already stays off."""
    with _lock():
        c, n = _find_node(instance, node_name)
        _power_off(c, n)
        c.save()
    log(f"instance {instance}: {node_name} powered off")
    return n


def power_on(instance: str, node_name: str, timeout: float = 90) -> Node:
    """Boot a node that is off with the disk and network it had: same root filesystem, management
    address, fabric link and knobs. Returns once its sshd answers (the boot may still be starting
    units: enabled units start as on a real machine). A node that shut itself down (a poweroff from
    inside, its supply's pid gone) is cleaned up and booted the same way."""
    with _lock():
        c, n = _find_node(instance, node_name)
        _power_on(c, n)
        c.save()
    _wait_ssh(n, timeout)
    log(f"instance {instance}: {node_name} powered on")
    return n


def power_cycle(instance: str, node_names, off_seconds: float = 0.0, timeout: float = 90) -> list[Node]:
    """Power the named nodes (None or empty: all of them) off together, keep them off for
    off_seconds, then on together; returns once every one's sshd answers."""
    with _lock():
        c = _load(instance)
        nodes = _nodes(c, node_names)
        for n in nodes:
            _power_off(c, n)
        c.save()
    log(f"instance {instance}: {', '.join(n.name for n in nodes)} powered off")
    if off_seconds > 0:
        time.sleep(off_seconds)
    with _lock():
        c = _load(instance)
        nodes = _nodes(c, [n.name for n in nodes])
        for n in nodes:
            _power_on(c, n)
        c.save()
    for n in nodes:
        _wait_ssh(n, timeout)
    log(f"instance {instance}: {', '.join(n.name for n in nodes)} powered on")
    return nodes


def client_address(instance: str, host: int = 250) -> str:
    """A second address of this machine on the instance's management bridge, `{MGMT_BASE}.<index>.<host>`:
    a socket bound to it reaches the nodes as another machine on their network would, from an
    address that is not the controller's (the bridge's own address stays the source the kernel
    picks). Added once; it goes with the bridge when the instance is torn down."""
    with _lock():
        c = _load(instance)
        taken = {c.bridge_ip, *(n.mgmt_ip for n in c.nodes)}
        address = f"{MGMT_BASE}.{c.index}.{host}"
        if not 2 <= host <= 254 or address in taken:
            raise ValueError(f"harness: {address} is not free on {c.bridge}")
        run(["ip", "addr", "replace", f"{address}/24", "dev", c.bridge])
    return address


def instance_nodes(instance: str) -> list[Node]:
    return list(_load(instance).nodes)


def power_state(instance: str, node_name: str) -> str:
    """"on" while the node's power supply runs (a reboot from inside keeps it on), else "off"."""
    _, n = _find_node(instance, node_name)
    return "on" if n.pid and _alive(n.pid) else "off"


def wait_ssh(instance: str, node_name: str, timeout: float = 90) -> Node:
    """Wait until the node's sshd answers (e.g. after a reboot from inside)."""
    _, n = _find_node(instance, node_name)
    _wait_ssh(n, timeout)
    return n


def _power_off(c: Cluster, n: Node) -> None:
    _close_mux(n)
    if n.pid and not _alive(n.pid):
        log(f"{n.name} had shut itself down (its power supply, pid {n.pid}, is gone)")
    # Everything of the node at once: the supply, nspawn and every process inside.
    _kill_cgroup(_node_cgroup(c.instance, n.name))
    _reap(n.pid)
    # A stale subtree left from the old boot hangs the next systemd in it.
    for cg in _cgroup_dirs(c.instance, n.name):
        _rmdir_tree(cg)
    shutil.rmtree(f"/run/systemd/nspawn/propagate/spsim-{c.instance}-{n.name}", ignore_errors=True)
    for cmd in _nic_off(n):
        run(cmd, check=False, quiet=True)
    n.pid = 0


def _power_on(c: Cluster, n: Node) -> None:
    if n.pid and _alive(n.pid):
        raise RuntimeError(f"harness: {n.name} of instance {c.instance} is on (power supply pid {n.pid})")
    if not os.path.ismount(Path(n.dir) / "merged"):
        raise RuntimeError(f"harness: {n.name} of instance {c.instance} has no disk ({n.dir}/merged is not mounted)")
    _power_off(c, n)  # what a node that went off by itself left behind
    for cmd in _nic_on(n):
        run(cmd, quiet=True)
    _boot(c, n)


# The power supplies this process started, kept so that no Popen finalizer reaps one behind
# our back: reaping a supply adds the CPU of the node processes it waited for to this process's
# RUSAGE_CHILDREN, and tests/conftest.py counts the nodes from their cgroups instead.
_SUPPLIES: dict[int, subprocess.Popen] = {}
_REAPED = {"cpu": 0.0}


def instance_cpu_seconds(instance: str) -> float:
    """CPU seconds every node of an instance used so far (0 when it is down): the test suite's accounting."""
    try:
        stat = (_cgroup_root() / "spark-sim" / instance / "cpu.stat").read_text()
    except (OSError, RuntimeError):
        return 0.0
    return int(stat.split("usage_usec ", 1)[1].split()[0]) / 1e6


def reaped_supply_cpu() -> float:
    """CPU seconds the supplies reaped so far brought into this process's RUSAGE_CHILDREN."""
    return _REAPED["cpu"]


def _reap(pid: int) -> None:
    """Collect the exit status of a supply this process started, so that it leaves no zombie."""
    if not pid:
        return
    try:
        done, _status, usage = os.wait4(pid, os.WNOHANG)
    except ChildProcessError:
        _SUPPLIES.pop(pid, None)
        return
    if done:
        _REAPED["cpu"] += usage.ru_utime + usage.ru_stime
        supply = _SUPPLIES.pop(pid, None)
        if supply is not None:
            # Reaped here: its Popen must not wait for it again.
            supply.returncode = os.waitstatus_to_exitcode(_status)


def _wait_ssh(n: Node, timeout: float = 90) -> None:
    """Until sshd on the node runs a command (the event itself, polled; no fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        if not (n.pid and _alive(n.pid)):
            raise RuntimeError(f"harness: {n.name} is off (its power supply exited); see {n.dir}/console.log")
        try:
            with socket.create_connection((n.mgmt_ip, 22), timeout=2):
                pass
            if subprocess.run(ssh_base(n) + ["true"], capture_output=True, timeout=30).returncode == 0:
                return
        except (OSError, subprocess.TimeoutExpired):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"harness: {n.name}'s sshd does not answer after {timeout}s; see {n.dir}/console.log")
        time.sleep(0.2)


def _halt(c: Cluster, n: Node) -> None:
    """Power a node off and remove its root filesystem (its namespace stays)."""
    _close_mux(n)
    if n.pid and _alive(n.pid):
        os.kill(n.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while n.pid and _alive(n.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    _kill_cgroup(_node_cgroup(c.instance, n.name))
    _reap(n.pid)
    # A stale subtree left from the old boot hangs the next systemd in it.
    for cg in _cgroup_dirs(c.instance, n.name):
        _rmdir_tree(cg)
    merged = Path(n.dir) / "merged"
    if os.path.ismount(merged):
        if subprocess.run(["umount", str(merged)], capture_output=True).returncode != 0:
            run(["umount", "-l", str(merged)], check=False, quiet=True)
    shutil.rmtree(n.dir, ignore_errors=True)
    shutil.rmtree(f"/run/systemd/nspawn/propagate/spsim-{c.instance}-{n.name}", ignore_errors=True)
    n.pid = 0


def _network_up(c: Cluster) -> None:
    run(["ip", "link", "add", c.bridge, "type", "bridge"])
    run(["ip", "addr", "add", f"{c.bridge_ip}/24", "dev", c.bridge])
    run(["ip", "link", "set", c.bridge, "up"])
    # The fabric subnet exists only between node namespaces; from here it
    # must fail at once rather than follow the default route off the machine.
    run(["ip", "route", "add", "unreachable", c.fabric_subnet])
    run(["ip", "route", "add", "unreachable", c.rail2_subnet])
    sw = c.switch_netns
    run(["ip", "netns", "add", sw])
    for n in c.nodes:
        run(["ip", "netns", "add", n.netns])
        run(["ip", "-n", n.netns, "link", "set", "lo", "up"])
        # Created with final names: veth has no permanent MAC to match on.
        run(["ip", "link", "add", n.host_veth, "type", "veth", "peer", "name", MGMT_IFACE, "netns", n.netns])
        run(["ip", "link", "set", n.host_veth, "master", c.bridge, "up"])
        run(["ip", "-n", n.netns, "addr", "add", f"{n.mgmt_ip}/24", "dev", MGMT_IFACE])
        run(["ip", "-n", n.netns, "link", "set", MGMT_IFACE, "up"])
    if c.ring:
        run(["ip", "route", "add", "unreachable", c.ring_subnet])
        _ring_cables(c)
        return
    if len(c.nodes) == 2:
        a, b = c.nodes
        # The DGX back-to-back cable.
        run(["ip", "link", "add", FABRIC_IFACE, "netns", a.netns, "type", "veth",
             "peer", "name", FABRIC_IFACE, "netns", b.netns])
        for n in (a, b):
            run(["ip", "-n", n.netns, "link", "set", FABRIC_IFACE, "up"])
    else:
        # A jumbo-capable switch: a bridge in a namespace of its own.
        _switched(c, "fabric", FABRIC_IFACE, "port")
    _switched(c, "rail2", RAIL2_IFACE, "rail2port")


def _ring_cables(c: Cluster, closed: bool = True) -> None:
    """The ring's cables in c.ring's order: each node's first port to the next node's second. Not `closed`: the last
    cable is out - the two ports it joined are there, without carrier (their far ends lie unplugged in the switch
    namespace)."""
    by_rank = {n.rank: n for n in c.nodes}
    order = [by_rank[r] for r in c.ring]
    for k, a in enumerate(order):
        b = order[(k + 1) % len(order)]
        if closed or k < len(order) - 1:
            run(["ip", "link", "add", RING_PORTS[0], "netns", a.netns, "type", "veth",
                 "peer", "name", RING_PORTS[1], "netns", b.netns])
            continue
        for n, port, loose in ((a, RING_PORTS[0], "ringout0"), (b, RING_PORTS[1], "ringout1")):
            run(["ip", "link", "add", port, "netns", n.netns, "type", "veth", "peer", "name", loose,
                 "netns", c.switch_netns])
    for n in order:
        for port in RING_PORTS:
            run(["ip", "-n", n.netns, "link", "set", port, "up"])


def recable(instance: str, order: list[str], closed: bool = True) -> Cluster:
    """Cable the ring again in the order of the nodes named (as a site that moved its cables): the ports go and come
    back, and with them the nodes' carrier, addresses and RDMA devices, as when cables are pulled and plugged. Not
    `closed`: the cable from the last node named back to the first is left out."""
    with _lock():
        c = _load(instance)
        by_name = {n.name: n for n in c.nodes}
        if not c.ring or sorted(order) != sorted(by_name):
            raise SystemExit(f"harness: {order} is no ring order of {sorted(by_name)}")
        for n in c.nodes:
            for port in RING_PORTS:
                run(["ip", "-n", n.netns, "link", "del", port], check=False, quiet=True)
        c.ring = [by_name[name].rank for name in order]
        _ring_cables(c, closed)
        c.save()
    return c


def _switched(c: Cluster, bridge: str, iface: str, port_prefix: str) -> None:
    """Each node's `iface` on a jumbo-capable bridge `bridge` of the switch namespace, port `<port_prefix><rank>`."""
    sw = c.switch_netns
    run(["ip", "-n", sw, "link", "add", bridge, "type", "bridge"])
    run(["ip", "-n", sw, "link", "set", bridge, "mtu", "9000", "up"])
    for n in c.nodes:
        port = f"{port_prefix}{n.rank}"
        run(["ip", "link", "add", iface, "netns", n.netns, "type", "veth", "peer", "name", port, "netns", sw])
        run(["ip", "-n", sw, "link", "set", port, "mtu", "9000", "master", bridge, "up"])
        run(["ip", "-n", n.netns, "link", "set", iface, "up"])


def unplug_rail(instance: str, node: str, plugged: bool = False) -> None:
    """Pull (or, plugged=True, put back) the cable of `node`'s second rail at the switch: the node's port keeps
    its administrative state and loses its carrier, which no run on the node can bring back."""
    c = Cluster.load(instance)
    if c is None:
        raise SystemExit(f"harness: no instance {instance}")
    n = next(n for n in c.nodes if n.name == node)
    run(["ip", "-n", c.switch_netns, "link", "set", f"rail2port{n.rank}", "up" if plugged else "down"])


HUB_PORT = 8080


def _start_hub(c: Cluster) -> None:
    """The local hub emulator on the bridge address, serving the synthetic checkpoint."""
    import sys  # noqa: PLC0415 - only the hub needs the interpreter path

    sys.path.insert(0, str(STANDINS))
    import hub_emulator  # noqa: PLC0415 - a test stand-in, imported from its folder

    root = CACHE_ROOT / "hub"
    info = hub_emulator.build_checkpoint(root)
    logf = open(c.state_dir / "hub.log", "w")
    proc = subprocess.Popen(
        [sys.executable, str(STANDINS / "hub_emulator.py"), "--root", str(root),
         "--bind", c.bridge_ip, "--port", str(HUB_PORT)],
        stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
    )
    c.hub_pid, c.hub_url, c.hub_revision = proc.pid, f"http://{c.bridge_ip}:{HUB_PORT}", info["new"]
    c.save()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((c.bridge_ip, HUB_PORT), timeout=1):
                return
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    raise RuntimeError(f"harness: hub emulator did not start; see {c.state_dir / 'hub.log'}")


def _prepare_node(c: Cluster, n: Node, rootfs: Path, wheels: Path, knobs: dict) -> None:
    d = Path(n.dir)
    shutil.rmtree(d, ignore_errors=True)
    for sub in ("upper", "work", "merged"):
        (d / sub).mkdir(parents=True)
    run(["mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={rootfs},upperdir={d / 'upper'},workdir={d / 'work'}", str(d / "merged")])
    m = d / "merged"
    (m / "etc/hostname").write_text(n.name + "\n")
    (m / "etc/machine-id").write_text(run(["systemd-id128", "new"], capture=True))
    hosts = ["127.0.0.1 localhost", f"127.0.1.1 {n.name}", "::1 localhost ip6-localhost ip6-loopback"]
    hosts += [f"{o.mgmt_ip} {o.name}" for o in c.nodes]
    (m / "etc/hosts").write_text("\n".join(hosts) + "\n")
    # No DNS here: an empty resolv.conf fails lookups at once instead of after 10 s.
    (m / "etc/resolv.conf").unlink(missing_ok=True)
    (m / "etc/resolv.conf").write_text("")
    # The management port is configured by netplan, as on DGX OS: networkd then
    # manages it, so network-online.target (the unit's After=) is reached at once
    # instead of after systemd-networkd-wait-online's 2-minute timeout.
    mgmt = m / "etc/netplan/00-spark-sim-mgmt.yaml"
    mgmt.parent.mkdir(parents=True, exist_ok=True)
    mgmt.write_text(f"network:\n  version: 2\n  renderer: networkd\n  ethernets:\n    {MGMT_IFACE}:\n"
                    f"      addresses: [{n.mgmt_ip}/24]\n")
    mgmt.chmod(0o600)
    # Each node's own host keys, of the three types DGX OS has; RSA at 2048 bits, not ssh-keygen -A's 3072:
    # the size decides nothing here, and the 3072-bit key was nearly all of the 1.4 CPU-s a node's keys cost.
    for kind, bits in (("rsa", ["-b", "2048"]), ("ecdsa", []), ("ed25519", [])):
        key = m / f"etc/ssh/ssh_host_{kind}_key"
        key.unlink(missing_ok=True)
        key.with_suffix(".pub").unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-N", "", "-t", kind, *bits, "-C", f"root@{n.name}", "-f", str(key)])
    _, pub = key_paths()
    auth = m / "root/.ssh/authorized_keys"
    auth.parent.mkdir(mode=0o700, exist_ok=True)
    auth.write_text(pub.read_text())
    auth.chmod(0o600)
    _install_standins(m)
    (m / "opt/spark-sim").mkdir(parents=True, exist_ok=True)
    set_knobs_in(m, knobs)
    shutil.copytree(wheels, m / "opt/spark-sim/wheels", dirs_exist_ok=True)


def install_standin_libs(root: Path) -> None:
    """The stand-ins' libraries into a node's root (tests that run a stand-in in a root of their own use it too)."""
    lib = root / "usr/lib/spark-sim"
    lib.mkdir(parents=True, exist_ok=True)
    for f in sorted((STANDINS / "lib").glob("*")):
        if f.is_file():
            shutil.copy2(f, lib / f.name)


def _install_standins(m: Path) -> None:
    """Tools DGX OS has and Debian lacks, as test stand-ins (tests/standins)."""
    for tool in sorted((STANDINS / "bin").glob("*")):
        dest = m / "usr/bin" / tool.name
        shutil.copy2(tool, dest)
        dest.chmod(0o755)
    install_standin_libs(m)
    # Kernel interfaces a container cannot have, started at every boot.
    wants = m / "etc/systemd/system/sysinit.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for unit in sorted((STANDINS / "units").glob("*.service")):
        shutil.copy2(unit, m / "etc/systemd/system" / unit.name)
        (wants / unit.name).unlink(missing_ok=True)
        (wants / unit.name).symlink_to(f"/etc/systemd/system/{unit.name}")


# Where a node's writes to /proc/sys/vm/drop_caches land (tests/standins/units/spark-sim-drop-caches.service).
DROP_CACHES = "/var/lib/spark-sim-proc/drop_caches"


def knob_path(merged: Path) -> Path:
    return merged / "etc/spark-sim/node.json"


def set_knobs_in(merged: Path, knobs: dict) -> None:
    """Deep-merge per-node stand-in knobs (see tests/standins/README.md)."""
    path = knob_path(merged)
    path.parent.mkdir(parents=True, exist_ok=True)
    current = json.loads(path.read_text()) if path.exists() else {}
    for section, values in knobs.items():
        if isinstance(values, dict):
            current.setdefault(section, {}).update(values)
        else:
            current[section] = values
    path.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    # A node without the driver has no nvidia-smi at all.
    smi = merged / "usr/bin/nvidia-smi"
    if current.get("gpu", {}).get("installed", True) is False:
        smi.unlink(missing_ok=True)
    elif not smi.exists() and (STANDINS / "bin/nvidia-smi").exists():
        shutil.copy2(STANDINS / "bin/nvidia-smi", smi)
        smi.chmod(0o755)


def _load(instance: str) -> Cluster:
    c = Cluster.load(instance)
    if c is None:
        raise SystemExit(f"harness: no instance {instance!r}")
    return c


def _nodes(c: Cluster, names) -> list[Node]:
    """The named nodes of a cluster, in the order given; None or empty: all of them."""
    if not names:
        return list(c.nodes)
    by_name = {n.name: n for n in c.nodes}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise SystemExit(f"harness: instance {c.instance} has no node {', '.join(map(repr, unknown))}")
    return [by_name[name] for name in dict.fromkeys(names)]


def _find_node(instance: str, node: str) -> tuple[Cluster, Node]:
    c = _load(instance)
    return c, _nodes(c, [node])[0]


def set_knobs(instance: str, node: str, knobs: dict) -> None:
    _, n = _find_node(instance, node)
    set_knobs_in(Path(n.dir) / "merged", knobs)


# The node's power supply: a shell that runs the machine (systemd-nspawn) and, when the machine
# reboots itself (`systemctl reboot` inside: nspawn exits 133), resets its NICs and boots it again,
# as systemd-nspawn@.service does with RestartForceExitStatus=133. Any other end of the machine
# (a poweroff from inside, or SIGTERM here: forwarded to nspawn, an orderly poweroff) ends the
# supply: the node is off and Node.pid is gone (power_state says so; power_on boots it again).
# $1: the node's cgroup; the supply lives in power/, the machine in machine/ (nspawn makes its
# supervisor/ and payload/ there); $2: the node's mirror in the v1 name=systemd hierarchy or "".
POWER_SUPPLY = r"""
cg=$1 v1=$2
shift 2
echo $$ > "$cg/power/cgroup.procs" || exit 1
off=0 child= rc=0
trap 'off=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM
while [ "$off" = 0 ]; do
    # A stale subtree left from the last boot hangs the next systemd in it.
    for d in "$cg/machine" $v1; do
        [ -d "$d" ] && find "$d" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null
    done
    (echo $BASHPID > "$cg/machine/cgroup.procs" && exec "$@") &
    child=$!
    wait "$child"; rc=$?
    while kill -0 "$child" 2>/dev/null; do wait "$child"; rc=$?; done
    [ "$rc" = 133 ] && [ "$off" = 0 ] || break
    echo "harness: $(date -u +%FT%TZ) the node rebooted itself: its NICs reset, booting it again"
    @NIC_RESET@
done
exit "$rc"
"""


def _nic_off(n: Node) -> list[list[str]]:
    """What a power loss does to the node's NICs (the namespace and cabling stay): links down (the
    peer's fabric port loses its carrier), no address, the fabric port back to MTU 1500, and the
    runtime firewall gone. The node's own configuration sets them up again when it boots."""
    ns, nft = n.netns, ["nsenter", f"--net=/run/netns/{n.netns}", f"--root={Path(n.dir) / 'merged'}", "nft"]
    return [
        ["ip", "-n", ns, "link", "set", FABRIC_IFACE, "down"],
        ["ip", "-n", ns, "addr", "flush", "dev", FABRIC_IFACE],
        ["ip", "-n", ns, "link", "set", FABRIC_IFACE, "mtu", "1500"],
        ["ip", "-n", ns, "link", "set", RAIL2_IFACE, "down"],
        ["ip", "-n", ns, "addr", "flush", "dev", RAIL2_IFACE],
        ["ip", "-n", ns, "link", "set", RAIL2_IFACE, "mtu", "1500"],
        ["ip", "-n", ns, "link", "set", MGMT_IFACE, "down"],
        ["ip", "-n", ns, "addr", "flush", "dev", MGMT_IFACE],
        [*nft, "flush", "ruleset"],
    ]


def _nic_on(n: Node) -> list[list[str]]:
    """The NICs as a node first boots with them (_network_up): links up, the management address."""
    ns = n.netns
    return [
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "addr", "replace", f"{n.mgmt_ip}/24", "dev", MGMT_IFACE],
        ["ip", "-n", ns, "link", "set", MGMT_IFACE, "up"],
        ["ip", "-n", ns, "link", "set", FABRIC_IFACE, "up"],
        ["ip", "-n", ns, "link", "set", RAIL2_IFACE, "up"],
    ]


def _boot(c: Cluster, n: Node) -> None:
    cg = _node_cgroup(c.instance, n.name)
    for sub in ("power", "machine"):
        (cg / sub).mkdir(parents=True, exist_ok=True)
    v1 = _V1_SYSTEMD / "spark-sim" / c.instance / n.name if (_V1_SYSTEMD / "cgroup.procs").exists() else ""
    # The node's /proc/sys/net writable, as a host's is (a ring forwards on its ports): it is the node's own network
    # namespace's, never this machine's.
    env = dict(os.environ, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY="1", SYSTEMD_NSPAWN_API_VFS_WRITABLE="network")
    # Appended to: a power cycle keeps the node's earlier boots on its console.
    logf = open(Path(n.dir) / "console.log", "a")
    reset = "\n    ".join(shlex.join(cmd) + " >/dev/null 2>&1" for cmd in _nic_off(n) + _nic_on(n))
    # nsenter, not `ip netns exec`: the latter remounts /sys and breaks
    # nspawn's view of the cgroup tree. The node gets a cgroup of its own so
    # that it can shut down cleanly with SSH sessions still open.
    proc = subprocess.Popen(
        [
            "bash", "-c", POWER_SUPPLY.replace("@NIC_RESET@", reset), f"power-{n.name}", str(cg), str(v1),
            "nsenter", f"--net=/run/netns/{n.netns}",
            "systemd-nspawn", "--boot", "--register=no", "--keep-unit",
            "--capability=CAP_NET_ADMIN", "--console=passive",
            f"--machine=spsim-{c.instance}-{n.name}", f"--hostname={n.name}",
            "-D", str(Path(n.dir) / "merged"),
        ],
        stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
        env=env, start_new_session=True,
    )
    n.pid = proc.pid
    _SUPPLIES[proc.pid] = proc


def _wait_ready(n: Node, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if n.pid and not _alive(n.pid):
            raise RuntimeError(f"harness: {n.name} exited during boot; see {n.dir}/console.log")
        try:
            with socket.create_connection((n.mgmt_ip, 22), timeout=2):
                pass
            out = ssh(n, "systemctl is-system-running --wait", check=False, timeout=60)
            last = out.strip()
            if last in ("running", "degraded"):
                if last == "degraded":
                    failed = ssh(n, "systemctl --failed --no-legend --plain", check=False)
                    log(f"{n.name} booted degraded: {failed.strip()}")
                return
        except (OSError, subprocess.TimeoutExpired):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"harness: {n.name} not ready after {timeout}s (last state {last!r}); see {n.dir}/console.log")


def ssh_base(n: Node, known_hosts: str = "/dev/null") -> list[str]:
    """The harness's own SSH to a node (the tests' look at it, not the product's connection: Ansible's is the
    inventory's). Its key exchange is plain curve25519: the client's default here (OpenSSH 9.2's hybrid
    sntrup761x25519) cost about 120 ms of CPU per connection (22 ms with this), paid by every look a test takes.
    It goes through the node's shared connection where ssh() has opened one (_mux_path), else on its own."""
    key, _ = key_paths()
    return [
        "ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
        "-o", "StrictHostKeyChecking=no", "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "ConnectTimeout=5", "-o", "KexAlgorithms=curve25519-sha256",
        "-o", "ControlMaster=no", "-o", f"ControlPath={_mux_path(n)}", f"root@{n.mgmt_ip}",
    ]


# A look a test takes at a node costs a connection of its own about 30 ms of the node's CPU (sshd's key exchange
# and session set-up) and as much on the controller; through one shared connection per node and boot, a few.
SSH_MUX_ROOT = STATE_ROOT / "ssh-mux"
_MUX_LOCK = threading.Lock()


def _mux_path(n: Node) -> Path:
    # The power supply's pid names the boot: a node powered off, reinstalled or booted again never gets a
    # connection opened to its previous boot, which would hang on a peer that is gone.
    return SSH_MUX_ROOT / f"{n.netns}-{n.pid}"


def _open_mux(n: Node) -> None:
    """The node's shared connection, opened once per boot (it closes itself 30 s after its last use)."""
    path = _mux_path(n)
    with _MUX_LOCK:
        if path.exists() or not n.pid:
            return
        SSH_MUX_ROOT.mkdir(parents=True, exist_ok=True)
        base = ssh_base(n)
        at = base.index("ControlMaster=no")
        base[at] = "ControlMaster=yes"
        # -f: in the background once authenticated, its stdio /dev/null, so no caller waits on a pipe it holds.
        # ServerAlive: a connection whose node went away without a word (no FIN) ends within seconds.
        options = ["-N", "-f", "-o", "ControlPersist=30", "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3"]
        try:
            subprocess.run(base[:-1] + options + base[-1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            pass  # the command below connects on its own and says what is wrong


def _close_mux(n: Node) -> None:
    """Close every shared connection to the node, whichever boot a test's Node names (an older copy keeps the pid
    of the boot it was taken at), before the node goes off."""
    for path in SSH_MUX_ROOT.glob(f"{n.netns}-*"):
        subprocess.run(["ssh", "-o", f"ControlPath={path}", "-O", "exit", f"root@{n.mgmt_ip}"],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False)
        path.unlink(missing_ok=True)


# The commands ssh() ran in this process: tests/conftest.py's summary shows them per module.
SSH_CONNECTIONS = {"count": 0}


def ssh(n: Node, command: str, *, check: bool = True, timeout: float = 60, stdin: str | None = None) -> str:
    """`command` on the node; `stdin` is its input (a secret goes there, never onto a command line)."""
    SSH_CONNECTIONS["count"] += 1
    _open_mux(n)
    proc = subprocess.run(ssh_base(n) + [command], capture_output=True, text=True, timeout=timeout, input=stdin)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ssh {n.name} {command!r} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _write_inventory(c: Cluster) -> None:
    key, _ = key_paths()
    inv = c.inventory
    # What the roles keep beside the inventory (the generated API key, the TLS CA) is the controller's,
    # not a node's: a node re-provisioned by reinstall() must not take the site's key away with it.
    for entry in inv.iterdir() if inv.is_dir() else []:
        if entry.name != ".credentials":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    inv.mkdir(parents=True, exist_ok=True)
    known = c.state_dir / "known_hosts"
    lines = []
    for n in c.nodes:
        for pub in sorted((Path(n.dir) / "merged/etc/ssh").glob("ssh_host_*_key.pub")):
            keytype, keydata = pub.read_text().split()[:2]
            lines.append(f"{n.mgmt_ip} {keytype} {keydata}")
    known.write_text("\n".join(lines) + "\n")
    head, *workers = c.nodes

    def host(n: Node) -> dict:
        return {"ansible_host": n.mgmt_ip, "spark_fabric_ip": n.fabric_ip}

    inventory = {
        "spark": {
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(key),
                "ansible_ssh_common_args": f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes",
                "spark_fabric_interface": RING_NODE_IFACE if c.ring else FABRIC_IFACE,
                "spark_fabric_prefix": ipaddress.ip_network(c.fabric_subnet).prefixlen,
                **(
                    {"spark_fabric_ring_subnet": c.ring_subnet, "spark_fabric_ring_ports": list(RING_PORTS)}
                    if c.ring
                    else {"spark_fabric_extra_rails": [{"interface": RAIL2_IFACE, "subnet": c.rail2_subnet}]}
                    if c.site_rails > 1
                    else {}
                ),
                "spark_sim_controller_ip": c.bridge_ip,
                **(
                    {
                        "checkpoint_hf_endpoint": c.hub_url,
                        "checkpoint_revision": c.hub_revision,
                    }
                    if c.hub_url
                    else {}
                ),
            },
            "children": {
                "spark_head": {"hosts": {head.name: host(head)}},
                "spark_workers": {"hosts": {w.name: host(w) for w in workers}},
            },
        }
    }
    if c.tp_groups > 1:
        size = len(c.nodes) // c.tp_groups
        groups = [c.nodes[i:i + size] for i in range(0, len(c.nodes), size)]
        inventory["spark"]["children"] = {
            "spark_tp_groups": {"children": {f"replica_{chr(ord('a') + i)}": {"hosts": {n.name: host(n) for n in g}}
                                             for i, g in enumerate(groups)}},
            "spark_head": {"hosts": {g[0].name: None for g in groups}},
            "spark_workers": {"hosts": {n.name: None for g in groups for n in g[1:]}},
        }
    (inv / "hosts.json").write_text(json.dumps(inventory, indent=2) + "\n")
    # The test site's settings (tests/inventory/group_vars), file by file, so
    # that the harness can add what only it knows beside them.
    if TEST_GROUP_VARS.exists():
        for src in TEST_GROUP_VARS.rglob("*.yml"):
            dest = inv / "group_vars" / src.relative_to(TEST_GROUP_VARS)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(src)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours still answers kill(0).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def down(instance: str = "sim") -> None:
    with _lock():
        c = Cluster.load(instance)
        if c is None:
            log(f"instance {instance}: nothing to tear down")
            return
        _down(c)
    log(f"instance {instance}: torn down")


def _down(c: Cluster) -> None:
    if c.hub_pid and _alive(c.hub_pid):
        os.kill(c.hub_pid, signal.SIGTERM)
    for n in c.nodes:
        if n.pid and _alive(n.pid):
            # nspawn turns SIGTERM into an orderly poweroff of the node.
            os.kill(n.pid, signal.SIGTERM)
    for n in c.nodes:
        _halt(c, n)
        run(["ip", "link", "del", n.host_veth], check=False, quiet=True)
        run(["ip", "netns", "del", n.netns], check=False, quiet=True)
    if c.switch_netns:
        run(["ip", "netns", "del", c.switch_netns], check=False, quiet=True)
    run(["ip", "route", "del", "unreachable", c.fabric_subnet], check=False, quiet=True)
    run(["ip", "route", "del", "unreachable", c.rail2_subnet], check=False, quiet=True)
    if c.ring:
        run(["ip", "route", "del", "unreachable", c.ring_subnet], check=False, quiet=True)
    run(["ip", "link", "del", c.bridge], check=False, quiet=True)
    for cg in _cgroup_dirs(c.instance):
        _rmdir_tree(cg)
        try:
            cg.parent.rmdir()
        except OSError:
            pass  # another instance still lives there
    shutil.rmtree(c.state_dir, ignore_errors=True)
    try:
        (WORK_ROOT / c.instance).rmdir()
    except OSError:
        pass


def _kill_cgroup(cg: Path) -> None:
    if not cg.exists():
        return
    if (cg / "cgroup.kill").exists():
        (cg / "cgroup.kill").write_text("1")
    else:
        for procs in cg.rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(p.read_text().strip() for p in cg.rglob("cgroup.procs")):
        time.sleep(0.1)


def _rmdir_tree(root: Path) -> None:
    if not root.exists():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:
            pass
    try:
        root.rmdir()
    except OSError:
        pass


def instances() -> list[Cluster]:
    if not STATE_ROOT.exists():
        return []
    return [c for d in sorted(STATE_ROOT.iterdir()) if d.is_dir() and (c := Cluster.load(d.name))]


def leftovers(instance: str | None = None, index: int | None = None) -> list[str]:
    """What of the harness is still on this machine: all of it, or one instance's."""
    ns_prefix = f"spsim-{instance}-" if instance else "spsim-"
    link_re = rf"spsim{index}(?:br|m\d+)" if index is not None else r"spsim[^:@\s]*"
    found = []
    netns = run(["ip", "netns", "list"], capture=True, check=False)
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith(ns_prefix)]
    links = run(["ip", "-o", "link", "show"], capture=True)
    found += [f"link {m}" for m in re.findall(rf"^\d+: ({link_re})[:@]", links, re.M)]
    bases = (MGMT_BASE, FABRIC_BASE, RAIL2_BASE)
    subnets = [f"{b}.{index}." for b in bases] if index is not None else list(bases)
    routes = run(["ip", "route", "show"], capture=True)
    found += [f"route {line}" for line in routes.splitlines() if any(s in line for s in subnets)]
    work = str(WORK_ROOT / instance) if instance else str(WORK_ROOT)
    mounts = Path("/proc/mounts").read_text()
    found += [f"mount {line.split()[1]}" for line in mounts.splitlines() if work in line]
    for cg in _cgroup_dirs(instance or ""):
        if instance:
            if cg.exists():
                found.append(f"cgroup {cg}")
        elif cg.exists():
            found += [f"cgroup {p}" for p in cg.iterdir() if p.is_dir()]
    ps = run(["ps", "-eo", "pid,args"], capture=True)
    found += [f"process {line.strip()}" for line in ps.splitlines() if "systemd-nspawn" in line and ns_prefix in line]
    if instance and (STATE_ROOT / instance).exists():
        found.append(f"state {STATE_ROOT / instance}")
    return found

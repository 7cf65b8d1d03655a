#!/usr/bin/python3
"""Stand-in for the mlx5 RoCE driver's sysfs on a simulated DGX Spark (tests/standins/README.md).

The machine running the nodes has no InfiniBand support, so a node has no /sys/class/infiniband,
and /sys is read-only in a container. At its first start in a boot this daemon puts a tmpfs over
/sys/class with every class of the real one bind-mounted back in place, so that nothing is hidden
and /sys/class/infiniband can be a directory of its own. It then keeps there, for each HCA of the
knobs (section "roce" of /etc/spark-sim/node.json), what mlx5 publishes for a ConnectX-7 port:
the port state and the GID table follow the HCA's netdev as the kernel's roce_gid_mgmt and
mlx5_query_port_roce do. The tree is rebuilt on every rtnetlink link or address event (from
`ip -o monitor link address`, never by polling) and, after re-reading the knobs, on SIGHUP
(`systemctl reload spark-sim-roce`: the unit is Type=notify-reload, so the reload returns once
the new tree is in place).

SPARK_SIM_ROOT (the unit tests) prefixes every path; mounting is then left out.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time

ROOT = os.environ.get("SPARK_SIM_ROOT", "")
KNOBS = ROOT + "/etc/spark-sim/node.json"
SYS_CLASS = ROOT + "/sys/class"
IB_CLASS = SYS_CLASS + "/infiniband"
NET_CLASS = SYS_CLASS + "/net"
# The real /sys/class, kept reachable under the tmpfs, and the HCA trees the class links point to.
STASH = ROOT + "/run/spark-sim-sys"
REAL_CLASS = STASH + "/class"
TREES = STASH + "/infiniband"
# What the "driver" was loaded with, for ibv_devinfo (the port's max MTU is no sysfs file).
DRIVER_STATE = ROOT + "/run/spark-sim/roce.json"

DEFAULTS = {
    # Both rails of the cabled QSFP cage, as a DGX Spark has them.
    "hcas": {"rocep1s0f1": "enp1s0f1np1", "roceP2p1s0f1": "enP2p1s0f1np1"},
    "roce_v2": True,
    "max_mtu": 4096,
    "port_state": "auto",
}
IB_MTUS = (256, 512, 1024, 2048, 4096)
PORT_STATES = {"auto", "DOWN", "INIT"}
STATE_TEXT = {1: "1: DOWN", 2: "2: INIT", 4: "4: ACTIVE"}
# roce_address_table_size is larger on a real ConnectX-7; 16 slots show every entry a test makes.
GID_TABLE_LEN = 16
ROCE_V1, ROCE_V2 = "IB/RoCE v1", "RoCE v2"
# mlx5 fills in 4X QDR before asking the port and keeps it when no link is negotiated (a down
# port reads 40 Gb/sec); a 200G link with two 100G lanes (200GBASE-CR2) is 2X NDR.
RATE_UP, RATE_DOWN = "200 Gb/sec (2X NDR)", "40 Gb/sec (4X QDR)"
FW_VER = "28.45.4028"
HCA_TYPE = "MT4129"  # ConnectX-7, PCI device 0x1021


class KnobError(ValueError):
    pass


def knobs(data: dict) -> dict:
    """The section's knobs over the defaults, checked (KnobError: what is wrong)."""
    k = {**DEFAULTS, **data.get("roce", {})}
    hcas = k["hcas"]
    if not isinstance(hcas, dict) or not all(isinstance(a, str) and isinstance(b, str) and a and b
                                             for a, b in hcas.items()):
        raise KnobError(f"roce.hcas must map HCA names to netdev names, not {hcas!r}")
    if any("/" in name or name.startswith(".") for name in hcas):
        raise KnobError(f"roce.hcas: {sorted(hcas)!r} are not device names")
    if not isinstance(k["roce_v2"], bool):
        raise KnobError(f"roce.roce_v2 must be true or false, not {k['roce_v2']!r}")
    if k["max_mtu"] not in IB_MTUS:
        raise KnobError(f"roce.max_mtu must be one of {IB_MTUS}, not {k['max_mtu']!r}")
    states = k["port_state"].values() if isinstance(k["port_state"], dict) else [k["port_state"]]
    if not all(isinstance(s, str) and s in PORT_STATES for s in states):
        raise KnobError(f"roce.port_state must be one of {sorted(PORT_STATES)} (or a map of HCA names to one), "
                        f"not {k['port_state']!r}")
    return k


def read_knobs() -> dict:
    try:
        with open(KNOBS) as f:
            return knobs(json.load(f))
    except FileNotFoundError:
        return knobs({})


def gid_text(gid: bytes) -> str:
    """sysfs's form: eight groups of four hex digits, zeros kept."""
    h = gid.hex()
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


def mac_bytes(mac: str) -> bytes:
    return bytes(int(x, 16) for x in mac.split(":"))


def default_gid(mac: str) -> bytes:
    """fe80::/64 with the MAC's modified EUI-64, as the kernel's make_default_gid does."""
    m = mac_bytes(mac)
    return bytes([0xFE, 0x80] + [0] * 6 + [m[0] ^ 0x02, m[1], m[2], 0xFF, 0xFE, m[3], m[4], m[5]])


def node_guid(mac: str) -> str:
    """A Mellanox-style GUID: the MAC's OUI, 03:00, then the rest of the MAC."""
    m = mac_bytes(mac)
    g = bytes([m[0], m[1], m[2], 0x03, 0x00, m[3], m[4], m[5]]).hex()
    return ":".join(g[i:i + 4] for i in range(0, 16, 4))


def ip_gids(netdev: dict, default: bytes) -> list[bytes]:
    """The GIDs of the netdev's addresses in roce_gid_mgmt's order: IPv4 (IPv4-mapped) first, then
    IPv6. An IPv6 address equal to the default GID is the same entry (the kernel finds it there);
    an address still in duplicate address detection has not been announced to the RDMA core yet."""
    v4, v6 = [], []
    for a in netdev.get("addr_info", []):
        if a.get("family") == "inet":
            v4.append(bytes(10) + b"\xff\xff" + ipaddress.IPv4Address(a["local"]).packed)
        elif a.get("family") == "inet6" and not (a.get("tentative") or a.get("dadfailed")):
            packed = ipaddress.IPv6Address(a["local"]).packed
            if packed != default:
                v6.append(packed)
    return v4 + v6


class GidTable:
    """One port's GID table as ib_core keeps it: the default GIDs in reserved slots 0 (RoCE v1)
    and 1 (RoCE v2), each address a v1 then a v2 entry in the lowest free slots; a removed entry
    frees its slot for the next one added, entries that stay keep theirs. A full table drops
    what does not fit, as the kernel does (with a log line)."""

    def __init__(self, roce_v2: bool, size: int = GID_TABLE_LEN):
        self.types = (ROCE_V1, ROCE_V2) if roce_v2 else (ROCE_V1,)
        self.size = size
        self.slots: dict[int, tuple[bytes, str]] = {}

    def update(self, default: bytes | None, addresses: list[bytes]) -> None:
        reserved = {i: (default, t) for i, t in enumerate(self.types)} if default else {}
        wanted = [(g, t) for g in addresses for t in self.types]
        for i in range(len(self.types)):
            self.slots.pop(i, None)
        self.slots = {i: e for i, e in self.slots.items() if e in wanted}
        held = set(self.slots.values())
        free = (i for i in range(len(self.types), self.size) if i not in self.slots)
        for entry in wanted:
            if entry not in held:
                i = next(free, None)
                if i is None:
                    log(f"GID table full: {gid_text(entry[0])} ({entry[1]}) left out")
                    break
                self.slots[i] = entry
                held.add(entry)
        self.slots.update(reserved)

    def entries(self) -> dict[int, tuple[bytes, str]]:
        return dict(sorted(self.slots.items()))


def port_state(netdev: dict | None, forced: str) -> tuple[int, bool]:
    """(IB port state, physical link up) as mlx5_query_port_roce reports them: ACTIVE when the
    netdev is running (administratively up) with carrier, else DOWN; `forced` is the knob."""
    flags = set(netdev.get("flags", [])) if netdev else set()
    link = "LOWER_UP" in flags
    if forced == "DOWN":
        return 1, link
    if forced == "INIT":
        return 2, link
    return (4 if "UP" in flags and link else 1), link


def hca_files(netdev_name: str, netdev: dict | None, k: dict, table: GidTable, hca: str = "") -> dict[str, str]:
    """Every file of one HCA's tree (path relative to the HCA dir: content); the device/net link
    is made beside them. The port_state knob is one state for every HCA or a map by HCA name."""
    mac = netdev.get("address") if netdev else None
    forced = k["port_state"].get(hca, "auto") if isinstance(k["port_state"], dict) else k["port_state"]
    state, link = port_state(netdev, forced)
    table.update(default_gid(mac) if mac else None, ip_gids(netdev, default_gid(mac)) if mac else [])
    guid = node_guid(mac) if mac else "0000:0000:0000:0000"
    files = {
        "node_type": "1: CA",
        "fw_ver": FW_VER,
        "node_guid": guid,
        "sys_image_guid": guid,
        "hca_type": HCA_TYPE,
        "hw_rev": "0x0",
        "device/vendor": "0x15b3",
        "device/device": "0x1021",
        "ports/1/state": STATE_TEXT[state],
        "ports/1/phys_state": "5: LinkUp" if link else "3: Disabled",
        "ports/1/link_layer": "Ethernet",
        "ports/1/rate": RATE_UP if link else RATE_DOWN,
        "ports/1/lid": "0x0",
        "ports/1/sm_lid": "0x0",
        "ports/1/sm_sl": "0",
        "ports/1/lid_mask_count": "0",
        "ports/1/pkeys/0": "0xffff",
    }
    entries = table.entries()
    for i in range(table.size):
        gid, kind = entries.get(i, (bytes(16), None))
        files[f"ports/1/gids/{i}"] = gid_text(gid)
        if kind:
            # Unused slots answer EINVAL on real sysfs; here their type and ndev files are absent.
            files[f"ports/1/gid_attrs/types/{i}"] = kind
            files[f"ports/1/gid_attrs/ndevs/{i}"] = netdev_name
    return files


def log(msg: str) -> None:
    print(f"spark-sim-roce: {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc


def mount_targets() -> set[str]:
    with open("/proc/self/mountinfo") as f:
        return {line.split()[4].encode().decode("unicode_escape") for line in f}


def expose_sys_class() -> None:
    """/sys/class becomes a tmpfs with each real class bind-mounted back: done once per boot,
    completed if an earlier start stopped half-way, and classes the kernel added since are bound too."""
    if ROOT:
        os.makedirs(IB_CLASS.rsplit("/", 1)[0], exist_ok=True)
        return
    mounted = mount_targets()
    os.makedirs(REAL_CLASS, exist_ok=True)
    if REAL_CLASS not in mounted:
        run(["mount", "--bind", SYS_CLASS, REAL_CLASS])
        # Else the tmpfs below would propagate onto this bind and hide the real classes.
        run(["mount", "--make-private", REAL_CLASS])
    # The top of the mounts stacked there: nspawn binds /sys/class from sysfs where a node's /proc/sys/net is
    # writable, and the tmpfs of an earlier start lies on that.
    stacked = run(["findmnt", "-n", "-o", "FSTYPE", "--mountpoint", SYS_CLASS], check=False).stdout.split()
    if stacked[-1:] != ["tmpfs"]:
        run(["mount", "-t", "tmpfs", "-o", "mode=0755", "spark-sim-class", SYS_CLASS])
    mounted = mount_targets()
    for name in sorted(os.listdir(REAL_CLASS)):
        if name == "infiniband":
            continue  # a host with RDMA: the stand-in's HCAs are the node's, not the host's
        target = f"{SYS_CLASS}/{name}"
        if target not in mounted:
            os.makedirs(target, exist_ok=True)
            run(["mount", "--bind", f"{REAL_CLASS}/{name}", target])


def netdev_info(name: str) -> dict | None:
    proc = run(["ip", "-j", "addr", "show", "dev", name], check=False)
    if proc.returncode != 0:
        return None  # no such netdev
    found = json.loads(proc.stdout or "[]")
    return found[0] if found else None


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# Tree names unique within the boot: a new tree never lands on the one a reader is in.
_TREE_IDS = itertools.count(1)


class Driver:
    """The HCAs as the driver has them: knobs applied at start and at each reload."""

    def __init__(self, k: dict):
        self.k = k
        self.tables = {hca: GidTable(k["roce_v2"]) for hca in k["hcas"]}
        self.written: dict[str, tuple] = {}

    def sync(self) -> None:
        hcas = self.k["hcas"]
        if not hcas:
            self._remove_all()
            self._state()
            return
        os.makedirs(IB_CLASS, exist_ok=True)
        os.makedirs(TREES, exist_ok=True)
        for stale in set(os.listdir(IB_CLASS)) - set(hcas):
            self._unlink(stale)
        for hca, ndev in hcas.items():
            info = netdev_info(ndev)
            files = hca_files(ndev, info, self.k, self.tables[hca], hca)
            key = (ndev, info is not None, tuple(sorted(files.items())))
            if self.written.get(hca) == key and os.path.islink(f"{IB_CLASS}/{hca}"):
                continue
            self._publish(hca, ndev, info is not None, files)
            self.written[hca] = key
            gids = sum(1 for p in files if p.startswith("ports/1/gid_attrs/types/"))
            log(f"{hca} ({ndev}): port {files['ports/1/state']}, {files['ports/1/phys_state']}, {gids} GIDs")
        self._state()

    def _publish(self, hca: str, ndev: str, has_netdev: bool, files: dict[str, str]) -> None:
        # A new tree beside the old one, then the class link swapped to it in one rename:
        # a reader sees the old tree or the new one, never a mix.
        tree = f"{TREES}/{hca}.{os.getpid()}.{next(_TREE_IDS)}"
        for rel, text in files.items():
            path = f"{tree}/{rel}"
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text + "\n")
        os.makedirs(f"{tree}/device/net", exist_ok=True)
        if has_netdev:
            os.symlink(f"{NET_CLASS}/{ndev}", f"{tree}/device/net/{ndev}")
        link = f"{IB_CLASS}/{hca}"
        old = os.readlink(link) if os.path.islink(link) else None
        tmp = f"{IB_CLASS}/.{hca}.new"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(tree, tmp)
        os.replace(tmp, link)
        if old and old != tree:
            shutil.rmtree(old, ignore_errors=True)

    def drop_orphans(self) -> None:
        """Trees no class link points to (an earlier run that was killed while building one)."""
        linked = set()
        if os.path.isdir(IB_CLASS):
            linked = {os.readlink(f"{IB_CLASS}/{n}") for n in os.listdir(IB_CLASS) if os.path.islink(f"{IB_CLASS}/{n}")}
        for name in os.listdir(TREES) if os.path.isdir(TREES) else []:
            if f"{TREES}/{name}" not in linked:
                shutil.rmtree(f"{TREES}/{name}", ignore_errors=True)

    def _unlink(self, hca: str) -> None:
        link = f"{IB_CLASS}/{hca}"
        old = os.readlink(link) if os.path.islink(link) else None
        if os.path.lexists(link):
            os.unlink(link) if os.path.islink(link) else shutil.rmtree(link)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        self.written.pop(hca, None)

    def _remove_all(self) -> None:
        if os.path.isdir(IB_CLASS):
            for name in os.listdir(IB_CLASS):
                self._unlink(name)
            os.rmdir(IB_CLASS)
        shutil.rmtree(TREES, ignore_errors=True)
        self.written.clear()

    def _state(self) -> None:
        os.makedirs(os.path.dirname(DRIVER_STATE), exist_ok=True)
        write_atomic(DRIVER_STATE, json.dumps({"max_mtu": self.k["max_mtu"], "hcas": self.k["hcas"],
                                                "roce_v2": self.k["roce_v2"]}) + "\n")


def notify(message: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        s.connect(address)
        s.sendall(message.encode())


def main() -> int:
    try:
        k = read_knobs()
    except (KnobError, json.JSONDecodeError) as e:
        log(f"bad knobs in {KNOBS}: {e}")
        return 1
    expose_sys_class()
    # The monitor first, so that no change between the first build and its start goes unseen.
    monitor = subprocess.Popen(["ip", "-o", "monitor", "link", "address"], stdout=subprocess.PIPE,
                               stdin=subprocess.DEVNULL)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # handled in the loop, through the wakeup fd
    driver = Driver(k)
    driver.drop_orphans()
    driver.sync()
    notify("READY=1")
    sel = selectors.DefaultSelector()
    sel.register(monitor.stdout, selectors.EVENT_READ, "netlink")
    sel.register(wake_r, selectors.EVENT_READ, "signal")
    while True:
        for key, _ in sel.select():
            if key.data == "netlink":
                if not os.read(monitor.stdout.fileno(), 65536):
                    log(f"ip monitor ended (status {monitor.wait()})")
                    return 1
                driver.sync()
                continue
            for signum in os.read(wake_r, 64):
                if signum == signal.SIGHUP:
                    notify(f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
                    try:
                        k = read_knobs()
                    except (KnobError, json.JSONDecodeError) as e:
                        log(f"reload: bad knobs in {KNOBS}, kept the ones loaded: {e}")
                        notify(f"READY=1\nSTATUS=knobs not reloaded: {e}")
                        continue
                    expose_sys_class()
                    # A reload is the driver loaded anew: fresh GID tables.
                    driver = Driver(k)
                    driver.sync()
                    notify("READY=1\nSTATUS=")
                else:
                    # The driver unloaded: its devices go with it.
                    notify("STOPPING=1")
                    driver._remove_all()
                    monitor.terminate()
                    monitor.wait()
                    return 0


if __name__ == "__main__":
    sys.exit(main())

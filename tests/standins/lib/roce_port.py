"""What libibverbs reads of an HCA port from the RoCE stand-in's sysfs (tests/standins/README.md).

Shared by the verbs-side stand-ins (bin/ibv_devinfo, bin/ib_write_bw) so that they agree on a port's
state, GIDs and active MTU: one computation, as the real tools share libibverbs and the kernel's answers.
On a node this file is /usr/lib/spark-sim/roce_port.py (the harness copies lib/* there), in the
repository tests/standins/lib: each tool puts whichever is beside its own bin directory on sys.path.
SPARK_SIM_ROOT prefixes every path (the unit tests).
"""

from __future__ import annotations

import json
import os

ROOT = os.environ.get("SPARK_SIM_ROOT", "")
IB_CLASS = ROOT + "/sys/class/infiniband"
NET_CLASS = ROOT + "/sys/class/net"
# What the "driver" was loaded with (lib/roce_sysfs.py): the port's max MTU is no sysfs file.
DRIVER_STATE = ROOT + "/run/spark-sim/roce.json"
IB_MTUS = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
# include/rdma/ib_addr.h iboe_get_mtu: what RoCE headers take from the netdev's MTU
# (GRH 40 + UDP 8 + BTH 12 + XRC ext 4 + AtomicETH 28 + ICRC 4).
ROCE_HEADERS = 40 + 8 + 12 + 4 + 28 + 4
PORT_ACTIVE = 4
# The first 12 bytes of an IPv4-mapped GID (::ffff:a.b.c.d).
IPV4_MAPPED = bytes(10) + b"\xff\xff"


def iboe_mtu(netdev_mtu: int) -> int:
    """The largest IB MTU that fits the netdev's MTU less the RoCE headers (0: none)."""
    room = netdev_mtu - ROCE_HEADERS
    return max((m for m in IB_MTUS if m <= room), default=0)


def read(path: str, default: str = "") -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def devices() -> list[str] | None:
    """The HCAs, or None when there is no RDMA stack at all (ibv_get_device_list: ENOSYS)."""
    try:
        return sorted(n for n in os.listdir(IB_CLASS) if not n.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return None


def ports(hca: str) -> list[int]:
    path = f"{IB_CLASS}/{hca}/ports"
    return sorted(int(p) for p in os.listdir(path)) if os.path.isdir(path) else []


def driver_max_mtu() -> int:
    try:
        with open(DRIVER_STATE) as f:
            return json.load(f).get("max_mtu", 4096)
    except (OSError, ValueError):
        return 4096


def port_state(hca: str, port: int) -> int:
    """ibv_port_attr.state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE."""
    return int(read(f"{IB_CLASS}/{hca}/ports/{port}/state", "1: DOWN").split(":")[0])


def active_mtu(hca: str, max_mtu: int) -> int:
    """The port's active MTU in bytes, as mlx5_query_port_roce reports it: from the netdev's MTU
    whatever the port state; no netdev: 0."""
    net = f"{IB_CLASS}/{hca}/device/net"
    nets = os.listdir(net) if os.path.isdir(net) else []
    return min(max_mtu, iboe_mtu(int(read(f"{NET_CLASS}/{nets[0]}/mtu", "0")))) if nets else 0


def gid(hca: str, port: int, index: int) -> bytes | None:
    """The GID at an index (all zeros for an unused one, as ibv_query_gid answers it), or None past
    the table's end (the query fails)."""
    text = read(f"{IB_CLASS}/{hca}/ports/{port}/gids/{index}", "")
    if not text:
        return None
    return bytes.fromhex(text.replace(":", ""))


def nccl_ib_devices(env) -> list[str]:
    """The RoCE devices NCCL's IB transport uses, in NCCL_IB_HCA's order (every device where it is unset): port 1
    ACTIVE, and the GID at NCCL_IB_GID_INDEX (any, where unset) a RoCE v2 GID of an IPv4 address."""
    found = devices() or []
    listed = [h.lstrip("=^") for h in env.get("NCCL_IB_HCA", "").split(",") if h] or found
    index = env.get("NCCL_IB_GID_INDEX", "")
    out = []
    for hca in listed:
        if hca not in found or port_state(hca, 1) != PORT_ACTIVE:
            continue
        indexes = [int(index)] if index.isdigit() else range(16)
        for i in indexes:
            raw = gid(hca, 1, i)
            if raw and raw[:12] == IPV4_MAPPED and gid_type(hca, 1, i) == "RoCE v2":
                out.append(hca)
                break
    return out


def gid_type(hca: str, port: int, index: int) -> str | None:
    """`IB/RoCE v1` or `RoCE v2`; None for an unused index."""
    return read(f"{IB_CLASS}/{hca}/ports/{port}/gid_attrs/types/{index}", "") or None

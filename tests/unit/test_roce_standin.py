"""The RoCE stand-in (tests/standins/lib/roce_sysfs.py, bin/ibv_devinfo) on this machine, no node.

SPARK_SIM_ROOT points both at a temporary directory standing for a node's root: the daemon's tree
builder writes /sys/class/infiniband there from netdev descriptions shaped like `ip -j addr show`,
and ibv_devinfo reads it back. Nothing is mounted and no netlink is needed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROCE_SYSFS = REPO / "tests" / "standins" / "lib" / "roce_sysfs.py"
IBV_DEVINFO = REPO / "tests" / "standins" / "bin" / "ibv_devinfo"
MAC = "56:fa:89:b0:3d:62"
LINK_LOCAL = "fe80:0000:0000:0000:54fa:89ff:feb0:3d62"


@pytest.fixture
def roce(tmp_path, monkeypatch):
    """The daemon's module with its paths under tmp_path, and a netdev the test describes."""
    monkeypatch.setenv("SPARK_SIM_ROOT", str(tmp_path))
    spec = importlib.util.spec_from_file_location("roce_sysfs_under_test", ROCE_SYSFS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    netdevs = {}
    monkeypatch.setattr(mod, "netdev_info", netdevs.get)
    (tmp_path / "sys/class/net/enp1s0f1np1").mkdir(parents=True)
    mod.expose_sys_class()
    mod.netdevs = netdevs
    mod.root = tmp_path
    return mod


def netdev(flags=("BROADCAST", "MULTICAST", "UP", "LOWER_UP"), addrs=(), mtu=1500):
    return {"ifname": "enp1s0f1np1", "flags": list(flags), "mtu": mtu, "address": MAC, "addr_info": [
        {"family": "inet6" if ":" in a else "inet", "local": a} for a in addrs
    ]}


def set_netdev(roce, **kw):
    roce.netdevs["enp1s0f1np1"] = netdev(**kw)
    (roce.root / "sys/class/net/enp1s0f1np1/mtu").write_text(f"{kw.get('mtu', 1500)}\n")


def port(roce, rel, hca="rocep1s0f1"):
    return (roce.root / f"sys/class/infiniband/{hca}/ports/1" / rel).read_text().strip()


def gid_types(roce):
    types = roce.root / "sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types"
    return {int(p.name): p.read_text().strip() for p in types.iterdir()}


def devinfo(roce, *args):
    return subprocess.run([sys.executable, str(IBV_DEVINFO), *args], capture_output=True, text=True,
                          env=dict(os.environ, SPARK_SIM_ROOT=str(roce.root)))


def test_gid_table_follows_addresses_in_mlx5_order(roce):
    set_netdev(roce, addrs=["fe80::54fa:89ff:feb0:3d62", "10.232.1.10", "2001:db8::10"])
    driver = roce.Driver(roce.knobs({}))
    driver.sync()
    gids = {i: port(roce, f"gids/{i}") for i in range(16)}
    assert gids[0] == gids[1] == LINK_LOCAL
    assert gids[2] == gids[3] == "0000:0000:0000:0000:0000:ffff:0ae8:010a"
    assert gids[4] == gids[5] == "2001:0db8:0000:0000:0000:0000:0000:0010"
    assert all(gids[i] == "0000:0000:0000:0000:0000:0000:0000:0000" for i in range(6, 16))
    assert gid_types(roce) == {0: "IB/RoCE v1", 1: "RoCE v2", 2: "IB/RoCE v1", 3: "RoCE v2",
                               4: "IB/RoCE v1", 5: "RoCE v2"}
    ndevs = roce.root / "sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/ndevs"
    assert {p.read_text().strip() for p in ndevs.iterdir()} == {"enp1s0f1np1"}
    net = roce.root / "sys/class/infiniband/rocep1s0f1/device/net/enp1s0f1np1"
    assert os.readlink(net) == str(roce.root / "sys/class/net/enp1s0f1np1")
    assert (roce.root / "sys/class/infiniband/rocep1s0f1/node_guid").read_text() == "56fa:8903:00b0:3d62\n"
    # A removed address frees its slots; the next one added takes them, the others stay put.
    set_netdev(roce, addrs=["2001:db8::10"])
    driver.sync()
    assert port(roce, "gids/2") == "0000:0000:0000:0000:0000:0000:0000:0000"
    assert sorted(gid_types(roce)) == [0, 1, 4, 5]
    set_netdev(roce, addrs=["2001:db8::10", "10.232.1.11"])
    driver.sync()
    assert port(roce, "gids/3") == "0000:0000:0000:0000:0000:ffff:0ae8:010b"
    assert port(roce, "gids/5") == "2001:0db8:0000:0000:0000:0000:0000:0010"


def test_roce_v1_only_and_port_states(roce):
    set_netdev(roce, addrs=["10.232.1.10"])
    roce.Driver(roce.knobs({"roce": {"roce_v2": False}})).sync()
    assert gid_types(roce) == {0: "IB/RoCE v1", 1: "IB/RoCE v1"}
    assert port(roce, "gids/1") == "0000:0000:0000:0000:0000:ffff:0ae8:010a"
    driver = roce.Driver(roce.knobs({}))
    driver.sync()
    assert (port(roce, "state"), port(roce, "phys_state")) == ("4: ACTIVE", "5: LinkUp")
    set_netdev(roce, flags=("BROADCAST", "MULTICAST"))
    driver.sync()
    assert (port(roce, "state"), port(roce, "phys_state")) == ("1: DOWN", "3: Disabled")
    assert port(roce, "rate") == "40 Gb/sec (4X QDR)"
    set_netdev(roce)
    roce.Driver(roce.knobs({"roce": {"port_state": "INIT"}})).sync()
    assert (port(roce, "state"), port(roce, "phys_state")) == ("2: INIT", "5: LinkUp")
    with pytest.raises(roce.KnobError):
        roce.knobs({"roce": {"max_mtu": 9000}})


def test_no_driver_removes_the_class(roce):
    set_netdev(roce)
    roce.Driver(roce.knobs({})).sync()
    assert (roce.root / "sys/class/infiniband/rocep1s0f1").is_symlink()
    roce.Driver(roce.knobs({"roce": {"hcas": {}}})).sync()
    assert not (roce.root / "sys/class/infiniband").exists()
    assert not list((roce.root / "run/spark-sim-sys").glob("infiniband/*"))
    out = devinfo(roce)
    assert (out.returncode, out.stdout, out.stderr) == (
        255, "", "Failed to get IB devices list: Function not implemented\n")


@pytest.mark.parametrize(("mtu", "active"), [(1500, "1024 (3)"), (2200, "2048 (4)"), (4200, "4096 (5)"),
                                             (4191, "2048 (4)"), (9000, "4096 (5)")])
def test_ibv_devinfo_port_follows_the_netdev_mtu(roce, mtu, active):
    set_netdev(roce, mtu=mtu)
    roce.Driver(roce.knobs({})).sync()
    out = devinfo(roce, "-d", "rocep1s0f1", "-i", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        "hca_id:\trocep1s0f1\n"
        "\ttransport:\t\t\tInfiniBand (0)\n"
        "\tfw_ver:\t\t\t\t28.45.4028\n"
        "\tnode_guid:\t\t\t56fa:8903:00b0:3d62\n"
        "\tsys_image_guid:\t\t\t56fa:8903:00b0:3d62\n"
        "\tvendor_id:\t\t\t0x02c9\n"
        "\tvendor_part_id:\t\t\t4129\n"
        "\thw_ver:\t\t\t\t0x0\n"
        "\tphys_port_cnt:\t\t\t1\n"
        "\t\tport:\t1\n"
        "\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"
        "\t\t\tmax_mtu:\t\t4096 (5)\n"
        f"\t\t\tactive_mtu:\t\t{active}\n"
        "\t\t\tsm_lid:\t\t\t0\n"
        "\t\t\tport_lid:\t\t0\n"
        "\t\t\tport_lmc:\t\t0x00\n"
        "\t\t\tlink_layer:\t\tEthernet\n"
        "\n"
    )


def test_ibv_devinfo_caps_at_max_mtu_and_fails_like_rdma_core(roce):
    set_netdev(roce, mtu=9000)
    roce.Driver(roce.knobs({"roce": {"max_mtu": 2048}})).sync()
    assert json.loads((roce.root / "run/spark-sim/roce.json").read_text())["max_mtu"] == 2048
    out = devinfo(roce, "-d", "rocep1s0f1")
    assert "\t\t\tmax_mtu:\t\t2048 (4)\n\t\t\tactive_mtu:\t\t2048 (4)\n" in out.stdout
    # Both rails' devices, as rdma-core lists them (sorted by name).
    assert devinfo(roce, "-l").stdout == "2 HCAs found:\n\troceP2p1s0f1\n\trocep1s0f1\n\n"
    out = devinfo(roce, "-d", "mlx5_0")
    assert (out.returncode, out.stderr) == (255, "IB device 'mlx5_0' wasn't found\n")
    out = devinfo(roce, "-i", "2")
    # Each device is asked in turn, and each answers so.
    assert (out.returncode, out.stdout, out.stderr) == (4, "", "Invalid port requested for device\n" * 2)
    out = devinfo(roce, "-i", "0")
    assert out.returncode == 1 and out.stdout.startswith("Usage: ibv_devinfo")
    # The RDMA core loaded without any device: an empty class.
    roce.Driver(roce.knobs({"roce": {"hcas": {}}})).sync()
    (roce.root / "sys/class/infiniband").mkdir()
    assert devinfo(roce, "-l").stdout == "0 HCAs found:\n\n"
    out = devinfo(roce)
    assert (out.returncode, out.stderr) == (255, "No IB devices found\n")

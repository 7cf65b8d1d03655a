"""The fabric role's address arithmetic and nftables planning, without nodes."""

from __future__ import annotations

import json

import pytest

from tests.lib.role_module import module
from tests.lib.roles import filter_plugin

fabric = filter_plugin("fabric")


@pytest.mark.parametrize(
    ("address", "prefix", "problem"),
    [
        ("192.168.100.10", 24, ""),
        ("192.168.100.0", 24, "network or broadcast"),
        ("192.168.100.255", 24, "network or broadcast"),
        ("192.168.100.10", 31, "outside 8..30"),
        ("192.168.100.10", "x", "not a number"),
        ("192.168.100.300", 24, "not an IPv4 address"),
        ("169.254.1.1", 16, "link-local"),
    ],
)
def test_ipv4_error(address, prefix, problem):
    error = fabric.fabric_ipv4_error(address, prefix)
    assert (problem in error) if problem else error == ""


def test_off_subnet_lists_only_strangers():
    ips = {"a": "10.0.0.10", "b": "10.0.0.11", "c": "10.0.1.12", "d": "bogus"}
    prefixes = {"a": 24, "b": 24, "c": 24, "d": 24}
    assert fabric.fabric_off_subnet(["b", "c", "d"], ips, prefixes, "10.0.0.0/24") == ["c", "d"]
    # Same address range, different prefix: not the same subnet either.
    assert fabric.fabric_off_subnet(["b"], ips, {"b": 16}, "10.0.0.0/24") == ["b"]


def test_ifaces_in_network_finds_the_twin():
    addrs = [
        {"ifname": "enP7s7", "addr_info": [{"family": "inet", "local": "10.0.0.100", "prefixlen": 25},
                                           {"family": "inet6", "local": "fe80::1", "prefixlen": 64}]},
        {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
    ]
    assert fabric.fabric_ifaces_in_network(addrs, "10.0.0.0/24") == ["enP7s7 (10.0.0.100/25)"]


def chain(policy="drop", family="inet", hook="input"):
    return {"chain": {"family": family, "table": "filter", "name": "input", "hook": hook, "policy": policy}}


def rule(expr=None, comment=None, family="inet"):
    r = {"family": family, "table": "filter", "chain": "input", "expr": expr or [{"accept": None}]}
    if comment:
        r["comment"] = comment
    return {"rule": r}


def test_nft_no_ruleset_or_accepting_chain_is_no_firewall():
    assert fabric.fabric_nft_missing({"nftables": [{"metainfo": {}}]}, ["10.0.0.11"], "eth1") == []
    assert fabric.fabric_nft_missing({"nftables": [chain("accept"), rule()]}, ["10.0.0.11"], "eth1") == []
    assert fabric.fabric_nft_missing({"nftables": [chain(hook="output")]}, ["10.0.0.11"], "eth1") == []
    assert fabric.fabric_nft_missing({"nftables": [chain(family="ip6")]}, ["10.0.0.11"], "eth1") == []


def test_nft_dropping_chain_needs_one_rule_per_missing_peer():
    ruleset = {"nftables": [chain("accept"), rule([{"drop": None}]), rule(comment="spark-fabric from 10.0.0.11")]}
    missing = fabric.fabric_nft_missing(ruleset, ["10.0.0.11", "10.0.0.12"], "eth1")
    assert missing == [{"family": "inet", "table": "filter", "chain": "input", "peer": "10.0.0.12",
                        "interface": "eth1", "comment": "spark-fabric from 10.0.0.12"}]


def addrs(flags=("BROADCAST", "MULTICAST", "UP", "LOWER_UP"), mtu=9000, local="192.168.100.10", name="enp1s0f1np1"):
    info = [{"family": "inet", "local": local, "prefixlen": 24}] if local else []
    return [{"ifname": "lo", "flags": ["LOOPBACK", "UP"], "mtu": 65536, "addr_info": []},
            {"ifname": name, "flags": list(flags), "mtu": mtu, "addr_info": info}]


WANT = {"interface": "enp1s0f1np1", "ip": "192.168.100.10", "prefix": 24, "mtu": 9000}


def test_port_reads_admin_state_carrier_mtu_and_addresses():
    assert fabric.fabric_port(addrs(), "enp1s0f1np1") == {
        "present": True, "up": True, "carrier": True, "mtu": 9000, "addresses": ["192.168.100.10/24"]}
    assert fabric.fabric_port(addrs(flags=("NO-CARRIER", "BROADCAST", "UP")), "enp1s0f1np1")["carrier"] is False
    down = fabric.fabric_port(addrs(flags=("BROADCAST", "MULTICAST")), "enp1s0f1np1")
    assert (down["up"], down["carrier"]) == (False, False)
    assert fabric.fabric_port(addrs(), "enp9s0")["present"] is False


@pytest.mark.parametrize(("live", "drift"), [
    (addrs(), []),
    (addrs(mtu=1500), ["enp1s0f1np1 has MTU 1500, configured 9000"]),
    (addrs(flags=("BROADCAST", "MULTICAST")), ["enp1s0f1np1 is down (set down by hand: ip link set enp1s0f1np1 down)"]),
    (addrs(local=None), ["enp1s0f1np1 lacks its address 192.168.100.10/24 (has none)"]),
    # A cable out: networkd takes the address off with the carrier and puts it back with it; nothing to repair.
    (addrs(flags=("NO-CARRIER", "BROADCAST", "UP"), local=None), []),
    (addrs(name="enp9s0"), []),
])
def test_drift_is_what_netplan_apply_and_a_link_up_put_back(live, drift):
    assert fabric.fabric_drift(live, "enp1s0f1np1", "192.168.100.10", 24, 9000) == drift


def peer(host, in_play=True, **port):
    state = fabric.fabric_port(addrs(**port), "enp1s0f1np1") if in_play else None
    return {"host": host, "in_play": in_play, "port": state}


def test_causes_name_the_peers_port_the_peer_outside_the_run_or_the_cable():
    no_carrier = fabric.fabric_port(addrs(flags=("NO-CARRIER", "BROADCAST", "UP"), local=None), "enp1s0f1np1")
    down_there = fabric.fabric_port_cause(no_carrier, WANT, [peer("spark-1", flags=("BROADCAST",))])
    assert down_there[0].startswith("no carrier: the peer's port is down on spark-1")
    assert "not set while there is no carrier" in down_there[1]
    outside = fabric.fabric_port_cause(no_carrier, WANT, [peer("spark-1", in_play=False)])
    assert "the peer spark-1 (outside this run) is off, or its port is down" in outside[0]
    cable = fabric.fabric_port_cause(no_carrier, WANT, [peer("spark-1")])
    assert "the cable is not in this port" in cable[0]
    for causes in (down_there, outside, cable):
        assert not any("renderer" in c for c in causes)


def test_causes_of_a_port_with_carrier_that_keeps_the_wrong_mtu_or_no_address():
    live = fabric.fabric_port(addrs(mtu=1500, local=None), "enp1s0f1np1")
    causes = fabric.fabric_port_cause(live, WANT, [peer("spark-1")])
    assert "MTU 1500 after netplan apply, configured 9000: something else sets it" in causes[0]
    assert "another renderer manages enp1s0f1np1" in causes[1]
    still_down = fabric.fabric_port(addrs(flags=("BROADCAST",)), "enp1s0f1np1")
    assert "still down after netplan apply and ip link set up" in fabric.fabric_port_cause(still_down, WANT, [])[0]


def test_peer_port_is_the_last_reading_of_its_own_play():
    reread = {"stdout": json.dumps(addrs(mtu=1500))}
    hostvars = {"spark-1": {"__fabric_link": reread, "__fabric_probe": {"addrs": {"stdout": "[]"}}}}
    assert fabric.fabric_peer_port("spark-1", hostvars, ["spark-0", "spark-1"], "enp1s0f1np1")["port"]["mtu"] == 1500
    skipped = {"spark-1": {"__fabric_link": {"skipped": True},
                           "__fabric_probe": {"addrs": {"stdout": json.dumps(addrs())}}}}
    assert fabric.fabric_peer_port("spark-1", skipped, ["spark-1"], "enp1s0f1np1")["port"]["mtu"] == 9000
    assert fabric.fabric_peer_port("spark-1", {}, ["spark-0"], "enp1s0f1np1") == {
        "host": "spark-1", "in_play": False, "port": None}


# ---- RoCE: what NCCL can use on the fabric port, and why not --------------------------------------------------

IFACE, ADDR = "enp1s0f1np1", "10.232.1.10"
MAPPED = "0000:0000:0000:0000:0000:ffff:0ae8:010a"  # ::ffff:10.232.1.10, as sysfs writes it
LINK_LOCAL = "fe80:0000:0000:0000:0a00:27ff:fe00:0001"
RAIL = {"interface": IFACE, "ip": ADDR, "primary": True}
RAIL2, ADDR2 = "enP2p1s0f1np1", "10.233.1.10"
MAPPED2 = "0000:0000:0000:0000:0000:ffff:0ae9:010a"  # ::ffff:10.233.1.10


def rdma(*, state="ACTIVE", phys="LinkUp", v2=True, active=4096, max_mtu=4096, netdev=IFACE, devinfo_rc=0, address=True):
    gids = [{"index": 0, "gid": LINK_LOCAL, "type": "IB/RoCE v1", "ndev": netdev}]
    if v2:
        gids.append({"index": 1, "gid": LINK_LOCAL, "type": "RoCE v2", "ndev": netdev})
    if address:
        gids.append({"index": len(gids), "gid": MAPPED, "type": "IB/RoCE v1", "ndev": netdev})
        if v2:
            gids.append({"index": len(gids), "gid": MAPPED, "type": "RoCE v2", "ndev": netdev})
    port = {"port": 1, "state": state, "phys_state": phys, "link_layer": "Ethernet", "gids": gids,
            "active_mtu": active if devinfo_rc == 0 else None, "max_mtu": max_mtu if devinfo_rc == 0 else None}
    return {"devices": [{"name": "rocep1s0f1", "netdevs": [netdev], "ports": [port]}],
            "devinfo": {"rc": devinfo_rc, "stdout": "", "stderr": ""}}


@pytest.mark.parametrize(("netdev_mtu", "roce"), [(9000, 4096), (4200, 4096), (4191, 2048), (1500, 1024), (600, 256)])
def test_roce_mtu_is_the_largest_ib_mtu_that_fits_after_the_roce_headers(netdev_mtu, roce):
    assert fabric.fabric_roce_mtu(netdev_mtu) == roce


def test_a_usable_device_gives_the_ranks_its_name_and_the_v2_gid_index_of_the_fabric_address():
    assert fabric.fabric_rdma_usable(rdma(), RAIL) == {"hcas": ["rocep1s0f1"], "gid_index": 3,
                                                     "gid_indexes": {"rocep1s0f1": 3}}
    report = fabric.fabric_rdma_report({"spark-0": rdma(), "spark-1": rdma()}, "spark-0", [RAIL], 9000)
    assert report["warnings"] == []
    assert report["lines"] == [f"rocep1s0f1 port 1 ({IFACE}): ACTIVE, active MTU 4096, RoCE v2 GID index 3 ({ADDR})"]


@pytest.mark.parametrize(("reading", "cause"), [
    ({"devices": [], "devinfo": {}}, "no RDMA device at all"),
    (rdma(netdev="enP2p1s0f1np1"), f"no RDMA device behind {IFACE}"),
    (rdma(state="DOWN", phys="Disabled"), "has no link"),
    (rdma(state="DOWN"), "the driver keeps the RDMA port down"),
    (rdma(v2=False), "only in a GID of type IB/RoCE v1 (index 1)"),
    (rdma(address=False), f"has no GID for {ADDR}"),
])
def test_each_cause_of_a_socket_fallback_is_named_and_nothing_is_given_to_nccl(reading, cause):
    assert fabric.fabric_rdma_usable(reading, RAIL) == {"hcas": [], "gid_index": None, "gid_indexes": {}}
    report = fabric.fabric_rdma_report({"spark-0": reading}, "spark-0", [RAIL], 9000)
    assert len(report["warnings"]) == 1, report
    assert cause in report["warnings"][0] and "falls back to its socket transport" in report["warnings"][0], report


def test_an_active_mtu_below_the_fabric_mtu_or_a_peers_is_a_warning_that_still_gives_rdma():
    capped = fabric.fabric_rdma_report({"spark-0": rdma(active=1024, max_mtu=1024), "spark-1": rdma()},
                                       "spark-0", [RAIL], 9000)
    assert capped["usable"]["hcas"] == ["rocep1s0f1"]
    assert [w for w in capped["warnings"] if "active MTU of 1024, not the 4096" in w and "maximum is 1024" in w]
    assert [w for w in capped["warnings"] if "spark-1 has 4096: RDMA between them runs at 1024" in w]
    peer = fabric.fabric_rdma_report({"spark-0": rdma(), "spark-1": rdma(active=1024, max_mtu=1024)},
                                     "spark-0", [RAIL], 9000)
    assert [w for w in peer["warnings"] if "spark-1 has 1024" in w] and len(peer["warnings"]) == 1


def test_without_ibv_devinfo_the_active_mtu_is_a_line_not_a_guess():
    report = fabric.fabric_rdma_report({"spark-0": rdma(devinfo_rc=127)}, "spark-0", [RAIL], 9000)
    assert report["warnings"] == []
    assert any("ibv_devinfo is not installed (apt install ibverbs-utils)" in line for line in report["lines"])


def test_the_newest_reading_is_the_one_taken_again_after_a_change():
    hostvars = {"a": {"__fabric_probe": {"rdma": {"devices": []}}, "__fabric_reread": {"rdma": rdma()}},
                "b": {"__fabric_probe": {"rdma": rdma()}, "__fabric_reread": {"skipped": True}}}
    reads = fabric.fabric_rdma_reads(["a", "b"], hostvars)
    assert reads == {"a": rdma(), "b": rdma()}


DEVINFO = """hca_id:\trocep1s0f1
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t28.45.4028
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t1024 (3)
\t\t\tlink_layer:\t\tEthernet

hca_id:\troceP2p1s0f1
\ttransport:\t\t\tInfiniBand (0)
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_DOWN (1)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t4096 (5)
"""


def test_the_probe_reads_each_ports_mtus_from_ibv_devinfo():
    probe = module("fabric_probe")
    assert probe._devinfo_mtus(DEVINFO) == {("rocep1s0f1", 1): {"active_mtu": 1024, "max_mtu": 4096},
                                            ("roceP2p1s0f1", 1): {"active_mtu": 4096, "max_mtu": 4096}}


def test_rails_usable_on_both_ends_are_measured_each_on_a_port_of_its_own():
    ips = {"spark-0": [ADDR], "spark-1": [ADDR], "spark-2": [ADDR]}
    perftest = {"ib_write_bw": "/usr/bin/ib_write_bw"}
    reads = {"spark-0": {**rdma(), **perftest}, "spark-1": {**rdma(), **perftest},
             "spark-2": {**rdma(state="DOWN"), **perftest}}
    members = ["spark-0", "spark-1", "spark-2"]
    rounds = fabric.fabric_pair_rounds(members, members)
    plan = fabric.fabric_rdma_pairs(reads, rounds, [IFACE], rail_ips=ips, port=18515)
    # spark-2's rail is not usable: its own warning says why, and nothing is measured with it.
    assert plan == {"unmeasured": [], "pairs": [
        {"round": 2, "from": "spark-0", "to": "spark-1", "owner": "spark-1", "rail": IFACE, "address": ADDR,
         "from_hca": "rocep1s0f1", "from_gid": 3, "to_hca": "rocep1s0f1", "to_gid": 3, "port": 18515}]}
    reads["spark-1"] = rdma()
    plan = fabric.fabric_rdma_pairs(reads, fabric.fabric_pair_rounds(members[:2], members), [IFACE], rail_ips=ips,
                                    port=18515)
    assert plan["pairs"] == []
    assert plan["unmeasured"] == ["spark-0 -> spark-1: RDMA bandwidth not measured: ib_write_bw is not installed on "
                                  "spark-1 (apt install perftest)"]


def test_every_pair_of_a_group_is_measured_in_rounds_of_pairs_that_share_no_node():
    # A pair: the head to the worker, one round, as the proof has always measured it.
    assert fabric.fabric_pair_rounds(["h", "w"], ["h", "w"]) == [[{"from": "h", "to": "w", "index": 0, "owner": "w"}]]
    for size, rounds_wanted in ((3, 3), (4, 3), (5, 5), (8, 7)):
        members = [f"spark-{i}" for i in range(size)]
        rounds = fabric.fabric_pair_rounds(members, members)
        assert len(rounds) == rounds_wanted
        pairs = [(p["from"], p["to"]) for r in rounds for p in r]
        # Every pair once, the lower rank measuring, each with a port index of its own.
        assert sorted(pairs) == [(a, b) for i, a in enumerate(members) for b in members[i + 1:]]
        assert sorted(p["index"] for r in rounds for p in r) == list(range(len(pairs)))
        for r in rounds:
            ends = [h for p in r for h in (p["from"], p["to"])]
            assert len(ends) == len(set(ends)), r
    # --limit to one worker of four: its three pairs, owned by whichever end is in the run; the others not measured.
    members = ["spark-0", "spark-1", "spark-2", "spark-3"]
    kept = [p for r in fabric.fabric_pair_rounds(members, ["spark-2"]) for p in r]
    assert sorted((p["from"], p["to"], p["owner"]) for p in kept) == [
        ("spark-0", "spark-2", "spark-2"), ("spark-1", "spark-2", "spark-2"), ("spark-2", "spark-3", "spark-2")]


def test_the_write_bandwidth_is_the_average_of_the_result_line():
    out = (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
           " 65536      18600            97.63              97.50  \t\t   0.185967\n"
           "---------------------------------------------------------------------------------------\n")
    assert fabric.fabric_write_bw_gbps(out) == 97.5
    assert fabric.fabric_write_bw_gbps("Couldn't connect to 10.0.0.1:18515") is None


def two_rails(*, second_state="ACTIVE", second_gid=3, second_netdev=RAIL2):
    """A node's reading with both ConnectX-7 rails: the fabric port's device and the second rail's."""
    first = rdma()
    port = {"port": 1, "state": second_state, "phys_state": "LinkUp", "link_layer": "Ethernet",
            "gids": [{"index": second_gid, "gid": MAPPED2, "type": "RoCE v2", "ndev": second_netdev}],
            "active_mtu": 4096, "max_mtu": 4096}
    first["devices"].append({"name": "roceP2p1s0f1", "netdevs": [second_netdev], "ports": [port]})
    return first


RAILS = [RAIL, {"interface": RAIL2, "ip": ADDR2, "primary": False}]


def test_a_rail_takes_the_nodes_host_number_in_its_own_subnet():
    extra = [{"interface": RAIL2, "subnet": "10.233.1.0/24"}]
    assert fabric.fabric_rails(extra, IFACE, ADDR, 24) == [
        {"interface": IFACE, "ip": ADDR, "prefix": 24, "primary": True},
        {"interface": RAIL2, "ip": ADDR2, "prefix": 24, "primary": False}]
    assert fabric.fabric_rail_ips(["a"], {"a": ADDR}, {"a": 24}, extra) == {"a": [ADDR, ADDR2]}
    assert fabric.fabric_rail_address("192.168.100.11", 24, "192.168.101.0/24") == "192.168.101.11"
    # No room for host number 200 in a /25, and none for a subnet that is no network.
    assert fabric.fabric_rail_address("192.168.100.200", 24, "192.168.101.0/25") == ""
    assert fabric.fabric_rail_address("192.168.100.11", 24, "192.168.101.7/24") == ""
    assert fabric.fabric_rails_errors([], IFACE, ADDR, 24, [IFACE]) == []
    assert fabric.fabric_rails_errors(extra, IFACE, ADDR, 24, [IFACE, RAIL2]) == []


@pytest.mark.parametrize(("extra", "problem"), [
    ("enP2p1s0f1np1", "it must be a list of {interface, subnet}"),
    ([{"interface": RAIL2}], "each rail needs an interface and a subnet"),
    ([{"interface": IFACE, "subnet": "10.233.1.0/24"}], "which is already the fabric port"),
    ([{"interface": RAIL2, "subnet": "10.233.1.0/24"}, {"interface": RAIL2, "subnet": "10.234.1.0/24"}],
     "which is already another rail"),
    ([{"interface": "enP9s9", "subnet": "10.233.1.0/24"}], "which this node does not have"),
    ([{"interface": RAIL2, "subnet": "10.233.1.7/24"}], "has host bits set"),
    ([{"interface": RAIL2, "subnet": "10.233.1.0/31"}], "prefix /31 is outside 8..30"),
    ([{"interface": RAIL2, "subnet": "10.232.0.0/16"}], "overlaps the fabric port's subnet"),
    ([{"interface": RAIL2, "subnet": "10.233.1.0/29"}], "has no room for this node's host number"),
])
def test_a_rail_that_cannot_work_is_refused_with_its_fix(extra, problem):
    errors = fabric.fabric_rails_errors(extra, IFACE, ADDR, 24, [IFACE, RAIL2])
    assert len(errors) == 1 and problem in errors[0] and "Fix:" in errors[0], errors
    assert errors[0].startswith("fabric_extra_rails (spark_fabric_extra_rails)"), errors


def test_both_rails_are_given_to_the_ranks_with_their_shared_gid_index():
    assert fabric.fabric_rdma_usable(two_rails(), RAILS) == {
        "hcas": ["rocep1s0f1", "roceP2p1s0f1"], "gid_index": 3, "gid_indexes": {"rocep1s0f1": 3, "roceP2p1s0f1": 3}}
    report = fabric.fabric_rdma_report({"spark-0": two_rails()}, "spark-0", RAILS, 9000)
    assert report["warnings"] == []
    assert report["lines"][1] == f"roceP2p1s0f1 port 1 ({RAIL2}): ACTIVE, active MTU 4096, RoCE v2 GID index 3 ({ADDR2})"
    # GID indexes that differ: no NCCL_IB_GID_INDEX, said so.
    mixed = fabric.fabric_rdma_report({"spark-0": two_rails(second_gid=5)}, "spark-0", RAILS, 9000)
    assert mixed["usable"]["gid_index"] is None and mixed["usable"]["hcas"] == ["rocep1s0f1", "roceP2p1s0f1"]
    assert "NCCL_IB_GID_INDEX is left unset" in mixed["lines"][-1]


def test_a_rail_down_is_a_warning_and_the_ranks_keep_the_other():
    report = fabric.fabric_rdma_report({"spark-0": two_rails(second_state="DOWN")}, "spark-0", RAILS, 9000)
    assert report["usable"]["hcas"] == ["rocep1s0f1"]
    (warning,) = report["warnings"]
    assert "roceP2p1s0f1 port 1 is DOWN although enP2p1s0f1np1 has its link" in warning
    assert "NCCL runs RDMA on rocep1s0f1 only" in warning and "socket" not in warning


def test_the_ranks_get_only_the_rails_every_member_can_use():
    ips = {"spark-0": [ADDR, ADDR2], "spark-1": [ADDR, ADDR2]}
    reads = {"spark-0": two_rails(), "spark-1": two_rails(second_state="DOWN")}
    group = fabric.fabric_rdma_group_usable(two_rails(), "spark-0", [IFACE, RAIL2], rail_ips=ips, reads=reads)
    assert group["hcas"] == ["rocep1s0f1"] and group["gid_index"] == 3
    assert group["left_out"] == [f"rail {RAIL2} is left out of NCCL_IB_HCA: spark-1 cannot use it (its warning names "
                                 "why), and every rank is given the same rails"]
    # Read alone (server.yml's facts entry point): its own rails.
    alone = fabric.fabric_rdma_group_usable(two_rails(), "spark-0", [IFACE, RAIL2], rail_ips=ips, reads={})
    assert alone["hcas"] == ["rocep1s0f1", "roceP2p1s0f1"] and alone["left_out"] == []


def test_a_second_rail_with_a_link_that_is_not_configured_is_named():
    report = fabric.fabric_rdma_report({"spark-0": two_rails()}, "spark-0", [RAIL], 9000)
    assert report["usable"]["hcas"] == ["rocep1s0f1"]
    (warning,) = report["warnings"]
    assert f"roceP2p1s0f1 port 1 ({RAIL2}) has a link but is no rail" in warning
    assert "Fix: add each to spark_fabric_extra_rails" in warning


def test_each_rail_is_measured_between_its_own_devices_and_addresses():
    perftest = {"ib_write_bw": "/usr/bin/ib_write_bw"}
    reads = {"spark-0": {**two_rails(), **perftest}, "spark-1": {**two_rails(), **perftest}}
    # Both readings carry the GIDs of .10: the worker reads as if it had the head's addresses.
    ips = {"spark-0": [ADDR, ADDR2], "spark-1": [ADDR, ADDR2]}
    plan = fabric.fabric_rdma_pairs(reads, fabric.fabric_pair_rounds(["spark-0", "spark-1"], ["spark-0", "spark-1"]),
                                    [IFACE, RAIL2], rail_ips=ips, port=18515)
    assert [(p["rail"], p["from_hca"], p["to_hca"], p["address"], p["port"]) for p in plan["pairs"]] == [
        (IFACE, "rocep1s0f1", "rocep1s0f1", ADDR, 18515),
        (RAIL2, "roceP2p1s0f1", "roceP2p1s0f1", ADDR2, 18516)]


def test_a_rail_fault_is_named_by_its_cause():
    up = [{"ifname": RAIL2, "flags": ["BROADCAST", "UP", "LOWER_UP"], "mtu": 9000,
           "addr_info": [{"family": "inet", "local": ADDR2, "prefixlen": 24}]}]
    rail = {"interface": RAIL2, "ip": ADDR2, "prefix": 24}
    route = {"item": "10.233.1.11", "rc": 0, "stdout": json.dumps([{"dev": RAIL2, "prefsrc": ADDR2}])}
    ok = {"routes": [route], "pings": [{"item": "10.233.1.11", "rc": 0}]}
    kw = {"mtu": 9000, "peers": ["10.233.1.11"], "peer_ports": []}
    assert fabric.fabric_rail_faults(ok, up, rail, **kw) == []
    no_carrier = [{**up[0], "flags": ["NO-CARRIER", "BROADCAST", "UP"], "addr_info": []}]
    (fault,) = fabric.fabric_rail_faults({}, no_carrier, rail, **kw)
    assert fault.startswith(f"rail {RAIL2} is up with NO CARRIER") and "no carrier although the peer's port is up" in fault
    small = {"routes": [route], "pings": [{"item": "10.233.1.11", "rc": 1, "small": {"rc": 0}}]}
    assert "answers small pings but not 8972-byte ones" in fabric.fabric_rail_faults(small, up, rail, **kw)[0]


NET_IB = "NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:{ip}<0>"
ALL_REDUCE_IB = "\n".join([
    "spark-0:101:101 [0] " + NET_IB.format(ip="10.232.1.10"),
    "spark-0:101:101 [0] NCCL INFO Using network IB",
    "# nThread 1 nGpus 1 minBytes 1073741824 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20",
    "  1073741824     268435456     float     sum      -1  46301.0   23.19   23.19      0  46301.0   23.19   23.19      0",
    "# Out of bounds values : 0 OK",
    "# Avg bus bandwidth    : 23.19 ",
    "#",
    "spark-1:202:202 [0] " + NET_IB.format(ip="10.232.1.11"),
    "spark-1:202:202 [0] NCCL INFO Using network IB",
])


def test_the_all_reduce_figure_and_the_network_nccl_chose_are_read():
    assert fabric.fabric_all_reduce(ALL_REDUCE_IB) == {
        "busbw": 23.19, "network": "IB",
        "hosts": {"spark-0": ["rocep1s0f1", "roceP2p1s0f1"], "spark-1": ["rocep1s0f1", "roceP2p1s0f1"]}}
    fallback = ALL_REDUCE_IB.replace(NET_IB.format(ip="10.232.1.11"), "NCCL INFO NET/IB : No device found.").replace(
        "Using network IB", "Using network Socket").replace("23.19", "1.9")
    said = fabric.fabric_all_reduce(fallback)
    assert (said["busbw"], said["network"], said["hosts"]["spark-1"]) == (1.9, "Socket", [])
    assert fabric.fabric_all_reduce("ORTE was unable to reliably start one or more daemons.") == {
        "busbw": None, "network": None, "hosts": {}}


@pytest.mark.parametrize(("reads", "play", "trust", "why"), [
    ({"a": "mpirun=/usr/bin/mpirun\nall_reduce_perf=/usr/bin/all_reduce_perf\nunit=inactive"}, ["a"], True,
     "b is outside this run"),
    ({}, ["a", "b"], False, "which fabric_ssh_trust turns off"),
    ({"a": "mpirun=/usr/bin/mpirun\nall_reduce_perf=/usr/bin/all_reduce_perf\nunit=active",
      "b": "mpirun=/usr/bin/mpirun\nall_reduce_perf=/usr/bin/all_reduce_perf\nunit=inactive"}, ["a", "b"], True,
     "the ranks hold the GPUs (spark-llm.service is running on a)"),
    ({"a": "mpirun=/usr/bin/mpirun\nall_reduce_perf=\nunit=inactive",
      "b": "mpirun=/usr/bin/mpirun\nall_reduce_perf=/usr/bin/all_reduce_perf\nunit=inactive"}, ["a", "b"], True,
     "all_reduce_perf on a not found. Build nccl-tests with MPI=1"),
])
def test_the_all_reduce_runs_only_across_the_whole_idle_group_with_its_tools(reads, play, trust, why):
    plan = fabric.fabric_busbw_plan(reads, ["a", "b"], play, trust=trust, unit="spark-llm.service")
    assert plan["run"] is False and why in plan["why_not"], plan
    ready = {h: "mpirun=/usr/bin/mpirun\nall_reduce_perf=/usr/bin/all_reduce_perf\nunit=inactive" for h in "ab"}
    assert fabric.fabric_busbw_plan(ready, ["a", "b"], ["a", "b"], trust=True, unit="u") == {"run": True, "why_not": ""}


def test_the_gid_tables_have_settled_when_every_active_port_has_its_address():
    assert fabric.fabric_rdma_settled(two_rails(), RAILS)
    # The address is on the port, its GID not yet in the table: wait.
    assert not fabric.fabric_rdma_settled(rdma(address=False), [RAIL])
    # A port that is not ACTIVE cannot get there: not waited for.
    assert fabric.fabric_rdma_settled(rdma(state="DOWN", address=False), [RAIL])


def test_the_record_keeps_each_figure_with_the_time_it_was_taken():
    pair = {"round": 0, "from": "spark-0", "to": "spark-1", "owner": "spark-1", "rail": IFACE, "address": ADDR,
            "from_hca": "rocep1s0f1", "from_gid": 3, "to_hca": "rocep1s0f1", "to_gid": 3, "port": 18515}
    out = (" 65536      18600            97.63              97.50  \t\t   0.185967\n")
    first = fabric.fabric_record({}, time="T1", members=["spark-0", "spark-1"], rails=[IFACE],
                                 rdma_results=[{"item": pair, "rc": 0, "stdout": out}],
                                 busbw={"rc": 0, "stdout": ALL_REDUCE_IB}, busbw_bytes="1G")
    assert first["rdma_write"] == {"time": "T1", "pairs": [
        {"rail": IFACE, "from": "spark-0", "from_hca": "rocep1s0f1", "to": "spark-1", "to_hca": "rocep1s0f1",
         "gbits_per_second": 97.5}]}
    assert first["all_reduce"]["busbw_gbytes_per_second"] == 23.19 and first["all_reduce"]["network"] == "IB"
    # A later run that measured RDMA and TCP only (the ranks held the GPUs) keeps the all-reduce figure and its time.
    tcp = {"from": "spark-0", "to": "spark-1", "index": 0, "owner": "spark-1"}
    iperf = json.dumps({"end": {"sum_received": {"bits_per_second": 9.4e9}}})
    later = fabric.fabric_record(first, time="T2", members=["spark-0", "spark-1"], rails=[IFACE],
                                 rdma_results=[{"item": pair, "rc": 1, "stdout": ""}],
                                 iperf_results=[{"item": tcp, "rc": 0, "stdout": iperf}])
    assert later["all_reduce"] == first["all_reduce"]
    assert later["rdma_write"]["time"] == "T2" and later["rdma_write"]["pairs"][0]["gbits_per_second"] is None
    assert fabric.fabric_record_lines(later) == [
        f"fabric: RDMA write spark-0 rocep1s0f1 -> spark-1 rocep1s0f1 ({IFACE}): failed (measured T2)",
        "fabric: TCP (iperf3) spark-0 -> spark-1: 9.40 Gbit/s (measured T2)",
        "fabric: all-reduce across spark-0, spark-1 (1G messages): 23.19 GB/s bus bandwidth over NCCL's IB transport "
        "(measured T1)"]
    assert fabric.fabric_record_lines({}) == []
    # A record written before every pair was measured named the head's device and the worker: the head measured.
    old = {"members": ["spark-0", "spark-1"], "rdma_write": {"time": "T0", "pairs": [
        {"rail": IFACE, "head_hca": "rocep1s0f1", "worker": "spark-1", "worker_hca": "rocep1s0f1", "gbits_per_second": 97.5}]}}
    assert fabric.fabric_record_lines(old) == [
        f"fabric: RDMA write spark-0 rocep1s0f1 -> spark-1 rocep1s0f1 ({IFACE}): 97.50 Gbit/s (measured T0)"]


def test_each_further_rail_is_reported_with_its_reach_or_its_cause():
    up = [{"ifname": RAIL2, "flags": ["BROADCAST", "UP", "LOWER_UP"], "mtu": 9000,
           "addr_info": [{"family": "inet", "local": ADDR2, "prefixlen": 24}]}]
    rails = [{"interface": IFACE, "ip": ADDR, "prefix": 24}, {"interface": RAIL2, "ip": ADDR2, "prefix": 24}]
    rail_peers = [{"interface": IFACE, "peers": ["10.232.1.11"]}, {"interface": RAIL2, "peers": ["10.233.1.11"]}]
    route = {"item": "10.233.1.11", "rc": 0, "stdout": json.dumps([{"dev": RAIL2, "prefsrc": ADDR2}])}
    kw = {"mtu": 9000, "rail_peers": rail_peers, "peers": ["spark-1"], "hostvars": {}, "play_hosts": []}
    ok = fabric.fabric_rails_report([{"routes": [route], "pings": [{"item": "10.233.1.11", "rc": 0}]}], up, rails, **kw)
    assert ok == {"lines": [f"rail {RAIL2} ({ADDR2}/24, MTU 9000) reaches 10.233.1.11 with full-size frames"],
                  "warnings": []}
    silent = fabric.fabric_rails_report([{"routes": [route], "pings": [{"item": "10.233.1.11", "rc": 1}]}], up, rails, **kw)
    assert silent["lines"] == [] and silent["warnings"][0].startswith(f"rail {RAIL2}: 10.233.1.11 does not answer")
    assert silent["warnings"][0].endswith("the ranks run on the other rails until it is fixed")


def test_the_ports_set_down_are_the_rails_a_link_up_brings_back():
    down = [{"ifname": IFACE, "flags": ["BROADCAST", "MULTICAST"], "mtu": 9000, "addr_info": []},
            {"ifname": RAIL2, "flags": ["NO-CARRIER", "BROADCAST", "UP"], "mtu": 9000, "addr_info": []}]
    # The fabric port is down; the rail is up without carrier (nothing a link up does); a port absent is no port.
    assert fabric.fabric_ports_down(down, [IFACE, RAIL2, "enP9s9"]) == [IFACE]


def test_a_dropping_forward_chain_needs_the_rings_two_directions_once():
    ports = ["enp1s0f0np0", "enp1s0f1np1"]
    forward = {"chain": {"family": "ip", "table": "filter", "name": "FORWARD", "hook": "forward", "policy": "drop"}}
    missing = fabric.fabric_nft_missing_forward({"nftables": [forward]}, ports)
    assert missing == [
        {"family": "ip", "table": "filter", "chain": "FORWARD", "in": ports[0], "out": ports[1],
         "comment": "spark-fabric ring enp1s0f0np0 -> enp1s0f1np1"},
        {"family": "ip", "table": "filter", "chain": "FORWARD", "in": ports[1], "out": ports[0],
         "comment": "spark-fabric ring enp1s0f1np1 -> enp1s0f0np0"}]
    done = {"rule": {"family": "ip", "table": "filter", "chain": "FORWARD", "expr": [{"accept": None}],
                     "comment": missing[0]["comment"]}}
    assert [m["in"] for m in fabric.fabric_nft_missing_forward({"nftables": [forward, done]}, ports)] == [ports[1]]
    # An accepting forward chain, or an input chain, is nothing to open.
    assert fabric.fabric_nft_missing_forward({"nftables": [chain("accept", hook="forward"), chain()]}, ports) == []

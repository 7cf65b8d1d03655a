"""A TP group cabled in a ring without a switch (plugins/module_utils/fabric_ring.py): the cables' addresses, the
host routes and their symmetry, what each port lets in, the pairs the RDMA proof measures, the input refused with its
fix, and the cabling the nodes report checked against the group's order."""

from __future__ import annotations

import pytest

from tests.lib.role_module import module
from tests.lib.roles import filter_plugin

fabric = filter_plugin("fabric")
F = fabric.FilterModule().filters()
NODES = ["spark-0", "spark-1", "spark-2", "spark-3"]
IPS = {h: f"192.168.100.{10 + i}" for i, h in enumerate(NODES)}
FIRST, SECOND = "enp1s0f0np0", "enp1s0f1np1"
PORTS = {h: [FIRST, SECOND] for h in NODES}
SUBNET = "192.168.110.0/24"


def plan(members=NODES):
    return F["fabric_ring_plan"](members, IPS, PORTS, SUBNET, "fabric0")


def test_each_cable_is_a_subnet_of_its_own_from_one_nodes_first_port_to_the_next_nodes_second():
    p = plan()
    assert p["spark-0"]["rails"] == [
        {"interface": "fabric0", "ip": "192.168.100.10", "prefix": 32, "primary": True},
        {"interface": FIRST, "ip": "192.168.110.1", "prefix": 30, "primary": False},
        {"interface": SECOND, "ip": "192.168.110.14", "prefix": 30, "primary": False},
    ]
    assert p["spark-1"]["rails"][2]["ip"] == "192.168.110.2"
    assert p["spark-3"]["rails"][1]["ip"] == "192.168.110.13"
    assert p["spark-0"]["neighbours"] == {FIRST: "spark-1", SECOND: "spark-3"}
    assert F["fabric_ring_rail_ips"](p)["spark-2"] == ["192.168.100.12", "192.168.110.9", "192.168.110.6"]


def test_the_node_across_a_ring_of_four_is_reached_through_the_same_neighbour_in_both_directions():
    p = plan()
    route = {h: {r["peer"]: r for r in p[h]["routes"]} for h in NODES}
    # spark-0 <-> spark-2 through spark-1 (first in the group of their common neighbours), both ways.
    assert route["spark-0"]["spark-2"] == {"peer": "spark-2", "to": "192.168.100.12/32", "via": "192.168.110.2",
                                            "interface": FIRST, "from": "192.168.100.10"}
    assert route["spark-2"]["spark-0"]["via"] == "192.168.110.5"
    assert route["spark-2"]["spark-0"]["interface"] == SECOND
    # spark-1 <-> spark-3 through spark-0.
    assert route["spark-1"]["spark-3"]["interface"] == SECOND
    assert route["spark-3"]["spark-1"]["interface"] == FIRST
    # Every flow comes back over the cable it went out on (strict reverse-path filtering holds).
    for a in NODES:
        for b in NODES:
            if a != b:
                there = p[a]["neighbours"][route[a][b]["interface"]]
                back = p[b]["neighbours"][route[b][a]["interface"]]
                assert (there, back) == (b, a) if there == b else there == back


def test_a_ports_firewall_peers_are_its_neighbour_and_the_nodes_routed_over_it():
    p = plan()
    assert p["spark-0"]["rail_peers"] == [{"interface": "fabric0", "peers": []},
                                          {"interface": FIRST, "peers": ["192.168.110.2"]},
                                          {"interface": SECOND, "peers": ["192.168.110.13"]}]
    assert p["spark-0"]["ingress"] == [{"interface": FIRST, "peers": ["192.168.110.2", "192.168.100.11", "192.168.100.12"]},
                                       {"interface": SECOND, "peers": ["192.168.110.13", "192.168.100.13"]}]


def test_a_ring_of_three_has_no_node_across_it():
    p = plan(NODES[:3])
    assert all(r["via"] in {x["ip"] for h in NODES[:3] for x in p[h]["rails"][1:]} for r in p["spark-0"]["routes"])
    assert {r["peer"]: r["interface"] for r in p["spark-0"]["routes"]} == {"spark-1": FIRST, "spark-2": SECOND}


def test_the_rdma_proof_measures_each_cable_once_in_rounds_that_share_no_node():
    rounds = F["fabric_ring_pair_rounds"](NODES, NODES)
    assert [[(p["from"], p["to"]) for p in r] for r in rounds] == [
        [("spark-0", "spark-1"), ("spark-2", "spark-3")], [("spark-1", "spark-2"), ("spark-3", "spark-0")]]
    assert len(F["fabric_ring_pair_rounds"](NODES[:3], NODES[:3])) == 3
    # A node re-provisioned alone is still measured, from its neighbours' ends where they are not in the run.
    alone = F["fabric_ring_pair_rounds"](NODES, ["spark-2"])
    assert [(p["from"], p["to"], p["owner"]) for r in alone for p in r] == [("spark-2", "spark-3", "spark-2"),
                                                                            ("spark-1", "spark-2", "spark-2")]


def test_each_cable_is_measured_from_the_first_port_of_one_end_to_the_second_of_the_other():
    p = plan()
    v2 = {"state": "ACTIVE", "port": 1}

    def read(host):
        rails = p[host]["rails"]
        return {"ib_write_bw": "/usr/bin/ib_write_bw", "devices": [
            {"name": hca, "netdevs": [port], "ports": [{**v2, "gids": [
                {"index": 3, "type": "RoCE v2", "ndev": port, "gid": f"0000:0000:0000:0000:0000:ffff:{ip_hex(ip)}"}]}]}
            for hca, port, ip in (("rocep1s0f0", FIRST, rails[1]["ip"]), ("rocep1s0f1", SECOND, rails[2]["ip"]))]}

    rounds = F["fabric_ring_pair_rounds"](NODES, NODES)
    got = fabric.fabric_rdma_pairs({h: read(h) for h in NODES}, rounds, [r["interface"] for r in p["spark-0"]["rails"]],
                                   rail_ips=F["fabric_ring_rail_ips"](p), port=18515, links=[[1, 2]])
    assert [(x["from"], x["from_hca"], x["to"], x["to_hca"], x["address"]) for x in got["pairs"]] == [
        ("spark-0", "rocep1s0f0", "spark-1", "rocep1s0f1", "192.168.110.2"),
        ("spark-2", "rocep1s0f0", "spark-3", "rocep1s0f1", "192.168.110.10"),
        ("spark-1", "rocep1s0f0", "spark-2", "rocep1s0f1", "192.168.110.6"),
        ("spark-3", "rocep1s0f0", "spark-0", "rocep1s0f1", "192.168.110.14"),
    ]


def ip_hex(ip):
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"{a:02x}{b:02x}:{c:02x}{d:02x}"


@pytest.mark.parametrize(
    "case",
    [
        (NODES[:2], SUBNET, [FIRST, SECOND], "fabric0", None, "three or four DGX Sparks"),
        (NODES + ["spark-4"], SUBNET, [FIRST, SECOND], "fabric0", None, "more than four nodes need a switch"),
        (NODES, "192.168.110.1/24", [FIRST, SECOND], "fabric0", None, "host bits zero"),
        (NODES, "192.168.110.0/29", [FIRST, SECOND], "fabric0", None, "fewer than the 4 /30s"),
        (NODES, "192.168.100.0/25", [FIRST, SECOND], "fabric0", None, "overlaps the nodes' own subnet"),
        (NODES, SUBNET, [FIRST], "fabric0", None, "must name the node's two QSFP ports"),
        (NODES, SUBNET, [FIRST, FIRST], "fabric0", None, "must name the node's two QSFP ports"),
        (NODES, SUBNET, [FIRST, SECOND], SECOND, None, "one of the ring's ports"),
        (NODES, SUBNET, [FIRST, "enp9s0"], "fabric0", [FIRST, SECOND, "enP7s7"], "names enp9s0, which this node"),
    ],
)
def test_ring_input_is_refused_with_the_variable_the_value_and_the_fix(case):
    members, subnet, ports, interface, netdevs, said = case
    errors = F["fabric_ring_errors"](members, subnet, ports, interface=interface, node_ip="192.168.100.10",
                                     node_prefix=24, netdevs=netdevs)
    assert len(errors) == 1 and said in errors[0] and "Fix:" in errors[0]
    assert F["fabric_ring_errors"](NODES, SUBNET, [FIRST, SECOND], interface="fabric0", node_ip="192.168.100.10",
                                   node_prefix=24, netdevs=[FIRST, SECOND]) == []


def link_local(host, port):
    return f"fe80::{NODES.index(host) + 1}:{[FIRST, SECOND].index(port) + 1}"


def readings(cables, dark=()):
    """What each node reads: its ports' link-local addresses, and who answered on each (itself among them)."""
    heard = {(h, p): [link_local(h, p)] for h in NODES for p in (FIRST, SECOND)}
    for a, b in cables:
        heard[(a, FIRST)].append(link_local(b, SECOND))
        heard[(b, SECOND)].append(link_local(a, FIRST))
    return {h: {"links": [{"ifname": p, "flags": ["UP", "NO-CARRIER"] if (h, p) in dark else ["UP", "LOWER_UP"],
                           "addr_info": [{"family": "inet6", "scope": "link", "local": link_local(h, p)}]}
                          for p in (FIRST, SECOND)],
                "neighbours": {p: heard[(h, p)] for p in (FIRST, SECOND) if (h, p) not in dark}} for h in NODES}


def ring(order):
    return list(zip(order, order[1:] + order[:1], strict=True))


def test_cabling_in_the_groups_order_passes():
    assert F["fabric_ring_cabling_errors"](NODES, PORTS, readings(ring(NODES))) == []


def test_cabling_in_another_order_is_refused_with_the_order_the_cables_close():
    errors = F["fabric_ring_cabling_errors"](NODES, PORTS, readings(ring(["spark-0", "spark-2", "spark-1", "spark-3"])))
    assert len(errors) == 1
    assert "spark-0's enp1s0f0np0 (cabled, by the group's order, to spark-1's enp1s0f1np1) reaches spark-2's" in errors[0]
    assert "close the ring spark-0 -> spark-2 -> spark-1 -> spark-3 -> spark-0: list the group's hosts" in errors[0]


def test_a_cable_out_is_a_ring_that_does_not_close():
    cables = ring(NODES)[:-1]
    errors = F["fabric_ring_cabling_errors"](NODES, PORTS, readings(cables, dark={("spark-3", FIRST), ("spark-0", SECOND)}))
    assert errors == [errors[0]] and errors[0].startswith("the ring does not close: spark-0's enp1s0f1np1, spark-3's "
                                                          "enp1s0f0np0 are up without carrier")


def test_first_ports_cabled_to_first_ports_close_no_ring():
    data = readings([])
    for a, b in (("spark-0", "spark-1"), ("spark-2", "spark-3")):
        data[a]["neighbours"][FIRST].append(link_local(b, FIRST))
        data[b]["neighbours"][FIRST].append(link_local(a, FIRST))
    errors = F["fabric_ring_cabling_errors"](NODES, PORTS, data)
    assert len(errors) == 1 and "do not close one ring" in errors[0]


def test_the_probe_reads_who_answered_on_a_port_from_pings_output():
    probe = module("fabric_probe")
    out = ("PING ff02::1(ff02::1) from :: enp1s0f0np0: 56 data bytes\n"
           "64 bytes from fe80::d07d:f2ff:fe67:ff9c%enp1s0f0np0: icmp_seq=1 ttl=64 time=0.046 ms\n"
           "64 bytes from fe80::7884:1dff:fe17:b040%enp1s0f0np0: icmp_seq=1 ttl=64 time=0.103 ms (DUP!)\n"
           "64 bytes from fe80::1: icmp_seq=2 ttl=64 time=0.049 ms\n")
    assert probe.LINK_LOCAL_REPLY.findall(out) == ["fe80::d07d:f2ff:fe67:ff9c", "fe80::7884:1dff:fe17:b040", "fe80::1"]

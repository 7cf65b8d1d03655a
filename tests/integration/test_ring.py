"""Four simulated Sparks cabled in a ring without a switch (tests/conftest.py sim_ring): each node's first QSFP port
to the next node's second, one TP group of four in the ring's order.

Before any change the cabling the nodes report is checked against the group's order: cables in another order are
refused with the order they do close, a cable out with the ports that lack it, and nothing is written. Cabled as the
group's order, one site.yml converges the ring: each cable a /30 of its own, the node addresses on a bridge without
ports reached over host routes (through the neighbour that comes first across the ring), both ports' RoCE devices
and the ring's NCCL settings in every rank's environment, a forward chain that drops (Docker's) opened between the two
ports alone; the proof measures each cable's RDMA and the all-reduce
over RDMA, and verify passes. A second site.yml changes nothing and measures nothing. NCCL's ring without the ring's
settings, or with ranks out of the ring's order, fails as NCCL does.
"""

from __future__ import annotations

import json

import pytest

from tests.harness import cluster as sim
from tests.lib.fabric_runs import RDMA_BW_TASK, assert_quiet_rerun, converge_from_scratch
from tests.lib.playbook import run_playbook

pytestmark = pytest.mark.slow

NODES = ("spark-0", "spark-1", "spark-2", "spark-3")
FIRST, SECOND = sim.RING_PORTS
NETPLAN = "/etc/netplan/40-cx7.yaml"
RECORD = "/var/lib/spark-llm-fabric/proof.json"
CABLING_CHECK = "Check the node's fabric address and prefix, subnet, MTU, interface and further rails"
BUSBW_TASK = "Show the all-reduce bus bandwidth and the network NCCL used, and check it against the minimum"
VERIFY_TABLE_TASK = "Show the verification table"
RETRY_EXCEEDED = "transport retry counter exceeded"
DOCKER_FORWARD = "add chain ip filter FORWARD { type filter hook forward priority 0; policy drop; }"


def sh(node, command: str, check: bool = True) -> str:
    return sim.ssh(node, command, timeout=120, check=check).strip()


def env_of(node) -> dict:
    lines = sh(node, "cat /etc/spark-llm/spark-llm.env").splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def refusal(result) -> str:
    """The cabling check's refusal, as one line."""
    return " ".join(result.failure_messages().split())


def test_cabling_that_is_not_the_groups_order_or_does_not_close_is_refused_before_any_change(sim_ring):
    try:
        sim.recable(sim_ring.instance, ["spark-0", "spark-2", "spark-1", "spark-3"])
        crossed = run_playbook("playbooks/fabric.yml", sim_ring.inventory)
        assert crossed.rc != 0 and crossed.changed == [], [(c["host"], c["task"]) for c in crossed.changed]
        said = refusal(crossed)
        assert ("spark-0's enp1s0f0np0 (cabled, by the group's order, to spark-1's enp1s0f1np1) reaches spark-2's "
                "enp1s0f1np1") in said, said
        assert ("Fix: the cables close the ring spark-0 -> spark-2 -> spark-1 -> spark-3 -> spark-0: list the group's "
                "hosts in that order") in said, said
        sim.recable(sim_ring.instance, list(NODES), closed=False)
        open_ring = run_playbook("playbooks/fabric.yml", sim_ring.inventory)
        assert open_ring.rc != 0 and open_ring.changed == []
        said = refusal(open_ring)
        assert (f"the ring does not close: spark-0's {SECOND}, spark-3's {FIRST} are up without carrier") in said, said
        assert {e["event_data"]["task"] for e in open_ring.task_events("runner_on_failed")} == {CABLING_CHECK}
        for node in sim_ring.nodes:
            assert sh(node, f"test -e {NETPLAN} && echo written || echo absent") == "absent"
    finally:
        sim.recable(sim_ring.instance, list(NODES))


@pytest.fixture(scope="module")
def ring(sim_ring, tmp_path_factory):
    """The ring converged by one site.yml run, and the run."""
    # As Docker leaves a DGX: the filter table's FORWARD policy drops, on both nodes the traffic across the ring
    # passes (spark-1 between spark-0 and spark-2, spark-0 between spark-1 and spark-3).
    for n in sim_ring.nodes[:2]:
        sh(n, f"nft add table ip filter && nft '{DOCKER_FORWARD}'")
    return converge_from_scratch(sim_ring, tmp_path_factory.mktemp("reports"))


def test_each_cable_is_a_subnet_and_the_peers_are_reached_over_host_routes(ring):
    cluster, _, _ = ring
    subnet = cluster.ring_subnet.rsplit(".", 1)[0]
    ips = {n.name: n.fabric_ip for n in cluster.nodes}
    # Node k's first port takes the first host of the k-th /30, the next node's second port the second.
    for k, node in enumerate(cluster.nodes):
        nxt, prev = NODES[(k + 1) % 4], NODES[(k - 1) % 4]
        addrs = {i["ifname"]: [f"{a['local']}/{a['prefixlen']}" for a in i.get("addr_info", []) if a["family"] == "inet"]
                 for i in json.loads(sh(node, "ip -j addr show"))}
        assert addrs["fabric0"] == [f"{node.fabric_ip}/32"], addrs
        assert addrs[FIRST] == [f"{subnet}.{4 * k + 1}/30"], addrs
        assert addrs[SECOND] == [f"{subnet}.{4 * ((k - 1) % 4) + 2}/30"], addrs
        routes = {peer: json.loads(sh(node, f"ip -j route get {ip}"))[0] for peer, ip in ips.items() if peer != node.name}
        assert routes[nxt]["dev"] == FIRST and routes[prev]["dev"] == SECOND, routes
        assert {r["prefsrc"] for r in routes.values()} == {node.fabric_ip}, routes
    # Across the ring through the neighbour first in the group, both ways: spark-0 <-> spark-2 through spark-1,
    # spark-1 <-> spark-3 through spark-0.
    across = {(a, b): json.loads(sh(cluster.nodes[NODES.index(a)], f"ip -j route get {ips[b]}"))[0]["dev"]
              for a, b in (("spark-0", "spark-2"), ("spark-2", "spark-0"), ("spark-1", "spark-3"), ("spark-3", "spark-1"))}
    assert across == {("spark-0", "spark-2"): FIRST, ("spark-2", "spark-0"): SECOND,
                      ("spark-1", "spark-3"): SECOND, ("spark-3", "spark-1"): FIRST}, across
    # The forward chain that drops lets the ring's traffic through between the two ports, and nothing else.
    chain = sh(cluster.nodes[1], "nft list chain ip filter FORWARD")
    assert f'iifname "{FIRST}" oifname "{SECOND}"' in chain and f'iifname "{SECOND}" oifname "{FIRST}"' in chain, chain
    assert "policy drop" in chain and chain.count("accept") == 2, chain
    forwarding = sh(cluster.nodes[1], f"cat /proc/sys/net/ipv4/conf/{FIRST}/forwarding "
                                      f"/proc/sys/net/ipv4/conf/{SECOND}/forwarding /proc/sys/net/ipv4/conf/enP7s7/forwarding")
    assert forwarding.split() == ["1", "1", "0"], forwarding


def test_every_rank_gets_both_ports_devices_and_the_rings_nccl_settings_and_verify_passes(ring):
    cluster, converged, _ = ring
    head = cluster.nodes[0]
    for rank, node in enumerate(cluster.nodes):
        env = env_of(node)
        assert {k: env.get(k) for k in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_CROSS_NIC", "NCCL_ALGO")} == {
            "NCCL_SOCKET_IFNAME": "fabric0", "NCCL_IB_HCA": "rocep1s0f0,rocep1s0f1", "NCCL_CROSS_NIC": "1",
            "NCCL_ALGO": "Ring"}, (node.name, env)
        args = json.loads(sh(node, "cat /etc/spark-llm/server-args.json"))
        assert args[args.index("--node-rank") + 1] == str(rank)
        assert args[args.index("--dist-init-addr") + 1] == f"{head.fabric_ip}:20000"
        assert sh(node, "systemctl is-active spark-llm") == "active"
    table = converged.results(VERIFY_TABLE_TASK)["spark-0"]["msg"]
    assert any(line.startswith("fabric: all-reduce across spark-0, spark-1, spark-2, spark-3") for line in table), table


def test_the_proof_measures_each_cable_and_the_all_reduce_over_rdma(ring):
    cluster, converged, _ = ring
    cables = [(NODES[k], NODES[(k + 1) % 4]) for k in range(4)]
    rdma = converged.results(RDMA_BW_TASK)["spark-0"]["results"]
    assert sorted((r["item"]["item"]["from"], r["item"]["item"]["to"]) for r in rdma) == sorted(cables), rdma
    for r in rdma:
        pair = r["item"]["item"]
        assert (pair["from_hca"], pair["to_hca"]) == ("rocep1s0f0", "rocep1s0f1"), pair
        assert " ".join(r["msg"].split()).startswith(
            f"{pair['from']} rocep1s0f0 -> {pair['to']} rocep1s0f1: RDMA write 97.50 Gbit/s"), r["msg"]
    busbw = " ".join(converged.results(BUSBW_TASK)["spark-0"]["msg"].split())
    assert "23.19 GB/s bus bandwidth over NCCL's IB transport (rocep1s0f0, rocep1s0f1)" in busbw, busbw
    record = json.loads(sh(cluster.nodes[0], f"cat {RECORD}"))
    assert sorted((p["from"], p["to"]) for p in record["rdma_write"]["pairs"]) == sorted(cables), record


def test_a_second_run_changes_nothing_and_measures_nothing(ring):
    cluster, _, extravars = ring
    assert_quiet_rerun(run_playbook("site.yml", cluster.inventory, extravars=extravars), NODES, RDMA_BW_TASK, BUSBW_TASK)


def test_nccls_ring_fails_without_the_rings_settings_or_with_ranks_out_of_its_order(ring):
    cluster, _, _ = ring
    ips = [n.fabric_ip for n in cluster.nodes]

    def all_reduce(order, *env):
        hosts = ",".join(f"{ips[NODES.index(h)]}:1" for h in order)
        exports = " ".join(f"-x {e}" for e in ("NCCL_SOCKET_IFNAME=fabric0", "NCCL_IB_HCA=rocep1s0f0,rocep1s0f1", *env))
        return sh(cluster.nodes[0], f"mpirun --allow-run-as-root -np 4 -H {hosts} --mca plm_rsh_agent "
                                    f"'ssh -i /root/.ssh/id_spark_fabric -o BatchMode=yes' {exports} "
                                    "all_reduce_perf -b 1M -e 1M 2>&1; echo rc=$?", check=False)

    assert all_reduce(NODES, "NCCL_CROSS_NIC=1").endswith("rc=0")
    same_nic = all_reduce(NODES)
    assert RETRY_EXCEEDED in same_nic and not same_nic.endswith("rc=0"), same_nic
    crossed = all_reduce(("spark-0", "spark-2", "spark-1", "spark-3"), "NCCL_CROSS_NIC=1")
    assert RETRY_EXCEEDED in crossed and not crossed.endswith("rc=0"), crossed

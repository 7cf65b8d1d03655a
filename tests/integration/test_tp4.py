"""TP over four Sparks: one group of four nodes (tests/conftest.py sim_tp4), --tp-size 4, ranks 0-3, one head.

One site.yml converges it: every rank meets at the head's fabric address, verify passes, and the fabric proof
measures every pair of the four (six pairs, in three rounds of two that share no node) and names each in the
head's record and verify's report. A second site.yml changes nothing and measures nothing.
"""

from __future__ import annotations

import json
from itertools import combinations

import pytest

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook

pytestmark = pytest.mark.slow

NODES = ("spark-0", "spark-1", "spark-2", "spark-3")
PAIRS = {(a, b) for a, b in combinations(NODES, 2)}
RECORD = "/var/lib/spark-llm-fabric/proof.json"
RDMA_BW_TASK = "Show the RDMA bandwidth of each rail and check it against the minimum"
IPERF_TASK = "Check the bandwidth against the minimum"
ROUNDS_INCLUDE = "Measure each round of pairs of peers that share no node"
MEASURE_INCLUDE = "Measure the link's bandwidth where this run changed it or the site asked"
VERIFY_TABLE_TASK = "Show the verification table"


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.fixture(scope="module")
def site(sim_tp4, tmp_path_factory):
    """The group converged by one site.yml run, and the run (shared by every test of the module)."""
    for n in sim_tp4.nodes:
        sim.set_knobs(sim_tp4.instance, n.name, {"sglang": {"load_seconds": 0.2}})
    extravars = {"verify_report_dir": str(tmp_path_factory.mktemp("reports"))}
    converged = run_playbook("site.yml", sim_tp4.inventory, extravars=extravars)
    assert converged.rc == 0, converged.failure_messages() or converged.stdout[-3000:]
    return sim_tp4, converged, extravars


def test_ranks_0_to_3_meet_at_the_heads_fabric_address(site):
    cluster, _, _ = site
    head = cluster.nodes[0]
    for rank, node in enumerate(cluster.nodes):
        args = json.loads(sim.ssh(node, "cat /etc/spark-llm/server-args.json", timeout=60))
        said = {f: flag(args, f) for f in ("--tp-size", "--nnodes", "--node-rank", "--dist-init-addr")}
        assert said == {"--tp-size": "4", "--nnodes": "4", "--node-rank": str(rank),
                        "--dist-init-addr": f"{head.fabric_ip}:20000"}, (node.name, args)


def test_the_fabric_proof_measures_and_names_every_pair_and_verify_passes(site):
    cluster, converged, _ = site
    # Every pair measured once, the lower rank measuring, over RDMA (the one rail) and TCP.
    rdma = converged.results(RDMA_BW_TASK)["spark-0"]["results"]
    assert {(r["item"]["item"]["from"], r["item"]["item"]["to"]) for r in rdma} == PAIRS and len(rdma) == 6, rdma
    for r in rdma:
        pair = r["item"]["item"]
        assert " ".join(r["msg"].split()).startswith(
            f"{pair['from']} {pair['from_hca']} -> {pair['to']} {pair['to_hca']}: RDMA write 97.50 Gbit/s"), r["msg"]
    tcp = converged.results(IPERF_TASK)["spark-0"]["results"]
    assert {(r["item"]["item"]["from"], r["item"]["item"]["to"]) for r in tcp} == PAIRS and len(tcp) == 6, tcp
    # In three rounds of two pairs that share no node: each round one include on all four hosts.
    rounds = [e["event_data"] for e in converged.task_events() if e["event_data"].get("task") == ROUNDS_INCLUDE]
    assert {e["host"] for e in rounds} == set(NODES)
    # The head's record and verify's report name each pair.
    record = json.loads(sim.ssh(cluster.nodes[0], f"cat {RECORD}", timeout=60))
    assert {(p["from"], p["to"]) for p in record["rdma_write"]["pairs"]} == PAIRS, record
    assert {(p["from"], p["to"]) for p in record["tcp"]["pairs"]} == PAIRS, record
    assert record["members"] == list(NODES)
    table = converged.results(VERIFY_TABLE_TASK)["spark-0"]["msg"]
    for a, b in PAIRS:
        assert any(line.startswith(f"fabric: RDMA write {a} ") and f" -> {b} " in line for line in table), (a, b, table)
    assert any(line.startswith("fabric: all-reduce across spark-0, spark-1, spark-2, spark-3") for line in table), table


def test_a_second_run_changes_nothing_and_measures_nothing(site):
    cluster, _, extravars = site
    again = run_playbook("site.yml", cluster.inventory, extravars=extravars)
    assert again.rc == 0, again.failure_messages() or again.stdout[-3000:]
    assert again.changed == [], [(c["host"], c["task"]) for c in again.changed]
    skipped = {e["event_data"]["host"] for e in again.task_events("runner_on_skipped")
               if e["event_data"].get("task") == MEASURE_INCLUDE}
    assert skipped == set(NODES)
    assert again.results(RDMA_BW_TASK) == {} and again.results(IPERF_TASK) == {}

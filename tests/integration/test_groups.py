"""Four simulated Sparks (tests/conftest.py sim_four), first as one TP group of four, then regrouped as two pairs.

TP over four: one site.yml converges the group of four: every rank meets at the head's fabric address, verify
passes, and the fabric proof measures every pair of the four (six pairs, in three rounds of two that share no
node) and names each in the head's record and verify's report. A second site.yml changes nothing and measures
nothing.

Several TP groups: the same four nodes written as two groups of two (as an operator regroups the Sparks), and
site.yml converges both groups, each on its own: each group's ranks meet at their own head's fabric address and
each head serves. Then one group alone (--limit) takes a changed flag: its ranks restart, the other group's
containers and units are the same ones as before. The gateway (the real smg, on spark-0, which site.yml puts in
front of both heads): its requests reach both groups, a killed rank of one group costs at most the requests in
flight there, and upgrade.yml and restart.yml roll one group at a time behind it with no failed request. Last,
monitoring.yml alone puts Prometheus on a worker of the second group, which scrapes every node, both heads and the
gateway's metrics (bound where that host reaches them).
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from itertools import combinations
from pathlib import Path

import pytest

from tests.harness import cluster as sim
from tests.lib.checkpoint_site import hub_stats
from tests.lib.fabric_runs import RDMA_BW_TASK, assert_quiet_rerun, converge_from_scratch
from tests.lib.looping_client import LoopingClient
from tests.lib.playbook import run_playbook
from tests.lib.prometheus_tools import prometheus_api
from tests.lib.supervised import MODEL_DIR, STATE_DIR, SUPERVISOR, read_node_file, signal_rank, wait_for

pytestmark = pytest.mark.slow

GROUPS = {"replica_a": ("spark-0", "spark-1"), "replica_b": ("spark-2", "spark-3")}
# What identifies one start of a rank: its container and the unit's start.
IMAGE = "lmsysorg/sglang:glm-5.3-flash-arm64"
# An image that answers 17 x 23 wrongly: it starts, and fails verify (the docker stand-in's registry build).
WRONG = f"{IMAGE}-wrong"
BUILDS = {WRONG: {"sglang": {"output_corruption": "wrong-answer"}}}
# The heads' request counter on /metrics (the SGLang stand-in's, as SGLang names it).
COUNTER = re.compile(r"^sglang:num_requests_total\{[^}]*\} ([0-9.e+]+)$", re.M)
# The gateway notices a head that stopped answering within a second or two rather than the default 30 s.
GATEWAY = {"gateway_health_check_interval": 1, "gateway_health_failure_threshold": 1,
           "gateway_health_success_threshold": 1}
# The image ID a rank's container runs.
RUNS = "docker inspect --format '{{.Image}}' spark-llm"
STARTED = ("docker inspect --format '{{.Id}}' spark-llm; "
           "systemctl show -p ActiveEnterTimestampMonotonic --value spark-llm.service")


def sh(node, command: str) -> str:
    return sim.ssh(node, command, timeout=120)


def args_of(node) -> list[str]:
    return json.loads(sh(node, "cat /etc/spark-llm/server-args.json"))


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def key_header(cluster) -> dict:
    return {"Authorization": f"Bearer {(cluster.inventory / '.credentials' / 'spark_llm_api_key').read_text().strip()}"}


def head_get(cluster, via, head, path: str, connect_timeout: float = 10) -> tuple[str, str]:
    """GET on a head's server_port from the node `via`, with the key (through curl's stdin, on no command line):
    behind the gateway a head's port admits only the gateway's host and the monitoring host, not this controller."""
    out = sim.ssh(via, f"curl -s --connect-timeout {connect_timeout} --max-time 30 -H @- -w '\\n%{{http_code}}' "
                       f"http://{head.mgmt_ip}:30000{path}", check=False,
                  stdin=f"Authorization: {key_header(cluster)['Authorization']}\n")
    body, _, status = out.rpartition("\n")
    return status.strip(), body


def serves(cluster, head, via) -> bool:
    status, body = head_get(cluster, via, head, "/v1/models")
    return status == "200" and bool(json.loads(body)["data"])


# --- one TP group of four ------------------------------------------------------------------------------------------

NODES = ("spark-0", "spark-1", "spark-2", "spark-3")
PAIRS = {(a, b) for a, b in combinations(NODES, 2)}
RECORD = "/var/lib/spark-llm-fabric/proof.json"
IPERF_TASK = "Check the bandwidth against the minimum"
ROUNDS_INCLUDE = "Measure each round of pairs of peers that share no node"
VERIFY_TABLE_TASK = "Show the verification table"
CHOOSE_TASK = "Choose the node this one takes the checkpoint from"
SYNC_TASK = "Push the files from the source host over the fabric"
# Whom a node lets in over ssh and whose host keys it pins.
TRUST = "cat /root/.ssh/authorized_keys /root/.ssh/known_hosts* 2>/dev/null; ls /run/spark-checkpoint-trust 2>/dev/null; true"


@pytest.fixture(scope="module")
def tp4(sim_four, tmp_path_factory):
    """The group of four converged by one site.yml run, and the run (shared by the TP=4 tests)."""
    return converge_from_scratch(sim_four, tmp_path_factory.mktemp("reports"))


def test_ranks_0_to_3_meet_at_the_heads_fabric_address(tp4):
    cluster, _, _ = tp4
    head = cluster.nodes[0]
    for rank, node in enumerate(cluster.nodes):
        args = json.loads(sim.ssh(node, "cat /etc/spark-llm/server-args.json", timeout=60))
        said = {f: flag(args, f) for f in ("--tp-size", "--nnodes", "--node-rank", "--dist-init-addr")}
        assert said == {"--tp-size": "4", "--nnodes": "4", "--node-rank": str(rank),
                        "--dist-init-addr": f"{head.fabric_ip}:20000"}, (node.name, args)


def test_the_fabric_proof_measures_and_names_every_pair_and_verify_passes(tp4):
    cluster, converged, _ = tp4
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


def test_a_second_tp4_run_changes_nothing_and_measures_nothing(tp4):
    cluster, _, extravars = tp4
    assert_quiet_rerun(run_playbook("site.yml", cluster.inventory, extravars=extravars), NODES, RDMA_BW_TASK, IPERF_TASK)


# --- the same four as two groups of two behind the gateway ---------------------------------------------------------


class Site:
    def __init__(self, cluster, extravars):
        self.cluster, self.vars = cluster, extravars
        self.nodes = {n.name: n for n in cluster.nodes}

    def play(self, playbook, limit=None, **extravars):
        return run_playbook(playbook, self.cluster.inventory, extravars={**self.vars, **extravars}, limit=limit)

    def started(self, group: str) -> dict:
        return {name: sh(self.nodes[name], STARTED).split() for name in GROUPS[group]}

    @property
    def gateway(self) -> str:
        """The gateway's host and port: on the first group's head (no spark_gateway group)."""
        return f"{self.nodes['spark-0'].mgmt_ip}:30080"

    def ask(self, timeout: float = 30) -> bool:
        """One chat completion through the gateway, as a client asks it."""
        body = json.dumps({"model": "/models/glm53", "max_tokens": 4,
                           "messages": [{"role": "user", "content": f"17 x 23 = ? ({time.monotonic_ns()})"}]}).encode()
        req = urllib.request.Request(f"http://{self.gateway}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json", **key_header(self.cluster)})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the simulated gateway
                return resp.status == 200 and bool(json.loads(resp.read())["choices"])
        except (OSError, urllib.error.URLError, ValueError, KeyError):
            return False

    def workers(self) -> list[dict]:
        """The gateway's workers (smg's GET /workers): url, status, is_healthy."""
        req = urllib.request.Request(f"http://{self.gateway}/workers", headers=key_header(self.cluster))
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - the simulated gateway
            return json.loads(resp.read())["workers"]

    def counted(self, group: str) -> float:
        """The requests the group's head has processed (its /metrics counter, asked from the gateway's host)."""
        status, body = head_get(self.cluster, self.nodes["spark-0"], self.nodes[GROUPS[group][0]], "/metrics")
        assert status == "200", (status, body[-500:])
        return sum(float(v) for v in COUNTER.findall(body))


@pytest.fixture(scope="module")
def site(sim_four, tp4, tmp_path_factory):
    """The four nodes, after the TP=4 tests, regrouped as two groups of two and converged by one site.yml run
    (shared by every test of the groups)."""
    cluster = sim.regroup(sim_four.instance, 2)
    for n in cluster.nodes:
        sim.set_knobs(cluster.instance, n.name, {"sglang": {"load_seconds": 0.2}, "docker": {"registry": BUILDS}})
    s = Site(cluster, {"verify_report_dir": str(tmp_path_factory.mktemp("reports")), **SUPERVISOR, **GATEWAY})
    s.converged = s.play("site.yml")
    assert s.converged.rc == 0, s.converged.failure_messages() or s.converged.stdout[-3000:]
    return s


def test_site_converges_each_group_at_its_own_head(site):
    # The TP=4 group's head let itself in on spark-1..3; regrouped, only a worker's own head is let in.
    for head, worker in GROUPS.values():
        assert "spark-fabric@" not in sh(site.nodes[head], "cat /root/.ssh/authorized_keys"), head
        fabric_keys = [line.split()[-1] for line in sh(site.nodes[worker], "cat /root/.ssh/authorized_keys").splitlines()
                       if "spark-fabric@" in line]
        assert fabric_keys == [f"spark-fabric@{head}"], (worker, fabric_keys)
        # And only a head pins the host keys of its own workers' fabric addresses.
        for name in (head, worker):
            pinned = {line.split()[0] for line in sh(site.nodes[name], "cat /root/.ssh/known_hosts 2>/dev/null; true")
                      .splitlines() if line.strip()}
            others = {n.fabric_ip for n in site.cluster.nodes if n.name != (worker if name == head else None)}
            assert not pinned & others, (name, pinned)
    for group, (head, worker) in GROUPS.items():
        fabric = site.nodes[head].fabric_ip
        for rank, name in enumerate((head, worker)):
            args = args_of(site.nodes[name])
            assert (flag(args, "--tp-size"), flag(args, "--node-rank")) == ("2", str(rank)), (group, name, args)
            assert flag(args, "--dist-init-addr") == f"{fabric}:20000", (group, name, args)
        assert serves(site.cluster, site.nodes[head], via=site.nodes["spark-0"]), group


def damage_checkpoint(node) -> list[str]:
    """Take a node's checkpoint from it as a lost disk would, in part: its stamp and two shards go."""
    shards = sh(node, f"ls {MODEL_DIR} | grep safetensors | head -2").split()
    sh(node, f"rm -f {MODEL_DIR}.verified " + " ".join(f"{MODEL_DIR}/{s}" for s in shards))
    return shards


def holds_again(node, shards, kept: str) -> bool:
    """The node's stamp vouches again, its shards are back with the bytes `kept` has."""
    sums = f"cd {MODEL_DIR} && sha256sum {' '.join(shards)}"
    return (sh(node, f"test -s {MODEL_DIR}.verified && echo yes").strip() == "yes"
            and sh(node, sums) == kept)


def test_the_checkpoint_moves_from_a_node_that_holds_it_whatever_its_group_and_never_again_from_the_hub(site):
    """The hub once per site: a node that kept the verified checkpoint feeds the others, a group's worker an
    earlier group included, and a group re-provisioned alone (--limit) takes it from a node the run left out.
    The cross-group access lasts only as long as the sync."""
    n = site.nodes
    hub_before = hub_stats(site.cluster)
    trusted = {name: sh(n[name], TRUST) for name in NODES}
    shards = damage_checkpoint(n["spark-0"])
    for name in ("spark-1", "spark-2"):
        assert damage_checkpoint(n[name]) == shards
    kept = sh(n["spark-3"], f"cd {MODEL_DIR} && sha256sum {' '.join(shards)}")
    moved = site.play("playbooks/checkpoint.yml")
    assert moved.rc == 0, moved.failure_messages() or moved.stdout[-3000:]
    chosen = {h: r["ansible_facts"]["checkpoint_chosen_source"] for h, r in moved.results(CHOOSE_TASK).items()}
    assert chosen == {"spark-0": "spark-3", "spark-1": "spark-3", "spark-2": "spark-3", "spark-3": "spark-3"}
    assert set(moved.results(SYNC_TASK)) == {"spark-0", "spark-1", "spark-2"}
    assert all(holds_again(n[name], shards, kept) for name in ("spark-0", "spark-1", "spark-2"))

    for name in ("spark-2", "spark-3"):
        damage_checkpoint(n[name])
    again = site.play("playbooks/checkpoint.yml", limit="replica_b")
    assert again.rc == 0, again.failure_messages() or again.stdout[-3000:]
    chosen = {h: r["ansible_facts"]["checkpoint_chosen_source"] for h, r in again.results(CHOOSE_TASK).items()}
    assert chosen == {"spark-2": "spark-0", "spark-3": "spark-0"}
    assert all(holds_again(n[name], shards, kept) for name in ("spark-2", "spark-3"))
    assert hub_stats(site.cluster) == hub_before, "no byte came from the hub"
    # The access each sync was given went with it: every node's authorized and pinned keys are as before.
    now = {name: sh(n[name], TRUST) for name in NODES}
    assert now == trusted, {name: (set(trusted[name].splitlines()) ^ set(now[name].splitlines())) for name in NODES}


def test_a_changed_flag_on_one_group_restarts_that_group_alone(site):
    before = {group: site.started(group) for group in GROUPS}
    changed = site.play("site.yml", limit="replica_a", server_flag_overrides={"max-running-requests": 1})
    assert changed.rc == 0, changed.failure_messages() or changed.stdout[-3000:]
    # Only replica_a's hosts were in the run, and both its ranks run the new flag under new containers.
    hosts = {e["event_data"]["host"] for e in changed.task_events()}
    assert hosts <= {"spark-0", "spark-1", "localhost"}, hosts
    for name in GROUPS["replica_a"]:
        assert flag(args_of(site.nodes[name]), "--max-running-requests") == "1", name
    after = site.started("replica_a")
    assert all(after[n] != before["replica_a"][n] for n in GROUPS["replica_a"]), (before, after)
    # The other group: the same containers, started at the same moment, on its old flags.
    assert site.started("replica_b") == before["replica_b"]
    assert flag(args_of(site.nodes["spark-2"]), "--max-running-requests") != "1"
    gateway_host = site.nodes["spark-0"]
    assert serves(site.cluster, site.nodes["spark-0"], gateway_host) and serves(site.cluster, site.nodes["spark-2"],
                                                                                gateway_host)


def test_requests_through_the_gateway_reach_both_groups(site):
    before = {group: site.counted(group) for group in GROUPS}
    # Two at a time: in front of two groups the gateway sends each request to the group with fewer requests in
    # flight (gateway_policy auto: power_of_two).
    with LoopingClient(site.ask), LoopingClient(site.ask) as client:
        wait_for(lambda: all(site.counted(g) > before[g] for g in GROUPS), "both heads to count a request", 120,
                 every=0.5)
    assert client.failed == 0, client.failed
    assert sorted(w["url"] for w in site.workers()) == sorted(
        f"http://{site.nodes[GROUPS[g][0]].mgmt_ip}:30000" for g in GROUPS)


def test_behind_the_gateway_a_heads_port_admits_the_gateway_host_alone_and_the_playbooks_ask_from_the_heads(
        site, tmp_path):
    gateway_host, head, worker = site.nodes["spark-0"], site.nodes["spark-2"], site.nodes["spark-3"]
    # The gateway's host reaches the other group's head; that group's own worker and this controller get no answer
    # (dropped, not refused); the controller's clients go through the gateway instead.
    assert head_get(site.cluster, gateway_host, head, "/v1/models")[0] == "200"
    assert head_get(site.cluster, worker, head, "/v1/models", connect_timeout=2)[0] == "000"
    with pytest.raises(TimeoutError):
        socket.create_connection((head.mgmt_ip, 30000), timeout=2).close()
    assert site.ask()
    rules = sh(head, "cat /etc/nftables.d/spark_llm_guard.nft")
    assert f"# HTTP port 30000: only spark-0 ({gateway_host.mgmt_ip}) (the model gateway fronts the heads)." in rules
    # So verify asked each group from its head (the gateway from here), status and the benchmark likewise.
    reports = [json.loads(p.read_text()) for p in Path(site.vars["verify_report_dir"]).glob("verify-replica_*.json")]
    assert {r["asked_from"] for r in reports} == {"spark-0", "spark-2"}, [r["asked_from"] for r in reports]
    assert {r["endpoint"] for r in reports} == {"http://127.0.0.1:30000"} and all(r["ok"] for r in reports)
    status = site.play("playbooks/status.yml")
    assert status.rc == 0, status.failure_messages() or status.stdout[-3000:]
    lines = {h: r["msg"] for h, r in status.results("Show one line per node").items()}
    assert all("endpoint healthy, serves /models/glm53" in lines[h] for h in ("spark-0", "spark-2")), lines
    # The benchmark: one group named, from its head; without a name, the gateway's endpoint from here, its levels up
    # to the sum of what the heads run (in file order replica_a runs 1 since the changed flag above, replica_b 2)
    # and one beyond.
    small = {"benchmark_prompts": ["short"], "benchmark_recall": False, "benchmark_chart": False,
             "benchmark_max_tokens": 8, "benchmark_rounds": 1, "benchmark_min_requests": 1,
             "benchmark_report_dir": str(tmp_path)}
    bench = site.play("playbooks/benchmark.yml", benchmark_group="replica_b", benchmark_concurrency=[1, 2], **small)
    assert bench.rc == 0, bench.failure_messages() or bench.stdout[-3000:]
    (report,) = [json.loads(p.read_text()) for p in tmp_path.glob("benchmark-*.json")]
    assert (report["meta"]["asked_from"], report["meta"]["endpoint"]) == ("spark-2", "http://127.0.0.1:30000")
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2], report["levels"]
    assert all(lv["summary"]["ok"] == lv["summary"]["requests"] > 0 for lv in report["levels"]), report["levels"]
    assert sh(head, "ls -d /tmp/spark-llm-benchmark-* 2>/dev/null || true").strip() == ""
    through = site.play("playbooks/benchmark.yml", **small)
    assert through.rc == 0, through.failure_messages() or through.stdout[-3000:]
    (report,) = [json.loads(p.read_text()) for p in tmp_path.glob("benchmark-gateway-*.json")]
    assert (report["meta"]["asked_from"], report["meta"]["endpoint"]) == ("localhost", f"http://{site.gateway}")
    caps = sum(int(flag(args_of(site.nodes[GROUPS[g][0]]), "--max-running-requests")) for g in GROUPS)
    assert int(report["meta"]["max_running_requests"]) == caps
    assert [lv["concurrency"] for lv in report["levels"]] == sorted({1, 2, caps, caps + 1}), report["levels"]
    assert all(lv["summary"]["ok"] == lv["summary"]["requests"] > 0 for lv in report["levels"]), report["levels"]
    assert len(list(tmp_path.glob("benchmark-*.json"))) == 2, "no group of its own measured beside the gateway"
    refused = site.play("playbooks/benchmark.yml", benchmark_group="replica_c", **small)
    assert refused.rc != 0 and "benchmark_group = 'replica_c': the site has no TP group of that name. Fix: one of " \
        "replica_a, replica_b" in refused.failure_messages(), refused.failure_messages()


def test_a_killed_rank_costs_the_gateway_only_what_was_in_flight_on_its_group(site):
    head, worker = (site.nodes[n] for n in GROUPS["replica_b"])

    def supervisor():
        try:
            return json.loads(read_node_file(head, f"{STATE_DIR}/state.json") or "{}")
        except (ValueError, OSError):
            return {}

    restarts = len(supervisor().get("restarts", []))
    with LoopingClient(site.ask) as one, LoopingClient(site.ask) as two:
        wait_for(lambda: one.ok and two.ok, "the clients' first answers", 60, every=0.2)
        signal_rank(worker, "KILL")
        # Healed: the supervisor restarted the group and calls it healthy; then the gateway uses it again.
        wait_for(lambda: len(supervisor().get("restarts", [])) > restarts and supervisor().get("state") == "healthy",
                 "replica_b's supervisor to heal the group", 420, every=0.5)
        healed = site.counted("replica_b")
        wait_for(lambda: site.counted("replica_b") > healed, "the gateway to use replica_b again", 120, every=0.5)
    failed, answered = one.failed + two.failed, one.ok + two.ok
    print(f"killed rank: {failed} of {failed + answered} requests through the gateway failed")
    # At most what the two clients had in flight on replica_b when its rank died, and its broken answers before
    # the gateway's next health check (1 s) took it out.
    assert failed <= 4, (failed, answered)
    assert answered > failed


def test_a_group_that_fails_its_upgrade_rolls_back_into_the_gateway_and_the_next_group_is_not_touched(site):
    before = site.started("replica_b")
    images = {name: sh(site.nodes[name], RUNS) for name in GROUPS["replica_a"]}
    with LoopingClient(site.ask) as client:
        result = site.play("playbooks/upgrade.yml", server_image=WRONG)
    assert result.rc != 0, result.stdout[-3000:]
    assert "The change failed and was rolled back" in result.failure_messages(), result.failure_messages()
    # replica_a went back to its image and, serving, back into the gateway; replica_b never left nor restarted.
    assert {w["url"] for w in site.workers() if w["status"] == "ready" and w["is_healthy"]} == {
        f"http://{site.nodes[GROUPS[g][0]].mgmt_ip}:30000" for g in GROUPS}
    assert site.started("replica_b") == before
    assert {name: sh(site.nodes[name], RUNS) for name in GROUPS["replica_a"]} == images
    print(f"failed upgrade: {client.ok} requests through the gateway, {client.failed} failed")
    assert client.failed == 0 and client.ok > 0, (client.ok, client.failed)


def rolled(site, what: str, playbook: str, **extravars):
    """Run a rolling change while a client loops requests through the gateway and the gateway's ready heads are
    looked at between them; it passes with no failed request, never both groups out of the gateway, each head out at
    some point and both back in at the end. Returns the run's result."""
    heads = {f"http://{site.nodes[GROUPS[g][0]].mgmt_ip}:30000" for g in GROUPS}
    seen: list[set] = []

    def record():
        try:
            seen.append({w["url"] for w in site.workers() if w["status"] == "ready" and w["is_healthy"]})
        except (OSError, urllib.error.URLError, ValueError, KeyError):
            seen.append(set())

    with LoopingClient(site.ask, watch=record) as client:
        result = site.play(playbook, **extravars)
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    print(f"{what}: {client.ok} requests through the gateway, {client.failed} failed")
    assert client.failed == 0 and client.ok > 0, (client.ok, client.failed)
    # Every look found a ready head, and each head was out at some point.
    assert all(seen), [i for i, s in enumerate(seen) if not s]
    assert all(any(h not in s for s in seen) for h in heads), seen
    assert {w["url"] for w in site.workers() if w["status"] == "ready" and w["is_healthy"]} == heads
    return result


def test_upgrade_rolls_one_group_at_a_time_behind_the_gateway_with_no_failed_request(site):
    new = f"{IMAGE}-v2"
    rolled(site, "rolling upgrade", "playbooks/upgrade.yml", server_image=new)
    for node in site.nodes.values():
        image = sh(node, "docker inspect --format '{{.Config.Image}}' spark-llm").strip()
        assert image == new, (node.name, image)


def test_restart_rolls_one_group_at_a_time_behind_the_gateway_with_no_failed_request(site):
    before = {group: site.started(group) for group in GROUPS}
    rolled(site, "rolling restart", "playbooks/restart.yml")
    # Every rank of both groups started again.
    after = {group: site.started(group) for group in GROUPS}
    assert all(after[g][n] != before[g][n] for g in GROUPS for n in GROUPS[g]), (before, after)


def test_the_monitoring_scrapes_every_group_and_the_gateway(site):
    """monitoring.yml on the site of two groups, Prometheus on a worker of the second group: every node's exporter,
    each group's head and the gateway's metrics port are scraped over the management network."""
    monitor = site.nodes["spark-3"]
    result = site.play("playbooks/monitoring.yml", spark_monitoring=True, spark_monitor_host=monitor.name,
                       monitoring_scrape_interval="2s", monitoring_evaluation_interval="2s",
                       monitoring_allowed_clients=[f"{site.cluster.bridge_ip}/32"])
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]

    seen: list = []

    def targets_up():
        try:
            active = prometheus_api(monitor.mgmt_ip, "targets", state="active")["activeTargets"]
        except (OSError, urllib.error.URLError, ValueError, KeyError, AssertionError) as ex:
            seen[:] = [repr(ex)]
            return None
        seen[:] = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in active]
        return active if len(active) == 8 and all(t["health"] == "up" for t in active) else None

    try:
        active = wait_for(targets_up, "every target of both groups and the gateway up in Prometheus", 120)
    except AssertionError as timeout:
        raise AssertionError(f"{timeout}: {seen}") from None
    urls = {t["scrapeUrl"] for t in active}
    nodes = site.nodes.values()
    assert {f"http://{n.mgmt_ip}:9100/metrics" for n in nodes} <= urls, urls
    assert {f"http://{site.nodes[GROUPS[g][0]].mgmt_ip}:30000/metrics" for g in GROUPS} <= urls, urls
    assert f"http://{site.nodes['spark-0'].mgmt_ip}:29000/metrics" in urls, urls

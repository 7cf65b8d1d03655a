"""Several TP groups on one site: four simulated Sparks as two groups of two (tests/conftest.py sim_groups).

site.yml converges both groups, each on its own: each group's ranks meet at their own head's fabric address and
each head serves. Then one group alone (--limit) takes a changed flag: its ranks restart, the other group's
containers and units are the same ones as before. The gateway's tests join this module on the same site.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook

pytestmark = pytest.mark.slow

GROUPS = {"replica_a": ("spark-0", "spark-1"), "replica_b": ("spark-2", "spark-3")}
# What identifies one start of a rank: its container and the unit's start.
STARTED = ("docker inspect --format '{{.Id}}' spark-llm; "
           "systemctl show -p ActiveEnterTimestampMonotonic --value spark-llm.service")


def sh(node, command: str) -> str:
    return sim.ssh(node, command, timeout=120)


def args_of(node) -> list[str]:
    return json.loads(sh(node, "cat /etc/spark-llm/server-args.json"))


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def serves(cluster, head) -> bool:
    key = (cluster.inventory / ".credentials" / "spark_llm_api_key").read_text().strip()
    req = urllib.request.Request(f"http://{head.mgmt_ip}:30000/v1/models", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - the simulated head's address
        return resp.status == 200 and bool(json.loads(resp.read())["data"])


class Site:
    def __init__(self, cluster, extravars):
        self.cluster, self.vars = cluster, extravars
        self.nodes = {n.name: n for n in cluster.nodes}

    def play(self, playbook, limit=None, **extravars):
        return run_playbook(playbook, self.cluster.inventory, extravars={**self.vars, **extravars}, limit=limit)

    def started(self, group: str) -> dict:
        return {name: sh(self.nodes[name], STARTED).split() for name in GROUPS[group]}


@pytest.fixture(scope="module")
def site(sim_groups, tmp_path_factory):
    """Both groups converged by one site.yml run (shared by every test of the module)."""
    for n in sim_groups.nodes:
        sim.set_knobs(sim_groups.instance, n.name, {"sglang": {"load_seconds": 0.2}})
    s = Site(sim_groups, {"verify_report_dir": str(tmp_path_factory.mktemp("reports"))})
    s.converged = s.play("site.yml")
    assert s.converged.rc == 0, s.converged.failure_messages() or s.converged.stdout[-3000:]
    return s


def test_site_converges_each_group_at_its_own_head(site):
    for group, (head, worker) in GROUPS.items():
        fabric = site.nodes[head].fabric_ip
        for rank, name in enumerate((head, worker)):
            args = args_of(site.nodes[name])
            assert (flag(args, "--tp-size"), flag(args, "--node-rank")) == ("2", str(rank)), (group, name, args)
            assert flag(args, "--dist-init-addr") == f"{fabric}:20000", (group, name, args)
        assert serves(site.cluster, site.nodes[head]), group


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
    assert serves(site.cluster, site.nodes["spark-0"]) and serves(site.cluster, site.nodes["spark-2"])

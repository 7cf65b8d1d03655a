"""What a test reads of a run's fabric proof: the tasks that show its figures, and a converged site's run."""

from __future__ import annotations

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook

RDMA_BW_TASK = "Show the RDMA bandwidth of each rail and check it against the minimum"
MEASURE_INCLUDE = "Measure the link's bandwidth where this run changed it or the site asked"


def assert_quiet_rerun(again, hosts, *figure_tasks: str) -> None:
    """A run of a site it converged before: rc 0, nothing changed, the bandwidth proofs skipped on every host of
    `hosts`, and none of `figure_tasks` (the tasks that show a figure) ran."""
    assert again.rc == 0, again.failure_messages() or again.stdout[-3000:]
    assert again.changed == [], [(c["host"], c["task"]) for c in again.changed]
    skipped = {e["event_data"]["host"] for e in again.task_events("runner_on_skipped")
               if e["event_data"].get("task") == MEASURE_INCLUDE}
    assert skipped == set(hosts)
    for task in figure_tasks:
        assert again.results(task) == {}, task


def converge_from_scratch(cluster, reports_dir) -> tuple:
    """One site.yml over a fresh instance whose ranks load at once (their weights' load time is no test's concern),
    verify's reports under `reports_dir`: (cluster, the run, its extra vars), for a module's tests to share."""
    for n in cluster.nodes:
        sim.set_knobs(cluster.instance, n.name, {"sglang": {"load_seconds": 0.2}})
    extravars = {"verify_report_dir": str(reports_dir)}
    converged = run_playbook("site.yml", cluster.inventory, extravars=extravars)
    assert converged.rc == 0, converged.failure_messages() or converged.stdout[-3000:]
    return cluster, converged, extravars

"""Shared fixtures: the simulated Spark cluster and the playbook runner.

How test modules get simulated nodes (the README's Tests section says the same):

- A module that changes node state (installs, configures, starts a rank, downloads) gets a
  freshly booted pair of its own (`sim_cluster`, module scope), so it inherits nothing from
  another module and leaves nothing to one.
- A module marked `pytestmark = pytest.mark.shared_nodes` promises to only read node state
  after the common setup (a freshly booted pair), putting back whatever it plants (a tmpfs, a
  transient unit). It shares its worker's one pair with the other such modules that run on that
  worker: booted when first needed, torn down at the end of the session. The promise is checked:
  the pair is fingerprinted when it has booted and again after each module that used it
  (tests/lib/node_state.py: changed files, units, mounts, addresses, routes, firewall,
  processes, /tmp); any difference fails that module (an error in its last test's teardown)
  and the pair is replaced, so a module that changes node state cannot pass while sharing.
  The stand-in knobs are test controls, not node state: they are put back before the check.
- Workers: pytest-xdist, `--dist loadfile` (a module and its pair stay on one worker) and
  `--no-loadscope-reorder`, so that modules start in the order below (xdist would otherwise
  start the modules with the most tests first, and a long module with few tests would run
  last, alone). Each worker boots its pairs under instance names of its own.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
from pathlib import Path

import pytest

from tests.harness import cluster as sim
from tests.lib import node_state
from tests.lib.checkpoint_site import serve_hub
from tests.lib.playbook import RUN_LOG

# Modules that converge whole clusters, longest first: with parallel workers
# a long module started last would finish alone while the other worker idles.
# Then the modules that mostly wait (the stand-ins' processes, the benchmark's
# measured runs): last, one of them ended the run alone for a minute with the
# cores idle. Everything else keeps its file order.
HEAVY_FIRST = (
    "test_supervisor.py",
    "test_change.py",
    "test_tune.py",
    "test_vllm.py",
    "test_server_nodes.py",
    "test_firewall.py",
    "test_groups.py",
    "test_ring.py",
    "test_monitoring.py",
    "test_checkpoint_nodes.py",
    "test_checkpoint_local.py",
    "test_checkpoint_interrupted.py",
    "test_day2.py",
    "test_secure_endpoint.py",
    "test_doctor.py",
    "test_doctor_fingerprints.py",
    "test_fabric.py",
    "test_sglang_standins.py",
    "test_benchmark.py",
    "test_build_cache.py",
    "test_vllm_standins.py",
    "test_checkpoint_modules.py",
    "test_verify.py",
    "test_preflight_running.py",
    "test_preflight.py",
    "test_harness_power.py",
    "test_inventory_check.py",
    "test_harness.py",
)
SHARED_MARK = "shared_nodes"


def sim_instance_name(suffix: str = "") -> str:
    """SPARK_SIM_INSTANCE (default `pytest`), plus the xdist worker number when there is one,
    so that parallel workers boot clusters of their own; `suffix` names a worker's second pair."""
    base = os.environ.get("SPARK_SIM_INSTANCE", "pytest")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    number = worker[2:] if worker.startswith("gw") else ""
    return base[: 8 - len(number) - len(suffix)] + number + suffix


def pytest_configure(config):
    # One name for this run's CPU log, inherited by the xdist workers started after this.
    if not hasattr(config, "workerinput"):
        os.environ["SPARK_TEST_RUN"] = f"{os.getpid()}"
    config.addinivalue_line(
        "markers",
        f"{SHARED_MARK}: the module only reads node state after a fresh boot and may share its worker's "
        "booted pair (tests/conftest.py); checked after the module",
    )


def pytest_collection_modifyitems(config, items):
    def weight(item):
        name = item.path.name
        return HEAVY_FIRST.index(name) if name in HEAVY_FIRST else len(HEAVY_FIRST)

    items.sort(key=weight)  # stable: file and test order are kept within a module


def pytest_addoption(parser):
    parser.addoption("--keep-nodes", action="store_true", help="leave the simulated nodes up after the run")


def _require_root():
    if os.geteuid() != 0:
        pytest.fail("the simulated nodes need root (network namespaces, systemd-nspawn)")


class SharedPair:
    """A worker's pair for the modules marked shared_nodes, and the proof that each gave it back unchanged."""

    def __init__(self, instance: str):
        self.instance = instance
        self.cluster: sim.Cluster | None = None
        self.baseline: list[node_state.NodeState] = []
        self.knobs: dict[str, bytes] = {}

    def lend(self) -> sim.Cluster:
        if self.cluster is None:
            self.cluster = sim.up(self.instance, 2, hub=True)
            self.baseline = node_state.snapshot(self.cluster)
            self.knobs = node_state.knobs_of(self.cluster)
        return self.cluster

    def give_back(self, module: str) -> None:
        node_state.restore_knobs(self.cluster, self.knobs)
        found = node_state.changes(self.baseline, self.cluster)
        if found:
            self.down()  # the next module gets a fresh pair, not this one's leftovers
            shown = "\n  ".join(found[:60]) + ("\n  ..." if len(found) > 60 else "")
            pytest.fail(f"{module} is marked {SHARED_MARK} but changed the shared nodes; put back what it "
                        f"plants or give it a pair of its own (drop the mark):\n  {shown}", pytrace=False)

    def down(self) -> None:
        if self.cluster is not None:
            sim.down(self.instance)
            self.cluster = None


@pytest.fixture(scope="session")
def shared_pair(request):
    """The worker's pair for modules marked shared_nodes (booted on first use)."""
    pair = SharedPair(sim_instance_name("s"))
    yield pair
    if not request.config.getoption("--keep-nodes"):
        pair.down()


@pytest.fixture(scope="module")
def sim_cluster(request):
    """A two-node simulated Spark cluster for the module: its own, or the worker's shared one.

    A boot costs seconds. SPARK_SIM_INSTANCE names the instances (default `pytest`),
    so parallel runs on one machine do not collide. The local hub emulator serves the
    synthetic checkpoint on the bridge; the inventory points the checkpoint role at it.
    """
    _require_root()
    nodes_cpu = request.node.stash.get(_NODES_CPU, {"own": 0.0})
    if request.node.get_closest_marker(SHARED_MARK):
        pair = request.getfixturevalue("shared_pair")
        lent = pair.lend()
        before = sim.instance_cpu_seconds(lent.instance)
        yield lent
        nodes_cpu["own"] += sim.instance_cpu_seconds(lent.instance) - before
        pair.give_back(request.node.name)
        return
    instance = sim_instance_name()
    c = sim.up(instance, 2, hub=True)
    yield c
    nodes_cpu["own"] += sim.instance_cpu_seconds(instance)
    if not request.config.getoption("--keep-nodes"):
        sim.down(instance)


def _own_four_nodes(request, suffix: str, **layout):
    """A module's own instance of four nodes (SPARK_SIM_INSTANCE plus suffix), one rail, with the hub; its nodes'
    CPU counted for the module, and the nodes taken down after it unless --keep-nodes."""
    _require_root()
    nodes_cpu = request.node.stash.get(_NODES_CPU, {"own": 0.0})
    instance = sim_instance_name(suffix)
    c = sim.up(instance, 4, hub=True, site_rails=1, **layout)
    yield c
    nodes_cpu["own"] += sim.instance_cpu_seconds(instance)
    if not request.config.getoption("--keep-nodes"):
        sim.down(instance)


@pytest.fixture(scope="module")
def sim_four(request):
    """Four simulated Sparks, written as one TP group of four (spark-0 the head, spark-1..3 its workers, ranked in
    that order; `sim.regroup` writes them as two groups of two), the fabric ports on one switch, one rail, with the
    hub: the module's own instance (SPARK_SIM_INSTANCE plus `f`)."""
    yield from _own_four_nodes(request, "f")


@pytest.fixture(scope="module")
def sim_ring(request):
    """Four simulated Sparks cabled in a ring without a switch (each node's first QSFP port to the next node's
    second, in node order), one TP group of four, with the hub: the module's own instance (SPARK_SIM_INSTANCE plus
    `r`)."""
    yield from _own_four_nodes(request, "r", ring=True)


@pytest.fixture(scope="module")
def sim_inventory(sim_cluster):
    return sim_cluster.inventory



# ---- where CI's budget goes ------------------------------------------------------------------
# Wall time per module says little on a loaded 2-core machine; CPU seconds do: the worker's own and
# its playbook runs' (rusage), and the module's simulated nodes' (their cgroup's cpu.stat).

_module_seconds: dict[str, float] = {}
_CPU_LOG = Path(tempfile.gettempdir()) / "spark-test-cpu"


def _process_cpu_seconds() -> float:
    """This worker's CPU and its children's (the playbook runs), without the nodes' that a reaped power
    supply brings into RUSAGE_CHILDREN: the nodes are counted from their cgroups."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime - sim.reaped_supply_cpu()


@pytest.fixture(scope="module", autouse=True)
def _module_cpu(request):
    start, connections = _process_cpu_seconds(), sim.SSH_CONNECTIONS["count"]
    nodes = {"own": 0.0}
    request.node.stash[_NODES_CPU] = nodes
    yield
    run = os.environ.get("SPARK_TEST_RUN", "")
    line = {"module": request.node.nodeid, "controller": _process_cpu_seconds() - start, "nodes": nodes["own"],
            "ssh": sim.SSH_CONNECTIONS["count"] - connections}
    with open(f"{_CPU_LOG}-{run}.jsonl", "a") as log:
        log.write(json.dumps(line) + "\n")


_NODES_CPU = pytest.StashKey[dict]()
_module_span: dict[str, tuple[float, float, str]] = {}


def pytest_runtest_logreport(report):
    # Runs on the controller for every worker's report too: the per-module wall time that CI's
    # budget is spent on (setup, call and teardown, the module's pair included).
    module = report.nodeid.split("::", 1)[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration
    # When and on which worker: a core idle at the end of the run is a module that started too late.
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "main")
    start, stop, _ = _module_span.get(module, (report.start, report.stop, worker))
    _module_span[module] = (min(start, report.start), max(stop, report.stop), worker)


def pytest_terminal_summary(terminalreporter, config):
    if not _module_seconds or hasattr(config, "workerinput"):
        return
    run = os.environ.get("SPARK_TEST_RUN", "")
    cpu: dict[str, dict] = {}
    log = Path(f"{_CPU_LOG}-{run}.jsonl")
    if log.exists():
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            cpu[entry["module"]] = entry
        log.unlink()
    runs: list[dict] = []
    run_log = Path(f"{RUN_LOG}-{run}.jsonl")
    if run_log.exists():
        runs = [json.loads(line) for line in run_log.read_text().splitlines()]
        if os.environ.get("SPARK_TEST_RUNS_JSON"):  # every run, for a look at where the time went
            Path(os.environ["SPARK_TEST_RUNS_JSON"]).write_text(json.dumps(runs, indent=1))
        run_log.unlink()
    runs_of: dict[str, list[dict]] = {}
    for entry in runs:
        runs_of.setdefault(entry["test"].split("::", 1)[0], []).append(entry)
    ranked = sorted(_module_seconds.items(), key=lambda kv: -kv[1])
    terminalreporter.write_sep("=", "per module: wall seconds (setup + call + teardown), CPU seconds (controller + nodes), "
                                    "playbook runs (their controller CPU-s), the harness's own SSH commands")
    for module, seconds in ranked[:30]:
        c = cpu.get(module, {})
        mine = runs_of.get(module, [])
        terminalreporter.write_line(f"{seconds:8.1f}s wall  {c.get('controller', 0):7.1f} + {c.get('nodes', 0):7.1f} CPU-s  "
                                    f"{len(mine):4d} runs ({sum(r['cpu'] for r in mine):6.1f}) "
                                    f"{c.get('ssh', 0):5d} ssh  {module}")
    terminalreporter.write_line(f"{sum(_module_seconds.values()):8.1f}s wall  "
                                f"{sum(c['controller'] for c in cpu.values()):7.1f} + "
                                f"{sum(c['nodes'] for c in cpu.values()):7.1f} CPU-s  "
                                f"{len(runs):4d} runs ({sum(r['cpu'] for r in runs):6.1f}) "
                                f"{sum(c.get('ssh', 0) for c in cpu.values()):5d} ssh  in all modules")
    if _module_span:
        first = min(start for start, _, _ in _module_span.values())
        terminalreporter.write_sep("-", "per worker: each module's start and end, seconds after the first module started")
        for worker in sorted({w for _, _, w in _module_span.values()}):
            spans = sorted((start, stop, m) for m, (start, stop, w) in _module_span.items() if w == worker)
            terminalreporter.write_line(f"{worker}: " + ", ".join(
                f"{Path(m).stem.removeprefix('test_')} {start - first:.0f}-{stop - first:.0f}" for start, stop, m in spans))
    if runs:
        terminalreporter.write_sep("-", "costliest playbook runs: controller + nodes CPU-s, wall s, task results on the nodes")
        for entry in sorted(runs, key=lambda r: -r["cpu"] - r.get("nodes", 0))[:20]:
            terminalreporter.write_line(f"{entry['cpu']:7.1f} + {entry.get('nodes', 0):6.1f} {entry['wall']:7.1f}s "
                                        f"{entry['host_results']:5d}  "
                                        f"{entry['playbook']}{' --check' if entry['check'] else ''}  {entry['test']}")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The hub emulator (tests/standins/hub_emulator.py) on this machine, for a module's checkpoint tests that
    fetch without nodes (the modules run here, or a local site)."""
    with serve_hub(tmp_path_factory.mktemp("hub")) as emulator:
        yield emulator


@pytest.fixture
def knobs(sim_cluster):
    """Set stand-in knobs for one test, `knobs(node_name, values)`; every node gets back the knobs it had."""
    before = node_state.knobs_of(sim_cluster)
    yield lambda name, values: sim.set_knobs(sim_cluster.instance, name, values)
    node_state.restore_knobs(sim_cluster, before)

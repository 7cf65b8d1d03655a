"""Shared fixtures: the simulated Spark cluster and the playbook runner."""

from __future__ import annotations

import os

import pytest

from tests.harness import cluster as sim

# Modules that converge whole clusters, longest first: with parallel workers
# (pytest-xdist, --dist loadfile) a long module started last would finish
# alone while the other worker idles. Everything else keeps its file order.
HEAVY_FIRST = (
    "test_server_nodes.py",
    "test_checkpoint_nodes.py",
    "test_day2.py",
    "test_doctor.py",
    "test_fabric.py",
    "test_verify.py",
    "test_preflight_running.py",
    "test_preflight.py",
    "test_harness.py",
)


def sim_instance_name() -> str:
    """SPARK_SIM_INSTANCE (default `pytest`), plus the xdist worker number when there is one,
    so that parallel workers boot clusters of their own."""
    base = os.environ.get("SPARK_SIM_INSTANCE", "pytest")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    number = worker[2:] if worker.startswith("gw") else ""
    return base[: 8 - len(number)] + number


def pytest_collection_modifyitems(config, items):
    def weight(item):
        name = item.path.name
        return HEAVY_FIRST.index(name) if name in HEAVY_FIRST else len(HEAVY_FIRST)

    items.sort(key=weight)  # stable: file and test order are kept within a module


def pytest_addoption(parser):
    parser.addoption("--keep-nodes", action="store_true", help="leave the simulated nodes up after the run")


@pytest.fixture(scope="module")
def sim_cluster(request):
    """A freshly booted two-node simulated Spark cluster for each test module.

    Each module gets nodes of its own, so no module inherits the units,
    files or knobs another one left (a boot costs seconds). SPARK_SIM_INSTANCE
    names it (default `pytest`), so parallel runs on one machine do not
    collide. The local hub emulator serves the synthetic checkpoint on the
    bridge; the inventory points the checkpoint role at it.
    """
    if os.geteuid() != 0:
        pytest.fail("the simulated nodes need root (network namespaces, systemd-nspawn)")
    instance = sim_instance_name()
    c = sim.up(instance, 2, hub=True)
    yield c
    if not request.config.getoption("--keep-nodes"):
        sim.down(instance)


@pytest.fixture(scope="module")
def sim_inventory(sim_cluster):
    return sim_cluster.inventory

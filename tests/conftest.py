"""Shared fixtures: the simulated Spark cluster and the playbook runner."""

from __future__ import annotations

import os

import pytest

from tests.harness import cluster as sim


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
    instance = os.environ.get("SPARK_SIM_INSTANCE", "pytest")
    c = sim.up(instance, 2, hub=True)
    yield c
    if not request.config.getoption("--keep-nodes"):
        sim.down(instance)


@pytest.fixture(scope="module")
def sim_inventory(sim_cluster):
    return sim_cluster.inventory

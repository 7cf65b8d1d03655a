"""The monitoring role's one read of a node (monitoring_probe) and what it is compared with.

A no-change run reads the packages, files and units the role owns in one probe and installs nothing when they
are what the role would install (monitoring_drift); any difference - a package gone, a file edited,
removed or of another mode, a unit stopped or disabled - runs the installation. The reports directory on the
controller is pruned without counting as a change of any node.
"""

from __future__ import annotations

import hashlib
import os
import pwd

import pytest
import yaml

from tests.lib.role_module import REPO, run_module
from tests.lib.roles import filter_plugin

FILTER = filter_plugin("monitoring")
DROPIN = "/etc/systemd/system/prometheus-node-exporter.service.d/spark-llm-monitoring.conf"
KEY = "/etc/prometheus/spark/spark_llm_api_key"
WANT = {"packages": ["prometheus-node-exporter"],
        "paths": [{"path": "/var/lib/prometheus/node-exporter", "type": "directory", "owner": "root", "group": "root",
                   "mode": "0755"},
                  {"path": DROPIN, "owner": "root", "group": "root", "mode": "0644", "checksum": "aa"},
                  {"path": KEY, "type": "absent"}],
        "units": ["prometheus-node-exporter.service"]}


def node(**changes):
    answer = {"packages": {"prometheus-node-exporter": True},
              "paths": {"/var/lib/prometheus/node-exporter": {"type": "directory", "owner": "root", "group": "root",
                                                              "mode": "0755"},
                        DROPIN: {"type": "file", "owner": "root", "group": "root", "mode": "0644", "checksum": "aa"},
                        KEY: {"type": "absent"}},
              "units": {"prometheus-node-exporter.service": {"active": "active", "enabled": "enabled"}}}
    answer.update(changes)
    return answer


def test_a_node_that_holds_what_the_role_installs_has_nothing_to_do():
    assert FILTER.monitoring_drift(node(), WANT) == []


@pytest.mark.parametrize(("changes", "found"), [
    ({"packages": {"prometheus-node-exporter": False}}, "package prometheus-node-exporter not installed"),
    ({"packages": {}}, "package prometheus-node-exporter not installed"),
    ({"paths": {**node()["paths"], DROPIN: {**node()["paths"][DROPIN], "checksum": "bb"}}}, f"{DROPIN}: checksum differs"),
    ({"paths": {**node()["paths"], DROPIN: {"type": "absent"}}}, f"{DROPIN}: absent, not a file"),
    ({"paths": {**node()["paths"], DROPIN: {**node()["paths"][DROPIN], "owner": "nobody"}}},
     f"{DROPIN}: owner nobody, not root"),
    # A key file where the scrape sends no key: it goes.
    ({"paths": {**node()["paths"], KEY: {"type": "file", "owner": "prometheus", "group": "prometheus", "mode": "0600",
                                         "checksum": "cc"}}}, f"{KEY}: file, not a absent"),
    ({"units": {"prometheus-node-exporter.service": {"active": "failed", "enabled": "enabled"}}},
     "prometheus-node-exporter.service not active (failed)"),
    ({"units": {"prometheus-node-exporter.service": {"active": "active", "enabled": "disabled"}}},
     "prometheus-node-exporter.service not enabled (disabled)"),
])
def test_any_difference_on_the_node_runs_the_installation(changes, found):
    assert found in FILTER.monitoring_drift(node(**changes), WANT)


def test_the_probe_reads_packages_files_and_directories_in_one_go(tmp_path):
    program = tmp_path / "collector.py"
    program.write_bytes(b"#!/usr/bin/python3\nprint('x')\n")
    program.chmod(0o755)
    result = run_module("monitoring_probe", {
        "packages": ["spark-no-such-package"], "paths": [str(program), str(tmp_path), str(tmp_path / "gone")]},
        tmp_path, check=True)
    assert result["changed"] is False
    assert result["packages"] == {"spark-no-such-package": False}
    me = pwd.getpwuid(os.getuid())[0]
    assert result["paths"][str(program)] == {
        "type": "file", "owner": me, "group": result["paths"][str(program)]["group"], "mode": "0755",
        "checksum": hashlib.sha1(program.read_bytes()).hexdigest()}  # noqa: S324 - as the copy module
    assert result["paths"][str(tmp_path)]["type"] == "directory"
    assert result["paths"][str(tmp_path / "gone")] == {"type": "absent"}
    assert result["units"] == {}


def test_pruning_the_controllers_reports_is_no_change_of_a_node():
    tasks = yaml.safe_load((REPO / "roles" / "monitoring" / "tasks" / "controller.yml").read_text())
    prune = next(t for t in tasks if t["name"].startswith("Keep only the last runs of each report kind"))
    # Housekeeping on the controller: the run's changed count stays the nodes' (a drift check reads 0).
    assert prune["changed_when"] is False
    assert prune["delegate_to"] == "localhost" and prune["run_once"] is True and prune["become"] is False
    # It still removes what the kept number leaves out, in the controller's process (tests/integration/test_monitoring).
    assert set(prune["dgx_spark.llm_serving.monitoring_reports"]) == {"path", "kinds", "keep"}

"""The monitoring ports in the firewall's plan (firewall, wired from the monitoring role's settings).

The node exporter's port admits the monitoring host only, Prometheus's the allowed clients only (nobody by default),
loopback always; the head's HTTP port admits the monitoring host besides its clients (/metrics). The packets run
through `firewall_verdict` here are decided by the same rules the nftables table holds.
"""

from __future__ import annotations

import pytest
import yaml

from tests.lib.playbook import REPO
from tests.lib.roles import filter_plugin, role_defaults

fw = filter_plugin("firewall")
HEAD, WORKER, MONITOR = "spark-0", "spark-1", "mon-0"
CONTROLLER = "10.0.0.1"


def services(monitor=WORKER, clients=(), exporter=9100, prometheus=9090):
    """What group_vars/all/spark.yml wires from the monitoring role's settings."""
    return [
        {"name": "node exporter", "port": exporter, "var": "monitoring_node_exporter_port", "clients": [],
         "client_hosts": [monitor]},
        {"name": "Prometheus", "port": prometheus, "var": "monitoring_prometheus_port",
         "clients_var": "monitoring_allowed_clients", "clients": list(clients), "client_hosts": []},
    ]


def plan(host=HEAD, monitor=WORKER, **changes):
    ctx = {
        "host": host, "head": HEAD, "nodes": [HEAD, WORKER], "allowed_clients": ["10.0.0.0/24"], "http_port": 30000,
        "dist_ports": [20000], "fabric_interface": "enp1s0f1np1", "ssh_port": 22, "connection": "ssh",
        "must_reach": True, "probe": None, "head_probe": None, "routes": {},
        "fabric_ips": {HEAD: "192.168.100.10", WORKER: "192.168.100.11"},
        "management": {HEAD: "10.0.0.10", WORKER: "10.0.0.11", MONITOR: "10.0.5.20"},
        "service_ports": services(monitor), "http_client_hosts": [monitor],
    }
    ctx.update(changes)
    return fw.firewall_plan(ctx)


def verdict(p, saddr, daddr, dport, iif="eth0"):
    return fw.firewall_verdict(p, {"saddr": saddr, "daddr": daddr, "dport": dport, "iif": iif})[0]


def test_the_exporter_admits_the_monitoring_host_only_and_prometheus_nobody_by_default():
    for host, own in ((HEAD, "10.0.0.10"), (WORKER, "10.0.0.11")):
        p = plan(host=host)
        assert p["errors"] == []
        assert verdict(p, "10.0.0.11", own, 9100) == "accept"
        assert verdict(p, CONTROLLER, own, 9100) == "drop"
        assert verdict(p, "127.0.0.1", own, 9100, iif="lo") == "accept"
        assert verdict(p, CONTROLLER, own, 9090) == "drop"
        assert verdict(p, "10.0.0.11", own, 9090) == "drop"
        # The ranks' ports and SSH are as before.
        assert verdict(p, CONTROLLER, own, 22) is None
    services_seen = {s["name"]: s for s in plan()["services"]}
    assert services_seen["node exporter"]["source"] == "10.0.0.11/32 (and loopback)"
    assert services_seen["Prometheus"]["source"] == "loopback (nobody else)"


def test_prometheus_admits_its_allowed_clients():
    p = plan(service_ports=services(clients=["10.0.0.1/32", "fd00::/64"]))
    assert verdict(p, CONTROLLER, "10.0.0.10", 9090) == "accept"
    assert verdict(p, "fd00::7", "fd00::1", 9090) == "accept"
    assert verdict(p, "10.0.0.2", "10.0.0.10", 9090) == "drop"


def test_the_http_port_admits_the_monitoring_host_outside_the_clients():
    p = plan(monitor=MONITOR, allowed_clients=["10.0.0.0/24"])
    assert p["errors"] == []
    assert verdict(p, "10.0.5.20", "10.0.0.10", 30000) == "accept"
    assert verdict(p, "10.0.5.21", "10.0.0.10", 30000) == "drop"
    assert "and the monitoring host 10.0.5.20" in p["clients_source"]
    assert verdict(p, "10.0.5.20", "10.0.0.10", 9100) == "accept"
    # Without monitoring nothing changes.
    quiet = plan(service_ports=[], http_client_hosts=[])
    assert quiet["services"] == [] and "monitoring" not in quiet["clients_source"]


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"service_ports": services(exporter=22)}, "monitoring_node_exporter_port = 22: ansible_port uses that port"),
    ({"service_ports": services(prometheus=30000)}, "monitoring_prometheus_port = 30000: firewall_http_port"),
    ({"service_ports": services(clients=["10.0.0.1/24"])}, "monitoring_allowed_clients[0] = '10.0.0.1/24'"),
    ({"service_ports": services(exporter="x")}, "monitoring_node_exporter_port = 'x': not a TCP port"),
])
def test_clashing_or_bad_monitoring_ports_are_refused(changes, fragment):
    errors = plan(**changes)["errors"]
    assert any(fragment in e and "Fix:" in e for e in errors), errors


def test_a_monitoring_host_named_without_an_address_is_refused_on_the_node():
    p = plan(management={HEAD: "10.0.0.10", WORKER: "10.0.0.11", MONITOR: "mon.example"}, monitor=MONITOR,
             probe={"addrs": [], "ssh_connection": "10.0.0.1 5000 10.0.0.10 22"})
    assert any("names 'mon-0', whose address the firewall cannot tell" in e for e in p["errors"]), p["errors"]
    # Before any contact (the inventory check) it is not known yet, not wrong.
    assert plan(management={HEAD: "10.0.0.10", WORKER: "10.0.0.11", MONITOR: "mon.example"},
                monitor=MONITOR)["errors"] == []


def test_the_wiring_matches_the_monitoring_defaults():
    wiring = yaml.safe_load((REPO / "playbooks" / "group_vars" / "all" / "spark.yml").read_text())
    monitoring = role_defaults("monitoring")
    text = wiring["firewall_service_ports"]
    assert f"monitoring_node_exporter_port | default({monitoring['monitoring_node_exporter_port']})" in text
    assert f"monitoring_prometheus_port | default({monitoring['monitoring_prometheus_port']})" in text
    assert "monitoring_allowed_clients | default([])" in text and monitoring["monitoring_allowed_clients"] == []
    assert role_defaults("firewall")["firewall_service_ports"] == []

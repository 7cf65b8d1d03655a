"""The model gateway's plan (plugins/filter/gateway.py): its settings refused before any change, each refusal naming
the variable, the value, why and the fix; smg's launch arguments derived from the role's defaults (every option in
them is one `smg launch --help` of the pinned 1.13.0 lists); and the gateway's ports in the firewall's plan."""

from __future__ import annotations

import pytest
import yaml

from tests.lib.playbook import REPO
from tests.lib.roles import filter_plugin, role_defaults

gw = filter_plugin("gateway")
fw = filter_plugin("firewall")
DEFAULTS = role_defaults("gateway")
PINS = yaml.safe_load((REPO / "roles/gateway/vars/main.yml").read_text())["__gateway_pins"]
HEAD, WORKER = "spark-0", "spark-1"


def ctx(**changes):
    """The context roles/gateway/vars/main.yml gives the filter, from the role's defaults."""
    base = {key.removeprefix("gateway_"): value for key, value in DEFAULTS.items()}
    base.update(enabled=True, host=HEAD, heads=[HEAD], monitor=HEAD, pins=PINS, tls_cert="", tls_key="", heads_ca="",
                management={HEAD: "10.0.0.10", WORKER: "10.0.0.11"}, tls_unsigned=False)
    base.update(changes)
    return base


def errors(**changes):
    return gw.gateway_plan(ctx(**changes))["errors"]


def test_the_defaults_give_smg_its_arguments_without_the_key():
    plan = gw.gateway_plan(ctx())
    assert plan["errors"] == []
    assert plan["worker_urls"] == ["http://10.0.0.10:30000"]
    assert plan["args"] == [
        "--worker-urls", "http://10.0.0.10:30000", "--host", DEFAULTS["gateway_listen_address"], "--port", "30080",
        # auto in front of one group: cache_aware (smg refuses power_of_two in front of one worker).
        "--policy", "cache_aware",
        "--health-check-endpoint", "/health", "--health-check-interval-secs", "10", "--health-check-timeout-secs", "5",
        "--health-failure-threshold", "3", "--health-success-threshold", "2", "--load-monitor-interval", "1",
        # The monitoring host is the gateway host: its metrics stay on loopback.
        "--prometheus-host", "127.0.0.1", "--prometheus-port", "29000", "--disable-tokenizer-autoload"]
    assert plan["policy"] == "cache_aware"
    assert "--api-key" not in plan["args"]


def test_auto_in_front_of_two_groups_is_power_of_two_on_the_requests_in_flight():
    plan = gw.gateway_plan(ctx(heads=[HEAD, WORKER]))
    args = plan["args"]
    assert plan["errors"] == [] and plan["policy"] == "power_of_two"
    assert args[args.index("--policy") + 1] == "power_of_two"
    # Each request to the group with fewer requests in flight at the gateway (counted as they come and go).
    assert args[-2:] == ["--power-of-two-load-metric", "least_requests"]
    args = gw.gateway_plan(ctx(heads=[HEAD, WORKER], power_of_two_load_metric="expected_wait"))["args"]
    assert args[-2:] == ["--power-of-two-load-metric", "expected_wait"]


def test_the_load_metric_goes_with_power_of_two_only():
    plan = gw.gateway_plan(ctx(heads=[HEAD, WORKER], policy="cache_aware", power_of_two_load_metric="fastest"))
    assert plan["errors"] == [] and plan["policy"] == "cache_aware"
    assert plan["args"][plan["args"].index("--policy") + 1] == "cache_aware"
    assert "--power-of-two-load-metric" not in plan["args"]


def test_extra_arguments_follow_the_roles_own():
    plan = gw.gateway_plan(ctx(extra_args=["--worker-overload-waiting-requests", 1]))
    assert plan["errors"] == [] and plan["args"][-2:] == ["--worker-overload-waiting-requests", "1"]
    assert plan["args"][:-2] == gw.gateway_plan(ctx())["args"]


def test_every_head_over_tls_with_the_heads_ca_and_the_gateway_serving_tls_itself():
    plan = gw.gateway_plan(ctx(host=WORKER, heads=[HEAD, WORKER], heads_tls=True, heads_ca="cred:heads-ca.crt",
                               tls_cert="cred:tls.crt", tls_key="cred:tls.key",
                               management={HEAD: "10.0.0.10", WORKER: "fd00::11"}))
    assert plan["errors"] == []
    assert plan["worker_urls"] == ["https://10.0.0.10:30000", "https://[fd00::11]:30000"]
    args = plan["args"]
    assert args[args.index("--ca-cert-paths") + 1] == "cred:heads-ca.crt"
    assert args[args.index("--tls-cert-path") + 1] == "cred:tls.crt"
    assert args[args.index("--tls-key-path") + 1] == "cred:tls.key"
    # The monitoring host (the head) scrapes the gateway on the worker: its management address.
    assert args[args.index("--prometheus-host") + 1] == "fd00::11"


def test_off_it_checks_nothing_but_its_switch():
    assert gw.gateway_plan(ctx(enabled=False, policy="fastest", port="x")) == {
        "errors": [], "enabled": False, "args": [], "worker_urls": [], "metrics_address": "", "policy": ""}
    assert errors(enabled="maybe") == ["gateway_enabled = 'maybe': must be true or false. Fix: a YAML boolean."]


@pytest.mark.parametrize(("changes", "expected"), [
    ({"version": "1.12.0"}, "gateway_version = '1.12.0': no pinned wheels are known for it"),
    ({"policy": "fastest"}, "gateway_policy = 'fastest': smg has no such routing policy. Fix: one of auto, cache_aware, "),
    ({"heads": [HEAD, WORKER], "power_of_two_load_metric": "fastest"},
     "gateway_power_of_two_load_metric = 'fastest': smg's power_of_two compares least_requests, requests, "
     "expected_wait. Fix: least_requests"),
    ({"policy": "power_of_two"}, "gateway_policy = 'power_of_two': smg refuses to start it in front of one group (1 "
                                 "head here). Fix: gateway_policy: auto"),
    ({"extra_args": ["--power-of-two-load-metric", "requests"]},
     "gateway_extra_args = ['--power-of-two-load-metric', 'requests']: --power-of-two-load-metric is set by the role"),
    ({"port": 30000}, "gateway_port = 30000: the gateway runs on the head spark-0, whose engine serves server_port "
                      "30000. Fix: another gateway_port (the default is 30080)."),
    ({"metrics_port": 30080}, "gateway_metrics_port = 30080: gateway_port is the same port."),
    ({"port": 70000}, "gateway_port = 70000: not a TCP port."),
    ({"health_check_interval": 0}, "gateway_health_check_interval = 0: must be a whole number >= 1"),
    ({"health_failure_threshold": "three"}, "gateway_health_failure_threshold = 'three': must be a whole number"),
    ({"heads": []}, "spark_heads = []: the gateway fronts every TP group's head, and there is none."),
    ({"host": "", "heads": [HEAD]}, "spark_gateway_host = '': the gateway needs a host."),
    ({"management": {HEAD: ""}}, "ansible_host of spark-0: the gateway reaches each head by its management address."),
    ({"listen_address": "gateway.example"}, "gateway_listen_address = 'gateway.example': smg binds an IP address"),
    ({"tls_unsigned": True}, "gateway_tls_cert = '': TLS is on (server_tls) with the heads' own certificate"),
    ({"extra_args": ["--api-key", "x"]}, "gateway_extra_args = ['--api-key', 'x']: --api-key is set by the role from "
                                         "its own settings (the key from its 0600 file, never on a command line)."),
    ({"extra_args": ["--policy=round_robin"]}, "gateway_extra_args = ['--policy=round_robin']: --policy is set by"),
    ({"extra_args": "--load-monitor-interval 1"}, "gateway_extra_args = '--load-monitor-interval 1': must be a list"),
    ({"extra_args": ["--load-monitor-interval", "5"]}, "gateway_extra_args = ['--load-monitor-interval', '5']: "
                                                       "--load-monitor-interval is set by the role"),
    ({"load_monitor_interval": 0}, "gateway_load_monitor_interval = 0: must be a whole number >= 1"),
])
def test_a_bad_setting_is_refused_with_its_fix(changes, expected):
    found = errors(**changes)
    assert len(found) == 1 and found[0].startswith(expected), found
    assert "Fix:" in found[0]


def test_on_another_host_the_gateway_may_take_the_heads_port():
    assert errors(host=WORKER, port=30000, metrics_port=29000) == []


def test_the_firewall_admits_the_endpoints_clients_on_the_gateway_port_and_the_monitoring_host_on_its_metrics():
    wired = [{"name": "model gateway", "port": 30080, "var": "gateway_port", "clients_as_http": True,
              "client_hosts": []},
             {"name": "model gateway metrics", "port": 29000, "var": "gateway_metrics_port", "clients": [],
              "client_hosts": [HEAD]}]
    base = {"host": WORKER, "head": HEAD, "nodes": [HEAD, WORKER], "http_port": 30000, "dist_ports": [20000],
            "fabric_interface": "enp1s0f1np1", "ssh_port": 22, "connection": "ssh", "must_reach": True, "probe": None,
            "head_probe": None, "routes": {}, "fabric_ips": {HEAD: "192.168.100.10", WORKER: "192.168.100.11"},
            "management": {HEAD: "10.0.0.10", WORKER: "10.0.0.11"}, "service_ports": wired,
            "http_client_hosts": [HEAD], "names": {"allowed_clients": "server_allowed_clients", "http_port": "server_port"}}

    def verdict(plan, saddr, dport):
        return fw.firewall_verdict(plan, {"saddr": saddr, "daddr": "10.0.0.11", "dport": dport, "iif": "eth0"})[0]

    plan = fw.firewall_plan({**base, "allowed_clients": ["10.0.9.0/24"]})
    assert plan["errors"] == []
    assert verdict(plan, "10.0.9.7", 30080) == "accept"
    assert verdict(plan, "10.0.0.10", 30080) == "drop"
    assert verdict(plan, "10.0.0.10", 29000) == "accept"
    assert verdict(plan, "10.0.9.7", 29000) == "drop"
    seen = {s["name"]: s["source"] for s in plan["services"]}
    assert seen["model gateway"] == "server_allowed_clients ['10.0.9.0/24'] (and loopback)"
    assert seen["model gateway metrics"] == "10.0.0.10/32 (and loopback)"
    # A gateway port equal to the heads' port is refused on the nodes too.
    clash = fw.firewall_plan({**base, "allowed_clients": [], "service_ports": [{**wired[0], "port": 30000}]})
    assert clash["errors"][0].startswith("gateway_port = 30000: server_port uses that port too.")


def test_the_wiring_matches_the_gateway_defaults():
    wiring = yaml.safe_load((REPO / "playbooks" / "group_vars" / "all" / "spark.yml").read_text())
    text = wiring["firewall_service_ports"]
    assert f"gateway_port | default({DEFAULTS['gateway_port']})" in text
    assert f"gateway_metrics_port | default({DEFAULTS['gateway_metrics_port']})" in text
    assert wiring["gateway_heads_port"] == "{{ server_port | default(30000) }}"


def test_a_host_without_ansible_host_is_reached_by_its_name():
    assert gw.gateway_management({"node-a": "", "node-b": "10.0.0.11"}) == {"node-a": "node-a", "node-b": "10.0.0.11"}
    plan = gw.gateway_plan(ctx(management=gw.gateway_management({HEAD: ""})))
    assert plan["worker_urls"] == ["http://spark-0:30000"]
    # smg binds addresses only: metrics for a monitoring host elsewhere need the gateway host's IP address.
    assert errors(host=WORKER, management=gw.gateway_management({HEAD: "", WORKER: ""}))[0].startswith(
        "gateway_metrics_address = 'spark-1': smg binds an IP address, not a name.")

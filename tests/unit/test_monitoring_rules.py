"""The monitoring role's alert rules, Prometheus configuration and input checks, through Prometheus's own promtool.

Every alert rule is unit-tested with `promtool test rules`: it fires on the series that mean its fault, with its
labels and its annotations (the runbook line included), and stays quiet on healthy ones. The generated
configuration passes `promtool check config` (the rule file and the API key file it names included), with the role
defaults and with TLS. promtool comes from Debian's package (tests/lib/prometheus_tools.py).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.lib.playbook import REPO
from tests.lib.prometheus_tools import promtool
from tests.lib.roles import action_plugin, filter_plugin, flag_model, role_defaults

FILTER = filter_plugin("monitoring")
REPORTS = action_plugin("monitoring_reports")
NODES = ["spark-0", "spark-1"]
HOSTVARS = {"spark-0": {"ansible_host": "10.0.0.10"}, "spark-1": {"ansible_host": "10.0.0.11"},
            "mon-0": {"ansible_host": "10.0.0.20"}}
SEVERITY = {"service": "server"}


def ctx(tmp_path: Path, **changes) -> dict:
    """The role's context with its defaults (as vars/main.yml builds it), paths under tmp_path."""
    defaults = role_defaults("monitoring")
    out = {key[len("monitoring_"):]: value for key, value in defaults.items()}
    out.update(
        host="spark-0", monitoring=True, monitor="spark-0", monitor_host_setting="", monitor_group="spark_monitor",
        monitor_candidates=[], inventory_hosts=[*NODES, "mon-0"], head="spark-0", nodes=NODES,
        unit="spark-llm.service", model_dir="/opt/models/glm53", fabric_interface="enp1s0f1np1", ssh_port=22,
        api_key_set=True, grafana_token_file=str(tmp_path / "grafana_token"), engine=flag_model("sglang"),
        paths={"config": str(tmp_path / "prometheus.yml"), "rules": str(tmp_path / "alerts.yml"),
               "key": str(tmp_path / "spark_llm_api_key"), "ca": str(tmp_path / "spark-llm-ca.crt")},
    )
    out.update(changes)
    return out


def promtool_run(*args, cwd=None):
    return subprocess.run([str(promtool()), *args], capture_output=True, text=True, cwd=cwd, check=False)


# --- every rule through promtool test rules -----------------------------------------------------------

# Short windows so that each case is a few minutes of series.
RULES_CTX = {
    "ttft_p99_seconds": 10, "queue_threshold": 4, "filesystem_free_percent": 10, "gpu_temperature_celsius": 85,
    "speculative_min_accept_length": 1.3, "stall_window": "5m", "collector_interval": 15,
    "alert_for": dict.fromkeys(FILTER.ALERT_FOR_KEYS, "2m"),
}
HEAD_SGLANG = {"job": "server", "instance": "10.0.0.10:30000", "node": "spark-0", "rank": "0", "role": "head"}
WORKER_NODE = {"job": "node", "instance": "10.0.0.11:9100", "node": "spark-1", "rank": "1", "role": "worker"}
HEAD_NODE = {"job": "node", "instance": "10.0.0.10:9100", "node": "spark-0", "rank": "0", "role": "head"}
MODEL = "/opt/models/glm53"


def series(name: str, labels: dict, values: str) -> dict:
    shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{shown}}}", "values": values}


def expand(text: str, labels: dict, value: str) -> str:
    """Prometheus's expansion of the annotations' templates for these labels and this (formatted) value."""
    text = re.sub(r"\{\{ \$value \| humanize(?:Duration)? \}\}", value, text)
    text = text.replace("{{ $value }}", value)
    return re.sub(r"\{\{ \$labels\.([a-z_]+) \}\}", lambda m: labels.get(m.group(1), ""), text)


def case(rules, alert, inputs, eval_time, *, fired=(), quiet_at=None):
    """A promtool test: `alert` fires at eval_time once per (labels, value) in `fired`, and not at quiet_at."""
    rule = next(r for r in rules if r["alert"] == alert)
    exp = []
    for labels, value in fired:
        exp.append({"exp_labels": {**labels, **rule["labels"]},
                    "exp_annotations": {k: expand(v, labels, value) for k, v in rule["annotations"].items()}})
    tests = [{"eval_time": eval_time, "alertname": alert, "exp_alerts": exp}]
    if quiet_at:
        tests.append({"eval_time": quiet_at, "alertname": alert, "exp_alerts": []})
    return {"interval": "1m", "input_series": inputs, "alert_rule_test": tests}


# The labels each engine puts on its series: SGLang's scheduler gauges carry its engine type and ranks, vLLM's
# every series its engine index.
ENGINE_LABELS = {"sglang": {"engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}, "vllm": {"engine": "0"}}


def rule_cases(rules, engine="sglang"):
    """The cases of every rule, the engine's series under the names its flag model gives each figure."""
    figure = flag_model(engine)["monitoring"]["metrics"]
    prefix = flag_model(engine)["monitoring"]["alert_prefix"]
    gauge_labels = ENGINE_LABELS[engine]
    unit_state = {**WORKER_NODE, "name": "spark-llm.service", "state": "active", "type": "simple"}
    served = {"job": "server", "instance": HEAD_SGLANG["instance"], "model_name": "/models/glm53"}
    bucket = f"{figure['time_to_first_token']}_bucket"
    cases = [
        # The endpoint stops answering: fires once it has been down for the window, not before.
        case(rules, f"{prefix}EndpointDown", [series("up", HEAD_SGLANG, "1 1 0 0 0 0 0")], "6m",
             fired=[(HEAD_SGLANG, "0")], quiet_at="3m"),
        case(rules, f"{prefix}EndpointDown", [series("up", HEAD_SGLANG, "1x10")], "10m"),
        # The worker's rank unit goes inactive; the head's stays active.
        case(rules, "SparkRankUnitNotActive",
             [series("node_systemd_unit_state", unit_state, "1 1 0 0 0 0 0"),
              series("node_systemd_unit_state", {**unit_state, **{k: HEAD_NODE[k] for k in ("instance", "node", "rank",
                                                                                           "role")}}, "1x10"),
              series("up", WORKER_NODE, "1x10"), series("up", HEAD_NODE, "1x10")],
             "6m", fired=[(unit_state, "0")], quiet_at="3m"),
        # An exporter that answers without the rank's unit (never installed, or removed).
        case(rules, "SparkRankUnitNotActive", [series("up", HEAD_NODE, "1x10")], "5m", fired=[(HEAD_NODE, "1")]),
        # The supervisor's generation probe fails while /health (the scrape) answers.
        case(rules, f"{prefix}GroupNotServing",
             [series("spark_supervisor_probe_failures", {**HEAD_NODE}, "0 0 1 2 2 2 2"),
              series("up", HEAD_SGLANG, "1x10")],
             "6m", fired=[({}, "1")], quiet_at="2m"),
        # Without a supervisor: requests run and no token comes out for the stall window.
        case(rules, f"{prefix}GroupNotServing",
             [series(figure["running_requests"], {**served, **gauge_labels},
                     "1x20"),
              series(f"{figure['inter_token_latency']}_count", served, "0+5x3 15x16"),
              series(f"{figure['time_to_first_token']}_count", served, "0+1x3 3x16"),
              series("up", HEAD_SGLANG, "1x20")],
             "12m", fired=[({}, "1")], quiet_at="5m"),
        # p99 of the time to first token between 10 and 20 s, above the 10 s threshold; then fast again.
        case(rules, f"{prefix}TimeToFirstTokenHigh",
             [series(bucket, {**served, "le": "10.0"}, "0x20"), series(bucket, {**served, "le": "20.0"}, "0+10x20"),
              series(bucket, {**served, "le": "+Inf"}, "0+10x20")],
             "10m", fired=[({}, "19.9s")]),
        case(rules, f"{prefix}TimeToFirstTokenHigh",
             [series(bucket, {**served, "le": "1.0"}, "0+10x20"), series(bucket, {**served, "le": "+Inf"}, "0+10x20")],
             "10m"),
        # The queue grows past the threshold.
        case(rules, f"{prefix}QueueGrowing",
             [series(figure["queued_requests"], {**served, **gauge_labels},
                     "0+1x20")],
             "10m", fired=[({**served, **gauge_labels}, "10")],
             quiet_at="4m"),
        # A queue above the threshold that drains does not page.
        case(rules, f"{prefix}QueueGrowing",
             [series(figure["queued_requests"], {**served, **gauge_labels},
                     "20-1x15")],
             "10m"),
        case(rules, "SparkModelFilesystemFilling",
             [series("spark_filesystem_avail_bytes", {**WORKER_NODE, "purpose": "model", "path": MODEL}, "5x10"),
              series("spark_filesystem_size_bytes", {**WORKER_NODE, "purpose": "model", "path": MODEL}, "100x10"),
              series("spark_filesystem_avail_bytes", {**WORKER_NODE, "purpose": "root", "path": "/"}, "50x10"),
              series("spark_filesystem_size_bytes", {**WORKER_NODE, "purpose": "root", "path": "/"}, "100x10")],
             "5m", fired=[({**WORKER_NODE, "purpose": "model", "path": MODEL}, "5")]),
        case(rules, "SparkRootFilesystemFilling",
             [series("spark_filesystem_avail_bytes", {**HEAD_NODE, "purpose": "root", "path": "/"}, "9x10"),
              series("spark_filesystem_size_bytes", {**HEAD_NODE, "purpose": "root", "path": "/"}, "100x10"),
              series("spark_filesystem_avail_bytes", {**HEAD_NODE, "purpose": "model", "path": MODEL}, "90x10"),
              series("spark_filesystem_size_bytes", {**HEAD_NODE, "purpose": "model", "path": MODEL}, "100x10")],
             "5m", fired=[({**HEAD_NODE, "purpose": "root", "path": "/"}, "9")]),
        case(rules, "SparkGpuTemperatureHigh",
             [series("spark_gpu_temperature_celsius", {**HEAD_NODE, "gpu": "0"}, "60 70 90 90 90 90"),
              series("spark_gpu_temperature_celsius", {**WORKER_NODE, "gpu": "0"}, "60x10")],
             "5m", fired=[({**HEAD_NODE, "gpu": "0"}, "90")], quiet_at="2m"),
        case(rules, "SparkNodeExporterMissing",
             [series("up", WORKER_NODE, "1 0 0 0 0 0"), series("up", HEAD_NODE, "1x10")],
             "5m", fired=[(WORKER_NODE, "0")], quiet_at="2m"),
        # The collector stopped writing (its timestamp frozen at 0 s) on the worker; nvidia-smi fails on the head.
        case(rules, "SparkNodeCollectorStale",
             [series("spark_collector_last_run_timestamp_seconds", WORKER_NODE, "0x10"),
              series("spark_gpu_query_success", HEAD_NODE, "1 1 0 0 0 0 0")],
             "6m", fired=[(WORKER_NODE, "360"), (HEAD_NODE, "0")]),
        # The supervisor gave up on a crash loop; a supervisor that keeps healing a flapping group.
        case(rules, "SparkSupervisorGaveUp", [series("spark_supervisor_gave_up", HEAD_NODE, "0 0 1 1 1")],
             "4m", fired=[(HEAD_NODE, "1")], quiet_at="1m"),
        case(rules, "SparkSupervisorFlapping", [series("spark_supervisor_flapping", HEAD_NODE, "0 0 1 1 1 0 0")],
             "4m", fired=[(HEAD_NODE, "1")], quiet_at="6m"),
        # The worker's RDMA port went down (its rail's link, or the driver): NCCL there serves over sockets.
        case(rules, "SparkFabricWithoutRdma",
             [series("spark_rdma_fabric_ports_usable", {**WORKER_NODE, "netdev": "enp1s0f1np1"}, "1 1 0 0 0 0 0 0"),
              series("spark_rdma_fabric_ports_usable", {**HEAD_NODE, "netdev": "enp1s0f1np1"}, "1x10")],
             "7m", fired=[({**WORKER_NODE, "netdev": "enp1s0f1np1"}, "0")], quiet_at="3m"),
    ]
    accept = figure["speculative_accept_length"]
    if accept is not None:
        # A drafter whose accept length falls below the floor pages; none running (0) and one that pays do not.
        cases += [
            case(rules, f"{prefix}SpeculativeNotPaying",
                 [series(accept, {**served, **gauge_labels}, "1.6 1.6 1.1 1.1 1.1 1.1 1.1")],
                 "6m", fired=[({**served, **gauge_labels}, "1.1")], quiet_at="3m"),
            case(rules, f"{prefix}SpeculativeNotPaying",
                 [series(accept, {**served, **gauge_labels}, "0x10")], "10m"),
            case(rules, f"{prefix}SpeculativeNotPaying",
                 [series(accept, {**served, **gauge_labels}, "1.6x10")], "10m"),
        ]
    return cases


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_alert_rule_fires_on_its_fault_and_not_otherwise(tmp_path, engine):
    rules = FILTER.monitoring_rules(ctx(tmp_path, **RULES_CTX, engine=flag_model(engine)))["groups"][0]["rules"]
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": rules}]}, sort_keys=False))
    cases = rule_cases(rules, engine)
    tested = {t["alertname"] for c in cases for t in c["alert_rule_test"] if t["exp_alerts"]}
    assert tested == {r["alert"] for r in rules}, "every rule needs a case where it fires"
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(
        {"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": cases}, sort_keys=False))
    result = promtool_run("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_a_wrong_expectation_fails_the_rule_test(tmp_path):
    """The harness above can fail: the endpoint alert expected one minute too early is a failure."""
    rules = FILTER.monitoring_rules(ctx(tmp_path, **RULES_CTX))["groups"][0]["rules"]
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": rules}]}, sort_keys=False))
    early = case(rules, "SglangEndpointDown", [series("up", HEAD_SGLANG, "1 1 0 0 0 0 0")], "3m",
                 fired=[(HEAD_SGLANG, "0")])
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(
        {"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": [early]}, sort_keys=False))
    assert promtool_run("test", "rules", "alerts_test.yml", cwd=tmp_path).returncode != 0


ROLE_PREFIXES = sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())
KNOWN_SETTINGS = {name for role in ROLE_PREFIXES for name in role_defaults(role)}


def test_every_rule_has_a_runbook_naming_a_playbook_or_setting_that_exists(tmp_path):
    rules = FILTER.monitoring_rules(ctx(tmp_path))["groups"][0]["rules"]
    # The site's engine (SGLang) serves the speculative accept length: its rule is one of them.
    assert len(rules) == len({r["alert"] for r in rules}) == 14
    for rule in rules:
        runbook = rule["annotations"]["runbook"]
        playbooks = re.findall(r"(?:playbooks/)?[a-z_]+\.yml", runbook)
        settings = re.findall(rf"\b(?:{'|'.join(ROLE_PREFIXES)})_[a-z_]+\b", runbook)
        assert playbooks or settings, rule["alert"]
        for setting in settings:
            assert setting in KNOWN_SETTINGS, f"{rule['alert']}: {setting} is no role's setting"
        for pb in playbooks:
            assert (REPO / pb).is_file(), f"{rule['alert']}: {pb} does not exist"
        assert rule["for"] and rule["labels"]["severity"] in ("critical", "warning")


# --- the configuration and the rules with the role's defaults ------------------------------------------


@pytest.mark.parametrize("variant", ["defaults", "tls-and-key", "monitor-outside-the-group", "no-key", "vllm", "gateway"])
def test_the_generated_configuration_passes_promtool(tmp_path, variant):
    changes = {
        "defaults": {},
        "tls-and-key": {"server_tls": True, "server_tls_ca": "/controller/ca.crt",
                        "alertmanagers": ["10.0.0.5:9093"], "allowed_clients": ["10.0.0.0/24"]},
        "monitor-outside-the-group": {"monitor": "mon-0"},
        "no-key": {"api_key_set": False},
        # vLLM's /metrics answers without the key, which the site has: the scrape neither sends nor needs it.
        "vllm": {"engine": flag_model("vllm")},
        # The model gateway on the worker: its metrics port, as group_vars/all/spark.yml wires it.
        "gateway": {"gateway": {"host": "spark-1", "address": "10.0.0.11", "port": 29000}},
    }[variant]
    c = ctx(tmp_path, **changes)
    (tmp_path / "spark_llm_api_key").write_text("k" * 48)
    (tmp_path / "spark-llm-ca.crt").write_text("")
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(FILTER.monitoring_rules(c), sort_keys=False, width=200))
    config = FILTER.monitoring_prometheus_config(c, HOSTVARS)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    assert promtool_run("check", "rules", str(tmp_path / "alerts.yml")).returncode == 0
    checked = promtool_run("check", "config", str(tmp_path / "prometheus.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    targets = {t: g["labels"] for j in jobs.values() for g in j["static_configs"] for t in g["targets"]}
    # Every node's exporter and the head's SGLang over the management network, from the inventory.
    assert targets["10.0.0.10:9100"] == {"node": "spark-0", "rank": "0", "role": "head"}
    assert targets["10.0.0.11:9100"] == {"node": "spark-1", "rank": "1", "role": "worker"}
    assert "10.0.0.10:30000" in jobs["server"]["static_configs"][0]["targets"]
    sglang = jobs["server"]
    if variant in ("no-key", "vllm"):
        assert "authorization" not in sglang
    else:
        # The key is read from its file at each scrape: the configuration holds only the file's name.
        assert sglang["authorization"] == {"type": "Bearer", "credentials_file": str(tmp_path / "spark_llm_api_key")}
    if variant == "tls-and-key":
        assert sglang["scheme"] == "https" and sglang["tls_config"]["ca_file"] == str(tmp_path / "spark-llm-ca.crt")
        assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["10.0.0.5:9093"]
    if variant == "monitor-outside-the-group":
        assert targets["127.0.0.1:9100"] == {"node": "mon-0", "role": "monitor"}
    if variant == "gateway":
        assert jobs["gateway"]["static_configs"] == [{"targets": ["10.0.0.11:29000"],
                                                      "labels": {"node": "spark-1", "role": "gateway"}}]
        assert "authorization" not in jobs["gateway"]
    else:
        assert "gateway" not in jobs


SITE = [{"name": "replica_a", "head": "spark-0", "workers": ["spark-1"], "nodes": ["spark-0", "spark-1"]},
        {"name": "replica_b", "head": "spark-2", "workers": ["spark-3"], "nodes": ["spark-2", "spark-3"]}]
SITE_HOSTVARS = {**HOSTVARS, "spark-2": {"ansible_host": "10.0.0.12"}, "spark-3": {"ansible_host": "10.0.0.13"}}


def test_one_prometheus_scrapes_every_group_of_the_site_each_under_its_name(tmp_path):
    """On a site of several TP groups the monitoring host (the first head) scrapes every node and every head, each
    labelled with its group (it scraped its own group alone); a site of one group keeps its labels as they were."""
    c = ctx(tmp_path, groups=SITE, group_engines={"replica_a": "sglang", "replica_b": "sglang"})
    (tmp_path / "spark_llm_api_key").write_text("k" * 48)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(FILTER.monitoring_rules(c), sort_keys=False, width=200))
    config = FILTER.monitoring_prometheus_config(c, SITE_HOSTVARS)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    checked = promtool_run("check", "config", str(tmp_path / "prometheus.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    nodes = {t: g["labels"] for g in jobs["node"]["static_configs"] for t in g["targets"]}
    assert nodes == {
        "10.0.0.10:9100": {"node": "spark-0", "rank": "0", "role": "head", "tp_group": "replica_a"},
        "10.0.0.11:9100": {"node": "spark-1", "rank": "1", "role": "worker", "tp_group": "replica_a"},
        "10.0.0.12:9100": {"node": "spark-2", "rank": "0", "role": "head", "tp_group": "replica_b"},
        "10.0.0.13:9100": {"node": "spark-3", "rank": "1", "role": "worker", "tp_group": "replica_b"}}
    heads = {t: g["labels"] for g in jobs["server"]["static_configs"] for t in g["targets"]}
    assert heads == {"10.0.0.10:30000": {"node": "spark-0", "rank": "0", "role": "head", "tp_group": "replica_a"},
                     "10.0.0.12:30000": {"node": "spark-2", "rank": "0", "role": "head", "tp_group": "replica_b"}}
    assert FILTER.monitoring_plan(c)["errors"] == []
    one = FILTER.monitoring_prometheus_config(ctx(tmp_path, groups=SITE[:1], group_engines={"replica_a": "sglang"}),
                                              SITE_HOSTVARS)
    assert {t: g["labels"] for j in one["scrape_configs"] if j["job_name"] == "node"
            for g in j["static_configs"] for t in g["targets"]} == {
        "10.0.0.10:9100": {"node": "spark-0", "rank": "0", "role": "head"},
        "10.0.0.11:9100": {"node": "spark-1", "rank": "1", "role": "worker"}}


def test_a_site_whose_groups_run_different_engines_is_refused_while_the_monitoring_is_on(tmp_path):
    mixed = {"replica_a": "sglang", "replica_b": "vllm"}
    errors = FILTER.monitoring_plan(ctx(tmp_path, groups=SITE, group_engines=mixed))["errors"]
    assert len(errors) == 1 and errors[0].startswith(
        "spark_monitoring = true on a site whose TP groups run different engines (sglang: replica_a; vllm: "
        "replica_b)") and "Fix: run one engine in every group (spark_engine), or set spark_monitoring: false." in \
        errors[0], errors
    assert FILTER.monitoring_plan(ctx(tmp_path, groups=SITE, group_engines=mixed, monitoring=False))["errors"] == []


def test_promtool_refuses_a_configuration_whose_key_file_is_missing(tmp_path):
    """What the template's validate relies on: the configuration is checked with the files it names."""
    c = ctx(tmp_path)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(FILTER.monitoring_rules(c), sort_keys=False))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(FILTER.monitoring_prometheus_config(c, HOSTVARS)))
    assert promtool_run("check", "config", str(tmp_path / "prometheus.yml")).returncode != 0


# --- refused before any change -------------------------------------------------------------------------


BAD = [
    ("retention", {"retention_time": "15 days"}, "monitoring_retention_time = '15 days': not a Prometheus duration"),
    ("retention-size", {"retention_size": "4 gigs"}, "monitoring_retention_size = '4 gigs': not a Prometheus size"),
    ("unbounded", {"retention_time": "", "retention_size": ""}, "retention must be bounded"),
    ("monitor-not-in-inventory", {"monitor_host_setting": "spark-9"},
     "spark_monitor_host = 'spark-9': not a host of the inventory"),
    ("two-monitors", {"monitor_candidates": ["mon-0", "spark-1"]}, "spark_monitor = mon-0, spark-1: one Prometheus"),
    ("threshold-not-a-number", {"ttft_p99_seconds": "slow"},
     "monitoring_ttft_p99_seconds = 'slow': not a number"),
    ("temperature-out-of-range", {"gpu_temperature_celsius": 400},
     "monitoring_gpu_temperature_celsius = 400: out of range"),
    # A step yields at least its own token: a floor of 1 or below could never fire.
    ("accept-length-floor", {"speculative_min_accept_length": 1},
     "monitoring_speculative_min_accept_length = 1: out of range"),
    ("alert-for-unknown", {"alert_for": {"endpoint_dwn": "1m"}}, "monitoring_alert_for['endpoint_dwn']: no such"),
    ("alert-for-bad", {"alert_for": {"endpoint_down": "1 minute"}},
     "monitoring_alert_for['endpoint_down'] = '1 minute': not a Prometheus duration"),
    ("interval", {"scrape_interval": "fast"}, "monitoring_scrape_interval = 'fast'"),
    ("port-clash", {"node_exporter_port": 30000}, "monitoring_node_exporter_port = 30000: server_port"),
    ("clients", {"allowed_clients": ["10.0.0.1/24"]}, "monitoring_allowed_clients = ['10.0.0.1/24']"),
    ("alertmanager", {"alertmanagers": ["am.example"]}, "monitoring_alertmanagers = ['am.example']"),
    ("journal", {"journal_max_use": "lots"}, "monitoring_journal_max_use = 'lots': not a journald size"),
    ("grafana-url", {"grafana_url": "grafana.example"}, "spark_grafana_url = 'grafana.example': not an http(s) URL"),
    ("grafana-token-missing", {"grafana_url": "http://grafana.example:3000"},
     "monitoring_grafana_token_file = "),
]


@pytest.mark.parametrize(("changes", "fragment"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_settings_are_refused_with_variable_value_why_and_fix(tmp_path, changes, fragment):
    errors = FILTER.monitoring_plan(ctx(tmp_path, **changes))["errors"]
    assert len(errors) >= 1, errors
    assert any(fragment in e and "Fix:" in e for e in errors), errors


def test_defaults_pass_and_nothing_is_checked_while_monitoring_is_off(tmp_path):
    assert FILTER.monitoring_plan(ctx(tmp_path)) == {"errors": [], "monitor": "spark-0"}
    assert FILTER.monitoring_plan(ctx(tmp_path, monitoring="false", retention_time="x"))["errors"] == []
    assert FILTER.monitoring_plan(ctx(tmp_path, monitoring="maybe"))["errors"][0].startswith(
        "spark_monitoring = 'maybe'")


def test_a_grafana_token_readable_by_others_is_refused(tmp_path):
    token = tmp_path / "grafana_token"
    token.write_text("glsa_x")
    token.chmod(0o644)
    errors = FILTER.monitoring_plan(ctx(tmp_path, grafana_url="https://grafana.example"))["errors"]
    assert errors == [f"monitoring_grafana_token_file = '{token}': mode 0644 lets other users read the token. "
                      f"Fix: chmod 600 {token}."]
    token.chmod(0o600)
    assert FILTER.monitoring_plan(ctx(tmp_path, grafana_url="https://grafana.example"))["errors"] == []


# --- the reports directory -----------------------------------------------------------------------------


def test_reports_keep_the_last_runs_of_each_kind_and_nothing_else():
    names = [f"verify-2026010{d}T000000Z.json" for d in range(1, 6)]
    names += ["benchmark-20260101T000000Z.json", "benchmark-20260101T000000Z.md", "benchmark-20260101T000000Z.png",
              "benchmark-20260102T000000Z.json", "benchmark-20260103T000000Z.json",
              "doctor-20260101T000000Z.tar.gz", "tune-record.json", "tune-20260101T000000Z.json", "notes.txt"]
    doomed = REPORTS.runs_beyond([f"/r/{n}" for n in names], ["verify", "doctor", "benchmark"], 2)
    assert doomed == sorted([
        "/r/verify-20260101T000000Z.json", "/r/verify-20260102T000000Z.json", "/r/verify-20260103T000000Z.json",
        # A run is all its files.
        "/r/benchmark-20260101T000000Z.json", "/r/benchmark-20260101T000000Z.md", "/r/benchmark-20260101T000000Z.png",
    ])


def test_uninstall_stops_again_only_what_was_there_and_stopped_before_the_role():
    record = ["prometheus-node-exporter.service disabled inactive", "prometheus.service enabled active",
              "grafana.service absent inactive", "prometheus-pushgateway.service enabled failed", "garbled"]
    assert FILTER.monitoring_stopped_before(record) == [
        {"unit": "prometheus-node-exporter.service", "enabled": False},
        {"unit": "prometheus-pushgateway.service", "enabled": True}]
    assert FILTER.monitoring_stopped_before([]) == []

"""Metrics, alerts and logs of the TP group (issue 18) on one simulated pair, with real Prometheus and node exporter.

The pair is deployed as a site is (server.yml: the ranks and the firewall, then playbooks/monitoring.yml) with the
monitoring host on the worker (spark_monitor_host), short scrape, evaluation and alert windows, and the head's
SGLang built as before /metrics was exempt from the API key (the stand-in's metrics_behind_key knob), so that the
scrape only succeeds with the key Prometheus reads from its 0600 file. Check mode first shows the files it would
write and writes none; then Prometheus's API shows every target up over the management network; a query for the
generation throughput returns a number after a few requests; the GPU collector's figures (a GB10's memory [N/A])
and every metric a dashboard panel uses are there; the dashboard went to Grafana's HTTP API (a stand-in on this machine)
with the token from its 0600 file; the firewall drops the exporter for all but the monitoring host; a second run
changes nothing and posts nothing; stopping the worker's rank fires its alert through Prometheus's alerts API (polled
for, never timed). Then the pair becomes a vLLM group (server.yml, monitoring.yml again): the rules speak vLLM's names,
the scrape carries no key, and a stopped rank fires vLLM's alerts. Bad input is refused before any node is contacted,
through render.yml and site.yml.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.harness import cluster as sim
from tests.lib.playbook import REPO, SITE_CHECK, run_playbook
from tests.lib.prometheus_tools import prometheus_api
from tests.lib.reach import DROPPED, at_once, connect
from tests.lib.supervised import REVISION, api_key_header, checkpoint_files, generate, wait_for
from tests.standins.grafana_api import GrafanaAPI

pytestmark = pytest.mark.slow

MONITORING = "playbooks/monitoring.yml"
ALERT_KEYS = ("endpoint_down", "rank_unit_inactive", "group_not_serving", "ttft_high", "queue_growing",
              "filesystem_filling", "gpu_temperature", "node_exporter_missing", "node_collector_stale",
              "fabric_without_rdma", "supervisor_gave_up", "supervisor_flapping")
CONFIG_DIR = "/etc/prometheus/spark"
NO_CONTACT = {"ANSIBLE_CONNECTION_PLUGINS": str(REPO / "tests" / "lib" / "connection_plugins")}
DASHBOARD = REPO / "roles" / "monitoring" / "files" / "dashboard.json"
# Kept by the report pruning (monitoring_reports_keep: 2 runs of each kind).
REPORTS = ["verify-20260101T000000Z.json", "verify-20260102T000000Z.json", "verify-20260103T000000Z.json",
           "benchmark-20260101T000000Z.json", "benchmark-20260101T000000Z.md", "tune-record.json"]


def sh(node, command: str, check: bool = True, timeout: float = 60) -> str:
    return sim.ssh(node, command, check=check, timeout=timeout)


# The fabric proof's record on the head, as fabric.yml writes it after measuring both rails and the group.
FABRIC_RECORD = "/var/lib/spark-llm-fabric/proof.json"
RECORD = {"kind": "spark-llm-fabric-proof", "members": ["spark-0", "spark-1"], "rails": [sim.FABRIC_IFACE, sim.RAIL2_IFACE],
          "rdma_write": {"time": "2026-12-04T12:00:00Z", "pairs": [
              {"rail": rail, "head_hca": hca, "worker": "spark-1", "worker_hca": hca, "gbits_per_second": 97.5}
              for rail, hca in ((sim.FABRIC_IFACE, sim.ROCE_HCA), (sim.RAIL2_IFACE, sim.RAIL2_HCA))]},
          "all_reduce": {"time": "2026-12-04T12:00:05Z", "bytes": "1G", "network": "IB", "busbw_gbytes_per_second": 23.19,
                         "devices": {}}}
GRAFANA_TOKEN = "glsa_monitoring_test_token_0123456789abcdef"  # noqa: S105 - a test token


def settings(cluster, reports: Path, grafana: str = "", token_file: str = "") -> dict:
    return {
        "checkpoint_revision": REVISION,
        "spark_monitoring": True,
        "spark_monitor_host": cluster.nodes[1].name,
        "monitoring_scrape_interval": "2s",
        "monitoring_evaluation_interval": "2s",
        # The node collector keeps the role's default interval (15 s): every run of it costs each node a Python
        # start and two nvidia-smi queries, and no test waits on a second run of it - the timer's first run, a
        # second after the deployment starts it, already finds the ranks holding their GPU.
        "monitoring_stall_window": "20s",
        "monitoring_alert_for": dict.fromkeys(ALERT_KEYS, "4s"),
        # The controller queries Prometheus; nobody else may.
        "monitoring_allowed_clients": [f"{cluster.bridge_ip}/32"],
        "monitoring_reports_dir": str(reports),
        "monitoring_reports_keep": 2,
        "spark_grafana_url": grafana,
        "monitoring_grafana_token_file": token_file,
    }


def prometheus(cluster, path: str, **params) -> dict:
    """Prometheus's HTTP API on the monitoring host (the worker), as an allowed client asks it."""
    return prometheus_api(cluster.nodes[1].mgmt_ip, path, **params)


def value(cluster, expr: str) -> list[tuple[dict, float]]:
    return [(r["metric"], float(r["value"][1])) for r in prometheus(cluster, "query", query=expr)["result"]]


def changed(result) -> set[tuple[str, str]]:
    return {(d["host"], d["task"]) for d in result.changed}


@pytest.fixture(scope="module")
def site(sim_cluster, tmp_path_factory):
    head, worker = sim_cluster.nodes
    # The head's SGLang wants the key on /metrics too, as builds from before the exemption do.
    sim.set_knobs(sim_cluster.instance, head.name, {"sglang": {"metrics_behind_key": True, "token_seconds": 0.01}})
    rail2 = sim_cluster.rail2_subnet.rsplit(".", 1)[0]
    for n in sim_cluster.nodes:
        # What checkpoint.yml and fabric.yml leave behind, in their smallest form (as tests/integration/test_day2.py):
        # both rails' addresses, and on the head the proof's record of its last figures.
        sh(n, checkpoint_files() + f" && (ip -o addr show dev {sim.FABRIC_IFACE} | grep -q ' {n.fabric_ip}/' || "
              f"ip addr add {n.fabric_ip}/24 dev {sim.FABRIC_IFACE})"
              f" && (ip -o addr show dev {sim.RAIL2_IFACE} | grep -q ' {rail2}.{10 + n.rank}/' || "
              f"ip addr add {rail2}.{10 + n.rank}/24 dev {sim.RAIL2_IFACE})")
    sh(head, f"mkdir -p {FABRIC_RECORD.rsplit('/', 1)[0]} && echo {shlex.quote(json.dumps(RECORD))} > {FABRIC_RECORD}")
    reports = tmp_path_factory.mktemp("reports")
    for name in REPORTS:
        (reports / name).write_text("{}")
    # Grafana's HTTP API as the controller reaches it, with its token in a 0600 file.
    grafana = GrafanaAPI(GRAFANA_TOKEN)
    token_file = tmp_path_factory.mktemp("grafana") / "grafana_token"
    token_file.write_text(GRAFANA_TOKEN + "\n")
    token_file.chmod(0o600)
    extravars = settings(sim_cluster, reports, grafana.url, str(token_file))
    server = run_playbook("playbooks/server.yml", sim_cluster.inventory, extravars=extravars)
    assert server.rc == 0, server.failure_messages() or server.stdout[-4000:]
    preview = run_playbook(MONITORING, sim_cluster.inventory, extravars=extravars, check=True, diff=True)
    assert preview.rc == 0, preview.failure_messages() or preview.stdout[-4000:]
    written_by_preview = sh(worker, " ; ".join(f"test -e {path} && echo written {path}" for path in (
        CONFIG_DIR, "/etc/systemd/journald.conf.d/60-spark-llm-monitoring.conf",
        "/etc/systemd/system/prometheus.service.d/spark-llm-monitoring.conf",
        "/usr/local/lib/spark-llm-monitoring")) + " ; true")
    reports_after_preview = sorted(p.name for p in reports.iterdir())
    posts_after_preview = len(grafana.posts())
    deploy = run_playbook(MONITORING, sim_cluster.inventory, extravars=extravars)
    assert deploy.rc == 0, deploy.failure_messages() or deploy.stdout[-4000:]
    sim_cluster.runs = {"preview": preview, "deploy": deploy, "extravars": extravars, "reports": reports,
                        "written_by_preview": written_by_preview, "reports_after_preview": reports_after_preview,
                        "posts_after_preview": posts_after_preview}
    sim_cluster.grafana = grafana
    yield sim_cluster
    grafana.close()


def test_check_mode_shows_the_files_it_would_write_and_writes_none(site):
    preview = site.runs["preview"]
    head, worker = (n.name for n in site.nodes)
    shown = changed(preview)
    for host, task in [
        (worker, "Install the alert rules"),
        (worker, "Install Prometheus's configuration (the targets from the inventory)"),
        (worker, "Give Prometheus its flags (configuration, retention, listen address)"),
        (head, "Configure the node exporter (listen address, textfile and systemd collectors)"),
        (head, "Install the node collector"),
        (worker, "Keep the journal on disk, capped"),
    ]:
        assert (host, task) in shown, sorted(shown)
    # --diff shows the content: the targets from the inventory, the rules with their runbooks.
    assert f"{site.nodes[0].mgmt_ip}:9100" in preview.stdout and "SparkRankUnitNotActive" in preview.stdout
    assert "runbook:" in preview.stdout
    # Nothing was written on the nodes, nor pruned on the controller.
    assert site.runs["written_by_preview"].strip() == "", site.runs["written_by_preview"]
    assert site.runs["reports_after_preview"] == sorted(REPORTS)
    assert site.runs["posts_after_preview"] == 0, "check mode posted a dashboard to Grafana"
    assert "prometheus.yml" in sh(site.nodes[1], f"ls {CONFIG_DIR}")


def test_prometheus_scrapes_every_target_over_the_management_network(site):
    head, worker = site.nodes

    def targets_up():
        active = prometheus(site, "targets", state="active")["activeTargets"]
        return active if len(active) == 4 and all(t["health"] == "up" for t in active) else None

    active = wait_for(targets_up, "every target up in Prometheus", 120)
    urls = sorted(t["scrapeUrl"] for t in active)
    assert urls == sorted([f"http://{head.mgmt_ip}:9100/metrics", f"http://{worker.mgmt_ip}:9100/metrics",
                           f"http://{head.mgmt_ip}:30000/metrics", "http://127.0.0.1:9090/metrics"])
    by_job = {(t["labels"]["job"], t["labels"].get("node")): t["labels"] for t in active}
    assert by_job[("node", head.name)]["rank"] == "0" and by_job[("node", worker.name)]["rank"] == "1"
    # The head's SGLang wants the key on /metrics (metrics_behind_key): the target is up only with it. Prometheus
    # reads it from its 0600 file; it is in no configuration, unit or command line.
    key = api_key_header(site)["Authorization"].split(" ", 1)[1]
    assert sh(worker, f"stat -c '%a %U' {CONFIG_DIR}/spark_llm_api_key").strip() == "600 prometheus"
    config = sh(worker, f"cat {CONFIG_DIR}/prometheus.yml")
    assert f"credentials_file: {CONFIG_DIR}/spark_llm_api_key" in config and key not in config
    assert key not in sh(worker, "ps -eo args; systemctl cat prometheus.service")
    # Retention bounded by the role's defaults; Prometheus answers only the allowed client.
    flags = sh(worker, "ps -o args= -C prometheus")
    assert "--storage.tsdb.retention.time=15d" in flags and "--storage.tsdb.retention.size=4GB" in flags, flags
    assert "--web.listen-address=0.0.0.0:9090" in flags


def test_a_query_for_the_generation_throughput_returns_a_number_after_a_few_requests(site):
    for _ in range(3):
        assert generate(site, timeout=30)

    def throughput():
        found = value(site, 'sum(rate(sglang:generation_tokens_total{job="server"}[1m]))')
        return found if found and found[0][1] > 0 else None

    (labels, tokens_per_second), = wait_for(throughput, "a generation throughput above 0", 60)
    assert labels == {} and tokens_per_second > 0
    # The histograms moved with the requests (once a scrape after the last one came); the model is labelled as
    # SGLang labels it.
    (labels, count), = wait_for(lambda: [r for r in value(site, 'sglang:time_to_first_token_seconds_count{job="server"}')
                                         if r[1] >= 3], "three first tokens counted", 60)
    assert labels["model_name"] == "/models/glm53"


def test_gpu_and_node_figures_and_every_dashboard_metric_are_in_prometheus(site):
    head, worker = site.nodes
    wait_for(lambda: len(value(site, "spark_rank_process_present == 1")) == 2, "both ranks seen holding their GPU", 60)
    temperatures = {m["node"]: v for m, v in value(site, "spark_gpu_temperature_celsius")}
    assert temperatures == {head.name: 41.0, worker.name: 41.0}
    # A GB10 reports no memory of its own: not a 0, a field it does not support.
    unsupported = {m["node"] for m, v in value(site, 'spark_gpu_field_supported{field="memory.used"}') if v == 0}
    assert unsupported == {head.name, worker.name}
    assert value(site, "spark_gpu_memory_used_bytes") == []
    units = {m["node"]: v for m, v in value(site, 'node_systemd_unit_state{name="spark-llm.service",state="active"}')}
    assert units == {head.name: 1.0, worker.name: 1.0}
    assert {m["purpose"] for m, _ in value(site, f'spark_filesystem_size_bytes{{node="{head.name}"}}')} == {"model", "root"}
    # The RoCE device behind each rail's port (the stand-in's), ACTIVE with the RoCE v2 GID of its address.
    usable = {(m["node"], m["netdev"]): v for m, v in value(site, "spark_rdma_fabric_ports_usable")}
    assert usable == {(n.name, iface): 1.0 for n in site.nodes for iface in (sim.FABRIC_IFACE, sim.RAIL2_IFACE)}, usable
    # The fabric proof's last figures, from the head's record.
    busbw = {(m["node"], m["network"]): v for m, v in value(site, "spark_fabric_all_reduce_busbw_gbytes_per_second")}
    assert busbw == {(head.name, "IB"): 23.19}, busbw
    rails = {m["rail"]: v for m, v in value(site, "spark_fabric_rdma_write_gbits_per_second")}
    assert rails == {sim.FABRIC_IFACE: 97.5, sim.RAIL2_IFACE: 97.5}, rails
    # Every metric a dashboard panel uses is a name Prometheus holds (the supervisor is off here, and no alert fired yet).
    names = set(prometheus(site, "label/__name__/values"))
    used = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            used |= set(re.findall(r"\b(?:sglang:|spark_|node_)[A-Za-z0-9_]+", target["expr"]))
    missing = {n for n in used - names if not n.startswith("spark_supervisor_")}
    assert missing == set(), missing


def test_the_exporter_admits_the_monitoring_host_only(site):
    head, worker = site.nodes
    # The monitoring host (the worker) scrapes the head's exporter (its target is up); this machine is dropped.
    assert at_once(lambda: connect(head.mgmt_ip, 9100), lambda: connect(worker.mgmt_ip, 9100)) == [DROPPED, DROPPED]
    assert ":9100" in sh(head, "ss -Hltn 'sport = :9100'"), "the exporter listens: the drop is the firewall's"
    rules = sh(head, "cat /etc/nftables.d/spark_llm_guard.nft")
    assert f"The node exporter port 9100: {worker.mgmt_ip}/32 (and loopback)" in rules
    assert "The Prometheus port 9090: " in rules


def test_logs_the_journal_persists_capped_and_the_reports_keep_the_last_runs(site):
    for n in site.nodes:
        machine = sh(n, "cat /etc/machine-id").strip()
        assert sh(n, f"test -d /var/log/journal/{machine} && echo persistent").strip() == "persistent"
        assert "SystemMaxUse=4G" in sh(n, "systemd-analyze cat-config systemd/journald.conf")
    kept = sorted(p.name for p in site.runs["reports"].iterdir())
    assert kept == ["benchmark-20260101T000000Z.json", "benchmark-20260101T000000Z.md", "tune-record.json",
                    "verify-20260102T000000Z.json", "verify-20260103T000000Z.json"]


def test_the_dashboard_went_to_grafanas_api_with_the_token_from_its_file(site):
    (post,) = site.grafana.posts()
    assert post["path"] == "/api/dashboards/db"
    stored = site.grafana.dashboards["spark-sglang-glm53"]["dashboard"]
    fabric = next(v for v in stored["templating"]["list"] if v["name"] == "fabric_interface")
    assert fabric["query"] == sim.FABRIC_IFACE
    assert GRAFANA_TOKEN not in site.runs["deploy"].stdout + site.runs["preview"].stdout


def test_a_second_run_changes_nothing(site):
    # More runs than the kept number (2) since: the run prunes the oldest, and that housekeeping on the
    # controller is no change of a node - a drift check can trust changed=0 (issue 23).
    reports = site.runs["reports"]
    for name in ("verify-20260104T000000Z.json", "verify-20260105T000000Z.json", "doctor-20260101T000000Z.tar.gz",
                 "doctor-20260102T000000Z.tar.gz", "doctor-20260103T000000Z.tar.gz"):
        (reports / name).write_text("{}")
    again = run_playbook(MONITORING, site.inventory, extravars=site.runs["extravars"])
    assert again.rc == 0, again.failure_messages() or again.stdout[-3000:]
    assert changed(again) == set(), sorted(changed(again))
    recap = again.stdout[again.stdout.rindex("PLAY RECAP"):]
    assert not re.search(r"\bchanged=[1-9]", recap), recap
    assert sorted(p.name for p in reports.iterdir()) == [
        "benchmark-20260101T000000Z.json", "benchmark-20260101T000000Z.md",
        "doctor-20260102T000000Z.tar.gz", "doctor-20260103T000000Z.tar.gz", "tune-record.json",
        "verify-20260104T000000Z.json", "verify-20260105T000000Z.json"]
    # Grafana already holds this dashboard: it is read, not posted again.
    assert len(site.grafana.posts()) == 1


def test_stopping_a_rank_fires_its_alert(site):
    head, worker = site.nodes
    sh(worker, "systemctl stop spark-llm.service")

    def firing():
        alerts = prometheus(site, "alerts")["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "SparkRankUnitNotActive"
                and a["labels"].get("node") == worker.name and a["state"] == "firing"]

    (alert,) = wait_for(firing, "SparkRankUnitNotActive firing for the worker", 120)
    assert alert["labels"]["rank"] == "1" and alert["labels"]["severity"] == "critical"
    assert "playbooks/restart.yml" in alert["annotations"]["runbook"]
    assert alert["annotations"]["summary"] == f"Rank 1's spark-llm.service is not active on {worker.name}"


# --- the same pair as a vLLM group ----------------------------------------------------------------------------

# An image of the site's own that carries vLLM's recipe fix for GB10: the registry serves it to both nodes.
VLLM_IMAGE = "spark/vllm-glm53:sm121"


def test_a_vllm_group_is_scraped_under_vllms_names_and_a_stopped_rank_fires_its_alerts(site):
    """The pair switched to vLLM (server.yml) and its monitoring run again: the rules and the scrape follow the
    group's engine, the generation counter moves under vLLM's name, and stopping the head's rank fires the
    rank's alert and vLLM's endpoint alert. vLLM's /metrics answers without the key, so the scrape sends none and
    the monitoring host no longer holds it."""
    head, worker = site.nodes
    for n in site.nodes:
        sim.set_knobs(site.instance, n.name, {"docker": {"registry": {VLLM_IMAGE: {"vllm": {"sparse_mla_sm121": True}}}},
                                              "vllm": {"load_seconds": 0.2, "token_seconds": 0.01}})
    vllm = {**site.runs["extravars"], "spark_engine": "vllm", "server_image": VLLM_IMAGE}
    server = run_playbook("playbooks/server.yml", site.inventory, extravars=vllm)
    assert server.rc == 0, server.failure_messages() or server.stdout[-4000:]
    deploy = run_playbook(MONITORING, site.inventory, extravars=vllm)
    assert deploy.rc == 0, deploy.failure_messages() or deploy.stdout[-4000:]

    rules = [r for g in prometheus(site, "rules")["groups"] for r in g["rules"]]
    names = {r["name"] for r in rules}
    assert {"VllmEndpointDown", "VllmGroupNotServing", "VllmTimeToFirstTokenHigh", "VllmQueueGrowing"} <= names
    assert not [n for n in names if n.startswith("Sglang")], names
    queries = "\n".join(r["query"] for r in rules)
    assert "vllm:num_requests_running" in queries and "vllm:num_requests_waiting" in queries
    assert "sglang:" not in queries
    config = sh(worker, f"cat {CONFIG_DIR}/prometheus.yml")
    assert "credentials_file" not in config, config
    assert sh(worker, f"ls {CONFIG_DIR}").split() == ["alerts.yml", "prometheus.yml"]

    for _ in range(2):
        assert generate(site, timeout=30)
    wait_for(lambda: [r for r in value(site, 'sum(vllm:generation_tokens_total{job="server"})') if r[1] > 0],
             "vLLM's generation tokens counted in Prometheus", 60)
    (up,) = value(site, 'up{job="server"}')
    assert up[1] == 1.0

    sh(head, "systemctl stop spark-llm.service")

    def firing():
        alerts = [a for a in prometheus(site, "alerts")["alerts"] if a["state"] == "firing"]
        found = {a["labels"]["alertname"]: a for a in alerts
                 if a["labels"]["alertname"] == "VllmEndpointDown"
                 or (a["labels"]["alertname"] == "SparkRankUnitNotActive" and a["labels"].get("node") == head.name)}
        return found if len(found) == 2 else None

    found = wait_for(firing, "VllmEndpointDown and the head's SparkRankUnitNotActive firing", 120)
    assert found["VllmEndpointDown"]["annotations"]["summary"] == f"vLLM's endpoint on {head.name} does not answer"
    assert found["SparkRankUnitNotActive"]["labels"]["rank"] == "0"


# --- refused before any node is contacted -------------------------------------------------------------------

BAD = {"monitoring_retention_time": "15 days", "spark_monitor_host": "spark-9",
       "monitoring_ttft_p99_seconds": "slow", "spark_monitoring": True}


@pytest.mark.parametrize("playbook", ["playbooks/render.yml", "site.yml"])
def test_bad_input_is_refused_before_any_contact(tmp_path, playbook):
    def host(address, fabric):
        return {"ansible_host": address, "spark_fabric_ip": fabric, "ansible_connection": "no_contact"}

    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"spark": {"children": {
        "spark_head": {"hosts": {"spark-0": host("10.0.0.10", "192.168.100.10")}},
        "spark_workers": {"hosts": {"spark-1": host("10.0.0.11", "192.168.100.11")}}}}}))
    out = tmp_path / "rendered"
    result = run_playbook(playbook, inv, envvars=NO_CONTACT, extravars={"server_render_dir": str(out), **BAD})
    assert result.rc != 0, result.stdout[-3000:]
    assert {d["task"] for d in result.failed} == {SITE_CHECK}, result.stdout[-3000:]
    assert result.changed == []
    assert "no_contact" not in result.stdout, "a node was contacted before the refusal"
    message = result.failure_messages()
    for fragment in ("monitoring_retention_time = '15 days': not a Prometheus duration",
                     "spark_monitor_host = 'spark-9': not a host of the inventory",
                     "monitoring_ttft_p99_seconds = 'slow': not a number"):
        assert fragment in message, message
    assert message.count("Fix:") >= 3
    assert not out.exists()

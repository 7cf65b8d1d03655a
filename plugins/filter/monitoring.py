"""The monitoring of the TP group, planned on the controller: checks, Prometheus's configuration, the alert rules.

One computation serves the inventory check (before any node is contacted) and the deployment:
``monitoring_plan`` refuses what does not parse, each message naming the variable, the value,
why and the fix; ``monitoring_prometheus_config`` and ``monitoring_rules`` build what the
templates print (and what promtool checks before it is installed). Plain Python: the unit tests call these
functions directly.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from collections.abc import Mapping

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import inputs
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_reads import drift_of_paths_and_units

# Prometheus's duration (model.ParseDuration): units from years to milliseconds, largest first.
DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
DURATION_SECONDS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
# Prometheus's --storage.tsdb.retention.size (base-2 units).
SIZE = re.compile(r"^(\d+)(B|KB|MB|GB|TB|PB|EB)$")
# journald's sizes (SystemMaxUse=, SystemKeepFree=): bytes or a base-1024 suffix.
JOURNAL_SIZE = re.compile(r"^(\d+)([KMGTPE]?)$")
HOST_PORT = re.compile(r"^[A-Za-z0-9_.:\[\]-]+:(\d{1,5})$")

# Every alert the rules hold, by its key in monitoring_alert_for.
ALERT_FOR_KEYS = (
    "endpoint_down", "rank_unit_inactive", "group_not_serving", "ttft_high", "queue_growing",
    "filesystem_filling", "gpu_temperature", "node_exporter_missing", "node_collector_stale", "fabric_without_rdma",
    "supervisor_gave_up", "supervisor_flapping", "speculative_not_paying",
)
# A figure of the engine's /metrics in the rules and the shipped dashboard: `engine:<figure>` (a histogram's with
# _bucket, _count or _sum), translated into the group's engine's name by its flag model's monitoring.metrics.
ENGINE_FIGURE = re.compile(r"\bengine:([a-z0-9_]+)")
HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")
# The supervisor's states (roles/supervisor/files/spark_llm_supervisor.py, STATES), as the node
# collector exports them.
SUPERVISOR_STATES = ("healthy", "probing-failed", "restarting", "waiting-for-node", "stopped", "paused", "gave-up")


def duration_seconds(text):
    """Seconds of a Prometheus duration ('15d', '1h30m', '500ms'), or None when it does not parse."""
    if not isinstance(text, str) or not text:
        return None
    match = DURATION.match(text.strip())
    if not match or not any(match.groups()):
        return None
    return sum(int(g) * unit for g, unit in zip(match.groups(), DURATION_SECONDS, strict=True) if g)


def _flag(value):
    """A YAML boolean, or one given as text on the command line (-e spark_monitoring=false); None otherwise."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}.get(text)


def _networks(value):
    """(networks, problem) for a list of CIDRs or addresses."""
    if value is None:
        return [], None
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        return None, "must be a list of networks (CIDR) or addresses"
    nets = []
    for item in value:
        try:
            nets.append(ipaddress.ip_network(str(item).strip(), strict=True))
        except ValueError as err:
            return None, f"{inputs.shown(item)} is not a network ({err})"
    return nets, None


def _address(text):
    try:
        return ipaddress.ip_address(str(text).strip())
    except ValueError:
        return None


def _host_port(host, port):
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


# --- the checks --------------------------------------------------------------------------------------


def monitoring_plan(ctx):
    """Check the monitoring settings of one host; {errors, monitor}. Nothing is checked when monitoring is off."""
    errors = []
    monitoring = _flag(ctx.get("monitoring"))
    if monitoring is None:
        errors.append(f"spark_monitoring = {inputs.shown(ctx.get('monitoring'))}: must be true or false. Fix: a YAML "
                      "boolean.")
        return {"errors": errors, "monitor": ""}
    monitor = ctx.get("monitor") or ""
    if not monitoring:
        return {"errors": errors, "monitor": monitor}

    inventory = set(ctx.get("inventory_hosts") or [])
    setting = ctx.get("monitor_host_setting") or ""
    candidates = list(ctx.get("monitor_candidates") or [])
    group = ctx.get("monitor_group") or "spark_monitor"
    if setting:
        if not isinstance(setting, str) or setting not in inventory:
            errors.append(
                f"spark_monitor_host = {inputs.shown(setting)}: not a host of the inventory, so nothing can install "
                f"Prometheus there or reach it. Fix: add it to the inventory (e.g. in the group {group}), or set "
                f"spark_monitor_host to one of {', '.join(sorted(inventory)) or 'its hosts'}, or leave it empty for "
                "the head.")
    elif len(candidates) > 1:
        errors.append(
            f"{group} = {', '.join(candidates)}: one Prometheus watches the group, so the group holds one monitoring "
            f"host. Fix: keep one host in {group} (or set spark_monitor_host to it).")
    mixed = _mixed_engines(ctx)
    if mixed:
        # One Prometheus reads one engine's metric names and rules; a group of the other engine would be scraped
        # under names its engine does not export, its alerts silent.
        errors.append(
            "spark_monitoring = true on a site whose TP groups run different engines ("
            + "; ".join(f"{engine}: {', '.join(names)}" for engine, names in sorted(mixed.items()))
            + "): the monitoring watches the site with one engine's metrics and alerts, and would miss the others'. "
            "Fix: run one engine in every group (spark_engine), or set spark_monitoring: false.")

    for var, key in (("monitoring_scrape_interval", "scrape_interval"),
                     ("monitoring_evaluation_interval", "evaluation_interval"),
                     ("monitoring_stall_window", "stall_window")):
        value = ctx.get(key)
        seconds = duration_seconds(value)
        if seconds is None or seconds <= 0:
            errors.append(f"{var} = {inputs.shown(value)}: not a Prometheus duration. Fix: a positive duration such as "
                          "'15s', '1m' or '1h30m' (units ms, s, m, h, d, w, y, largest first).")
    retention = ctx.get("retention_time")
    size = ctx.get("retention_size")
    retention_seconds = duration_seconds(retention) if retention not in (None, "") else 0
    if retention_seconds is None:
        errors.append(f"monitoring_retention_time = {inputs.shown(retention)}: not a Prometheus duration, so "
                      "Prometheus would refuse to start. Fix: e.g. '15d', '720h' or '2w'.")
    size_ok = size in (None, "") or (isinstance(size, str) and SIZE.match(size.strip()))
    if not size_ok:
        errors.append(f"monitoring_retention_size = {inputs.shown(size)}: not a Prometheus size, so Prometheus would "
                      "refuse to start. Fix: a whole number with B, KB, MB, GB, TB, PB or EB, e.g. '4GB'.")
    if retention_seconds == 0 and size in (None, "") and size_ok:
        errors.append("monitoring_retention_time = '' and monitoring_retention_size = '': retention "
                      "must be bounded, or Prometheus keeps its default 15 days whatever the disk holds. Fix: set "
                      "either, e.g. monitoring_retention_time: 15d.")

    thresholds = (
        ("monitoring_ttft_p99_seconds", "ttft_p99_seconds", 0, None, "seconds, e.g. 30"),
        ("monitoring_queue_threshold", "queue_threshold", 0, None, "a number of requests, e.g. 4"),
        ("monitoring_filesystem_free_percent", "filesystem_free_percent", 0, 100, "a percentage, e.g. 10"),
        ("monitoring_gpu_temperature_celsius", "gpu_temperature_celsius", 0, 150, "degrees Celsius, e.g. 85"),
        ("monitoring_speculative_min_accept_length", "speculative_min_accept_length", 1, None,
         "tokens a drafting step yields, e.g. 1.3"),
    )
    for var, key, low, high, example in thresholds:
        value = ctx.get(key)
        number = inputs.decimal(value)
        if number is None:
            errors.append(f"{var} = {inputs.shown(value)}: not a number, so the alert rule could not compare with it. Fix: "
                          f"{example}.")
        elif number < low or (high is not None and number > high) or (key != "queue_threshold" and number == low):
            bound = f"between {low} and {high}" if high is not None else f"above {low}"
            errors.append(f"{var} = {inputs.shown(value)}: out of range. Fix: {example} ({bound}).")

    alert_for = ctx.get("alert_for")
    if not isinstance(alert_for, Mapping):
        errors.append(f"monitoring_alert_for = {inputs.shown(alert_for)}: must map each alert to a duration. Fix: "
                      f"keys {', '.join(ALERT_FOR_KEYS)}, values such as '5m'.")
    else:
        for key, value in alert_for.items():
            if key not in ALERT_FOR_KEYS:
                errors.append(f"monitoring_alert_for[{key!r}]: no such alert. Fix: one of "
                              f"{', '.join(ALERT_FOR_KEYS)}.")
            elif duration_seconds(value) is None:
                errors.append(f"monitoring_alert_for[{key!r}] = {inputs.shown(value)}: not a Prometheus duration. "
                              "Fix: e.g. '0s', '30s' or '5m'.")

    ports = {}
    for var, key in (("monitoring_prometheus_port", "prometheus_port"),
                     ("monitoring_node_exporter_port", "node_exporter_port")):
        port = inputs.port(ctx.get(key))
        if port is None:
            errors.append(f"{var} = {inputs.shown(ctx.get(key))}: not a TCP port. Fix: a whole number between 1 and 65535.")
        else:
            ports[var] = port
    taken = {"server_port": inputs.port(ctx.get("server_port")), "ansible_port": inputs.port(ctx.get("ssh_port") or 22)}
    for var, port in ports.items():
        for other, used in [*taken.items(), *((v, p) for v, p in ports.items() if v < var)]:
            if used == port:
                errors.append(f"{var} = {port}: {other} uses that port too, and only one program can listen on it. "
                              f"Fix: choose another {var}.")
    for var, key, low, high in (("monitoring_collector_interval", "collector_interval", 1, 3600),
                                ("monitoring_reports_keep", "reports_keep", 1, 100000)):
        value = ctx.get(key)
        text = str(value).strip()
        if isinstance(value, bool) or not text.isdigit() or not low <= int(text) <= high:
            errors.append(f"{var} = {inputs.shown(value)}: must be a whole number between {low} and {high}. Fix: e.g. "
                          f"{low if key == 'collector_interval' else 20}.")

    nets, problem = _networks(ctx.get("allowed_clients"))
    if problem:
        errors.append(f"monitoring_allowed_clients = {inputs.shown(ctx.get('allowed_clients'))}: {problem}. Fix: "
                      "a list such as ['10.0.0.0/24', '10.0.5.7'], or [] for nobody but the monitoring host.")
    managers = ctx.get("alertmanagers")
    if not isinstance(managers, (list, tuple)) or any(
            not isinstance(m, str) or not HOST_PORT.match(m) or not inputs.port(HOST_PORT.match(m).group(1))
            for m in managers):
        errors.append(f"monitoring_alertmanagers = {inputs.shown(managers)}: must be a list of 'host:port'. Fix: e.g. "
                      "['10.0.0.5:9093'], or [] for none.")
    for var, key in (("monitoring_journal_max_use", "journal_max_use"),
                     ("monitoring_journal_keep_free", "journal_keep_free")):
        value = ctx.get(key)
        if not isinstance(value, (str, int)) or isinstance(value, bool) or not JOURNAL_SIZE.match(str(value).strip()):
            errors.append(f"{var} = {inputs.shown(value)}: not a journald size. Fix: bytes or a number with K, M, G or T, "
                          "e.g. '4G'.")
    kinds = ctx.get("reports_kinds")
    if not isinstance(kinds, (list, tuple)) or not all(isinstance(k, str) and re.match(r"^[a-z][a-z0-9_]*$", k)
                                                       for k in kinds):
        errors.append(f"monitoring_reports_kinds = {inputs.shown(kinds)}: must be a list of report kinds (the name "
                      "before the time, e.g. 'verify' in verify-20260101T000000Z.json). Fix: e.g. [verify, doctor].")
    if _flag(ctx.get("scrape_with_api_key")) is None:
        errors.append(f"monitoring_scrape_with_api_key = {inputs.shown(ctx.get('scrape_with_api_key'))}: must be true "
                      "or false. Fix: a YAML boolean.")

    url = ctx.get("grafana_url") or ""
    if url:
        if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+(/\S*)?$", url):
            errors.append(f"spark_grafana_url = {inputs.shown(url)}: not an http(s) URL. Fix: e.g. "
                          "'https://grafana.example:3000', or '' for no Grafana.")
        token_file = ctx.get("grafana_token_file") or ""
        try:
            info = os.stat(token_file)
        except OSError as err:
            errors.append(f"monitoring_grafana_token_file = {inputs.shown(token_file)}: {err.strerror} on the "
                          "controller, and Grafana's API wants a token. Fix: put a Grafana service account token "
                          "there (mode 0600), or set spark_grafana_url: '' for no Grafana.")
        else:
            if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                errors.append(f"monitoring_grafana_token_file = {inputs.shown(token_file)}: mode "
                              f"{stat.S_IMODE(info.st_mode):04o} lets other users read the token. Fix: "
                              f"chmod 600 {token_file}.")
    return {"errors": errors, "monitor": monitor}


# --- Prometheus's configuration ----------------------------------------------------------------------


def _engine(ctx):
    """What the monitoring reads of the group's engine: its flag model's `monitoring`, with the engine, its label
    and its concurrency flag (SGLang's max-running-requests, or the flag that takes that name as an alias),
    which the runbooks name."""
    model = ctx.get("engine")
    if not isinstance(model, Mapping) or not isinstance((model.get("monitoring") or {}).get("metrics"), Mapping):
        raise ValueError("the monitoring context has no engine flag model with a monitoring block: "
                         f"{inputs.shown(model)}")
    concurrency = next((f["name"] for f in model.get("flags") or []
                        if "max-running-requests" in [f.get("name"), *(f.get("aliases") or [])]), "max-running-requests")
    return {**model["monitoring"], "engine": model.get("engine"), "label": model.get("label"),
            "concurrency_flag": concurrency}


def engine_expression(expr, engine):
    """`expr` with each engine:<figure> in the engine's metric name (`engine`: _engine's answer); None when the
    engine has no such figure (its metrics map says null). A figure the map does not know is a mistake of the
    caller, not of a site: ValueError."""
    metrics = engine["metrics"]
    absent = []

    def name(match):
        figure, series = match.group(1), ""
        if figure not in metrics:
            series = next((s for s in HISTOGRAM_SERIES if figure.endswith(s) and figure[:-len(s)] in metrics), "")
            figure = figure[:-len(series)] if series else figure
        if figure not in metrics:
            raise ValueError(f"engine:{match.group(1)} is no figure of the flag models' monitoring.metrics "
                             f"({', '.join(sorted(metrics))})")
        if metrics[figure] is None:
            absent.append(figure)
            return match.group(0)
        return f"{metrics[figure]}{series}"

    out = ENGINE_FIGURE.sub(name, expr)
    return None if absent else out


def _scrape_sends_key(ctx):
    return bool(_engine(ctx).get("scrape_needs_key")) and bool(_flag(ctx.get("scrape_with_api_key"))) \
        and bool(_flag(ctx.get("api_key_set")))


def _target_address(host, hostvars):
    return (hostvars.get(host) or {}).get("ansible_host", host)


def _site_groups(ctx):
    """[(label, head, nodes)]: the site's TP groups (ctx `groups`, spark_site_groups), each labelled with its name
    where the site has several; the host's own group, unlabelled, where it has one."""
    groups = [g for g in ctx.get("groups") or [] if isinstance(g, Mapping) and g.get("nodes")]
    if len(groups) > 1:
        return [({"tp_group": g["name"]}, g.get("head"), list(g["nodes"])) for g in groups]
    return [({}, ctx.get("head"), list(ctx.get("nodes") or []))]


def _mixed_engines(ctx):
    """The site's groups by engine ({engine: [group, ...]}) when they do not all run one engine, else {}."""
    by_engine = {}
    for name, engine in (ctx.get("group_engines") or {}).items():
        by_engine.setdefault(str(engine), []).append(name)
    return by_engine if len(by_engine) > 1 else {}


def monitoring_targets(ctx, hostvars):
    """[{job, target, labels}] of every endpoint the monitoring host scrapes, from the inventory: every node and
    every head of the site (one Prometheus for the site), each labelled with its TP group on a site of several."""
    site = _site_groups(ctx)
    every = [node for _label, _head, nodes in site for node in nodes]
    monitor = ctx.get("monitor")
    node_port = inputs.port(ctx.get("node_exporter_port"))
    out = []
    for label, head, nodes in site:
        for rank, node in enumerate(nodes):
            out.append({"job": "node", "target": _host_port(_target_address(node, hostvars), node_port),
                        "labels": {"node": node, "rank": str(rank), "role": "head" if node == head else "worker",
                                   **label}})
    if monitor and monitor not in every:
        # A monitoring host outside the TP groups: its node exporter listens on loopback only.
        out.append({"job": "node", "target": _host_port("127.0.0.1", node_port),
                    "labels": {"node": monitor, "role": "monitor"}})
    for label, head, _nodes in site:
        if head:
            out.append({"job": "server", "target": _host_port(_target_address(head, hostvars), ctx.get("server_port")),
                        "labels": {"node": head, "rank": "0", "role": "head", **label}})
    gateway = ctx.get("gateway") or {}
    if gateway.get("host"):
        # The model gateway's own metrics port, bound where only the monitoring host reaches it.
        out.append({"job": "gateway", "target": _host_port(gateway.get("address"), gateway.get("port")),
                    "labels": {"node": gateway["host"], "role": "gateway"}})
    out.append({"job": "prometheus", "target": _host_port("127.0.0.1", ctx.get("prometheus_port")),
                "labels": {"node": monitor}})
    return out


def monitoring_prometheus_config(ctx, hostvars):
    """Prometheus's configuration file, as data: one job per kind of endpoint, the targets from the inventory."""
    paths = ctx.get("paths") or {}
    jobs = {}
    for t in monitoring_targets(ctx, hostvars):
        jobs.setdefault(t["job"], []).append({"targets": [t["target"]], "labels": t["labels"]})
    scrape = []
    for job in ("prometheus", "node", "server", "gateway"):
        if job not in jobs:
            continue
        entry = {"job_name": job}
        if job == "server":
            entry["metrics_path"] = "/metrics"
            if _flag(ctx.get("server_tls")):
                entry["scheme"] = "https"
                if ctx.get("server_tls_ca"):
                    entry["tls_config"] = {"ca_file": paths["ca"]}
            if _scrape_sends_key(ctx):
                # Read by Prometheus at each scrape: never on a command line or in this file. An engine whose
                # /metrics never wants the key (vLLM's) gets none, and the monitoring host holds none.
                entry["authorization"] = {"type": "Bearer", "credentials_file": paths["key"]}
        entry["static_configs"] = jobs[job]
        scrape.append(entry)
    config = {
        "global": {
            "scrape_interval": ctx.get("scrape_interval"),
            "evaluation_interval": ctx.get("evaluation_interval"),
            # A scrape may not outlast the interval; the engine's /metrics answers at once.
            "scrape_timeout": ctx.get("scrape_interval") if duration_seconds(ctx.get("scrape_interval")) <= 10
            else "10s",
        },
        "rule_files": [paths["rules"]],
        "scrape_configs": scrape,
    }
    managers = list(ctx.get("alertmanagers") or [])
    if managers:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": managers}]}]}
    return config


# --- the alert rules ---------------------------------------------------------------------------------


def _for(ctx, key, default="5m"):
    return str((ctx.get("alert_for") or {}).get(key, default))


def _num(value):
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


def monitoring_rules(ctx):
    """The alert rules, as data: each with a runbook line naming the playbook or the setting that fixes it."""
    unit = ctx.get("unit") or "spark-llm.service"
    stall = ctx.get("stall_window") or "5m"
    stale = max(4 * int(ctx.get("collector_interval") or 15), 60)
    ttft = _num(ctx.get("ttft_p99_seconds"))
    queue = _num(ctx.get("queue_threshold"))
    free = _num(ctx.get("filesystem_free_percent"))
    temperature = _num(ctx.get("gpu_temperature_celsius"))
    model_dir = ctx.get("model_dir") or "the model directory"
    engine = _engine(ctx)
    label, prefix = engine.get("label") or "the engine", engine.get("alert_prefix") or "Engine"
    concurrency = engine.get("concurrency_flag") or "max-running-requests"

    def rule(name, expr, key, severity, summary, description, runbook):  # noqa: PLR0917 - one rule's fields
        translated = engine_expression(expr, engine)
        if translated is None:
            raise ValueError(f"the alert {name} needs a figure {label} does not serve: {expr}")
        return {"alert": name, "expr": " ".join(translated.split()), "for": _for(ctx, key),
                "labels": {"severity": severity, "service": "server"},
                "annotations": {"summary": summary, "description": description, "runbook": runbook}}

    rules = [
        rule(f"{prefix}EndpointDown",
             'up{job="server"} == 0',
             "endpoint_down", "critical",
             f"{label}'s endpoint on {{{{ $labels.node }}}} does not answer",
             "Prometheus cannot scrape {{ $labels.instance }}/metrics: the head's rank is down, starting, or "
             "unreachable from the monitoring host.",
             "Run playbooks/status.yml (every rank's state), then playbooks/doctor.yml (the cause and the inventory "
             "change that fixes it); playbooks/restart.yml restarts the whole group (the supervisor does it by "
             "itself while supervisor_enabled is true)."),
        rule("SparkRankUnitNotActive",
             f'node_systemd_unit_state{{job="node",rank!="",name="{unit}",state="active"}} == 0 '
             f'or on(instance) (up{{job="node",rank!=""}} == 1 unless on(instance) '
             f'node_systemd_unit_state{{job="node",name="{unit}",state="active"}})',
             "rank_unit_inactive", "critical",
             f"Rank {{{{ $labels.rank }}}}'s {unit} is not active on {{{{ $labels.node }}}}",
             f"{unit} on {{{{ $labels.node }}}} (rank {{{{ $labels.rank }}}}) is not active (or not installed): a TP "
             "group serves only with every rank.",
             "Run playbooks/doctor.yml for the cause (an OOM kill, the hybrid state cache, a peer that left), apply "
             "the inventory change it names, then playbooks/restart.yml: the ranks start together, never one alone "
             "(site.yml when the unit is missing)."),
        rule(f"{prefix}GroupNotServing",
             'max(spark_supervisor_probe_failures) > 0 and on() max(up{job="server"}) == 1 '
             f'or (sum(engine:running_requests{{job="server"}}) > 0 '
             f'and on() sum(increase(engine:inter_token_latency_count{{job="server"}}[{stall}])) == 0 '
             f'and on() sum(increase(engine:time_to_first_token_count{{job="server"}}[{stall}])) == 0)',
             "group_not_serving", "critical",
             "The TP group answers /health but generates nothing",
             "The supervisor's one-token generation probe fails while the endpoint answers, or requests run "
             f"without an output token for {stall}: a frozen or deadlocked rank.",
             "The supervisor restarts the whole group after supervisor_failures failed probes; without it "
             "run playbooks/restart.yml, and playbooks/doctor.yml for the rank that stalled."),
        rule(f"{prefix}TimeToFirstTokenHigh",
             'histogram_quantile(0.99, sum by (le) (rate(engine:time_to_first_token_bucket{job="server"}[5m]))) '
             f"> {ttft}",
             "ttft_high", "warning",
             "p99 time to first token is {{ $value | humanizeDuration }}",
             f"The 99th percentile time to first token over 5 minutes is above {ttft} s "
             "(monitoring_ttft_p99_seconds).",
             f"Too many concurrent or long requests for the group: choose a profile with fewer {concurrency} "
             "or a shorter context (playbooks/tune.yml, then server_profile, or server_flag_overrides), "
             "and measure with playbooks/benchmark.yml."),
        rule(f"{prefix}QueueGrowing",
             f'engine:queued_requests{{job="server"}} > {queue} and deriv(engine:queued_requests{{job="server"}}[10m]) > 0',
             "queue_growing", "warning",
             f"{{{{ $value }}}} requests wait in {label}'s queue, and more keep coming",
             f"More than {queue} requests (monitoring_queue_threshold) wait for a slot and the queue grows: "
             f"clients ask more than {concurrency} serve.",
             f"Find the largest {concurrency} the group holds with playbooks/tune.yml and apply it with "
             "server_profile (or server_flag_overrides), or slow the clients down."),
        rule("SparkModelFilesystemFilling",
             f'spark_filesystem_avail_bytes{{purpose="model"}} / spark_filesystem_size_bytes{{purpose="model"}} * 100 '
             f"< {free}",
             "filesystem_filling", "warning",
             "The model directory's filesystem on {{ $labels.node }} has {{ $value | humanize }}% free",
             f"Less than {free}% (monitoring_filesystem_free_percent) is free on the filesystem of "
             f"{model_dir}: a new checkpoint revision (181 GiB) or its partial files will not fit.",
             "Remove what does not belong beside spark_model_dir (old revisions, partial downloads under its "
             ".partial directory once no fetch runs), or move spark_model_dir to a larger filesystem and run "
             "playbooks/checkpoint.yml."),
        rule("SparkRootFilesystemFilling",
             f'spark_filesystem_avail_bytes{{purpose="root"}} / spark_filesystem_size_bytes{{purpose="root"}} * 100 '
             f"< {free}",
             "filesystem_filling", "warning",
             "The root filesystem of {{ $labels.node }} has {{ $value | humanize }}% free",
             f"Less than {free}% (monitoring_filesystem_free_percent) is free on /: the journal, docker's "
             "images and Prometheus's data live there.",
             "Prune docker images the group no longer runs (docker image prune), lower "
             "monitoring_journal_max_use or monitoring_retention_size and run playbooks/monitoring.yml."),
        rule("SparkGpuTemperatureHigh",
             f"spark_gpu_temperature_celsius > {temperature}",
             "gpu_temperature", "warning",
             "GPU {{ $labels.gpu }} on {{ $labels.node }} is at {{ $value }} °C",
             f"The GB10 on {{{{ $labels.node }}}} is above {temperature} °C "
             "(monitoring_gpu_temperature_celsius); it throttles, and the whole TP group slows with it.",
             "Check the node's airflow and power (nvidia-smi on the node); lower the load with fewer "
             f"{concurrency} (server_profile) until it cools."),
        rule("SparkNodeExporterMissing",
             'up{job="node"} == 0',
             "node_exporter_missing", "warning",
             "No node metrics from {{ $labels.node }}",
             "Prometheus cannot scrape the node exporter on {{ $labels.instance }}: the node is down, the exporter "
             "stopped, or the firewall drops the monitoring host.",
             "Run playbooks/monitoring.yml (it installs and starts the exporter and admits the monitoring host in the "
             "firewall); a node that does not answer SSH either needs its power or network looked at."),
        rule("SparkNodeCollectorStale",
             f"time() - spark_collector_last_run_timestamp_seconds > {stale} or spark_gpu_query_success == 0",
             "node_collector_stale", "warning",
             "GPU and disk figures of {{ $labels.node }} are stale or failing",
             f"The node collector has not written for {stale} s, or nvidia-smi fails on {{{{ $labels.node }}}}: the "
             "GPU temperature and filesystem alerts are blind there.",
             "Run playbooks/preflight.yml (nvidia-smi, the driver), then playbooks/monitoring.yml (the collector's "
             "timer, spark-llm-monitoring-collector.timer)."),
        rule("SparkFabricWithoutRdma",
             "spark_rdma_fabric_ports_usable == 0",
             "fabric_without_rdma", "warning",
             "NCCL on {{ $labels.node }} has no usable RDMA port behind {{ $labels.netdev }}",
             "No RDMA port behind the fabric rail {{ $labels.netdev }} on {{ $labels.node }} is ACTIVE with a "
             "RoCE v2 GID of its address: NCCL does not fail, it runs on the other rails (about half the link) or, "
             "where no rail is left, falls back to its socket transport (about a tenth of the link's all-reduce "
             "bandwidth), and the whole TP group slows with this rank.",
             "Run playbooks/fabric.yml: its proof names the cause (no RDMA device or none behind the interface, a "
             "port not ACTIVE, no RoCE v2 GID, an MTU) and repairs the link where it can; then playbooks/restart.yml, "
             "so that the ranks start with the usable devices in their environment (NCCL_IB_HCA)."),
    ]
    # Speculative decoding (a promoted profile): where the engine serves its accept length (SGLang's gauge; 0 while
    # no drafter runs, so the rule is quiet then).
    accept = _num(ctx.get("speculative_min_accept_length"))
    if engine_expression("engine:speculative_accept_length", engine) is not None:
        rules.append(rule(
            f"{prefix}SpeculativeNotPaying",
            f'engine:speculative_accept_length{{job="server"}} > 0 '
            f'and engine:speculative_accept_length{{job="server"}} < {accept}',
            "speculative_not_paying", "warning",
            "The drafter yields {{ $value }} tokens a step on {{ $labels.node }}",
            f"Speculative decoding runs, and its drafts yield fewer than {accept} tokens a step "
            "(monitoring_speculative_min_accept_length): every step pays for drafting and verifying, and a stream "
            "decodes about as fast as without the drafter, or slower. Today's prompts are not the ones it was "
            "promoted on.",
            "Measure the profile against the one without a drafter on today's prompts (playbooks/tune.yml -e "
            "tune_speculative=[...]); go back to that one (server_profile) when it no longer wins."))
    rules += [
        rule("SparkSupervisorGaveUp",
             "spark_supervisor_gave_up == 1",
             "supervisor_gave_up", "critical",
             "The group supervisor on {{ $labels.node }} gave up: a crash loop, every rank stopped",
             "The supervisor's group restarts did not reach stable service supervisor_max_restarts times in a row; it "
             "stopped every rank and does nothing more until it is resumed. gave-up.json on the head holds the reason "
             "and each rank's last journal lines.",
             "Run playbooks/doctor.yml for the cause and the inventory change that fixes it, apply it, then "
             "playbooks/restart.yml (which resumes the supervisor and clears the give-up)."),
        rule("SparkSupervisorFlapping",
             "spark_supervisor_flapping == 1",
             "supervisor_flapping", "warning",
             "The TP group of {{ $labels.node }} keeps dying and the supervisor keeps healing it",
             "supervisor_window_max_restarts group restarts within supervisor_window: each restart served again, so "
             "the supervisor keeps restarting (it never gives up on restarts that healed), but something takes the "
             "group down again and again.",
             "Run playbooks/status.yml (the restarts in the window) and playbooks/doctor.yml (each incident's cause "
             "in the history), then fix what the causes share (memory, a node, the fabric)."),
    ]
    return {"groups": [{"name": "spark-llm-tp-group", "rules": rules}]}


# --- Grafana -----------------------------------------------------------------------------------------


def monitoring_dashboard(dashboard, ctx):
    """The shipped dashboard in the group's engine's metric names, with the site's values in its constant
    variables (the fabric port). A query of a figure the engine does not serve is left out (vLLM has no
    throughput gauge and no token counts of its KV cache: the panels keep the figures it has), and a panel left
    with no query at all with it."""
    engine = _engine(ctx)
    out = dict(dashboard)
    panels = []
    for given in dashboard.get("panels") or []:
        panel = dict(given)
        if "targets" in given:
            targets = []
            for target in given["targets"]:
                expr = engine_expression(target.get("expr", ""), engine)
                if expr is not None:
                    targets.append({**target, "expr": expr})
            if not targets:
                continue
            panel["targets"] = targets
        panels.append(panel)
    out["panels"] = panels
    name = engine.get("engine") or "engine"
    out["tags"] = [name, *(dashboard.get("tags") or [])]
    # One Grafana may hold an SGLang site's dashboard and a vLLM site's: each engine's its own uid (SGLang's is the
    # shipped one, which sites have stored since 1.0) and its own title.
    out["uid"] = str(dashboard.get("uid") or "spark-sglang-glm53").replace("sglang", name, 1)
    if name != "sglang":
        out["title"] = f"{dashboard.get('title', 'LLM TP group')} - {engine.get('label') or name}"
    templating = []
    for given in (dashboard.get("templating") or {}).get("list", []):
        var = dict(given)
        if var.get("name") == "fabric_interface":
            value = str(ctx.get("fabric_interface") or var.get("query") or "")
            var.update(query=value, current={"text": value, "value": value},
                       options=[{"selected": True, "text": value, "value": value}])
        templating.append(var)
    out["templating"] = {"list": templating}
    out.pop("id", None)
    return out


def monitoring_dashboard_content(dashboard):
    """A dashboard without what Grafana adds when it stores one (its id and version): what a change changes."""
    return {k: v for k, v in (dashboard or {}).items() if k not in ("id", "version")}


# --- Drift: what the node holds against what the role would install -----------------------------------


def monitoring_drift(probe, want):
    """What differs between the node (the monitoring_probe module's answer) and `want`, one line each.

    `want`: {packages: [name], paths: [{path, type: file|directory, owner, group, mode, checksum (files)}],
    units: [name]} - a package not installed, a file absent, of another owner, group or mode or content, a
    unit not active or not enabled. Empty: the node holds what the role would install, so it has nothing to do.
    """
    probe = probe or {}
    want = want or {}
    drift = []
    packages = probe.get("packages") or {}
    drift += [f"package {name} not installed" for name in want.get("packages") or [] if not packages.get(name)]
    drift += drift_of_paths_and_units(probe, want)
    return drift


def monitoring_stopped_before(lines):
    """The units the role found on the node, not running, before it first touched them ("unit enabled-state
    active-state" lines of its record): [{unit, enabled}] for uninstall to stop again. A unit that was not there
    (its package was installed by the role, and is purged) or that ran is not in it."""
    out = []
    for line in lines or []:
        fields = str(line).split()
        if len(fields) == 3 and fields[1] not in ("absent", "not-found") and fields[2] != "active":
            out.append({"unit": fields[0], "enabled": fields[1] == "enabled"})
    return out


class FilterModule:
    def filters(self):
        return {
            "monitoring_plan": monitoring_plan,
            "monitoring_targets": monitoring_targets,
            "monitoring_prometheus_config": monitoring_prometheus_config,
            "monitoring_rules": monitoring_rules,
            "monitoring_drift": monitoring_drift,
            "monitoring_dashboard": monitoring_dashboard,
            "monitoring_dashboard_content": monitoring_dashboard_content,
            "monitoring_duration_seconds": duration_seconds,
            "monitoring_stopped_before": monitoring_stopped_before,
        }

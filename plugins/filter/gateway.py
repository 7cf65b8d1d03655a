"""The model gateway's plan: its settings checked and smg's launch arguments derived, once, for the
inventory check, the deployment and the render alike."""

from __future__ import annotations

import ipaddress

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import inputs

# smg 1.13.0's --policy choices (`smg launch --help`), after the role's own "auto": power_of_two in front of two
# groups or more (smg refuses to start it in front of one), cache_aware in front of one.
POLICIES = ("auto", "cache_aware", "round_robin", "power_of_two", "random", "least_load", "consistent_hashing",
            "prefix_hash", "passthrough", "manual")

# smg 1.13.0's --power-of-two-load-metric choices: what power_of_two compares between two groups.
POWER_OF_TWO_METRICS = ("least_requests", "requests", "expected_wait")

# The flags the role sets itself (from its own settings, the key from its file): gateway_extra_args may not repeat
# or override them.
OWN_FLAGS = ("--worker-urls", "--host", "--port", "--policy", "--health-check-endpoint", "--health-check-interval-secs",
             "--health-check-timeout-secs", "--health-failure-threshold", "--health-success-threshold",
             "--prometheus-host", "--prometheus-port", "--disable-tokenizer-autoload", "--ca-cert-paths",
             "--tls-cert-path", "--tls-key-path", "--api-key", "--load-monitor-interval",
             "--power-of-two-load-metric")

# Whole-number settings: (variable, smallest value, what it is, an example).
NUMBERS = (
    ("gateway_health_check_interval", 1, "seconds between two health checks of each head", "10"),
    ("gateway_health_check_timeout", 1, "seconds a head's /health may take", "5"),
    ("gateway_health_failure_threshold", 1, "failed checks in a row before a group is taken out", "3"),
    ("gateway_health_success_threshold", 1, "answered checks in a row before a group is put back", "2"),
    ("gateway_readiness_timeout", 1, "seconds a start may take until every head is registered", "180"),
    ("gateway_load_monitor_interval", 1, "seconds between two reads of each head's load", "1"),
)


def _url_host(address):
    """An address as a URL's host: IPv6 in brackets."""
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address


def _extra_args(raw, errors):
    """gateway_extra_args: more of smg launch's flags, as a list of strings; none of the role's own."""
    if raw is None or raw == "":
        return []
    if not isinstance(raw, (list, tuple)) or not all(isinstance(a, (str, int, float)) and not isinstance(a, bool)
                                                     for a in raw):
        errors.append(f"gateway_extra_args = {inputs.shown(raw)}: must be a list of smg launch's arguments as "
                      "strings. Fix: e.g. gateway_extra_args: ['--worker-overload-waiting-requests', '1'].")
        return []
    args = [str(a) for a in raw]
    owned = sorted({a.split("=", 1)[0] for a in args} & set(OWN_FLAGS))
    if owned:
        errors.append(f"gateway_extra_args = {inputs.shown(args)}: {', '.join(owned)} is set by the role from its own "
                      "settings (the key from its 0600 file, never on a command line). Fix: drop it from "
                      "gateway_extra_args and set the gateway_* variable that names it (gateway_port, gateway_policy, "
                      "gateway_health_*, gateway_load_monitor_interval, gateway_power_of_two_load_metric, gateway_tls_*; "
                      "server_api_key for the key).")
    return args


def gateway_management(addresses):
    """{host: its management address}: its ansible_host, else its inventory name (which then must resolve)."""
    return {host: str(address or host) for host, address in (addresses or {}).items()}


def gateway_metrics_address(host, monitor, management_address, given=""):
    """Where the gateway's metrics bind: the address given, else loopback when the monitoring host is the
    gateway host (only it scrapes them), else the gateway host's management address."""
    if given:
        return str(given)
    return "127.0.0.1" if monitor == host else str(management_address or "")


def gateway_plan(ctx):
    """Check the gateway's settings and derive what it runs with.

    ``ctx``: enabled (spark_gateway_enabled), host (the gateway host), heads (every group's head),
    management ({host: ansible_host}), monitor (the monitoring host), the gateway_* settings without
    their prefix (version, pins, port, listen_address, policy, extra_args, metrics_port, metrics_address, heads_port,
    heads_tls, the health numbers), paths on the gateway host (tls_cert, tls_key, heads_ca: '' for none)
    and keyed (whether the heads serve with a key).

    Returns {errors, enabled, args (smg launch's, without the key), worker_urls, metrics_address}.
    """
    errors = []
    enabled = inputs.switch(ctx.get("enabled"))
    if enabled is None:
        errors.append(inputs.not_a_switch("gateway_enabled", ctx.get("enabled")))
    plan = {"errors": errors, "enabled": bool(enabled), "args": [], "worker_urls": [], "metrics_address": "",
            "policy": ""}
    if not enabled:
        return plan
    host = ctx.get("host") or ""
    heads = list(ctx.get("heads") or [])
    management = ctx.get("management") or {}
    if not host:
        errors.append("spark_gateway_host = '': the gateway needs a host. Fix: put one host in the group "
                      "spark_gateway, or give the site a head (group spark_head).")
    if not heads:
        errors.append("spark_heads = []: the gateway fronts every TP group's head, and there is none. Fix: put the "
                      "head of each group in the group spark_head.")
    version, pins = ctx.get("version"), ctx.get("pins") or {}
    if str(version) not in pins:
        errors.append(f"gateway_version = {inputs.shown(version)}: no pinned wheels are known for it (its dependencies' "
                      f"versions are pinned with it). Fix: one of {sorted(pins)}.")
    policy = ctx.get("policy")
    if policy not in POLICIES:
        errors.append(f"gateway_policy = {inputs.shown(policy)}: smg has no such routing policy. Fix: one of "
                      f"{', '.join(POLICIES)} (auto, the default: power_of_two, each request to the group with fewer "
                      "requests in flight, in front of two groups or more; cache_aware, which keeps a conversation on "
                      "the group that holds its prefix, in front of one).")
    if policy == "power_of_two" and len(heads) < 2:
        errors.append(f"gateway_policy = 'power_of_two': smg refuses to start it in front of one group ({len(heads)} "
                      "head here). Fix: gateway_policy: auto (cache_aware in front of one group, power_of_two in "
                      "front of several) or cache_aware.")
    if policy == "auto":
        policy = "power_of_two" if len(heads) >= 2 else "cache_aware"
    plan["policy"] = policy
    metric = ctx.get("power_of_two_load_metric")
    if policy == "power_of_two" and metric not in POWER_OF_TWO_METRICS:
        errors.append(f"gateway_power_of_two_load_metric = {inputs.shown(metric)}: smg's power_of_two compares "
                      f"{', '.join(POWER_OF_TWO_METRICS)}. Fix: least_requests (the default: the requests the gateway "
                      "has in flight on each group, counted as they come and go).")
    ports = {}
    for var in ("port", "metrics_port", "heads_port"):
        number = inputs.port(ctx.get(var))
        name = "server_port" if var == "heads_port" else f"gateway_{var}"
        if number is None:
            errors.append(f"{name} = {inputs.shown(ctx.get(var))}: not a TCP port. Fix: a whole number between 1 "
                          "and 65535.")
        ports[var] = number
    if ports["port"] is not None and ports["port"] == ports["metrics_port"]:
        errors.append(f"gateway_metrics_port = {ports['port']}: gateway_port is the same port. Fix: choose another "
                      "port for the metrics (smg's default is 29000).")
    if host in heads and ports["port"] is not None and ports["port"] == ports["heads_port"]:
        errors.append(f"gateway_port = {ports['port']}: the gateway runs on the head {host}, whose engine serves "
                      f"server_port {ports['heads_port']}. Fix: another gateway_port (the default is 30080).")
    numbers = {}
    for var, low, what, example in NUMBERS:
        raw = ctx.get(var.removeprefix("gateway_"))
        number = inputs.whole_number(raw, signed=False)
        if number is None or number < low:
            errors.append(f"{var} = {inputs.shown(raw)}: must be a whole number >= {low} ({what}). Fix: e.g. "
                          f"{var}: {example}.")
        numbers[var] = number
    if inputs.switch(ctx.get("tls_unsigned")):
        errors.append("gateway_tls_cert = '': TLS is on (server_tls) with the heads' own certificate (server_tls_cert), "
                      "so no CA generated here can sign one for the gateway. Fix: set gateway_tls_cert and "
                      f"gateway_tls_key to a certificate for {host or 'the gateway host'} and its key.")
    heads_tls = inputs.switch(ctx.get("heads_tls"))
    if heads_tls is None:
        errors.append(inputs.not_a_switch("server_tls", ctx.get("heads_tls")))
    missing = [h for h in heads if not management.get(h)]
    if missing:
        errors.append(f"ansible_host of {', '.join(missing)}: the gateway reaches each head by its management "
                      "address. Fix: set ansible_host for it in the inventory.")
    listen = str(ctx.get("listen_address") or "")
    metrics_address = str(ctx.get("metrics_address") or "")
    if not metrics_address:
        metrics_address = gateway_metrics_address(host, ctx.get("monitor"), management.get(host))
    for var, value in (("gateway_listen_address", listen), ("gateway_metrics_address", metrics_address if host else "::")):
        try:
            ipaddress.ip_address(value)
        except ValueError:
            errors.append(f"{var} = {inputs.shown(value)}: smg binds an IP address, not a name. Fix: an address of "
                          f"{host or 'the gateway host'} (0.0.0.0 for every one).")
    extra = _extra_args(ctx.get("extra_args"), errors)
    if errors:
        return plan
    scheme = "https" if heads_tls else "http"
    urls = [f"{scheme}://{_url_host(str(management[h]))}:{ports['heads_port']}" for h in heads]
    args = ["--worker-urls", *urls, "--host", listen, "--port", str(ports["port"]), "--policy", policy,
            "--health-check-endpoint", "/health",
            "--health-check-interval-secs", str(numbers["gateway_health_check_interval"]),
            "--health-check-timeout-secs", str(numbers["gateway_health_check_timeout"]),
            "--health-failure-threshold", str(numbers["gateway_health_failure_threshold"]),
            "--health-success-threshold", str(numbers["gateway_health_success_threshold"]),
            "--load-monitor-interval", str(numbers["gateway_load_monitor_interval"]),
            "--prometheus-host", metrics_address, "--prometheus-port", str(ports["metrics_port"]),
            # The gateway host holds no checkpoint and reaches no hub: the heads tokenize.
            "--disable-tokenizer-autoload"]
    if policy == "power_of_two":
        args += ["--power-of-two-load-metric", str(metric)]
    if ctx.get("heads_ca"):
        args += ["--ca-cert-paths", str(ctx["heads_ca"])]
    if ctx.get("tls_cert"):
        args += ["--tls-cert-path", str(ctx["tls_cert"]), "--tls-key-path", str(ctx["tls_key"])]
    plan.update(args=args + extra, worker_urls=urls, metrics_address=metrics_address)
    return plan


class FilterModule:
    def filters(self):
        return {"gateway_plan": gateway_plan, "gateway_metrics_address": gateway_metrics_address,
                "gateway_management": gateway_management}

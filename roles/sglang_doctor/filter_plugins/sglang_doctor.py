"""Matching of a rank's evidence against the fingerprint catalogue, and redaction.

The catalogue (patterns, causes, remedies) is data in the role's
vars/main.yml; this module only interprets it, so the unit tests and the
playbook read the same catalogue. Remedies are ``str.format`` templates filled
with the current values of the flags and variables they name, plus a ready
``sglang_server_flag_overrides`` when a flag should change.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import time

SECRET_KEY = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD)", re.IGNORECASE)
# Shapes of secrets that may reach a log without the doctor knowing the value.
SECRET_PATTERNS = [
    # KEY=value / key: value / key='value' for anything named like a secret.
    re.compile(r"(?P<keep>\b[A-Za-z_]*(?:api[_-]?key|token|secret|password|passwd)[A-Za-z_]*\b['\"]?\s*[=:]\s*['\"]?)"
               r"(?P<secret>[^\s'\",;)]+)", re.IGNORECASE),
    re.compile(r"(?P<keep>--(?:admin-)?api-key[ =])(?P<secret>\S+)"),
    re.compile(r"(?P<keep>\bBearer\s+)(?P<secret>[A-Za-z0-9._~+/=-]+)", re.IGNORECASE),
    re.compile(r"(?P<keep>)(?P<secret>\bhf_[A-Za-z0-9]{16,})"),
    re.compile(r"(?P<keep>)(?P<secret>\bsk-[A-Za-z0-9_-]{16,})"),
]
# Long mixed-case alphanumerics look like tokens; hex digests and (GPU) UUIDs do not match.
TOKENISH = re.compile(r"\b(?=[A-Za-z0-9_]*[A-Z])(?=[A-Za-z0-9_]*[a-z])(?=[A-Za-z0-9_]*[0-9])[A-Za-z0-9_]{24,}\b")
# ...but CamelCase names (Glm5NextForConditionalGeneration) are code, not secrets.
IDENTIFIER = re.compile(r"^(?:[A-Z][a-z]{2,}|[a-z]{2,}|[0-9]{1,2}|_)+$")
REDACTED = "<redacted>"
# The unit's properties the doctor reads and the bundle shows, of all that `systemctl show` lists.
UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainCode", "NRestarts",
                   "ActiveEnterTimestamp", "FragmentPath", "ExecStart")


def redact(text, secrets=None):
    """Remove known secret values and anything shaped like a secret from text."""
    if text is None:
        return ""
    if not isinstance(text, str):
        text = json.dumps(text, indent=2, sort_keys=True, default=str)
    for secret in sorted({s for s in (secrets or []) if isinstance(s, str) and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    for pattern in SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group("keep") + REDACTED, text)
    return TOKENISH.sub(lambda m: m.group(0) if IDENTIFIER.match(m.group(0)) else REDACTED, text)


def env_secrets(env_text):
    """Values of secret-named variables in an env file, so they are redacted everywhere else too."""
    found = []
    for line in (env_text or "").splitlines():
        name, sep, value = line.partition("=")
        if sep and not name.lstrip().startswith("#") and SECRET_KEY.search(name) and value.strip():
            found.append(value.strip().strip("'\""))
    return found


def parse_env(env_text):
    env = {}
    for line in (env_text or "").splitlines():
        name, sep, value = line.partition("=")
        if sep and not name.lstrip().startswith("#"):
            env[name.strip()] = value.strip()
    return env


def journal_entries(json_lines):
    """journalctl -o json output -> [{t: seconds, msg: str}] (MESSAGE may be a byte array)."""
    entries = []
    for line in (json_lines or "").splitlines() if isinstance(json_lines, str) else json_lines or []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        message = record.get("MESSAGE", "")
        if isinstance(message, list):
            message = bytes(b & 0xFF for b in message if isinstance(b, int)).decode("utf-8", errors="replace")
        try:
            stamp = int(record.get("__REALTIME_TIMESTAMP", 0)) / 1e6
        except (TypeError, ValueError):
            stamp = 0.0
        entries.append({"t": stamp, "msg": str(message)})
    return entries


def unit_args(exec_start):
    """sglang.launch_server arguments from `systemctl show -p ExecStart` (or a plain command line)."""
    text = exec_start or ""
    match = re.search(r"argv\[\]=(.*?) ;", text)
    line = match.group(1) if match else text
    try:
        tokens = shlex.split(line)
    except ValueError:
        tokens = line.split()
    for start, word in enumerate(tokens):
        if word == "--model-path" or word.startswith("--model-path="):
            return tokens[start:]
    return []


def flag_values(args):
    values = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("--"):
            name, eq, inline = token[2:].partition("=")
            if eq:
                values[name] = inline
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                values[name] = args[i + 1]
                i += 1
            else:
                values[name] = True
        i += 1
    return values


def current_flags(node_args, flag_model, overrides):
    """Effective flags: the node's unit when installed, else the inventory (flag model defaults + overrides)."""
    planned = {s["name"]: s.get("default") for s in (flag_model or {}).get("flags", []) if s.get("kind") != "derived"}
    for name, value in (overrides or {}).items():
        planned[str(name)] = value
    deployed = flag_values(node_args or [])
    return {"source": "unit" if deployed else "inventory", "flags": deployed or planned, "planned": planned}


def _as_int(value, fallback):
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return fallback


class _Defaulting(dict):
    def __missing__(self, key):
        return "?"


def _override_yaml(overrides, changes):
    merged = dict(overrides or {})
    merged.update(changes)
    inner = ", ".join(f"{k}: {json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else v}"
                      for k, v in merged.items())
    return "sglang_server_flag_overrides: {" + inner + "}"


def _suggest(kind, flags, overrides):
    """The next override to try, in the seed's order: concurrency first, then context."""
    if kind != "lower_concurrency_then_context":
        return {}, ""
    running = _as_int(flags.get("max-running-requests"), 2)
    context = _as_int(flags.get("context-length"), 65536)
    if running > 1:
        change = {"max-running-requests": max(1, running // 2)}
        step = f"first lower max-running-requests {running} -> {change['max-running-requests']}"
    else:
        change = {"context-length": max(1024, context // 2)}
        step = f"max-running-requests is already {running}; now lower context-length {context} -> {change['context-length']}"
    return change, step + "; apply with: " + _override_yaml(overrides, change)


def props(text):
    """`systemctl show -p ...` output -> dict."""
    out = {}
    for line in (text or "").splitlines():
        name, sep, value = line.partition("=")
        if sep:
            out[name] = value
    return out


def probe_problems(raw, ctx):
    """Problems the probes show without any log line: {probe name: evidence text}, empty when fine."""
    problems = {}
    if not raw:
        return problems
    if raw.get("load_state") == "not-found":
        problems["unit_missing"] = f"{ctx.get('unit')} is not installed (LoadState=not-found)"
    if raw.get("smi_rc") not in (None, 0, "0"):
        problems["gpu"] = f"nvidia-smi exit {raw.get('smi_rc')}: {str(raw.get('smi_out', '')).strip()[:200]}"
    mtu = raw.get("mtu")
    expected = ctx.get("expected_mtu")
    if raw.get("link_rc") not in (None, 0, "0"):
        detail = str(raw.get("link_out", "")).strip()[:200]
        problems["fabric_link"] = f"interface {ctx.get('fabric_interface')} not found: {detail}"
    elif mtu and expected and str(mtu) != str(expected):
        problems["fabric_mtu"] = f"{ctx.get('fabric_interface')} MTU {mtu}, expected {expected}"
    bad_routes = [f"{peer} via {dev or 'no route'}" for peer, dev in (raw.get("routes") or {}).items()
                  if dev != ctx.get("fabric_interface")]
    if bad_routes:
        problems["fabric_route"] = "route to peer fabric address " + ", ".join(bad_routes) + \
            f" (expected dev {ctx.get('fabric_interface')})"
    env = parse_env(raw.get("env_text")) if raw.get("env_rc") in (0, "0") else None
    if env is not None:
        if env.get("SGLANG_HOST_IP") and ctx.get("fabric_ip") and env["SGLANG_HOST_IP"] != ctx["fabric_ip"]:
            problems["env_host_ip"] = f"SGLANG_HOST_IP={env['SGLANG_HOST_IP']} but spark_fabric_ip is {ctx['fabric_ip']}"
        ifnames = {k: v for k, v in env.items()
                   if k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") and v != ctx.get("fabric_interface")}
        if ifnames:
            problems["env_ifname"] = ", ".join(f"{k}={v}" for k, v in ifnames.items()) + \
                f" but the fabric interface is {ctx.get('fabric_interface')}"
        if env.get("HF_HUB_OFFLINE") != "1":
            problems["env_offline"] = f"HF_HUB_OFFLINE={env.get('HF_HUB_OFFLINE', '<unset>')} in the env file"
    return problems


def _matches(entry, entries):
    hits = []
    for pattern in entry.get("patterns", []):
        rx = re.compile(pattern)
        hits.extend(e for e in entries if rx.search(e["msg"]))
    return sorted(hits, key=lambda e: e["t"])


def _stalled(entry, entries, now, stall_seconds, active):
    stall = entry.get("stall")
    if not stall or not active or not entries:
        return None
    begin = [e for e in entries if re.search(stall["begin"], e["msg"])]
    if not begin:
        return None
    last_begin = begin[-1]
    progress = [e for e in entries if e["t"] >= last_begin["t"] and any(re.search(p, e["msg"]) for p in stall["progress"])]
    if progress or now - entries[-1]["t"] < stall_seconds:
        return None
    return last_begin


def findings(node, catalogue, ctx):
    """Findings for one node: [{id, title, cause, remedy, evidence, last_seen}] most recent first.

    node: {journal: [{t, msg}], kernel: [{t, msg}], unit: {systemctl show props}, now: seconds,
           probes: {name: bool-ish facts}}
    ctx:  values the remedy templates name (flags, overrides, variables, fabric facts).
    """
    entries = list(node.get("journal") or [])
    kernel = list(node.get("kernel") or [])
    unit = node.get("unit") or {}
    probes = dict(node.get("probes") or {})
    probes.update(probe_problems(node.get("raw") or {}, ctx))
    flags = ctx.get("flags") or {}
    overrides = ctx.get("overrides") or {}
    # A rank waiting to be restarted (Restart=on-failure) is "activating" but
    # its last exit is what failed.
    active = unit.get("ActiveState") in ("active", "activating", "reloading") and unit.get("SubState") != "auto-restart"
    found = []
    for entry in catalogue:
        evidence = None
        hits = _matches(entry, entries) + (_matches(entry, kernel) if entry.get("kernel") else [])
        if hits:
            evidence = hits[-1]
        status = str(unit.get("ExecMainStatus", ""))
        if evidence is None and status in [str(s) for s in entry.get("exit_status", [])] and not active:
            evidence = {"t": 0.0, "msg": f"{ctx.get('unit', 'unit')}: main process exited with status {status}"}
        if evidence is None and unit.get("Result") in entry.get("unit_result", []):
            evidence = {"t": 0.0, "msg": f"{ctx.get('unit', 'unit')}: result {unit.get('Result')}"}
        if evidence is None and entry.get("stall"):
            evidence = _stalled(entry, entries, float(node.get("now") or 0), float(ctx.get("stall_seconds", 900)), active)
        if evidence is None and entry.get("probe") and probes.get(entry["probe"]):
            evidence = {"t": 0.0, "msg": str(probes[entry["probe"]])}
        if evidence is None:
            continue
        change, step = _suggest(entry.get("suggest"), flags, overrides)
        values = _Defaulting(ctx)
        values.update({f.replace("-", "_"): v for f, v in flags.items()})
        values["next_step"] = step
        variant = []
        for v in entry.get("variants", []):
            if any(re.search(p, e["msg"]) for e in entries for p in v.get("when_any", [])) or any(
                    flags.get(f) for f in v.get("when_flag", [])):
                variant.append(v["text"].strip())
        values["variant"] = " ".join(variant)
        if entry.get("evidence_value"):
            m = re.search(entry["evidence_value"], evidence["msg"])
            values["evidence_value"] = m.group(1) if m else "?"
        found.append({
            "id": entry["id"],
            "title": entry["title"],
            "cause": " ".join(entry["cause"].format_map(values).split()),
            "remedy": " ".join(entry["remedy"].format_map(values).split()),
            "override": change,
            "evidence": evidence["msg"][:400],
            "last_seen": evidence["t"],
        })
    found.sort(key=lambda f: f["last_seen"], reverse=True)
    return found


def sections(text):
    """Output split at '--- name' markers -> {name: [lines]}."""
    out = {}
    current = None
    for line in (text or "").splitlines():
        if line.startswith("--- "):
            current = line[4:].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return out


def _rc(result):
    return (result or {}).get("rc")


def _slurped(result):
    """A slurp result's text, or None when the file could not be read."""
    content = (result or {}).get("content")
    return base64.b64decode(content).decode("utf-8", errors="replace") if content is not None else None


def evidence(results, fabric_interface=""):
    """Registered probe results of one node -> {node: input of findings(), facts: summary for output and bundle}.

    unit: systemd_service's result (its status: `systemctl show`); journal: the rank's journal, then the kernel's
    after a '--- kernel' line; env and record: slurp results; the others: command results.
    """
    status = (results.get("unit") or {}).get("status") or {}
    unit = {k: str(status[k]) for k in UNIT_PROPERTIES if k in status}
    logs = sections("--- journal\n" + (results.get("journal") or {}).get("stdout", ""))
    host = sections((results.get("host") or {}).get("stdout", ""))
    smi = results.get("smi") or {}
    smi_parts = sections("--- gpu\n" + smi.get("stdout", ""))
    link = results.get("link") or {}
    mtu = None
    try:
        mtu = json.loads(link.get("stdout") or "[]")[0].get("mtu")
    except (ValueError, IndexError, AttributeError):
        mtu = None
    routes = {}
    for item in (results.get("routes") or {}).get("results", []):
        if item.get("skipped"):
            continue
        try:
            dev = json.loads(item.get("stdout") or "[]")[0].get("dev")
        except (ValueError, IndexError, AttributeError):
            dev = None
        routes[str((item.get("cmd") or ["?"])[-1])] = dev
    meminfo = {}
    for line in host.get("meminfo", []):
        name, _, value = line.partition(":")
        meminfo[name] = _as_int(value.strip().split(" ")[0], 0) * 1024
    checkpoint = {line.split(" ", 1)[1]: line.split(" ", 1)[0] for line in host.get("checkpoint", []) if " " in line}
    try:
        record = json.loads(_slurped(results.get("record")) or "{}")
    except ValueError:
        record = {}
    revision = (record.get("revision") if isinstance(record, dict) else None) or "unknown"
    env_text = _slurped(results.get("env"))
    image = (results.get("image") or {})
    now = _as_int("".join(host.get("now", [])).strip(), 0)
    raw = {
        "load_state": unit.get("LoadState"),
        "smi_rc": _rc(smi),
        "smi_out": smi.get("stdout", "") + smi.get("stderr", "") + smi.get("msg", ""),
        "link_rc": _rc(link),
        "link_out": link.get("stderr", "") or link.get("msg", ""),
        "mtu": mtu,
        "routes": routes,
        "env_rc": 0 if env_text is not None else 1,
        "env_text": env_text or "",
    }
    facts = {
        "unit": {k: unit.get(k, "") for k in ("LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus",
                                             "NRestarts", "ActiveEnterTimestamp", "FragmentPath")},
        "gpu": smi_parts.get("gpu", []) if _rc(smi) == 0 else [raw["smi_out"].strip()[:300]],
        "gpu_processes": smi_parts.get("compute apps", []),
        "memory_bytes": meminfo,
        "disk": host.get("df", []),
        "checkpoint": checkpoint,
        "checkpoint_revision": revision,
        "fabric": {"interface": fabric_interface, "mtu": mtu, "routes": routes},
        "image": image.get("stdout", "").strip() if _rc(image) == 0 else "",
        "env_file": "present" if env_text is not None else "missing",
        "route": ", ".join(f"{ip} via {dev or 'no route'}" for ip, dev in routes.items()) or "no peer",
        "checkpoint_state": next((v for k, v in checkpoint.items() if k.endswith(".verified")), "missing"),
        "now": now,
    }
    node = {
        "journal": journal_entries(logs.get("journal", [])),
        "kernel": journal_entries(logs.get("kernel", [])),
        "unit": unit,
        "now": now,
        "raw": raw,
    }
    return {"node": node, "facts": facts, "args": unit_args(unit.get("ExecStart", ""))}


def bundle_files(ev, host, unit_file, env_text, found, current, secrets=None):  # noqa: PLR0917 - a Jinja filter's arguments
    """The bundle's files of one node, every one redacted: [{path, content}]."""
    def stamp(t):
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) if t else "-"

    files = {
        "journal.log": "\n".join(f"{stamp(e['t'])} {e['msg']}" for e in ev["node"]["journal"]),
        "kernel-oom.log": "\n".join(f"{stamp(e['t'])} {e['msg']}" for e in ev["node"]["kernel"]),
        "unit.service": unit_file or "(unit not installed)",
        "unit.env": env_text or "(env file not found)",
        "server-args.json": json.dumps(ev["args"], indent=2),
        "flags.json": json.dumps(current, indent=2, sort_keys=True, default=str),
        "facts.json": json.dumps({"unit": ev["node"]["unit"], **ev["facts"]}, indent=2, sort_keys=True, default=str),
        "findings.json": json.dumps(found, indent=2, default=str),
    }
    return [{"path": f"{host}/{name}", "content": redact(content, secrets) + "\n"} for name, content in files.items()]


def report_lines(host, items, secrets=None):
    if not items:
        return [f"{host}: no known fingerprint found"]
    lines = []
    for item in items:
        lines += [
            f"{host}: {item['title']}",
            f"  seen:   {redact(item['evidence'], secrets)}",
            f"  cause:  {item['cause']}",
            f"  remedy: {item['remedy']}",
        ]
    return lines


class FilterModule:
    def filters(self):
        return {
            "sglang_doctor_findings": findings,
            "sglang_doctor_redact": redact,
            "sglang_doctor_env_secrets": env_secrets,
            "sglang_doctor_parse_env": parse_env,
            "sglang_doctor_journal": journal_entries,
            "sglang_doctor_unit_args": unit_args,
            "sglang_doctor_current_flags": current_flags,
            "sglang_doctor_report_lines": report_lines,
            "sglang_doctor_props": props,
            "sglang_doctor_evidence": evidence,
            "sglang_doctor_bundle_files": bundle_files,
        }

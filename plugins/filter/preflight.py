"""Evaluation of preflight's check table against one node's probe results.

The table (which checks exist, their severity, when each one fails and what it
says) is data in the role's vars/main.yml; this module only reads the probes
into facts and interprets the table, so the unit tests and the playbook read
the same table. Its ``vars``, ``when``, ``severity``, ``problem`` and ``fix``
are Jinja, rendered here (not by Ansible: they are ``!unsafe`` in the vars
file) against the node's facts and the role's settings, in an environment
that renders like Ansible's: blocks trim their newline, an undefined name is an
error, ``human_readable`` and the ``version`` test behave as Ansible's do.
"""

from __future__ import annotations

import base64
import json
import operator
import re

from ansible.module_utils.common.text.formatters import bytes_to_human
from ansible.module_utils.compat.version import LooseVersion
from jinja2 import StrictUndefined
from jinja2.sandbox import ImmutableSandboxedEnvironment

SEVERITIES = ("fatal", "warn", "info")
# POSIX shells exit 127 for a command that is not found.
RC_NOT_FOUND = 127
# nvidia-smi exit codes with a known meaning (from the driver's documentation).
SMI_RC_NO_DRIVER = 9
SMI_RC_NO_DEVICES = 6
# The probes print their later parts after a "--- <name>" line.
SECTION = re.compile(r"^--- (\S+)(?: (\S+))?$")


def _version(value, version, op="eq"):
    """Ansible's `version` test (loose comparison), for the table's conditions."""
    ops = {"==": "eq", "=": "eq", "<": "lt", "<=": "le", ">": "gt", ">=": "ge", "!=": "ne", "<>": "ne"}
    return getattr(operator, ops.get(op, op))(LooseVersion(str(value)), LooseVersion(str(version)))


def _environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, undefined=StrictUndefined, keep_trailing_newline=False)
    env.filters["human_readable"] = lambda size, isbits=False, unit=None: bytes_to_human(size, isbits, unit)
    env.tests["version"] = _version
    return env


_ENV = _environment()


def _text(result, key):
    return str((result or {}).get(key) or "")


def _rc(result):
    """A command probe's exit status; a probe that did not run at all counts as failed."""
    rc = (result or {}).get("rc")
    return rc if isinstance(rc, int) else 1


def _sections(text):
    """Output up to the first marker, then each '--- <name> [<key>]' part: {(name, key): [lines]}."""
    out = {("head", None): []}
    current = out[("head", None)]
    for line in text.splitlines():
        match = SECTION.match(line)
        if match:
            current = out.setdefault((match.group(1), match.group(2)), [])
        else:
            current.append(line)
    return out


def _csv_rows(lines):
    """nvidia-smi's `--format=csv,noheader` lines -> [[field, ...]], blank lines skipped."""
    return [[field.strip() for field in line.split(",")] for line in lines if line]


def _owner(cgroup_lines, unit_cgroup, container_id):
    """Who runs a process, from its /proc/<pid>/cgroup: the unit, its container, or someone else.

    A process belongs to the rank when one of its cgroups is the unit's (or below
    it), or names the full ID of the unit's container (dockerd starts a rank's
    processes in docker-<id>.scope, outside the unit's cgroup).
    """
    owner = "foreign"
    for line in cgroup_lines:
        parts = line.split(":", 2)
        if len(parts) < 3 or not parts[2]:
            continue
        path = parts[2]
        if unit_cgroup and (path == unit_cgroup or path.startswith(unit_cgroup + "/")):
            owner = "unit"
        elif container_id and container_id in path:
            owner = "container"
    # The unified (cgroup v2) path is the one that names a unit or a container scope.
    unified = next((line[3:] for line in cgroup_lines if line.startswith("0::")), "")
    return owner, unified or "-"


def _gpu(result, server):
    rc = _rc(result)
    states = {0: "ok", RC_NOT_FOUND: "missing", SMI_RC_NO_DRIVER: "no-driver", SMI_RC_NO_DEVICES: "no-device"}
    parts = _sections(_text(result, "stdout")) if rc == 0 else {}
    apps = _csv_rows(parts.get(("apps", None), []))
    owners = {}
    for (name, pid), lines in parts.items():
        if name == "gone":
            owners[pid] = [pid, "gone", "-"]
        elif name == "cgroup":
            unit_cgroup = server["cgroup"] if server["active"] else ""
            container_id = server["container_id"] if server["active"] else ""
            owners[pid] = [pid, *_owner(lines, unit_cgroup, container_id)]
    return {
        "state": states.get(rc, "other"),
        "rc": rc,
        "stdout": _text(result, "stdout"),
        "stderr": _text(result, "stderr"),
        "rows": _csv_rows(parts.get(("head", None), [])),
        "apps": apps,
        # pid -> [pid, owner (unit, container, foreign or gone), unified cgroup path].
        "owners": owners,
        "rank_pids": [pid for pid, owner, dummy in owners.values() if owner in ("unit", "container")],
    }


def _docker(result):
    rc = _rc(result)
    stderr = _text(result, "stderr")
    runtimes = {}
    if rc == 0:
        try:
            runtimes = json.loads("\n".join(_sections(_text(result, "stdout"))[("head", None)]) or "{}")
        except ValueError:
            runtimes = {}
    if rc == RC_NOT_FOUND:
        state = "missing"
    elif "Cannot connect to the Docker daemon" in stderr:
        state = "unreachable"
    elif rc != 0:
        state = "other"
    else:
        state = "ok"
    return {"state": state, "rc": rc, "stderr": stderr, "runtimes": runtimes if isinstance(runtimes, dict) else {}}


def _meminfo_kib(text, field):
    """A /proc/meminfo figure in kB, None when the kernel does not report it."""
    match = re.search(rf"^{field}:\s+(\d+)", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _meminfo_mib(text, field):
    return (_meminfo_kib(text, field) or 0) // 1024


def _cmdline_value(cmdline, name):
    """A kernel command-line parameter as the setup module's proc_cmdline gives it (a list when given twice:
    the kernel obeys the last), "" when absent."""
    value = (cmdline or {}).get(name, "")
    if isinstance(value, list):
        value = value[-1] if value else ""
    return "" if value is True else str(value)


def _disk(result):
    """`df -B1 --output=avail,target` (a header, then the filesystem), then the bytes already present.

    When the probe failed part-way, the filesystem is still named if df printed it.
    """
    lines = _text(result, "stdout").splitlines()
    df = lines[1].split(None, 1) if len(lines) > 1 else []
    ok = _rc(result) == 0 and len(df) == 2 and df[0].isdigit() and len(lines) > 2 and lines[2].strip().isdigit()
    return {
        "rc": 0 if ok else (_rc(result) or 1),
        "stderr": _text(result, "stderr"),
        "avail": int(df[0]) if ok else 0,
        "mount": df[1].strip() if len(df) == 2 else "?",
        "present": int(lines[2]) if ok else 0,
    }


def _decoded(result):
    content = (result or {}).get("content")
    return base64.b64decode(content).decode("utf-8", errors="replace") if content else ""


def preflight_facts(probes):
    """The registered probe results of one node -> the facts the check table reads.

    probes: {facts: {architecture, distribution, distribution_version} (setup),
             unit: {status: {ActiveState, ControlGroup}} (the probe module's, in systemd_service's shape),
             container: {name, id} of the unit's container (id "" if none),
             gpu, docker, disk: command results, meminfo: slurp result, netdevs: find result,
             checkpoints: {here, beside} (the probe module's records beside the model directory),
             links: {interface: {up, carrier, operstate}} of the fabric ports,
             peer_links: {peer host of this run: its links}}
    """
    status = (probes.get("unit") or {}).get("status") or {}
    container = probes.get("container") or {}
    server = {
        "active": status.get("ActiveState") == "active",
        "cgroup": status.get("ControlGroup") or "",
        "container_name": str(container.get("name") or ""),
        "container_id": str(container.get("id") or ""),
    }
    setup = probes.get("facts") or {}
    meminfo = _decoded(probes.get("meminfo"))
    links = probes.get("links") or {}
    return {
        "arch": setup.get("architecture", ""),
        "distribution": setup.get("distribution", ""),
        "distribution_version": setup.get("distribution_version", ""),
        "kernel": str(setup.get("kernel") or ""),
        "kho": _cmdline_value(setup.get("proc_cmdline"), "kho"),
        # The contiguous memory allocator's figures (kB; None on a kernel built without it).
        "cma": {"total_kib": _meminfo_kib(meminfo, "CmaTotal"), "free_kib": _meminfo_kib(meminfo, "CmaFree")},
        "server": server,
        "gpu": _gpu(probes.get("gpu"), server),
        "docker": _docker(probes.get("docker")),
        "memory": {"available_mib": _meminfo_mib(meminfo, "MemAvailable"), "swap_mib": _meminfo_mib(meminfo, "SwapTotal")},
        "disk": _disk(probes.get("disk")),
        # The checkpoint records beside the model directory: its own (None without one) and the other builds'.
        "checkpoint_here": ((probes.get("checkpoints") or {}).get("here") or None),
        "checkpoints_beside": list((probes.get("checkpoints") or {}).get("beside") or []),
        "netdevs": sorted(f["path"].rsplit("/", 1)[-1] for f in (probes.get("netdevs") or {}).get("files") or []),
        # The fabric ports' link state: down (administratively), or up without carrier.
        "links": links,
        "fabric_down": sorted(name for name, link in links.items() if not link.get("up")),
        "fabric_no_carrier": sorted(name for name, link in links.items() if link.get("up") and link.get("carrier") is False),
        # The peers of this run whose fabric port is down: they explain this node's missing carrier.
        "peers_down": sorted(host for host, peer in (probes.get("peer_links") or {}).items()
                             if any(not link.get("up") for link in (peer or {}).values())),
    }


def _render(template, context):
    return _ENV.from_string(str(template)).render(context)


def _holds(condition, context):
    """A `when`: one expression, or a list that must all hold (as in a task)."""
    conditions = condition if isinstance(condition, list) else [condition]
    return all(_ENV.compile_expression(str(c), undefined_to_none=False)(context) for c in conditions)


def preflight_findings(probes, checks, settings):
    """One node's findings, in table order: [{check, severity, problem, fix}].

    checks: the table, [{check, severity, when, problem, fix, vars (optional)}];
    settings: the role's variables the table names (preflight_*), by name.
    """
    facts = preflight_facts(probes)
    found = []
    for entry in checks:
        context = {**settings, **facts}
        for name, expression in (entry.get("vars") or {}).items():
            context[name] = _ENV.compile_expression(str(expression), undefined_to_none=False)(context)
        if not _holds(entry["when"], context):
            continue
        severity = _render(entry["severity"], context).strip()
        if severity not in SEVERITIES:
            raise ValueError(f"preflight check {entry['check']}: severity {severity!r} is not one of {SEVERITIES}")
        found.append({
            "check": entry["check"],
            "severity": severity,
            "problem": _render(entry["problem"], context),
            "fix": _render(entry["fix"], context),
        })
    return found


def preflight_platform(probes):
    """What the summary records of one node: its running kernel and NVIDIA driver ("" when unknown)."""
    facts = preflight_facts(probes)
    drivers = sorted({row[3] for row in facts["gpu"]["rows"] if len(row) > 3})
    return {"kernel": facts["kernel"], "driver": ", ".join(drivers)}


class FilterModule:
    def filters(self):
        return {"preflight_findings": preflight_findings, "preflight_platform": preflight_platform}

"""What the collection's modules read on a node - files, systemd units, command output - read and parsed once.

Each probe reports a file the way the role comparing it needs (the firewall's and the monitoring's as
`type`/`checksum`, the server's and the supervisor's as `exists`/`isdir`/`sha1`); what they read is the
same, and is read here: the mode, the owner and group by name, and the SHA-1 Ansible's file modules compare.
A unit's properties come from `systemctl show`, parsed here for the probes and the doctor alike.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import stat

# The options of a probe that reads files and units (documented by the doc fragment
# dgx_spark.llm_serving.paths_and_units).
PATHS_AND_UNITS = {
    "paths": {"type": "list", "elements": "str", "default": []},
    "units": {"type": "list", "elements": "str", "default": []},
}


def read_bytes(path: str) -> bytes | None:
    """A file's content; None where there is none to read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def owner_and_group(st: os.stat_result) -> tuple[str, str]:
    """The names of a file's owner and group; the number where the name is unknown on this node."""
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return owner, group


def sha1_of(path: str) -> str:
    """The SHA-1 of a file's content (the checksum the copy and template modules compare); '' if unreadable."""
    digest = hashlib.sha1()  # noqa: S324 - the checksum Ansible's file modules compare, not a secret
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return ""
    return digest.hexdigest()


def path_facts(path: str, *, follow_symlinks: bool = True, checksum: bool = True) -> dict | None:
    """None where nothing is; else kind ('file', 'directory' or 'other'), mode ('0644'), owner, group and,
    for a regular file when `checksum`, its sha1. Never the content.

    `path` may start with ~ or ~user, as a role names a user's file (the fabric's authorized_keys): the probes
    answer keyed by the names the role gave, so they expand nothing themselves."""
    path = os.path.expanduser(path)
    try:
        st = os.stat(path) if follow_symlinks else os.lstat(path)
    except OSError:
        return None
    kind = "file" if stat.S_ISREG(st.st_mode) else "directory" if stat.S_ISDIR(st.st_mode) else "other"
    owner, group = owner_and_group(st)
    facts = {"kind": kind, "mode": f"{stat.S_IMODE(st.st_mode):04o}", "owner": owner, "group": group}
    if checksum and kind == "file":
        facts["sha1"] = sha1_of(path)
    return facts


def drift_facts(path: str) -> dict:
    """The firewall's and the monitoring's shape, what their drift checks compare, the link itself for a
    symlink: type, owner, group, mode and (files) checksum; {"type": "absent"} where nothing is."""
    facts = path_facts(path, follow_symlinks=False)
    if facts is None:
        return {"type": "absent"}
    info = {"type": facts["kind"], "owner": facts["owner"], "group": facts["group"], "mode": facts["mode"]}
    if facts["kind"] == "file":
        info["checksum"] = facts["sha1"]
    return info


def drift_of_paths_and_units(probe: dict, want: dict) -> list[str]:
    """What differs between a probe's `paths` and `units` (drift_facts, unit_states) and what a role installs:
    `want` lists paths ({path, type (default file), owner, group, mode, checksum}; an empty value is not
    compared) and units that must be active and enabled. The controller's filters call this on the probe's
    result; one line a difference, for the run's output."""
    drift = []
    paths = probe.get("paths") or {}
    for item in want.get("paths") or []:
        have = paths.get(item["path"]) or {"type": "absent"}
        if have.get("type") != item.get("type", "file"):
            drift.append(f"{item['path']}: {have.get('type')}, not a {item.get('type', 'file')}")
            continue
        for key in ("owner", "group", "mode", "checksum"):
            if item.get(key) not in (None, "") and str(have.get(key)) != str(item[key]):
                drift.append(f"{item['path']}: {key} differs" if key == "checksum"
                             else f"{item['path']}: {key} {have.get(key)}, not {item[key]}")
    units = probe.get("units") or {}
    for name in want.get("units") or []:
        state = units.get(name) or {}
        if state.get("active") != "active":
            drift.append(f"{name} not active ({state.get('active') or 'unknown'})")
        if state.get("enabled") != "enabled":
            drift.append(f"{name} not enabled ({state.get('enabled') or 'no unit file'})")
    return drift


def exists_facts(path: str, with_sum: bool = True) -> dict:
    """The server's and the supervisor's shape: exists, isdir, mode, owner, group and (files) sha1."""
    facts = path_facts(path, checksum=with_sum)
    if facts is None:
        return {"exists": False}
    out = {"exists": True, "isdir": facts["kind"] == "directory", "mode": facts["mode"], "owner": facts["owner"],
           "group": facts["group"]}
    if "sha1" in facts:
        out["sha1"] = facts["sha1"]
    return out


def parse_show(text: str) -> dict[str, str]:
    """One unit's `systemctl show` output -> {property: value}; an Exec* value in braces may span lines (as the
    systemd module parses it)."""
    parsed, multival, key = {}, [], None
    for line in text.splitlines():
        if key is None:
            if "=" in line:
                key, value = line.split("=", 1)
                if key.startswith("Exec") and value.lstrip().startswith("{") and not value.rstrip().endswith("}"):
                    multival.append(value)
                    continue
                parsed[key] = value.strip()
                key = None
        else:
            multival.append(line)
            if line.rstrip().endswith("}"):
                parsed[key] = "\n".join(multival).strip()
                multival, key = [], None
    return parsed


def unit_properties(module, names: list[str], properties: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """The `properties` of each unit from one `systemctl show`; empty strings where systemd gives none (no
    systemctl, or it failed)."""
    found = {name: dict.fromkeys(properties, "") for name in names}
    systemctl = module.get_bin_path("systemctl")
    if not names or not systemctl:
        return found
    rc, out, _err = module.run_command([systemctl, "show", "--property=" + ",".join(("Id", *properties)), "--", *names])
    if rc != 0:
        return found
    # One block per unit, in the order asked, separated by an empty line.
    blocks = [b for b in out.strip().split("\n\n") if b.strip()]
    for name, block in zip(names, blocks, strict=False):
        props = parse_show(block)
        found[name] = {key: props.get(key, "") for key in properties}
    return found


def unit_states(module, names: list[str]) -> dict[str, dict[str, str]]:
    """Each unit's ActiveState and UnitFileState, as {"active", "enabled"}."""
    return {name: {"active": props["ActiveState"], "enabled": props["UnitFileState"]}
            for name, props in unit_properties(module, names, ("ActiveState", "UnitFileState")).items()}

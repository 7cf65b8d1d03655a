"""What the collection's read-only probes learn about a node's files and units, in one place.

Each probe reports a file the way the role comparing it needs (the firewall's and the monitoring's as
`type`/`checksum`, the server's and the supervisor's as `exists`/`isdir`/`sha1`); what they read is the
same, and is read here: the mode, the owner and group by name, and the SHA-1 Ansible's file modules compare.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import stat


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
    for a regular file when `checksum`, its sha1. Never the content."""
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


def unit_states(module, names: list[str]) -> dict[str, dict[str, str]]:
    """Each unit's ActiveState and UnitFileState from one `systemctl show`; empty strings where systemd
    gives none (no systemctl, or it failed)."""
    states = {name: {"active": "", "enabled": ""} for name in names}
    systemctl = module.get_bin_path("systemctl")
    if not names or not systemctl:
        return states
    rc, out, _err = module.run_command([systemctl, "show", "--property=Id,ActiveState,UnitFileState", "--", *names])
    if rc != 0:
        return states
    # One block per unit, in the order asked, separated by an empty line.
    blocks = [b for b in out.strip().split("\n\n") if b.strip()]
    for name, block in zip(names, blocks, strict=False):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        states[name] = {"active": props.get("ActiveState", ""), "enabled": props.get("UnitFileState", "")}
    return states

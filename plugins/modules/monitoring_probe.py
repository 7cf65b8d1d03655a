#!/usr/bin/python
"""Read what the monitoring role owns on a node, in one round trip, changing nothing."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: monitoring_probe
short_description: Read the monitoring packages, files and units of a node
description:
  - For the monitoring role's internal use; options and return values may change with the role.
  - Reads, before the role changes anything, which of O(packages) dpkg holds installed, the type,
    owner, group, mode and SHA-1 of each of O(paths) (as the copy and template modules compute it),
    and the state of each of O(units), so that the role can skip its installation when all of it
    is what it would install.
version_added: "1.3.0"
author: spark-deploy maintainers
options:
  packages:
    description: Debian packages to look up.
    type: list
    elements: str
    default: []
  paths:
    description: Files and directories to read.
    type: list
    elements: str
    default: []
  units:
    description: systemd units whose state to read.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads only; it runs the same in check mode.
  diff_mode:
    support: N/A
    details: Never changes anything.
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Read the node
  monitoring_probe:
    packages: [prometheus-node-exporter]
    paths: [/etc/systemd/journald.conf.d/60-sglang-monitoring.conf]
    units: [prometheus-node-exporter.service]
  register: __monitoring_probe
"""

RETURN = r"""
packages:
  description: Each of O(packages) with whether dpkg holds it installed (status C(ii)).
  returned: always
  type: dict
paths:
  description: >-
    Each of O(paths): C(type) (file, directory, other or absent), C(owner), C(group), C(mode) (four octal
    digits) and, for a file, C(checksum) (SHA-1 of its bytes).
  returned: always
  type: dict
units:
  description: Each of O(units) with C(active) (ActiveState) and C(enabled) (UnitFileState, empty without a unit file).
  returned: always
  type: dict
"""

import grp
import hashlib
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule


def read_packages(module, names):
    found = dict.fromkeys(names, False)
    dpkg = module.get_bin_path("dpkg-query")
    if not names or not dpkg:
        return found
    # rc 1 only says that some name is unknown to dpkg: the others are still listed.
    _rc, out, _err = module.run_command([dpkg, "--show", "--showformat=${Package} ${db:Status-Abbrev}\n", *names])
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] in found:
            found[fields[0]] = fields[1].startswith("ii")
    return found


def _name(lookup, ident):
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


def read_path(path):
    try:
        st = os.lstat(path)
    except OSError:
        return {"type": "absent"}
    kind = "file" if stat.S_ISREG(st.st_mode) else "directory" if stat.S_ISDIR(st.st_mode) else "other"
    info = {"type": kind, "owner": _name(pwd.getpwuid, st.st_uid), "group": _name(grp.getgrgid, st.st_gid),
            "mode": f"{stat.S_IMODE(st.st_mode):04o}"}
    if kind == "file":
        digest = hashlib.sha1()  # noqa: S324 - the checksum the copy and template modules compare
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 16), b""):
                    digest.update(block)
            info["checksum"] = digest.hexdigest()
        except OSError:
            info["checksum"] = ""
    return info


def read_units(module, names):
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


def main():
    module = AnsibleModule(argument_spec={
        "packages": {"type": "list", "elements": "str", "default": []},
        "paths": {"type": "list", "elements": "str", "default": []},
        "units": {"type": "list", "elements": "str", "default": []},
    }, supports_check_mode=True)
    params = module.params
    module.exit_json(changed=False, packages=read_packages(module, params["packages"]),
                     paths={p: read_path(p) for p in params["paths"]}, units=read_units(module, params["units"]))


if __name__ == "__main__":
    main()

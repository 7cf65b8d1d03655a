#!/usr/bin/python
"""Read what the firewall role needs from a node, in one round trip, changing nothing."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: firewall_probe
short_description: Read a node's addresses, the controller's SSH session and the firewall table
description:
  - For the firewall role's internal use; options and return values may change with the role.
  - Reads, before the role changes anything, every interface's addresses (the head's management
    subnet is the default client range), the SSH session the module runs in as the node sees it
    (the controller's address), the kernel's ephemeral port range (where listeners on random ports
    are), whether C(nft) is installed and whether the role's table is loaded.
  - Reads also, where asked, the type, owner, group, mode and SHA-1 of O(paths) (the rules file and the unit, as the
    template module computes the checksum) and the state of O(units), so that the role can skip its installation
    when the node holds what it would install.
  - The SSH session is read from the module's environment, or, where C(become) reset it, from the
    nearest ancestor process's (the login shell that sshd started).
version_added: "1.2.0"
author: LLM serving maintainers (@dgx-spark)
options:
  table:
    description: The table to look for, as C(family name).
    type: str
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - dgx_spark.llm_serving.read_only
  - dgx_spark.llm_serving.paths_and_units
"""

EXAMPLES = r"""
- name: Read the node
  dgx_spark.llm_serving.firewall_probe:
    table: inet spark_llm_guard
  register: __firewall_probe
"""

RETURN = r"""
addrs:
  description: C(ip -j addr show) (every interface); empty when it cannot be read.
  returned: always
  type: list
  elements: dict
ssh_connection:
  description: C(SSH_CONNECTION) of the session (client address, port, server address, port); empty without SSH.
  returned: always
  type: str
local_ports:
  description: C(net.ipv4.ip_local_port_range) as read (two numbers), empty when it cannot be read.
  returned: always
  type: str
nft:
  description: The path of C(nft), empty when it is not installed.
  returned: always
  type: str
table_loaded:
  description: Whether O(table) is in the running ruleset.
  returned: always
  type: bool
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

import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_reads import PATHS_AND_UNITS, drift_facts, unit_states


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(p.decode("utf-8", "replace").split("=", 1) for p in pairs if b"=" in p)


def _parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def ssh_connection():
    """SSH_CONNECTION of this process, or of its nearest ancestor that has it (sudo resets the environment)."""
    if os.environ.get("SSH_CONNECTION"):
        return os.environ["SSH_CONNECTION"]
    pid = os.getppid()
    for _hop in range(16):
        if pid <= 1:
            break
        value = _environ(pid).get("SSH_CONNECTION")
        if value:
            return value
        pid = _parent(pid)
    return ""


def main():
    module = AnsibleModule(argument_spec={
        "table": {"type": "str", "required": True},
        **PATHS_AND_UNITS,
    }, supports_check_mode=True)
    addrs = []
    ip = module.get_bin_path("ip")
    if ip:
        rc, out, _err = module.run_command([ip, "-j", "addr", "show"])
        if rc == 0:
            try:
                addrs = json.loads(out or "[]")
            except ValueError:
                addrs = []
    nft = module.get_bin_path("nft") or shutil.which("nft", path="/usr/sbin:/sbin") or ""
    loaded = False
    if nft:
        rc, _out, _err = module.run_command([nft, "list", "table", *module.params["table"].split()])
        loaded = rc == 0
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            local_ports = f.read().strip()
    except OSError:
        local_ports = ""
    module.exit_json(changed=False, addrs=addrs, ssh_connection=ssh_connection(), local_ports=local_ports, nft=nft,
                     table_loaded=loaded, paths={p: drift_facts(p) for p in module.params["paths"]},
                     units=unit_states(module, module.params["units"]))


if __name__ == "__main__":
    main()

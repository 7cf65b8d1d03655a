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
author: LLM serving maintainers (@dgx-spark)
options:
  packages:
    description: Debian packages to look up.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - dgx_spark.llm_serving.read_only
  - dgx_spark.llm_serving.paths_and_units
"""

EXAMPLES = r"""
- name: Read the node
  dgx_spark.llm_serving.monitoring_probe:
    packages: [prometheus-node-exporter]
    paths: [/etc/systemd/journald.conf.d/60-spark-llm-monitoring.conf]
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


from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_reads import PATHS_AND_UNITS, drift_facts, unit_states


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


def main():
    module = AnsibleModule(argument_spec={
        "packages": {"type": "list", "elements": "str", "default": []},
        **PATHS_AND_UNITS,
    }, supports_check_mode=True)
    params = module.params
    module.exit_json(changed=False, packages=read_packages(module, params["packages"]),
                     paths={p: drift_facts(p) for p in params["paths"]}, units=unit_states(module, params["units"]))


if __name__ == "__main__":
    main()

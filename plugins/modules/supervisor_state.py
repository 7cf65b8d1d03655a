#!/usr/bin/python
"""Read, in one pass, what the supervisor role installed on the head and whether its unit runs."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: supervisor_state
short_description: Read the supervisor's files and unit state in one pass
description:
  - For the supervisor role's internal use; options and return values may change with the role.
  - Per path of O(paths) whether it exists, its SHA-1 (files), mode, owner and group; the unit's
    C(ActiveState) and C(UnitFileState). Never returns a file's content. Reads only, in check mode too.
version_added: "1.4.0"
author: LLM serving maintainers (@dgx-spark)
options:
  paths:
    description: Files and directories to describe.
    type: list
    elements: path
    required: true
  unit:
    description: The supervisor's systemd unit.
    type: str
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads only.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Read the supervisor on the head
  dgx_spark.llm_serving.supervisor_state:
    paths: [/usr/local/lib/spark-llm-supervisor, /etc/spark-llm/supervisor.json]
    unit: spark-llm-supervisor.service
"""

RETURN = r"""
paths:
  description: Per path C(exists), C(isdir), C(sha1) (files), C(mode) ('0644'), C(owner), C(group).
  returned: always
  type: dict
unit:
  description: The unit's C(ActiveState) and C(UnitFileState).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_reads import exists_facts as describe
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_reads import unit_properties


def main():
    module = AnsibleModule(
        argument_spec={"paths": {"type": "list", "elements": "path", "required": True},
                       "unit": {"type": "str", "required": True}},
        supports_check_mode=True,
    )
    unit = module.params["unit"]
    module.exit_json(changed=False, paths={path: describe(path) for path in module.params["paths"]},
                     unit=unit_properties(module, [unit], ("ActiveState", "UnitFileState"))[unit])


if __name__ == "__main__":
    main()

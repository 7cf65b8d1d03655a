#!/usr/bin/python
"""The documentation of the monitoring_reports action, which runs in the controller's own process
(plugins/action/monitoring_reports.py); there is no module to ship to a node."""

from __future__ import annotations

DOCUMENTATION = r"""
module: monitoring_reports
short_description: Keep only the last runs of each kind in the controller's reports directory
description:
  - For the monitoring role's internal use; options and return values may change with the role.
  - Lists O(path) on the controller and removes the reports of every run beyond the newest O(keep) of each kind in
    O(kinds). A run is every entry named C(<kind>-<UTC stamp>...) with the same kind and stamp
    (C(benchmark-<stamp>.json), C(.md) and C(.png) are one run).
  - Entries without a stamp (C(tune-record.json)) and kinds not listed are never removed.
  - Runs in the controller's own process (an action plugin); no module is sent anywhere.
options:
  path:
    description: The reports directory on the controller; a directory that does not exist holds nothing to remove.
    type: path
    required: true
  kinds:
    description: The report kinds to prune (C(verify), C(doctor), C(benchmark), ...).
    type: list
    elements: str
    default: []
  keep:
    description: How many runs of each kind to keep, the newest.
    type: int
    required: true
author: LLM serving maintainers (@dgx-spark)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Lists what it would remove (RV(removed)) and removes nothing.
  diff_mode:
    support: full
    details: Each removed report, present before and absent after.
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Keep the last 20 runs of each report kind
  dgx_spark.llm_serving.monitoring_reports:
    path: "{{ playbook_dir }}/../reports"
    kinds: [verify, doctor, benchmark]
    keep: 20
"""

RETURN = r"""
removed:
  description: The report files and directories removed (in check mode, that would be).
  returned: always
  type: list
  elements: str
"""

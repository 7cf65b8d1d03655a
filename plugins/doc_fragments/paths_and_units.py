"""The options of a probe that reports files and systemd units for its role's drift check
(plugins/module_utils/node_reads.py: PATHS_AND_UNITS, drift_facts, unit_states)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  paths:
    description:
      - Files and directories to read (a symlink itself, not what it points to).
      - Each is reported in RV(paths) by its type, owner, group, mode and, for a file, its SHA-1 checksum.
    type: list
    elements: str
    default: []
  units:
    description: systemd units whose state to read (RV(units)).
    type: list
    elements: str
    default: []
"""

"""The attributes of a module that only reads a node: the probes every role's drift check starts from."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
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

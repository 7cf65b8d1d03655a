"""The option of a module that runs the docker CLI on a node (the server role's modules)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  docker:
    description: The docker CLI.
    type: path
    default: /usr/bin/docker
"""

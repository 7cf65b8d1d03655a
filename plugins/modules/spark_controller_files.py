#!/usr/bin/python
"""Documentation of the spark_controller_files action (plugins/action/spark_controller_files.py).

The action runs in the controller's own process and never starts this file; it is here so that
`ansible-doc` documents the task's options like any module's.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: spark_controller_files
short_description: Write files on the controller, or prune what a render left, in the controller's process
description:
  - For the collection's roles (render.yml's files of each node, verify's JSON report); options and return values may
    change with the roles.
  - Writes each of O(files) into O(dest) where its content or mode differs, atomically (a temporary file beside it,
    renamed), creating O(dest) (mode 0755) when it is missing.
  - With O(prune_except), removes the subdirectories of O(dest) that hold O(prune_marker) and are not named in it.
  - Runs on the controller in the task's own process; no module interpreter is started.
version_added: "1.4.0"
author: LLM serving maintainers (@dgx-spark)
options:
  dest:
    description: The directory that receives the files (or whose subdirectories are pruned).
    type: path
    required: true
  files:
    description:
      - The files to write, each C(name) (a file name in O(dest), without a directory), C(content) and C(mode)
        (octal, written like C("0644")).
    type: list
    elements: dict
    default: []
  prune_except:
    description: The subdirectory names to keep; every other subdirectory that holds O(prune_marker) is removed.
    type: list
    elements: str
  prune_marker:
    description: The file that marks a subdirectory this action wrote; required with O(prune_except).
    type: str
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
    details: Reports what it would write or remove and writes nothing.
  diff_mode:
    support: full
    details: Each written file's content before and after; a created or removed directory's state.
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Write the node's rendered launch arguments
  dgx_spark.llm_serving.spark_controller_files:
    dest: /srv/rendered/spark-0
    files:
      - name: server-args.json
        mode: "0644"
        content: "{{ args | to_nice_json }}\n"
"""

RETURN = r"""
written:
  description: The files written (in check mode, the files that would be).
  returned: always
  type: list
  elements: str
pruned:
  description: The subdirectories removed (in check mode, the ones that would be).
  returned: always
  type: list
  elements: str
"""

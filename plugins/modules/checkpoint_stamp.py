#!/usr/bin/python
"""Report whether the verified-stamp beside a model directory vouches for it at a pinned revision."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_stamp
short_description: Report whether the verified-stamp beside a checkpoint vouches for it at a pinned revision
description:
  - For the checkpoint role's internal use, through its C(stamp) entry point (C(include_role) with
    C(tasks_from=stamp)); options and return values may change with the role.
  - Reads the verified-stamp that M(dgx_spark.llm_serving.checkpoint_verify) writes beside O(model_dir) after a passing deep
    verification (and removes after any failing check), and the checkpoint record beside it.
  - The stamp vouches when it records a deep check of O(model_dir) at O(revision) against that very
    record (same repository, revision and file list, compared through the record digest the stamp
    holds), and every file of the record is still there in the state the stamp remembers it was
    verified in (size, mtime, inode and ctime, as the role's fast verification compares them; for a
    stamp written before stamps remembered each file, a ctime older than its verified_at). One
    lstat per file; the checkpoint itself is not hashed again.
  - Never fails because of what it finds; every reason the stamp does not vouch is returned in
    RV(problems), one sentence each, naming the stamp, the record and the caller's variables.
version_added: "1.1.0"
author: LLM serving maintainers (@dgx-spark)
options:
  model_dir:
    description: Absolute path of the model directory the stamp must vouch for.
    type: path
    required: true
  revision:
    description:
      - The pinned commit (40 lowercase hex digits) the stamp must record. Anything else is reported as a
        problem, since no stamp can be matched against it.
    type: str
  stamp_path:
    description: The verified-stamp. Defaults to C(<model_dir>.verified) beside the directory.
    type: path
  record_path:
    description: The checkpoint record. Defaults to C(<model_dir>.record.json) beside the directory.
    type: path
  model_dir_variable:
    description: Name of the caller's variable that holds O(model_dir), as the problems name it.
    type: str
    default: checkpoint_model_dir
  revision_variable:
    description: Name of the caller's variable that holds O(revision), as the problems name it.
    type: str
    default: checkpoint_revision
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - dgx_spark.llm_serving.read_only
seealso:
  - module: dgx_spark.llm_serving.checkpoint_verify
    description: Writes the stamp after a passing deep verification.
"""

EXAMPLES = r"""
# From another role: the checkpoint role's entry point runs this module and
# publishes checkpoint_stamp_problems ({host: [problems]}).
- name: Ask the checkpoint role whether the stamp vouches for the model directory
  ansible.builtin.include_role:
    name: checkpoint
    tasks_from: stamp
  vars:
    checkpoint_stamp_model_dir: /opt/models/glm53
    checkpoint_stamp_revision: 0123456789abcdef0123456789abcdef01234567

# Inside the checkpoint role.
- name: Read whether the verified-stamp vouches for the checkpoint
  dgx_spark.llm_serving.checkpoint_stamp:
    model_dir: /opt/models/glm53
    revision: 0123456789abcdef0123456789abcdef01234567
    stamp_path: /opt/models/glm53.verified
    record_path: /opt/models/glm53.record.json
  register: stamp
"""

RETURN = r"""
ok:
  description: Whether the stamp vouches for O(model_dir) at O(revision).
  returned: always
  type: bool
problems:
  description: One sentence per reason the stamp does not vouch; empty when it does.
  returned: always
  type: list
  elements: str
  sample: ["the verified-stamp /opt/models/glm53.verified does not exist"]
stamp:
  description: The stamp's content when it is a JSON object, else null.
  returned: always
  type: dict
stamp_path:
  description: The stamp that was read.
  returned: always
  type: str
record_path:
  description: The record that was read.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.checkpoint_common import (
    checkpoint_paths,
    read_json,
    stamp_file_problems,
    stamp_problems,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "model_dir": {"type": "path", "required": True},
            "revision": {"type": "str"},
            "stamp_path": {"type": "path"},
            "record_path": {"type": "path"},
            "model_dir_variable": {"type": "str", "default": "checkpoint_model_dir"},
            "revision_variable": {"type": "str", "default": "checkpoint_revision"},
        },
        supports_check_mode=True,
    )
    p = module.params
    paths = checkpoint_paths(os.path.normpath(p["model_dir"]))
    stamp_path = p["stamp_path"] or paths["stamp"]
    record_path = p["record_path"] or paths["record"]
    stamp_read, record_read = read_json(stamp_path), read_json(record_path)
    problems = stamp_problems(
        stamp_read, record_read, revision=p["revision"], model_dir=p["model_dir"],
        stamp_path=stamp_path, record_path=record_path,
        model_dir_variable=p["model_dir_variable"], revision_variable=p["revision_variable"])
    stamp = stamp_read[0] if isinstance(stamp_read[0], dict) else None
    if not problems:
        # A stamp of this very record: do the files still have the state it verified them in?
        problems = stamp_file_problems(stamp, record_read[0]["files"], os.path.normpath(p["model_dir"]), stamp_path)
    module.exit_json(changed=False, ok=not problems, problems=problems, stamp=stamp,
                     stamp_path=stamp_path, record_path=record_path)


if __name__ == "__main__":
    main()

#!/usr/bin/python
"""Wait a little for an async checkpoint transfer and report its progress."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_progress
short_description: Report the progress of an async checkpoint transfer, waiting a bounded time for news
description:
  - For the checkpoint role's internal use (it follows the role's async fetch and sync); options and
    return values may change with the role.
  - Reads the progress file that M(checkpoint_fetch) or M(checkpoint_sync) writes while it runs as an
    async task, and the async job's status file, waiting up to O(wait) seconds (less if the job ends).
  - Returns a one-line summary (RV(line)) that a play prints, so a long transfer shows bytes, rate
    and ETA instead of silence. Never changes anything.
version_added: "1.0.0"
author: spark-deploy maintainers
options:
  path:
    description: Progress file.
    type: path
    required: true
  progress_id:
    description: Identifier the transfer writes into the progress file; an older file with another identifier is ignored.
    type: str
    default: ""
  jid:
    description: Async job id of the transfer (from C(ansible_job_id)).
    type: str
    required: true
  async_dir:
    description: Directory of async job status files on the node.
    type: path
    default: ~/.ansible_async
  wait:
    description: Seconds to wait before reporting, unless the job finishes earlier.
    type: int
    default: 15
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
- name: Report fetch progress
  checkpoint_progress:
    path: /opt/models/.glm53.partial/progress.json
    jid: "{{ fetch_job.ansible_job_id }}"
  register: progress
"""

RETURN = r"""
finished:
  description: Whether the async job has ended (successfully or not).
  returned: always
  type: bool
line:
  description: Human summary, e.g. "12.0 GiB / 181.0 GiB (6.6%), 9/131 files, 110.2 MiB/s, ETA 0:26:13".
  returned: always
  type: str
progress:
  description: The progress file's content, or null before the transfer has written one.
  returned: always
  type: dict
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.checkpoint_common import load_json


def job_finished(job_file: str) -> bool:
    data = load_json(job_file)
    if data is None:
        # The wrapper writes the file before the job starts; no file means it ended and was cleaned up.
        return not os.path.exists(job_file)
    return "started" not in data or bool(data.get("finished"))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "progress_id": {"type": "str", "default": ""},
            "jid": {"type": "str", "required": True},
            "async_dir": {"type": "path", "default": "~/.ansible_async"},
            "wait": {"type": "int", "default": 15},
        },
        supports_check_mode=True,
    )
    p = module.params
    job_file = os.path.join(os.path.expanduser(p["async_dir"]), p["jid"])
    deadline = time.monotonic() + max(0, p["wait"])
    finished = job_finished(job_file)
    while not finished and time.monotonic() < deadline:
        time.sleep(0.5)
        finished = job_finished(job_file)
    progress = load_json(p["path"])
    if not isinstance(progress, dict) or progress.get("id") != p["progress_id"]:
        progress = None
    if progress is None:
        line = "finished" if finished else "starting"
    else:
        line = progress.get("line", "")
    module.exit_json(changed=False, finished=finished, line=line, progress=progress)


if __name__ == "__main__":
    main()

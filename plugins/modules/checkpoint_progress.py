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
  - Reads the progress file that M(dgx_spark.llm_serving.checkpoint_fetch) or
    M(dgx_spark.llm_serving.checkpoint_sync) writes while it runs as an async task, and the async job's
    status file, waiting up to O(wait) seconds (less if the job ends).
  - Returns a one-line summary (RV(line)) that a play prints, so a long transfer shows bytes, rate
    and ETA instead of silence. Never changes anything.
  - While the transfer waits for one that an earlier (interrupted) run left running, shows that one's
    progress, read through the transfer lock O(lock_path).
  - Tells how the transfer ended (RV(outcome)). A transfer killed before it could report (the OOM
    killer, a kill -9; Ansible's async wrapper then holds no result but a JSON parse error) or
    stopped at the async time limit is reported as such, with RV(message) saying that a run again
    resumes from the bytes on disk, and how many.
version_added: "1.0.0"
author: LLM serving maintainers (@dgx-spark)
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
  lock_path:
    description:
      - The transfer's lock file (M(dgx_spark.llm_serving.checkpoint_fetch)'s C(fetch.lock)). While the transfer waits for an
        earlier one, that one's progress is shown; a lock nobody holds behind a progress file that still
        says running means the transfer was killed.
    type: path
  partial_dir:
    description: Directory whose C(*.part) files a killed transfer resumes from (counted in RV(message)).
    type: path
  what:
    description: What the transfer is called in RV(message).
    type: str
    default: transfer
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - dgx_spark.llm_serving.read_only
"""

EXAMPLES = r"""
- name: Report fetch progress
  dgx_spark.llm_serving.checkpoint_progress:
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
outcome:
  description:
    - C(running); C(ended) (the module reported, successfully or not, and the job's result says which);
      C(killed) (it died without reporting); C(timeout) (stopped at the async time limit).
  returned: always
  type: str
bytes_on_disk:
  description: For a killed or stopped transfer, the bytes it left on disk (complete files and partial files).
  returned: always
  type: int
message:
  description: For a killed or stopped transfer, what happened and that a run again resumes; empty otherwise.
  returned: always
  type: str
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.checkpoint_common import (
    human_bytes,
    load_json,
    lock_state,
    partial_bytes,
)

# Ansible's async wrapper writes this when the module printed nothing: it died before reporting.
NO_RESULT = "No start of json char found"


def job_state(job_file: str) -> tuple[bool, dict | None]:
    """(finished, the job file's content)."""
    data = load_json(job_file)
    if data is None:
        # The wrapper writes the file before the job starts; no file means it ended and was cleaned up.
        return not os.path.exists(job_file), None
    return "started" not in data or bool(data.get("finished")), data


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "progress_id": {"type": "str", "default": ""},
            "jid": {"type": "str", "required": True},
            "async_dir": {"type": "path", "default": "~/.ansible_async"},
            "wait": {"type": "int", "default": 15},
            "lock_path": {"type": "path"},
            "partial_dir": {"type": "path"},
            "what": {"type": "str", "default": "transfer"},
        },
        supports_check_mode=True,
    )
    p = module.params
    job_file = os.path.join(p["async_dir"], p["jid"])

    def ours() -> dict | None:
        data = load_json(p["path"])
        return data if isinstance(data, dict) and data.get("id") == p["progress_id"] else None

    def died_silently(progress: dict | None) -> bool:
        """Our transfer said it was running, and nobody holds its lock: its process is gone."""
        if not p["lock_path"] or progress is None or progress.get("state") != "running":
            return False
        held, _info = lock_state(p["lock_path"])
        return not held

    deadline = time.monotonic() + max(0, p["wait"])
    finished, job = job_state(job_file)
    while not finished and time.monotonic() < deadline and not died_silently(ours()):
        time.sleep(0.5)
        finished, job = job_state(job_file)
    progress = ours()

    outcome = "ended" if finished else "running"
    msg = str((job or {}).get("msg", ""))
    if finished and NO_RESULT in msg:
        outcome = "killed"
    elif finished and msg == "Timeout exceeded":
        outcome = "timeout"
    elif died_silently(progress):
        outcome = "killed"
        finished = True

    if progress is not None:
        line = progress.get("line", "")
    elif finished:
        line = "finished"
    else:
        line = "starting"
        if p["lock_path"]:
            held, info = lock_state(p["lock_path"])
            if held and isinstance(info, dict) and info.get("state") == "running" \
                    and info.get("progress_id") != p["progress_id"]:
                theirs = load_json(info.get("progress_path") or p["path"])
                their_line = theirs.get("line", "starting") if isinstance(theirs, dict) \
                    and theirs.get("id") == info.get("progress_id") else "starting"
                line = (f"waiting for the {p['what']} that an earlier run started (pid {info.get('pid')}, "
                        f"{info.get('started_at', '?')}) and left running: {their_line}")

    bytes_on_disk = 0
    message = ""
    if outcome in ("killed", "timeout"):
        complete = int((progress or {}).get("completed_bytes", 0) or 0)
        partial = partial_bytes(p["partial_dir"]) if p["partial_dir"] else 0
        bytes_on_disk = complete + partial if p["partial_dir"] else int((progress or {}).get("done_bytes", 0) or 0)
        pid = (progress or {}).get("pid", "?")
        if outcome == "killed":
            cause = (f"the {p['what']} (pid {pid}) was killed before it could report: by a signal it cannot catch "
                     "(the OOM killer, a kill -9) or a reboot")
        else:
            cause = (f"the {p['what']} (pid {pid}) was stopped at checkpoint_transfer_timeout (Ansible's async limit); "
                     "raise it if the link is this slow")
        files = ""
        if progress is not None and progress.get("files_total"):
            files = f", {progress.get('files_done', 0)} of {progress.get('files_total')} files complete"
        message = (f"{cause}. Complete files and partial bytes are kept: run again: it resumes from the "
                   f"{bytes_on_disk} bytes on disk ({human_bytes(bytes_on_disk)}{files}).")
        line = f"{outcome}: {line}"
    module.exit_json(changed=False, finished=finished, line=line, progress=progress, outcome=outcome,
                     bytes_on_disk=bytes_on_disk, message=message)


if __name__ == "__main__":
    main()

#!/usr/bin/python
"""Copy checkpoint files from this node to another over rsync, in parallel streams."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_sync
short_description: Push checkpoint files to another node with parallel, resumable rsync streams
description:
  - For the checkpoint role's internal use (its sync step); options and return values may change with
    the role.
  - Runs on the node that holds a verified checkpoint (the head) and pushes the listed O(files) to
    O(dest_host) over SSH, splitting them into O(streams) disjoint subsets balanced by size, one
    rsync process each, so the copy approaches link or disk speed rather than one SSH stream's
    cipher speed.
  - Resumable. An interrupted file is kept in O(partial_dir) on the destination and used as the
    basis of the next attempt. A complete destination file is only replaced by a complete new one
    (rsync renames into place). Nothing is deleted on the destination.
  - The listed files are always compared in full, whatever their size and modification time, because
    the list is what verification found missing or bad.
  - Writes live progress (bytes, rate, ETA) to O(progress_path) on this node once a second.
version_added: "1.0.0"
author: spark-deploy maintainers
options:
  src_dir:
    description: Local checkpoint directory.
    type: path
    required: true
  dest_host:
    description: Address of the destination (its fabric address).
    type: str
    required: true
  dest_user:
    description: SSH user on the destination.
    type: str
    default: root
  dest_dir:
    description: Checkpoint directory on the destination; its parent must exist.
    type: path
    required: true
  files:
    description: Paths relative to O(src_dir) to send. An empty list does nothing.
    type: list
    elements: str
    required: true
  streams:
    description: Parallel rsync processes.
    type: int
    default: 4
  ssh_command:
    description: Remote shell given to rsync C(-e) (options such as the cipher or the identity file go here).
    type: str
    default: ssh -o BatchMode=yes
  rsync_path:
    description: Local rsync binary.
    type: str
    default: rsync
  partial_dir:
    description: Absolute directory on the destination for partial files. Defaults to C(<parent>/.<name>.partial/rsync).
    type: path
  extra_args:
    description: More rsync arguments, appended as given.
    type: list
    elements: str
    default: []
  progress_path:
    description: JSON progress file on this node.
    type: path
  progress_id:
    description: Identifier written into the progress file so a poller can tell this run from an earlier one.
    type: str
    default: ""
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports what would be sent (RV(sent)) and sends nothing.
  diff_mode:
    support: none
  platform:
    platforms: posix
requirements:
  - rsync on both nodes; SSH from this node to O(dest_user)@O(dest_host) without a password prompt.
"""

EXAMPLES = r"""
- name: Send the files the worker lacks
  checkpoint_sync:
    src_dir: /opt/models/glm53
    dest_host: 192.168.100.11
    dest_dir: /opt/models/glm53
    files: "{{ worker_verify.refetch }}"
    streams: 8
  delegate_to: spark-0
"""

RETURN = r"""
sent:
  description: Files handed to rsync.
  returned: always
  type: list
  elements: str
transferred_files:
  description: Regular files rsync reports as transferred.
  returned: always
  type: int
bytes_sent:
  description: Bytes rsync sent over the wire, all streams.
  returned: always
  type: int
seconds:
  description: Wall time.
  returned: always
  type: float
streams:
  description: Per stream, its files count, bytes and rsync exit code.
  returned: always
  type: list
  elements: dict
"""

import os
import re
import shlex
import subprocess
import tempfile
import threading
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.checkpoint_common import (
    Rate,
    checkpoint_paths,
    progress_line,
    safe_relpath,
    write_progress,
)

PROGRESS_RE = re.compile(rb"^\s*([\d,]+)\s+\d+%")
STAT_FILES_RE = re.compile(r"Number of regular files transferred:\s*([\d,]+)")
STAT_SENT_RE = re.compile(r"Total bytes sent:\s*([\d,]+)")


def split_balanced(files: list[str], sizes: dict[str, int], n: int) -> list[list[str]]:
    """Largest first onto the lightest bin: disjoint subsets of near-equal bytes."""
    bins: list[tuple[int, list[str]]] = [(0, []) for _ in range(max(1, min(n, len(files))))]
    for name in sorted(files, key=lambda f: -sizes[f]):
        i = min(range(len(bins)), key=lambda k: bins[k][0])
        bins[i] = (bins[i][0] + sizes[name], bins[i][1] + [name])
    return [b[1] for b in bins if b[1]]


class Stream:
    def __init__(self, argv: list[str], files: list[str]):
        self.argv = argv
        self.files = files
        self.done = 0
        self.out = bytearray()
        self.proc: subprocess.Popen | None = None
        self.rc: int | None = None
        self.stderr = b""

    def run(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        err_chunks = []
        t = threading.Thread(target=lambda: err_chunks.append(self.proc.stderr.read()), daemon=True)
        t.start()
        buf = b""
        while chunk := self.proc.stdout.read1(65536):
            self.out += chunk
            buf += chunk
            *lines, buf = re.split(rb"[\r\n]", buf)
            for line in lines:
                m = PROGRESS_RE.match(line)
                if m:
                    self.done = int(m.group(1).replace(b",", b""))
        self.rc = self.proc.wait()
        t.join()
        self.stderr = b"".join(err_chunks)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "src_dir": {"type": "path", "required": True},
            "dest_host": {"type": "str", "required": True},
            "dest_user": {"type": "str", "default": "root"},
            "dest_dir": {"type": "path", "required": True},
            "files": {"type": "list", "elements": "str", "required": True},
            "streams": {"type": "int", "default": 4},
            "ssh_command": {"type": "str", "default": "ssh -o BatchMode=yes"},
            "rsync_path": {"type": "str", "default": "rsync"},
            "partial_dir": {"type": "path"},
            "extra_args": {"type": "list", "elements": "str", "default": []},
            "progress_path": {"type": "path"},
            "progress_id": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    src = os.path.normpath(p["src_dir"])
    dest = os.path.normpath(p["dest_dir"])
    partial_dir = p["partial_dir"] or checkpoint_paths(dest)["rsync_partial_dir"]
    files = sorted(set(p["files"]))
    result = {"changed": False, "sent": files, "transferred_files": 0, "bytes_sent": 0, "seconds": 0.0,
              "streams": []}
    if not files:
        module.exit_json(**result)
    bad = [f for f in files if not safe_relpath(f)]
    if bad:
        module.fail_json(msg=f"refusing paths outside the checkpoint: {bad}", **result)
    sizes = {}
    for f in files:
        try:
            sizes[f] = os.stat(os.path.join(src, f)).st_size
        except OSError as e:
            module.fail_json(msg=f"{f} is not in the source checkpoint {src} ({e}); verify the source first.",
                             **result)
    total = sum(sizes.values())
    result["changed"] = True
    if module.check_mode:
        module.exit_json(**result)

    target = f"{p['dest_user']}@{p['dest_host']}:{dest}/"
    progress_path = p["progress_path"]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="checkpoint-sync-") as tmp:
        streams = []
        for i, subset in enumerate(split_balanced(files, sizes, p["streams"])):
            listfile = os.path.join(tmp, f"stream-{i}.list")
            with open(listfile, "w", encoding="utf-8") as fh:
                fh.write("\n".join(subset) + "\n")
            argv = [p["rsync_path"], "-a", "--partial", f"--partial-dir={partial_dir}", "--ignore-times",
                    f"--files-from={listfile}", "--info=progress2", "--no-human-readable", "--stats",
                    "-e", p["ssh_command"], *p["extra_args"], f"{src}/", target]
            streams.append(Stream(argv, subset))
        threads = [threading.Thread(target=s.run, daemon=True) for s in streams]
        for t in threads:
            t.start()
        rate_window = Rate()
        while any(t.is_alive() for t in threads):
            if progress_path:
                now = time.monotonic()
                done = sum(s.done for s in streams)
                rate, eta = rate_window.update(now, done, total)
                write_progress(progress_path, {
                    "id": p["progress_id"], "kind": "sync", "state": "running", "pid": os.getpid(),
                    "done_bytes": done, "total_bytes": total, "rate_bytes_per_s": rate, "eta_s": eta,
                    "line": progress_line(done, total, rate, eta, f" to {p['dest_host']}, {len(streams)} streams")})
            for t in threads:
                t.join(timeout=1.0 / len(threads))
        result["seconds"] = round(time.monotonic() - started, 3)

    failed = []
    for s in streams:
        text = s.out.decode(errors="replace")
        nfiles = STAT_FILES_RE.search(text)
        sent = STAT_SENT_RE.search(text)
        result["transferred_files"] += int(nfiles.group(1).replace(",", "")) if nfiles else 0
        result["bytes_sent"] += int(sent.group(1).replace(",", "")) if sent else 0
        result["streams"].append({"files": len(s.files), "bytes": sum(sizes[f] for f in s.files), "rc": s.rc})
        if s.rc != 0:
            failed.append(f"rc={s.rc}: {s.stderr.decode(errors='replace').strip()[-800:]}")
    if progress_path:
        write_progress(progress_path, {"id": p["progress_id"], "kind": "sync", "state": "failed" if failed else "done",
                                       "pid": os.getpid(), "done_bytes": total if not failed else None,
                                       "total_bytes": total, "line": f"sync to {p['dest_host']} "
                                       + ("failed" if failed else f"done in {result['seconds']} s")})
    if failed:
        module.fail_json(
            msg=f"{len(failed)} of {len(streams)} rsync streams to {target} failed; partial files are kept in "
            f"{partial_dir} and resume on the next run. Command: {shlex.join(streams[0].argv)}. "
            f"First error: {failed[0]}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()

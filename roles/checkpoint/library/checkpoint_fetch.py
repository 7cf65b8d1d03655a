#!/usr/bin/python
"""Fetch a pinned Hugging Face model revision into a local directory."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_fetch
short_description: Download a pinned Hugging Face model revision into a local directory, resumably
description:
  - For the checkpoint role's internal use (its record and fetch steps); options and return values may
    change with the role.
  - Reads the file list of O(repo_id) at the commit O(revision) from the hub (model info with file
    metadata) and writes it as a record beside the checkpoint (O(record_path)) with every file's size,
    the sha256 of every LFS file and the git blob sha1 of every other file, as the hub reports them.
    Later verification (M(checkpoint_verify)) needs no network.
  - Downloads files into O(model_dir) as a plain local directory (no cache symlinks), through the public
    API of huggingface_hub (its file URLs, headers, shared HTTP session, retries and error reporting, as
    C(hf download) uses them). Every file is downloaded into O(staging_dir) as C(<name>.part) and moved into
    place only when complete, so a complete file is never replaced by a partial one and an
    interrupted download resumes from the bytes already on disk (HTTP Range) on the next run.
  - Without O(files), fetches every file of the record that is missing or has the wrong size.
    With O(files), fetches exactly those (typically the re-fetch list of M(checkpoint_verify)).
  - Writes live progress (bytes done and total, rate, ETA) to O(progress_path) once a second, for
    a poller such as M(checkpoint_progress) while this module runs as an async task.
  - Refuses to start when the filesystem cannot hold the bytes still missing.
  - Runs with the Python interpreter that has huggingface_hub installed.
version_added: "1.0.0"
author: spark-deploy maintainers
options:
  repo_id:
    description: Hub repository id, C(owner/name).
    type: str
    required: true
  revision:
    description:
      - Commit to fetch, exactly 40 lowercase hex digits. Branch names, tags and short hashes are
        refused so that every node and every run sees the same bytes.
    type: str
    required: true
  model_dir:
    description: Absolute path of the local model directory.
    type: path
    required: true
  record_path:
    description: Where the record of the revision is kept. Defaults to C(<model_dir>.record.json).
    type: path
  staging_dir:
    description:
      - Directory for partial downloads; must be on the same filesystem as O(model_dir) so that a
        finished file is moved into place atomically. Defaults to C(<parent>/.<name>.partial).
    type: path
  endpoint:
    description: Hub endpoint (a mirror, for instance). Exported as C(HF_ENDPOINT) to the client.
    type: str
    default: https://huggingface.co
  token:
    description: Hub access token. Sent only as an HTTP header; never logged or written to disk.
    type: str
  files:
    description:
      - Repository paths to fetch again even though a copy exists (the copy is replaced only when
        the new one is complete). Every name must be in the record.
      - When omitted, every file that is missing or has the wrong size is fetched.
    type: list
    elements: str
  record_only:
    description: Only make sure the record exists; download nothing.
    type: bool
    default: false
  max_workers:
    description: Files downloaded concurrently.
    type: int
    default: 8
  progress_path:
    description: JSON progress file. Defaults to C(<staging_dir>/progress.json).
    type: path
  progress_id:
    description: Identifier written into the progress file so a poller can tell this run from an earlier one.
    type: str
    default: ""
  disk_reserve_bytes:
    description: Bytes that must stay free on the filesystem after the download.
    type: int
    default: 1073741824
  timeout:
    description: Seconds to wait for the hub to answer a request before retrying.
    type: float
    default: 60
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: The record is read from the hub but not written, and nothing is downloaded; RV(fetched) lists what would be.
  diff_mode:
    support: none
  platform:
    platforms: posix
requirements:
  - huggingface_hub on the target's Python, the version the role pins (checkpoint_hub_client_version).
"""

EXAMPLES = r"""
- name: Fetch the checkpoint
  checkpoint_fetch:
    repo_id: LibertAIDAI/GLM-5.3-Flash-NVFP4
    revision: 0123456789abcdef0123456789abcdef01234567
    model_dir: /opt/models/glm53
    token: "{{ checkpoint_hf_token }}"
  no_log: true
  vars:
    ansible_python_interpreter: /opt/checkpoint-client/bin/python

- name: Fetch only the files that verification found bad
  checkpoint_fetch:
    repo_id: LibertAIDAI/GLM-5.3-Flash-NVFP4
    revision: 0123456789abcdef0123456789abcdef01234567
    model_dir: /opt/models/glm53
    files: "{{ verify_result.refetch }}"
"""

RETURN = r"""
record_path:
  description: Path of the record.
  returned: always
  type: str
record_written:
  description: Whether the record was (re)written by this run.
  returned: always
  type: bool
record:
  description: The record (repo_id, revision, files with size and sha256 or git_sha1, total_bytes).
  returned: always
  type: dict
fetched:
  description: Files downloaded (or, in check mode, that would be).
  returned: always
  type: list
  elements: str
fetched_bytes:
  description: Bytes received from the hub by this run (resumed bytes not counted).
  returned: always
  type: int
planned_bytes:
  description: Bytes of the files that had to be fetched.
  returned: always
  type: int
seconds:
  description: Wall time of the download.
  returned: always
  type: float
client_version:
  description: Version of huggingface_hub that ran.
  returned: always
  type: str
"""

import json
import os
import re
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from types import SimpleNamespace

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.checkpoint_common import (
    REVISION_RE,
    Rate,
    atomic_write,
    checkpoint_paths,
    free_bytes,
    human_bytes,
    load_json,
    progress_line,
    safe_relpath,
    write_progress,
)

REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
RECORD_FORMAT = 1
# The client's own download chunk (huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE): the same
# writes as `hf download`, and a cut transfer keeps whole chunks on disk.
CHUNK = 10 * 1024 * 1024
# Resumes of one file after its stream broke, in a row without a byte arriving (as the client's own).
RESUMES = 5


def record_from_hub(api, repo_id: str, revision: str, endpoint: str) -> dict:
    info = api.model_info(repo_id, revision=revision, files_metadata=True)
    if info.sha != revision:
        raise ValueError(f"the hub answered revision {info.sha!r} for the pinned {revision!r}")
    files = {}
    for sib in info.siblings or []:
        if sib.lfs is not None:
            files[sib.rfilename] = {"size": int(sib.lfs.size), "sha256": sib.lfs.sha256}
        else:
            files[sib.rfilename] = {"size": int(sib.size), "git_sha1": sib.blob_id}
    if not files:
        raise ValueError("the hub listed no files for this revision")
    return {
        "format": RECORD_FORMAT,
        "repo_id": repo_id,
        "revision": revision,
        "endpoint": endpoint,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "total_bytes": sum(e["size"] for e in files.values()),
        "files": dict(sorted(files.items())),
    }


class Progress:
    """Writes progress of the running download once a second.

    Bytes are counted from the partial files on disk rather than from the client's callbacks, so
    the figure is right whatever the client does internally (retries, resumes, restarts).
    """

    def __init__(self, path: str, progress_id: str, total: int, nfiles: int, staging: str):
        self.path = path
        self.id = progress_id
        self.total = total
        self.nfiles = nfiles
        self.staging = staging
        self.lock = threading.Lock()
        self.active: dict[str, int] = {}
        self.completed_bytes = 0
        self.completed_files = 0
        self.start = time.monotonic()
        self.rate = Rate()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def begin(self, name: str) -> None:
        with self.lock:
            self.active[name] = 0

    def finish(self, name: str, size: int) -> None:
        with self.lock:
            self.active.pop(name, None)
            self.completed_bytes += size
            self.completed_files += 1

    def done_bytes(self) -> int:
        with self.lock:
            names = list(self.active)
            done = self.completed_bytes
        for name in names:
            try:
                done += os.stat(os.path.join(self.staging, name + ".part")).st_size
            except OSError:
                pass
        return done

    def snapshot(self, state: str) -> dict:
        now = time.monotonic()
        done = self.done_bytes()
        rate, eta = self.rate.update(now, done, self.total)
        line = progress_line(done, self.total, rate, eta, f", {self.completed_files}/{self.nfiles} files")
        return {
            "id": self.id,
            "kind": "fetch",
            "state": state,
            "pid": os.getpid(),
            "done_bytes": done,
            "total_bytes": self.total,
            "files_done": self.completed_files,
            "files_total": self.nfiles,
            "rate_bytes_per_s": rate,
            "eta_s": eta,
            "elapsed_s": now - self.start,
            "line": line,
        }

    def write(self, state: str) -> None:
        write_progress(self.path, self.snapshot(state))

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.write("running")

    def __enter__(self):
        self.write("running")
        self.thread.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.stop.set()
        self.thread.join()
        self.write("failed" if exc_type else "done")


def prepare_staging(staging: str, revision: str) -> None:
    """Partial files of another revision are useless (different bytes): drop them, never a complete file."""
    os.makedirs(staging, mode=0o755, exist_ok=True)
    marker = os.path.join(staging, "revision")
    try:
        with open(marker, encoding="utf-8") as f:
            current = f.read().strip()
    except OSError:
        current = None
    if current != revision:
        for entry in os.listdir(staging):
            path = os.path.join(staging, entry)
            if entry.endswith(".part") or os.path.isdir(path):
                if os.path.isdir(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
        atomic_write(marker, (revision + "\n").encode(), 0o644)


def size_on_disk(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def partial_size(staging: str, name: str) -> int:
    return size_on_disk(os.path.join(staging, name + ".part"))


def download(hub: SimpleNamespace, url: str, part: str, size: int, *, headers: dict, timeout: float) -> None:
    """Complete the partial file ``part`` of a ``size``-byte file from ``url``, resuming with HTTP Range.

    ``hub`` holds the client's public HTTP helpers (imported late, see main), so requests go through
    its shared session, retries on 408/429 and error reporting, as they do for `hf download`. A
    stream that breaks is resumed from the bytes on disk, up to RESUMES times in a row without a
    byte arriving in between; a server that ignores the Range (200, not 206) has the file written from its start.
    """
    # Exists from here on, so an empty file of the repository is complete at once.
    open(part, "ab").close()
    left = RESUMES
    while True:
        have = size_on_disk(part)
        if have == size:
            break
        if have > size:
            have = 0  # longer than the file: not a prefix of it, written anew below
        request = dict(headers)
        if have:
            request["Range"] = f"bytes={have}-"
        received = 0
        try:
            with hub.stream("GET", url, headers=request, timeout=timeout,
                            retry_on_exceptions=(), retry_on_status_codes=(408, 429)) as response:
                hub.raise_for_status(response)
                with open(part, "ab" if have and response.status_code == 206 else "wb") as f:
                    for chunk in response.iter_bytes(chunk_size=CHUNK):
                        f.write(chunk)
                        received += len(chunk)
        except hub.transport_errors:
            left = (RESUMES if received else left) - 1
            if left < 0:
                raise
            time.sleep(1)
            continue
        break
    final = os.path.getsize(part)
    if final != size:
        raise OSError(f"consistency check failed: {url} should be {size} bytes, {final} arrived")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "repo_id": {"type": "str", "required": True},
            "revision": {"type": "str", "required": True},
            "model_dir": {"type": "path", "required": True},
            "record_path": {"type": "path"},
            "staging_dir": {"type": "path"},
            "endpoint": {"type": "str", "default": "https://huggingface.co"},
            "token": {"type": "str", "no_log": True},
            "files": {"type": "list", "elements": "str"},
            "record_only": {"type": "bool", "default": False},
            "max_workers": {"type": "int", "default": 8},
            "progress_path": {"type": "path"},
            "progress_id": {"type": "str", "default": ""},
            "disk_reserve_bytes": {"type": "int", "default": 1073741824},
            "timeout": {"type": "float", "default": 60},
        },
        supports_check_mode=True,
    )
    p = module.params
    revision = p["revision"]
    model_dir = os.path.normpath(p["model_dir"])
    if not REVISION_RE.match(revision):
        module.fail_json(
            msg=f"revision={revision!r} is not a pinned commit: it must be exactly 40 lowercase hex digits "
            "(a branch, tag or short hash can move or be ambiguous). Fix: set the full commit sha, "
            "e.g. from `hf api` or the repository's commit history."
        )
    if not REPO_ID_RE.match(p["repo_id"]):
        module.fail_json(msg=f"repo_id={p['repo_id']!r} is not of the form owner/name.")
    if not os.path.isabs(model_dir):
        module.fail_json(msg=f"model_dir={model_dir!r} must be an absolute local path.")
    paths = checkpoint_paths(model_dir)
    record_path = p["record_path"] or paths["record"]
    staging = p["staging_dir"] or paths["partial_dir"]
    progress_path = p["progress_path"] or os.path.join(staging, "progress.json")
    endpoint = p["endpoint"].rstrip("/")

    # The client reads HF_ENDPOINT at import time; the env must be set before the import.
    os.environ["HF_ENDPOINT"] = endpoint
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(int(p["timeout"])))
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(int(p["timeout"])))
    try:
        # Imported late: HF_ENDPOINT must be in the environment first. Public API only (the
        # package's and huggingface_hub.utils' exports), so a client upgrade cannot pull an
        # internal helper from under the module.
        from huggingface_hub import HfApi, hf_hub_url  # noqa: PLC0415
        from huggingface_hub import __version__ as hf_version  # noqa: PLC0415
        from huggingface_hub.utils import (  # noqa: PLC0415
            build_hf_headers,
            hf_raise_for_status,
            http_stream_backoff,
            httpx,
        )
    except ImportError as e:
        module.fail_json(
            msg=f"huggingface_hub is not importable by {sys.executable} ({e}). "
            "Fix: run this module with the interpreter of the venv the checkpoint role installs "
            "(checkpoint_venv_dir)."
        )

    token = p["token"] or None
    result = {"changed": False, "record_path": record_path, "record_written": False, "fetched": [],
              "fetched_bytes": 0, "planned_bytes": 0, "seconds": 0.0, "client_version": hf_version}

    record = load_json(record_path)
    if not isinstance(record, dict) or record.get("revision") != revision or record.get("repo_id") != p["repo_id"] \
            or record.get("format") != RECORD_FORMAT:
        api = HfApi(endpoint=endpoint, token=token, library_name="spark-checkpoint")
        try:
            record = record_from_hub(api, p["repo_id"], revision, endpoint)
        except Exception as e:  # noqa: BLE001 - every hub failure ends the same way, with its text
            module.fail_json(msg=f"could not read {p['repo_id']}@{revision} from {endpoint}: {e}", **result)
        bad = [n for n in record["files"] if not safe_relpath(n)]
        if bad:
            module.fail_json(msg=f"the hub listed unsafe paths {bad}; refusing to write them", **result)
        result["record_written"] = True
        result["changed"] = True
        if not module.check_mode:
            atomic_write(record_path, (json.dumps(record, indent=1) + "\n").encode(), 0o644)
    result["record"] = record
    if p["record_only"]:
        module.exit_json(**result)

    files = record["files"]
    if p["files"] is not None:
        unknown = sorted(set(p["files"]) - set(files))
        if unknown:
            module.fail_json(msg=f"files {unknown} are not in the record of {revision}", **result)
        plan = sorted(set(p["files"]))
    else:
        plan = []
        for name, entry in files.items():
            try:
                st = os.stat(os.path.join(model_dir, name))
                ok = st.st_size == entry["size"]
            except OSError:
                ok = False
            if not ok:
                plan.append(name)
    plan.sort(key=lambda n: -files[n]["size"])
    result["fetched"] = plan
    result["planned_bytes"] = sum(files[n]["size"] for n in plan)
    if not plan:
        module.exit_json(**result)
    result["changed"] = True
    if module.check_mode:
        module.exit_json(**result)

    os.makedirs(model_dir, mode=0o755, exist_ok=True)
    prepare_staging(staging, revision)
    still_needed = sum(files[n]["size"] - min(partial_size(staging, n), files[n]["size"]) for n in plan)
    free = free_bytes(staging)
    if free < still_needed + p["disk_reserve_bytes"]:
        module.fail_json(
            msg=f"checkpoint_model_dir={model_dir}: the filesystem has {human_bytes(free)} free but the "
            f"{len(plan)} files still to fetch need {human_bytes(still_needed)} plus a reserve of "
            f"{human_bytes(p['disk_reserve_bytes'])}. Fix: free space or point spark_model_dir at a larger filesystem.",
            free_bytes=free, needed_bytes=still_needed, **result,
        )

    headers = build_hf_headers(token=token, library_name="spark-checkpoint")
    hub = SimpleNamespace(stream=http_stream_backoff, raise_for_status=hf_raise_for_status,
                          transport_errors=httpx.TransportError)
    timeout = float(os.environ["HF_HUB_DOWNLOAD_TIMEOUT"])
    before = {n: partial_size(staging, n) for n in plan}
    errors: dict[str, str] = {}
    started = time.monotonic()

    def fetch_one(name: str) -> None:
        entry = files[name]
        part = os.path.join(staging, name + ".part")
        os.makedirs(os.path.dirname(part), exist_ok=True)
        progress.begin(name)
        url = hf_hub_url(p["repo_id"], name, revision=revision, endpoint=endpoint)
        download(hub, url, part, entry["size"], headers=headers, timeout=timeout)
        os.chmod(part, 0o644)
        dest = os.path.join(model_dir, name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.replace(part, dest)
        progress.finish(name, entry["size"])

    with Progress(progress_path, p["progress_id"], result["planned_bytes"], len(plan), staging) as progress:
        with ThreadPoolExecutor(max_workers=max(1, p["max_workers"])) as pool:
            futures = {pool.submit(fetch_one, n): n for n in plan}
            for fut in as_completed(futures):
                exc = fut.exception()
                if exc is not None:
                    errors[futures[fut]] = f"{type(exc).__name__}: {exc}"
        result["seconds"] = round(time.monotonic() - started, 3)
        done = [n for n in plan if n not in errors]
        result["fetched"] = done
        result["fetched_bytes"] = sum(files[n]["size"] - before[n] for n in done) + sum(
            max(partial_size(staging, n) - before[n], 0) for n in errors)
        if errors:
            # fail_json exits through SystemExit inside the context, so the progress file says "failed".
            module.fail_json(
                msg=f"{len(errors)} of {len(plan)} files failed to download from {endpoint}; completed files "
                "and partial bytes are kept, run again to resume. First error: "
                f"{next(iter(errors.items()))}",
                errors=errors, changed=bool(done), **{k: v for k, v in result.items() if k != "changed"},
            )
    module.exit_json(**result)


if __name__ == "__main__":
    main()

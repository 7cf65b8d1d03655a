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
  - Reads the file list of O(repo_id) at the commit O(revision) from the hub and writes it as a record
    beside the checkpoint (O(record_path)) with every file's size, the sha256 of every LFS file and the
    git blob sha1 of every other file, as the hub reports them. The list comes from the tree listing
    (what C(hf download) reads, so a plain mirror serves it), or from the model info with file
    metadata where the listing lacks a size or hash. Later verification (M(dgx_spark.llm_serving.checkpoint_verify)) needs
    no network.
  - A hub that cannot be reached, refuses the token or does not know the repository or revision
    fails with a message naming the variable to fix (C(checkpoint_hf_endpoint),
    C(checkpoint_hf_token), C(checkpoint_repo_id), C(checkpoint_revision)) and writes nothing.
  - Code files the record lists (C(*.py), C(*.so), ...) are downloaded for review into
    C(<staging_dir>/review/<revision>/) and refused unless O(trusted_code_files) pins each by name
    and sha256; the refusal prints the YAML to paste after review.
  - One fetch at a time per model directory. The fetch holds an fcntl.flock on
    C(<staging_dir>/fetch.lock) (with its pid, revision and progress file written into it). A fetch
    that finds another one of the same revision running (say the one an interrupted playbook left
    behind) waits for it to end, showing its progress, then fetches only what is still missing; one
    of another revision is refused, naming its pid. A fetch that finds the lock file saying
    "running" while nobody holds it reports that fetch as killed (RV(previous_fetch)) and resumes
    from the bytes it left on disk.
  - Downloads files into O(model_dir) as a plain local directory (no cache symlinks), through the public
    API of huggingface_hub (its file URLs, headers, shared HTTP session, retries and error reporting, as
    C(hf download) uses them). Every file is downloaded into O(staging_dir) as C(<name>.part) and moved into
    place only when complete, so a complete file is never replaced by a partial one and an
    interrupted download resumes from the bytes already on disk (HTTP Range) on the next run.
  - Without O(files), fetches every file of the record that is missing or has the wrong size.
    With O(files), fetches exactly those (typically the re-fetch list of M(dgx_spark.llm_serving.checkpoint_verify)).
  - Writes live progress (bytes done and total, rate, ETA) to O(progress_path) once a second, for
    a poller such as M(dgx_spark.llm_serving.checkpoint_progress) while this module runs as an async task. The rate and
    ETA count only the bytes this run moves, never the bytes a resumed file already had on disk.
  - Refuses to start when the filesystem cannot hold the bytes still missing.
  - Runs with the Python interpreter that has huggingface_hub installed.
version_added: "1.0.0"
author: LLM serving maintainers (@dgx-spark)
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
  trusted_code_files:
    description:
      - Code files of the revision that may be fetched, by repository path, each with the sha256 of
        its reviewed content (the role's C(checkpoint_trusted_code_files)).
    type: dict
    default: {}
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
  dgx_spark.llm_serving.checkpoint_fetch:
    repo_id: LibertAIDAI/GLM-5.3-Flash-NVFP4
    revision: 0123456789abcdef0123456789abcdef01234567
    model_dir: /opt/models/glm53
    token: "{{ checkpoint_hf_token }}"
  no_log: true
  vars:
    ansible_python_interpreter: /opt/checkpoint-client/bin/python

- name: Fetch only the files that verification found bad
  dgx_spark.llm_serving.checkpoint_fetch:
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
code_files:
  description:
    - Code files the record lists, each with C(name), C(sha256) (of the reviewed copy, when downloaded),
      C(pinned), C(review_path).
  returned: always
  type: list
  elements: dict
waited_for:
  description:
    - The fetch of the same revision that was running when this one started (pid, started_at, seconds
      waited), or null.
  returned: always
  type: dict
previous_fetch:
  description:
    - A fetch found killed (lock file says running, nobody holds it) with its pid, started_at and the
      bytes it left on disk, or null.
  returned: always
  type: dict
completed_by_earlier_fetch:
  description:
    - Requested files that the fetch waited for put in place meanwhile (the verification that follows
      judges them).
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
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from types import SimpleNamespace

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.checkpoint_common import (
    RECORD_FORMAT,
    REPO_ID_RE,
    REVISION_RE,
    TransferLock,
    TransferMeter,
    atomic_write,
    checkpoint_paths,
    file_digests,
    free_bytes,
    human_bytes,
    is_code_name,
    load_json,
    lock_state,
    partial_bytes,
    progress_line,
    read_lock_info,
    record_hash,
    safe_relpath,
    trusted_code_yaml,
    write_progress,
)

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# The client's own download chunk (huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE): the same
# writes as `hf download`, and a cut transfer keeps whole chunks on disk.
CHUNK = 10 * 1024 * 1024
# Resumes of one file after its stream broke, in a row without a byte arriving (as the client's own).
RESUMES = 5
LOCK_NAME = "fetch.lock"
# How long a lock held by a process that has not said what it does (or a reader's instant peek)
# is waited out before it counts as another fetch.
UNNAMED_HOLDER_SECONDS = 5.0


class HubProblem(Exception):
    """A hub failure already phrased for the operator: what failed, which variable, the fix."""


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def explain_hub_error(err: BaseException, hub: SimpleNamespace, *, endpoint: str, repo_id: str, revision: str,
                      token_set: bool, doing: str) -> str:
    """One sentence naming what failed, the variable that decides it and the fix; nothing was written."""
    where = f"checkpoint_hf_endpoint={endpoint}"
    response = getattr(err, "response", None)
    status = getattr(response, "status_code", None)
    server_says = ""
    if response is not None:
        server_says = response.headers.get("X-Error-Message") or ""
    said = f" ({status} {server_says})" if status else ""
    token_fix = (f"create a read token for an account with access to {repo_id} (on {endpoint}: Settings, Access "
                 "Tokens) and set checkpoint_hf_token to it (vault it)")
    if isinstance(err, hub.RevisionNotFoundError):
        return (f"{doing}: checkpoint_revision={revision} is unknown to checkpoint_repo_id={repo_id} at {where}{said}. "
                f"Fix: set checkpoint_revision to a full 40-hex commit of {repo_id} (its history: "
                f"{endpoint}/{repo_id}/commits/main); a mirror must hold that very commit.")
    if isinstance(err, hub.GatedRepoError):
        return (f"{doing}: checkpoint_repo_id={repo_id} is gated at {where}{said} and "
                + ("the account of checkpoint_hf_token has not been granted access" if token_set
                   else "no checkpoint_hf_token is set")
                + f". Fix: accept the conditions on {endpoint}/{repo_id} with your account, then {token_fix}.")
    if isinstance(err, hub.RepositoryNotFoundError) or (
            status == 401 and server_says != "Invalid credentials in Authorization header"):
        if token_set:
            return (f"{doing}: checkpoint_repo_id={repo_id} is not visible at {where} with checkpoint_hf_token{said}: "
                    "the repository does not exist there, or the token's account has no access to it. "
                    f"Fix: correct checkpoint_repo_id, or {token_fix}.")
        return (f"{doing}: {where} refused checkpoint_repo_id={repo_id} without a token{said}: the repository is "
                f"private or gated, or does not exist there. Fix: {token_fix}, or correct checkpoint_repo_id.")
    if status == 401:
        return (f"{doing}: {where} refused checkpoint_hf_token{said}: the token is wrong, expired or revoked. "
                f"Fix: {token_fix}.")
    if status == 403:
        return (f"{doing}: {where} forbids checkpoint_hf_token access to {repo_id}{said}. Fix: {token_fix} "
                "(a fine-grained token needs read access to this repository).")
    if isinstance(err, hub.HfHubHTTPError) and status is not None:
        if status == 404:
            return (f"{doing}: {where} answered 404 ({server_says or 'Not Found'}) for {repo_id}@{revision}: it "
                    "serves neither the hub's tree listing nor its model info there. Fix: set "
                    "checkpoint_hf_endpoint to the hub (https://huggingface.co) or to a mirror of it.")
        return (f"{doing}: {where} answered {status}{(' ' + server_says) if server_says else ''}: the hub or mirror "
                "is failing. Files complete and partial bytes on disk are kept. Fix: run again later, or set "
                "checkpoint_hf_endpoint to another mirror.")
    if isinstance(err, hub.TimeoutException):
        return (f"{doing}: {where} did not answer in time ({type(err).__name__}). Fix: check that this host reaches "
                "it (proxy variables, firewall) and run again; a slow mirror may need a longer timeout.")
    if isinstance(err, hub.TransportError | OSError | socket.error):
        return (f"{doing}: cannot reach {where} ({type(err).__name__}: {err}). Nothing was written. Fix: check "
                "checkpoint_hf_endpoint (the hub, https://huggingface.co, or your mirror's URL, scheme and "
                "port) and that this host reaches it (DNS, proxy variables, firewall).")
    return f"{doing}: {where}: {type(err).__name__}: {err}"


def probe_hub(hub: SimpleNamespace, url: str, *, headers: dict, timeout: float, endpoint: str, revision: str) -> None:
    """One HEAD of the revision's config.json, not retried: a wrong endpoint, token, repository or
    revision is told at once (the client's API calls retry a refused connection for about 25 s).

    Its X-Repo-Commit says which commit the endpoint serves for the pinned revision.
    """
    with hub.stream("HEAD", url, headers=headers, timeout=timeout, retry_on_exceptions=(),
                    retry_on_status_codes=(408, 429)) as response:
        commit = response.headers.get("X-Repo-Commit")
        if not (response.status_code == 404 and response.headers.get("X-Error-Code") == "EntryNotFound"):
            hub.raise_for_status(response)
    if commit and commit != revision:
        raise HubProblem(f"checkpoint_hf_endpoint={endpoint} answered commit {commit} for the pinned "
                         f"checkpoint_revision={revision}. Fix: use an endpoint that serves the pinned commit.")


def record_from_hub(api, hub: SimpleNamespace, repo_id: str, revision: str, endpoint: str) -> dict:
    """The record of the revision, from the tree listing; the model info fills in what it lacks.

    The tree listing is what `hf download` reads (so a plain mirror serves it) and carries every
    file's size, each LFS file's sha256 and each other file's git blob id.
    """
    files: dict[str, dict] = {}
    lacking: list[str] = []
    for item in api.list_repo_tree(repo_id, revision=revision, recursive=True):
        if not isinstance(item, hub.RepoFile):
            continue
        lfs = item.lfs
        if lfs is not None and lfs.sha256 and lfs.size is not None:
            files[item.path] = {"size": int(lfs.size), "sha256": lfs.sha256}
        elif lfs is None and item.size is not None and item.blob_id:
            files[item.path] = {"size": int(item.size), "git_sha1": item.blob_id}
        else:
            lacking.append(item.path)
    if lacking:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
        by_name = {s.rfilename: s for s in info.siblings or []}
        for name in lacking:
            sib = by_name.get(name)
            if sib is not None and sib.lfs is not None and sib.lfs.sha256 and sib.lfs.size is not None:
                files[name] = {"size": int(sib.lfs.size), "sha256": sib.lfs.sha256}
            elif sib is not None and sib.lfs is None and sib.size is not None and sib.blob_id:
                files[name] = {"size": int(sib.size), "git_sha1": sib.blob_id}
            else:
                raise HubProblem(
                    f"checkpoint_hf_endpoint={endpoint} lists {name} of {repo_id}@{revision} without its size and "
                    "hash, in its tree listing and in its model info: a record without them could not vouch for "
                    "the bytes. Fix: point checkpoint_hf_endpoint at the hub or at a mirror that serves the "
                    "tree listing with sizes and LFS hashes, as the hub does.")
    if not files:
        raise HubProblem(f"checkpoint_hf_endpoint={endpoint} lists no files for {repo_id}@{revision}. "
                         "Fix: check checkpoint_repo_id and checkpoint_revision.")
    return {
        "format": RECORD_FORMAT,
        "repo_id": repo_id,
        "revision": revision,
        "endpoint": endpoint,
        "recorded_at": now_iso(),
        "total_bytes": sum(e["size"] for e in files.values()),
        "files": dict(sorted(files.items())),
    }


def matches_record(path: str, entry: dict) -> bool:
    """Whether the file at ``path`` has the record's size and digest."""
    try:
        if os.stat(path).st_size != entry["size"]:
            return False
    except OSError:
        return False
    algo, want = record_hash(entry)
    return file_digests(path, entry["size"], [algo])[algo] == want


class Progress:
    """Writes the progress of the running download once a second.

    Bytes done are counted from the files on disk (complete, partial, and the partial files still
    queued), so the figure is right whatever the client does (retries, resumes, a partial file
    restarted); the rate and ETA come from the bytes this run received (TransferMeter).
    """

    def __init__(self, path: str, progress_id: str, plan: list[str], files: dict, staging: str):
        self.path = path
        self.id = progress_id
        self.files = files
        self.total = sum(files[n]["size"] for n in plan)
        self.nfiles = len(plan)
        self.staging = staging
        self.lock = threading.Lock()
        self.active: set[str] = set()
        self.queued = {n: min(partial_size(staging, n), files[n]["size"]) for n in plan}
        self.resumed = sum(self.queued.values())
        self.completed_bytes = 0
        self.completed_files = 0
        self.meter = TransferMeter(self.total)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def begin(self, name: str) -> None:
        with self.lock:
            self.queued.pop(name, None)
            self.active.add(name)

    def finish(self, name: str) -> None:
        with self.lock:
            self.active.discard(name)
            self.completed_bytes += self.files[name]["size"]
            self.completed_files += 1

    def done_bytes(self) -> int:
        with self.lock:
            names = list(self.active)
            done = self.completed_bytes + sum(self.queued.values())
        return done + sum(min(partial_size(self.staging, n), self.files[n]["size"]) for n in names)

    def snapshot(self, state: str) -> dict:
        final = state != "running"
        f = self.meter.figures(self.done_bytes(), final=final)
        detail = f", {self.completed_files}/{self.nfiles} files"
        if self.resumed:
            detail += f", resumed with {human_bytes(self.resumed)} on disk"
        return {
            "id": self.id,
            "kind": "fetch",
            "state": state,
            "pid": os.getpid(),
            "done_bytes": f["done"],
            "total_bytes": self.total,
            "moved_bytes": f["moved"],
            "resumed_bytes": self.resumed,
            "completed_bytes": self.completed_bytes,
            "files_done": self.completed_files,
            "files_total": self.nfiles,
            "rate_bytes_per_s": f["rate"],
            "eta_s": f["eta"],
            "percent": f["percent"],
            "elapsed_s": f["elapsed"],
            "line": progress_line(f["done"], self.total, f["rate"], f["eta"], detail),
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
    """Partial files of another revision are useless (different bytes): drop them, never a complete file.

    Review copies of code files live per revision under review/ and are kept.
    """
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
            if entry == "review":
                continue
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


def download(hub: SimpleNamespace, url: str, part: str, size: int, *, headers: dict, timeout: float,
             on_bytes=None) -> None:
    """Complete the partial file ``part`` of a ``size``-byte file from ``url``, resuming with HTTP Range.

    ``hub`` holds the client's public HTTP helpers (imported late, see main), so requests go through
    its shared session, retries on 408/429 and error reporting, as they do for `hf download`. A
    stream that breaks is resumed from the bytes on disk, up to RESUMES times in a row without a
    byte arriving in between; a server that ignores the Range (200, not 206) has the file written
    from its start. ``on_bytes`` hears of every chunk that arrives.
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
                        if on_bytes is not None:
                            on_bytes(len(chunk))
        except hub.TransportError:
            left = (RESUMES if received else left) - 1
            if left < 0:
                raise
            time.sleep(1)
            continue
        break
    final = os.path.getsize(part)
    if final != size:
        raise OSError(f"consistency check failed: {url} should be {size} bytes, {final} arrived")


def pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire(lock: TransferLock, lock_path: str, *, repo_id: str, revision: str, model_dir: str,
            staging: str) -> dict | None:
    """Take the fetch lock; wait for a fetch of the same revision to end (returns what was waited for).

    A fetch of another revision or repository is refused at once, naming its pid: waiting for it
    would leave this run's pin unfetched for as long as it runs.
    """
    waited = None
    unnamed_since = None
    while not lock.try_acquire():
        info = read_lock_info(lock_path)
        if not (isinstance(info, dict) and info.get("state") == "running" and pid_alive(info.get("pid"))):
            # A progress poller's instant peek, or a holder that has not written what it does yet
            # (the info may still be its killed predecessor's).
            unnamed_since = unnamed_since or time.monotonic()
            if time.monotonic() - unnamed_since < UNNAMED_HOLDER_SECONDS:
                time.sleep(0.1)
                continue
            raise HubProblem(f"another process holds {lock_path} and does not say what it does "
                             f"(last holder: {info}). Fix: find it (fuser {lock_path}), let it end or stop it, "
                             "then run again.")
        unnamed_since = None
        pid = info.get("pid", "?")
        if (info.get("repo_id"), info.get("revision"), info.get("model_dir")) != (repo_id, revision, model_dir):
            raise HubProblem(
                f"another fetch (pid {pid}) is writing into {staging}: {info.get('repo_id')}@{info.get('revision')} "
                f"into {info.get('model_dir')}, started {info.get('started_at', '?')} (an earlier run, interrupted?), "
                f"while this run pins checkpoint_revision={revision}. Two fetches must not share the partial "
                f"files. Fix: wait for it to end, or stop it (kill {pid}: its partial bytes are kept), then run again.")
        if waited is None:
            waited = {"pid": pid, "started_at": info.get("started_at"), "progress_id": info.get("progress_id"),
                      "since": time.monotonic()}
        time.sleep(0.5)
    if waited is not None:
        waited["seconds"] = round(time.monotonic() - waited.pop("since"), 1)
    return waited


def review_code_files(record: dict, *, model_dir: str, staging: str, trusted: dict, fetch_one_to, check_mode: bool):
    """Bring every code file of the record to <staging>/review/<revision>/ and read its sha256.

    A copy already there, or one in the model directory, with the record's digest is used as it is
    (nothing complete is fetched again). Returns the code_files report.
    """
    files, revision = record["files"], record["revision"]
    review_root = os.path.join(staging, "review")
    review_dir = os.path.join(review_root, revision)
    report = []
    names = sorted(n for n in files if is_code_name(n))
    if names and not check_mode:
        os.makedirs(review_dir, mode=0o755, exist_ok=True)
        for old in os.listdir(review_root):
            if old != revision:
                shutil.rmtree(os.path.join(review_root, old), ignore_errors=True)
    for name in names:
        entry = files[name]
        path = os.path.join(review_dir, name)
        if not check_mode and not matches_record(path, entry):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            local = os.path.join(model_dir, name)
            if matches_record(local, entry):
                shutil.copyfile(local, path + ".part")
            else:
                fetch_one_to(name, path + ".part")
            if not matches_record(path + ".part", entry):
                raise HubProblem(f"{name} as served by the hub does not match the digest the hub lists for it. "
                                 "Fix: run again; if it persists, the endpoint serves inconsistent data.")
            os.chmod(path + ".part", 0o644)
            os.replace(path + ".part", path)
        sha = file_digests(path, entry["size"], ["sha256"])["sha256"] if os.path.isfile(path) else None
        report.append({"name": name, "size": entry["size"], "sha256": sha, "review_path": path,
                       "pinned": trusted.get(name), "trusted": sha is not None and trusted.get(name) == sha})
    return report


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
            "trusted_code_files": {"type": "dict", "default": {}},
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
    trusted = p["trusted_code_files"] or {}
    bad_pins = sorted(n for n, v in trusted.items() if not (isinstance(v, str) and SHA256_RE.match(v)))
    if bad_pins:
        module.fail_json(msg=f"checkpoint_trusted_code_files pins {bad_pins} to values that are not a sha256 "
                         "(64 lowercase hex digits). Fix: paste the lines the refusal printed.")
    paths = checkpoint_paths(model_dir)
    record_path = p["record_path"] or paths["record"]
    staging = p["staging_dir"] or paths["partial_dir"]
    progress_path = p["progress_path"] or os.path.join(staging, "progress.json")
    lock_path = os.path.join(staging, LOCK_NAME)
    endpoint = p["endpoint"].rstrip("/")
    repo_id = p["repo_id"]

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
        from huggingface_hub import HfApi, RepoFile, hf_hub_url  # noqa: PLC0415
        from huggingface_hub import __version__ as hf_version  # noqa: PLC0415
        from huggingface_hub.utils import (  # noqa: PLC0415
            GatedRepoError,
            HfHubHTTPError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
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

    hub = SimpleNamespace(
        stream=http_stream_backoff, raise_for_status=hf_raise_for_status, TransportError=httpx.TransportError,
        TimeoutException=httpx.TimeoutException, RepoFile=RepoFile, RevisionNotFoundError=RevisionNotFoundError,
        GatedRepoError=GatedRepoError, RepositoryNotFoundError=RepositoryNotFoundError, HfHubHTTPError=HfHubHTTPError)
    token = p["token"] or None
    result = {"changed": False, "record_path": record_path, "record_written": False, "fetched": [],
              "fetched_bytes": 0, "planned_bytes": 0, "seconds": 0.0, "client_version": hf_version,
              "code_files": [], "waited_for": None, "previous_fetch": None, "completed_by_earlier_fetch": []}

    def explain(err: BaseException, doing: str) -> str:
        if isinstance(err, HubProblem):
            return f"{doing}: {err}"
        return explain_hub_error(err, hub, endpoint=endpoint, repo_id=repo_id, revision=revision,
                                 token_set=token is not None, doing=doing)

    headers = build_hf_headers(token=token, library_name="spark-checkpoint")
    timeout = float(os.environ["HF_HUB_DOWNLOAD_TIMEOUT"])
    record = load_json(record_path)
    if not isinstance(record, dict) or record.get("revision") != revision or record.get("repo_id") != repo_id \
            or record.get("format") != RECORD_FORMAT:
        api = HfApi(endpoint=endpoint, token=token, library_name="spark-checkpoint")
        try:
            probe_hub(hub, hf_hub_url(repo_id, "config.json", revision=revision, endpoint=endpoint),
                      headers=headers, timeout=timeout, endpoint=endpoint, revision=revision)
            record = record_from_hub(api, hub, repo_id, revision, endpoint)
        except Exception as e:  # noqa: BLE001 - every hub failure is explained the same way
            module.fail_json(msg=explain(e, f"could not read {repo_id}@{revision}"), **result)
        bad = [n for n in record["files"] if not safe_relpath(n)]
        if bad:
            module.fail_json(msg=f"the hub listed unsafe paths {bad}; refusing to write them", **result)
        result["record_written"] = True
        result["changed"] = True
        if not module.check_mode:
            atomic_write(record_path, (json.dumps(record, indent=1) + "\n").encode(), 0o644)
    files = record["files"]

    def url_of(name: str) -> str:
        return hf_hub_url(repo_id, name, revision=revision, endpoint=endpoint)

    # ---- code files: reviewed and pinned, or refused before any weight moves ---------------------
    try:
        result["code_files"] = review_code_files(
            record, model_dir=model_dir, staging=staging, trusted=trusted, check_mode=module.check_mode,
            fetch_one_to=lambda name, part: download(hub, url_of(name), part, files[name]["size"], headers=headers,
                                                     timeout=timeout))
    except Exception as e:  # noqa: BLE001
        module.fail_json(msg=explain(e, "could not download the revision's code files for review"), **result)
    untrusted = [c for c in result["code_files"] if not (c["trusted"] or (module.check_mode and c["sha256"] is None
                                                                          and c["pinned"]))]
    if untrusted:
        names = [c["name"] for c in untrusted]
        known = {c["name"]: c["sha256"] for c in untrusted if c["sha256"]}
        detail = "".join(f"; {c['name']} has sha256 {c['sha256']}, checkpoint_trusted_code_files pins {c['pinned']}"
                         for c in untrusted if c["pinned"] and c["sha256"])
        msg = (f"the pinned revision {revision} of {repo_id} holds code files that the server would run "
               f"(--trust-remote-code) and checkpoint_trusted_code_files does not pin to their content: {names}"
               f"{detail}. Nothing of the checkpoint was fetched.")
        if len(known) == len(names):
            msg += (f" Fix: review them (copies in {os.path.join(staging, 'review', revision)}), then add to the "
                    "inventory (e.g. group_vars/spark.yml) and run again:\n\n" + trusted_code_yaml(known) + "\n")
        else:
            msg += " Fix: run without --check: the run downloads them for review and prints the lines to paste."
        module.fail_json(msg=msg, **result)
    # Only now: a play reads the source host's record to feed the other hosts.
    result["record"] = record
    if p["record_only"]:
        module.exit_json(**result)

    if p["files"] is not None:
        unknown = sorted(set(p["files"]) - set(files))
        if unknown:
            module.fail_json(msg=f"files {unknown} are not in the record of {revision}", **result)

    def plan_files(only_missing: bool) -> list[str]:
        if p["files"] is not None and not only_missing:
            plan = sorted(set(p["files"]))
        else:
            plan = []
            for name in sorted(set(p["files"]) if p["files"] is not None else files):
                if size_on_disk(os.path.join(model_dir, name)) != files[name]["size"] \
                        or not os.path.exists(os.path.join(model_dir, name)):
                    plan.append(name)
        plan.sort(key=lambda n: -files[n]["size"])
        return plan

    if module.check_mode:
        plan = plan_files(False)
        result["fetched"] = plan
        result["planned_bytes"] = sum(files[n]["size"] for n in plan)
        result["changed"] = result["changed"] or bool(plan)
        held, info = lock_state(lock_path)
        if held and isinstance(info, dict):
            result["waited_for"] = {"pid": info.get("pid"), "started_at": info.get("started_at"), "seconds": 0}
        module.exit_json(**result)

    os.makedirs(model_dir, mode=0o755, exist_ok=True)
    os.makedirs(staging, mode=0o755, exist_ok=True)
    lock = TransferLock(lock_path)
    try:
        waited = acquire(lock, lock_path, repo_id=repo_id, revision=revision, model_dir=model_dir, staging=staging)
    except HubProblem as e:
        module.fail_json(msg=str(e), **result)
    outcome = "failed"
    try:
        previous = read_lock_info(lock_path)
        if isinstance(previous, dict) and previous.get("state") == "running":
            # Its holder is gone (we hold the lock now) without saying it ended: killed.
            result["previous_fetch"] = {"pid": previous.get("pid"), "started_at": previous.get("started_at"),
                                        "revision": previous.get("revision"), "state": "killed",
                                        "bytes_on_disk": partial_bytes(staging)}
        result["waited_for"] = waited
        prepare_staging(staging, revision)
        plan = plan_files(waited is not None)
        if waited is not None and p["files"] is not None:
            result["completed_by_earlier_fetch"] = sorted(set(p["files"]) - set(plan))
        result["fetched"] = plan
        result["planned_bytes"] = sum(files[n]["size"] for n in plan)
        lock.write({"state": "running", "pid": os.getpid(), "repo_id": repo_id, "revision": revision,
                    "model_dir": model_dir, "progress_path": progress_path, "progress_id": p["progress_id"],
                    "started_at": now_iso(), "planned_bytes": result["planned_bytes"], "files": len(plan)})
        if not plan:
            outcome = "done"
            module.exit_json(**result)
        result["changed"] = True
        still_needed = sum(files[n]["size"] - min(partial_size(staging, n), files[n]["size"]) for n in plan)
        free = free_bytes(staging)
        if free < still_needed + p["disk_reserve_bytes"]:
            module.fail_json(
                msg=f"checkpoint_model_dir={model_dir}: the filesystem has {human_bytes(free)} free but the "
                f"{len(plan)} files still to fetch need {human_bytes(still_needed)} plus a reserve of "
                f"{human_bytes(p['disk_reserve_bytes'])}. Fix: free space or point spark_model_dir at a larger "
                "filesystem.", free_bytes=free, needed_bytes=still_needed, **result,
            )
        code_by_name = {c["name"]: c for c in result["code_files"]}
        errors: dict[str, BaseException] = {}
        started = time.monotonic()

        def fetch_one(name: str) -> None:
            entry = files[name]
            part = os.path.join(staging, name + ".part")
            os.makedirs(os.path.dirname(part), exist_ok=True)
            progress.begin(name)
            review = code_by_name.get(name)
            if review and matches_record(review["review_path"], entry):
                # The reviewed copy is the pinned content: it is not fetched twice.
                shutil.copyfile(review["review_path"], part)
            else:
                download(hub, url_of(name), part, entry["size"], headers=headers, timeout=timeout,
                         on_bytes=progress.meter.add)
            os.chmod(part, 0o644)
            dest = os.path.join(model_dir, name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.replace(part, dest)
            progress.finish(name)

        with Progress(progress_path, p["progress_id"], plan, files, staging) as progress:
            with ThreadPoolExecutor(max_workers=max(1, p["max_workers"])) as pool:
                futures = {pool.submit(fetch_one, n): n for n in plan}
                for fut in as_completed(futures):
                    exc = fut.exception()
                    if exc is not None:
                        errors[futures[fut]] = exc
            result["seconds"] = round(time.monotonic() - started, 3)
            done = [n for n in plan if n not in errors]
            result["fetched"] = done
            result["fetched_bytes"] = progress.meter.moved
            if errors:
                first_name, first = next(iter(errors.items()))
                # fail_json exits through SystemExit inside the context, so the progress file says "failed".
                module.fail_json(
                    msg=f"{len(errors)} of {len(plan)} files failed to download; completed files and partial bytes "
                    f"are kept, run again to resume. First: {first_name}: "
                    + explain(first, f"downloading {first_name}"),
                    errors={n: f"{type(e).__name__}: {e}" for n, e in errors.items()}, changed=bool(done),
                    **{k: v for k, v in result.items() if k != "changed"},
                )
        outcome = "done"
    finally:
        lock.release({"state": "ended", "outcome": outcome, "pid": os.getpid(), "repo_id": repo_id,
                      "revision": revision, "model_dir": model_dir, "progress_path": progress_path,
                      "progress_id": p["progress_id"], "ended_at": now_iso()})
    module.exit_json(**result)


if __name__ == "__main__":
    main()

#!/usr/bin/python
"""Verify a local checkpoint directory against the record of its pinned revision."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_verify
short_description: Verify a local model checkpoint against the record of its pinned revision, offline
description:
  - For the checkpoint role's internal use (its converge steps); options and return values may change
    with the role. Other roles ask the role's C(stamp) entry point (M(dgx_spark.llm_serving.checkpoint_stamp)) whether the
    stamp vouches.
  - Compares O(model_dir) with the record written by M(dgx_spark.llm_serving.checkpoint_fetch) (file names, sizes, sha256 of
    LFS files, git blob sha1 of the others). Needs no network and no third-party Python package.
  - First the file set, failing at once whatever O(fail_on_problems) says, since hashing cannot fix
    it. Files the record does not list (never deleted) and code-like files (C(*.py), C(*.sh),
    C(*.so), any file with an execute bit, any symlink) it does not list are refused before a byte
    is read. Code files the record lists are read next, alone, and refused unless
    O(trusted_code_files) pins each by name and sha256, since the server runs with
    C(--trust-remote-code) and would execute them; the refusal prints the YAML to paste after
    review when the file's content is known. No weight is hashed before.
  - Fast mode (seconds) checks every size, the content of every file that is not a weight shard
    (so a stale C(model-input-scales.safetensors), replaced upstream on 2026-08-30, is caught), the
    shard count, that C(model.safetensors.index.json) references exactly the shards present, that
    C(config.json) declares O(model_type) with a C(quantization_config), and that
    C(processor_config.json) exists. With a stamp of this record it also compares every file's
    size, mtime, inode and ctime with the stamp's memory of them and hashes exactly the files that
    changed since they were verified, so an in-place change of a shard is caught without hashing
    the others.
  - Deep mode hashes every file that no stamp or O(cache_path) remembers verifying in its present
    state (every file with O(rehash)), on one thread per core, largest files first.
  - Returns the files to fetch again (missing, wrong size, wrong content) so only those move.
  - Probe mode reads, in one pass and without writing or failing, whether the directory needs
    nothing at all (RV(done)) - the role's no-change path. Done when the verified-stamp vouches
    for O(model_dir) at O(revision) as the role's C(stamp) entry point judges it (the record beside
    it, of O(repo_id), every file in the state the stamp remembers verifying it in, one lstat per
    file), and what the fast mode checks besides holds (no file the record does not list, every
    code file of the record pinned in O(trusted_code_files) to its content (read, they are small),
    the shard count, index, C(config.json) and C(processor_config.json)); with O(client_venv), the
    hub client O(client_version) installed there. Every reason it is not done is in RV(reasons);
    the fast mode that follows then says the same with its fix.
  - With O(stamp_path), writes a verified-stamp after a successful deep verification and removes it
    whenever verification fails, so a consumer (the server role) can refuse an unverified checkpoint.
version_added: "1.0.0"
author: LLM serving maintainers (@dgx-spark)
options:
  model_dir:
    description: Absolute path of the local model directory.
    type: path
    required: true
  record_path:
    description: Record of the revision (JSON written by M(dgx_spark.llm_serving.checkpoint_fetch)).
    type: path
    required: true
  record:
    description:
      - The record itself, used instead of reading O(record_path) when given (for instance in check
        mode, before the record has been written).
    type: dict
  revision:
    description: When set, the record must be of this revision.
    type: str
  mode:
    description: V(fast), V(deep) or V(probe) (read only, see above).
    type: str
    choices: [fast, deep, probe]
    default: fast
  repo_id:
    description: When set, the record must be of this repository (O(mode=probe) only).
    type: str
  client_venv:
    description: Venv that must hold the hub client, on the host that fetches (O(mode=probe) only).
    type: path
  client_version:
    description: Version of huggingface_hub that O(client_venv) must hold.
    type: str
  shard_count:
    description: Number of C(model-NNNNN-of-MMMMM.safetensors) shards expected.
    type: int
    default: 120
  model_type:
    description: Value C(config.json) must declare as C(model_type).
    type: str
    default: glm5_next
  ignore:
    description: Directory prefixes inside O(model_dir) that hold client metadata and are not part of the checkpoint.
    type: list
    elements: str
    default: [.cache/huggingface/]
  stamp_path:
    description:
      - Verified-stamp file to write after a passing deep check (with each file's state and digest)
        and to remove after any failing check. A fast check rewrites a stamp of this record whose
        memory of a file it had to renew.
    type: path
  cache_path:
    description:
      - File that remembers every file verified so far (state and digest), kept across failed
        passes, so a pass after a transfer hashes only what changed. Same format as the stamp's
        C(files).
    type: path
  rehash:
    description: Hash every file in deep mode even when a stamp or the cache vouches for it.
    type: bool
    default: false
  trusted_code_files:
    description:
      - Code files (C(*.py), C(*.so), ...) of the record that may be present, by repository path,
        each with the sha256 of its reviewed content. Any other code file of the record is refused.
    type: dict
    default: {}
  workers:
    description: Hashing threads in deep mode; 0 means one per core.
    type: int
    default: 0
  fail_on_problems:
    description:
      - Fail when the checkpoint is not complete and correct. When false, the problems are returned
        (with the re-fetch list) and only a refused code-like file fails the task.
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: >-
      The stamp is neither written nor removed; the result's C(changed) says whether it would be. O(mode=probe) reads
      only, in either mode.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: dgx_spark.llm_serving.checkpoint_stamp
    description: Reads the stamp for other roles.
"""

EXAMPLES = r"""
- name: Check the checkpoint quickly and learn what must be fetched again
  dgx_spark.llm_serving.checkpoint_verify:
    model_dir: /opt/models/glm53
    record_path: /opt/models/glm53.record.json
    fail_on_problems: false
  register: verify

- name: Hash what changed since the last verification and stamp the directory as verified
  dgx_spark.llm_serving.checkpoint_verify:
    model_dir: /opt/models/glm53
    record_path: /opt/models/glm53.record.json
    mode: deep
    stamp_path: /opt/models/glm53.verified
    cache_path: /opt/models/.glm53.partial/verified-files.json
    trusted_code_files:
      modeling_glm5_next.py: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08

- name: Read whether the directory needs nothing at all
  dgx_spark.llm_serving.checkpoint_verify:
    model_dir: /opt/models/glm53
    record_path: /opt/models/glm53.record.json
    revision: 0123456789abcdef0123456789abcdef01234567
    repo_id: LibertAIDAI/GLM-5.3-Flash-NVFP4
    mode: probe
    stamp_path: /opt/models/glm53.verified
  register: probe
"""

RETURN = r"""
done:
  description: O(mode=probe) only. Whether the directory needs nothing (see the description).
  returned: when O(mode=probe)
  type: bool
holds:
  description:
    - O(mode=probe) only. Whether the directory holds the verified checkpoint, whatever the hub client's state
      (another node may take it from here even when this host would install the client again).
  returned: when O(mode=probe)
  type: bool
reasons:
  description: O(mode=probe) only. Every reason the directory is not done; empty when it is.
  returned: when O(mode=probe)
  type: list
  elements: str
record:
  description: O(mode=probe) only. The record beside the directory, when it holds the verified checkpoint.
  returned: when O(mode=probe)
  type: dict
ok:
  description: Whether the checkpoint is complete and matches the record.
  returned: unless O(mode=probe)
  type: bool
problems:
  description: One sentence per problem found.
  returned: unless O(mode=probe)
  type: list
  elements: str
missing:
  description: Files in the record absent from the directory.
  returned: unless O(mode=probe)
  type: list
  elements: str
wrong_size:
  description: Files whose size differs from the record.
  returned: unless O(mode=probe)
  type: list
  elements: str
wrong_content:
  description: Files whose hash differs from the record.
  returned: unless O(mode=probe)
  type: list
  elements: str
stale_scales:
  description: Whether model-input-scales.safetensors is present but not the recorded version.
  returned: unless O(mode=probe)
  type: bool
extra:
  description: Files present but not in the record (never deleted by this role).
  returned: unless O(mode=probe)
  type: list
  elements: str
refused:
  description:
    - Code-like files present but not in the record, and code files of the record not pinned (or pinned to other
      content).
  returned: unless O(mode=probe)
  type: list
  elements: str
code_files:
  description: Code files the record lists, each with C(name), C(pinned) and, when its content was read, C(sha256).
  returned: unless O(mode=probe)
  type: list
  elements: dict
hashed:
  description:
    - Files this run hashed; the others were vouched for by a stamp or the cache, or are weight shards that a fast
      check without a stamp does not read.
  returned: unless O(mode=probe)
  type: list
  elements: str
changed_since_verified:
  description: Files a stamp or the cache remembered verifying, changed since (size, mtime, inode or ctime), so hashed again.
  returned: unless O(mode=probe)
  type: list
  elements: str
refetch:
  description: Files to fetch (or sync) again; fixing exactly these makes the directory complete.
  returned: unless O(mode=probe)
  type: list
  elements: str
refetch_bytes:
  description: Bytes of the files in RV(refetch).
  returned: unless O(mode=probe)
  type: int
total_bytes:
  description: Size of the checkpoint according to the record.
  returned: unless O(mode=probe)
  type: int
free_bytes:
  description: Free bytes on the filesystem that holds (or will hold) O(model_dir).
  returned: unless O(mode=probe)
  type: int
hashed_bytes:
  description: Bytes read and hashed by this run (0 when the file set was refused).
  returned: unless O(mode=probe)
  type: int
revision:
  description: Revision of the record.
  returned: unless O(mode=probe)
  type: str
mode:
  description: The O(mode) that ran.
  returned: unless O(mode=probe)
  type: str
structure_problems:
  description: Problems of the record itself (not the expected model); fetching again cannot fix them.
  returned: unless O(mode=probe)
  type: list
  elements: str
file_count:
  description: Files in the record.
  returned: unless O(mode=probe)
  type: int
seconds:
  description: Wall time of the check.
  returned: unless O(mode=probe)
  type: float
stamp:
  description: Content of the verified-stamp after this run, or null when there is none.
  returned: unless O(mode=probe)
  type: dict
"""

import glob
import json
import os
import re
import stat
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.checkpoint_common import (
    RECORD_FORMAT,
    atomic_write,
    file_digests,
    free_bytes,
    is_code_like,
    is_code_name,
    load_json,
    new_stamp,
    read_json,
    record_hash,
    stamp_file_problems,
    stamp_matches,
    stamp_problems,
    stamp_time_ns,
    still_verified,
    trusted_code_yaml,
    verified_entry,
)

SHARD_RE = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SCALES = "model-input-scales.safetensors"


def scan(model_dir: str, ignore: list[str]) -> dict[str, os.stat_result]:
    """Every non-directory entry under model_dir, by '/'-joined relative path (symlinks not followed)."""
    found: dict[str, os.stat_result] = {}
    if not os.path.isdir(model_dir):
        return found
    for root, dirs, names in os.walk(model_dir, followlinks=False):
        rel_root = os.path.relpath(root, model_dir)
        rel_root = "" if rel_root == "." else rel_root.replace(os.sep, "/") + "/"
        for d in list(dirs):
            full = os.path.join(root, d)
            if os.path.islink(full):
                dirs.remove(d)
                found[rel_root + d] = os.lstat(full)
            elif any((rel_root + d + "/").startswith(i) for i in ignore):
                dirs.remove(d)
        for n in names:
            found[rel_root + n] = os.lstat(os.path.join(root, n))
    return found


def structure_checks(model_dir: str, files: dict, *, shard_count: int, model_type: str,
                     present: set, found: set) -> tuple[list[str], list[str]]:
    """Return (record problems, local problems).

    Record problems mean the pinned revision is not the expected model: fetching again cannot fix
    them. Files in ``present`` match the record, so a wrong value inside one is a record problem too.
    """
    problems: list[str] = []
    local: list[str] = []
    shards = sorted(n for n in files if SHARD_RE.match(n))
    if len(shards) != shard_count:
        problems.append(f"the record lists {len(shards)} weight shards, expected {shard_count}: wrong repository "
                        "or revision (checkpoint_repo_id / checkpoint_revision)")
    for n in shards:
        m = SHARD_RE.match(n)
        if int(m.group(2)) != len(shards):
            problems.append(f"shard {n} names a total of {int(m.group(2))}, the record has {len(shards)} shards")
            break
    index = "model.safetensors.index.json"
    if index in present:
        try:
            with open(os.path.join(model_dir, index), encoding="utf-8") as f:
                referenced = set(json.load(f)["weight_map"].values())
            record_shards = set(shards)
            local_shards = {n for n in found if SHARD_RE.match(n)}
            if referenced != record_shards:
                problems.append(f"{index} references {len(referenced)} shards, the record lists {len(record_shards)}")
            elif referenced != local_shards:
                local.append(
                    f"{index} references {len(referenced)} shards, {len(local_shards)} are present; "
                    f"unreferenced: {sorted(local_shards - referenced)[:5]}, absent: {sorted(referenced - local_shards)[:5]}")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            problems.append(f"{index} is not a readable safetensors index: {e}")
    elif index not in files:
        problems.append(f"the record has no {index}")
    if "config.json" in present:
        try:
            with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
                cfg = json.load(f)
            if cfg.get("model_type") != model_type:
                problems.append(f"config.json declares model_type {cfg.get('model_type')!r}, expected {model_type!r}")
            if not isinstance(cfg.get("quantization_config"), dict):
                problems.append("config.json has no quantization_config: not the NVFP4 checkpoint")
        except (OSError, ValueError) as e:
            problems.append(f"config.json is not readable JSON: {e}")
    elif "config.json" not in files:
        problems.append("the record has no config.json")
    if "processor_config.json" not in files:
        problems.append("the record has no processor_config.json (the server opens it by path)")
    return problems, local


def memory_of(stamp, cache, record: dict) -> tuple[list[dict], int | None]:
    """The remembered verifications to consult (cache, then stamp), and the time before which an
    older stamp without per-file memory vouches for unchanged files (None: it does not).

    A stamp written before stamps remembered each file vouches, for its own record, for every file
    whose ctime is older than its verified_at: the kernel sets ctime on any change, so such a file
    has not changed since the verification ended. Its memory is then written the first time.
    """
    sources = []
    if isinstance(cache, dict) and isinstance(cache.get("files"), dict):
        sources.append(cache["files"])
    legacy_before = None
    if isinstance(stamp, dict):
        if isinstance(stamp.get("files"), dict):
            sources.append(stamp["files"])
        elif stamp_matches(stamp, record) and stamp.get("mode") == "deep":
            legacy_before = stamp_time_ns(stamp)
    return sources, legacy_before


def refusal_message(model_dir: str, revision: str, *, extra, refused_local, unpinned, mispinned,
                    code_info: dict) -> str:
    """Why the directory is refused, each part with its fix; the code files' YAML when their content is known."""
    parts = []
    if refused_local:
        parts.append(f"code-like files not in the pinned record {refused_local[:10]} would be executed by the "
                     "server (--trust-remote-code). Fix: inspect and remove them; the role never deletes files")
    if unpinned or mispinned:
        names = sorted(set(unpinned) | set(mispinned))
        text = (f"the pinned revision {revision} lists code files the server would run (--trust-remote-code) that "
                f"checkpoint_trusted_code_files does not pin to their content: {names}")
        for name in mispinned:
            text += (f"; {name} has sha256 {code_info[name]['sha256']}, checkpoint_trusted_code_files pins "
                     f"{code_info[name]['pinned_sha256']}: not the code that was reviewed")
        known = {n: code_info[n]["sha256"] for n in names if code_info.get(n, {}).get("sha256")}
        if known and len(known) == len(names):
            text += (". Fix: review them (in " + model_dir + "), then add to the inventory "
                     "(e.g. group_vars/spark.yml) and run again:\n\n" + trusted_code_yaml(known) + "\n")
        else:
            text += (". Fix: run playbooks/checkpoint.yml: the head downloads them for review and prints the "
                     "checkpoint_trusted_code_files lines to paste")
        parts.append(text)
    if extra:
        parts.append(f"{len(extra)} files not in the record of {revision}: {extra[:10]}. They are never deleted "
                     "automatically. Fix: remove them from the model directory (or move them elsewhere), "
                     "then run again")
    before = "before hashing anything" if extra or refused_local else "before hashing any weight"
    return f"refusing {model_dir} {before}: " + "; ".join(parts)


def probe(p: dict, model_dir: str) -> dict:
    """The probe mode: whether ``model_dir`` needs nothing, and every reason it does otherwise.

    Reads only and never fails. Done exactly when a fast check would pass hashing nothing but the
    code files and write nothing: the stamp vouches for this record (stamp_problems and
    stamp_file_problems, as the stamp entry point judges it, with the stamp's memory of every file)
    and nothing else the fast check refuses is there.
    """
    stamp_path = p["stamp_path"]
    record_path = p["record_path"]
    reasons: list[str] = []
    if not stamp_path:
        return {"done": False, "holds": False, "reasons": ["no stamp_path to read"], "record": None}
    stamp_read, record_read = read_json(stamp_path), read_json(record_path)
    reasons = stamp_problems(stamp_read, record_read, revision=p["revision"], model_dir=model_dir,
                             stamp_path=stamp_path, record_path=record_path)
    if reasons:
        return {"done": False, "holds": False, "reasons": reasons, "record": None}
    stamp, record = stamp_read[0], record_read[0]
    files = record["files"]
    if p["repo_id"] and record.get("repo_id") != p["repo_id"]:
        reasons.append(f"the record {record_path} is of {record.get('repo_id')}, checkpoint_repo_id is {p['repo_id']}")
    if record.get("format") != RECORD_FORMAT:
        reasons.append(f"the record {record_path} is of format {record.get('format')}, not {RECORD_FORMAT}")
    if not isinstance(stamp.get("files"), dict):
        # A stamp from before stamps remembered each file: the fast check writes that memory once.
        reasons.append(f"the stamp {stamp_path} remembers no file states yet")
    else:
        reasons += stamp_file_problems(stamp, files, model_dir, stamp_path)
    found = scan(model_dir, p["ignore"])
    strays = sorted(n for n, st in found.items() if n not in files or not stat.S_ISREG(st.st_mode))
    if strays:
        reasons.append(f"{len(strays)} entries of {model_dir} are not files of the record, e.g. {strays[:3]}")
    trusted = p["trusted_code_files"] or {}
    bad_code = []
    for name in sorted(n for n in files if is_code_name(n)):
        path = os.path.join(model_dir, name)
        algo, want = record_hash(files[name])
        try:
            got = file_digests(path, files[name]["size"], sorted({algo, "sha256"}))
        except OSError:
            got = {}
        if got.get(algo) != want or trusted.get(name) != got.get("sha256"):
            bad_code.append(name)
    if bad_code:
        reasons.append(f"code files of the record not pinned to their content in checkpoint_trusted_code_files: "
                       f"{bad_code}")
    present = {n for n in files if n in found} - set(bad_code)
    structural, local = structure_checks(model_dir, files, shard_count=p["shard_count"], model_type=p["model_type"],
                                         present=present, found=set(found))
    reasons += structural + local
    holds = not reasons
    venv = p["client_venv"]
    if venv:
        dist = f"huggingface_hub-{p['client_version']}.dist-info"
        installed = os.path.exists(os.path.join(venv, "bin", "python")) and bool(
            glob.glob(os.path.join(glob.escape(venv), "lib", "python3*", "site-packages", glob.escape(dist))))
        if not installed:
            reasons.append(f"huggingface_hub {p['client_version']} is not installed in {venv}")
    return {"done": not reasons, "holds": holds, "reasons": reasons, "record": record if holds else None}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "model_dir": {"type": "path", "required": True},
            "record_path": {"type": "path", "required": True},
            "record": {"type": "dict"},
            "revision": {"type": "str"},
            "mode": {"type": "str", "choices": ["fast", "deep", "probe"], "default": "fast"},
            "repo_id": {"type": "str"},
            "client_venv": {"type": "path"},
            "client_version": {"type": "str"},
            "shard_count": {"type": "int", "default": 120},
            "model_type": {"type": "str", "default": "glm5_next"},
            "ignore": {"type": "list", "elements": "str", "default": [".cache/huggingface/"]},
            "stamp_path": {"type": "path"},
            "cache_path": {"type": "path"},
            "rehash": {"type": "bool", "default": False},
            "trusted_code_files": {"type": "dict", "default": {}},
            "workers": {"type": "int", "default": 0},
            "fail_on_problems": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    model_dir = os.path.normpath(p["model_dir"])
    if p["mode"] == "probe":
        module.exit_json(changed=False, **probe(p, model_dir))
    record = p["record"]
    if record is None:
        record, problem = read_json(p["record_path"])
        if problem is None and not (isinstance(record, dict) and isinstance(record.get("files"), dict)):
            problem = ("json", "not a record (no files mapping)")
        if problem:
            module.fail_json(msg=f"cannot read the record {p['record_path']}: {problem[1]}. Fix: run the checkpoint "
                             "role on the head first; it writes the record and copies it to the workers.")
    if p["revision"] and record.get("revision") != p["revision"]:
        module.fail_json(msg=f"the record {p['record_path']} is of revision {record.get('revision')}, "
                         f"checkpoint_revision is {p['revision']}.")
    trusted = p["trusted_code_files"] or {}
    bad_pins = {n: v for n, v in trusted.items() if not (isinstance(v, str) and SHA256_RE.match(v))}
    if bad_pins:
        module.fail_json(msg=f"checkpoint_trusted_code_files pins {sorted(bad_pins)} to values that are not a sha256 "
                         "(64 lowercase hex digits). Fix: paste the lines the refusal printed.")
    files: dict = record["files"]
    revision = record["revision"]
    deep = p["mode"] == "deep"
    started = time.monotonic()
    found = scan(model_dir, p["ignore"])
    stamp_path = p["stamp_path"]
    stamp = load_json(stamp_path) if stamp_path else None
    cache = load_json(p["cache_path"]) if p["cache_path"] else None

    result = {
        "changed": False, "ok": False, "mode": p["mode"], "revision": revision, "problems": [],
        "structure_problems": [], "missing": [], "wrong_size": [], "wrong_content": [], "stale_scales": False,
        "extra": [], "refused": [], "code_files": [], "refetch": [], "refetch_bytes": 0, "hashed": [],
        "changed_since_verified": [], "total_bytes": sum(e["size"] for e in files.values()),
        "file_count": len(files), "free_bytes": free_bytes(model_dir), "hashed_bytes": 0, "seconds": 0.0,
        "stamp": None,
    }

    def drop_stamp() -> None:
        if stamp_path and os.path.lexists(stamp_path):
            result["changed"] = True
            if not module.check_mode:
                os.unlink(stamp_path)

    # ---- 1. the file set, before any byte is hashed ----------------------------------------------
    missing, wrong_size, extra, refused_local = [], [], [], []
    for name, st in sorted(found.items()):
        if name in files:
            if not stat.S_ISREG(st.st_mode):
                refused_local.append(name)
            continue
        (refused_local if is_code_like(name, st) else extra).append(name)
    present: dict[str, os.stat_result] = {}
    for name, entry in files.items():
        st = found.get(name)
        if st is None:
            missing.append(name)
        elif not stat.S_ISREG(st.st_mode):
            continue
        elif st.st_size != entry["size"]:
            wrong_size.append(name)
        else:
            present[name] = st
    code_names = sorted(n for n in files if is_code_name(n))
    code_info = {n: {"name": n, "pinned": n in trusted, "pinned_sha256": trusted.get(n), "sha256": None}
                 for n in code_names}
    workers = p["workers"] or len(os.sched_getaffinity(0)) or 1
    hashed_bytes = 0
    wrong_content: list[str] = []
    digests: dict[str, dict] = {}

    def hash_many(names: list[str]) -> None:
        """Hash ``names`` on ``workers`` threads, largest first; fills digests (None: changed meanwhile)."""
        nonlocal hashed_bytes

        def one(name: str):
            path = os.path.join(model_dir, name)
            algos = {record_hash(files[name])[0]} | ({"sha256"} if is_code_name(name) else set())
            before = os.lstat(path)
            got = file_digests(path, files[name]["size"], sorted(algos))
            after = os.lstat(path)
            # A file rewritten while it was read hashed to nothing meaningful.
            return (before, got) if _same(before, after) else (before, None)

        order = sorted(names, key=lambda n: -files[n]["size"])
        if not order:
            return
        with ThreadPoolExecutor(max_workers=min(workers, len(order))) as pool:
            for name, (st, got) in zip(order, pool.map(one, order), strict=True):
                hashed_bytes += files[name]["size"]
                digests[name] = {"st": st, "got": got}

    unpinned = [n for n in code_names if n not in trusted]

    def refuse(mispinned: list[str]) -> None:
        result.update(missing=missing, wrong_size=wrong_size, extra=extra,
                      refused=sorted(set(refused_local) | set(unpinned) | set(mispinned)),
                      code_files=[code_info[n] for n in code_names], hashed=sorted(digests),
                      hashed_bytes=hashed_bytes, seconds=round(time.monotonic() - started, 3))
        drop_stamp()
        module.fail_json(msg=refusal_message(model_dir, revision, extra=extra, refused_local=refused_local,
                                             unpinned=unpinned, mispinned=mispinned, code_info=code_info),
                         **result)

    # Files the directory must not hold: no byte is read, hashing cannot fix them.
    if extra or refused_local:
        refuse([])
    # Code files of the record are read next, alone (they are small): their content decides whether
    # the directory is refused, and the refusal prints the lines to paste.
    code_present = [n for n in code_names if n in present]
    hash_many(code_present)
    for name in code_present:
        got = digests[name]["got"]
        algo, want = record_hash(files[name])
        if got is not None and got.get(algo) == want:
            code_info[name]["sha256"] = got["sha256"]
    mispinned = [n for n in code_names if n in trusted and code_info[n]["sha256"]
                 and code_info[n]["sha256"] != trusted[n]]
    result["code_files"] = [code_info[n] for n in code_names]
    if unpinned or mispinned:
        refuse(mispinned)

    # ---- 2. what earlier verifications vouch for ---------------------------------------------------
    sources, legacy_before = memory_of(stamp, cache, record)
    stamp_of_record = isinstance(stamp, dict) and stamp_matches(stamp, record) and stamp.get("mode") == "deep"
    verified: dict[str, dict] = {}
    changed_since: list[str] = []
    to_hash: list[str] = []
    for name, st in present.items():
        if name in digests:
            continue
        remembered = [src.get(name) for src in sources if isinstance(src.get(name), dict)]
        vouched = any(still_verified(k, st, files[name]) for k in remembered)
        if not vouched and legacy_before is not None and st.st_ctime_ns < legacy_before:
            vouched = True
        if vouched and not p["rehash"]:
            verified[name] = verified_entry(st, files[name])
            continue
        want = record_hash(files[name])
        if not vouched and (legacy_before is not None or any(k.get(want[0]) == want[1] for k in remembered)):
            # Verified with these very bytes in mind, and changed since (not merely a new revision's file).
            changed_since.append(name)
        # Fast: small files always, and a weight shard when a stamp of this record must be confirmed.
        if deep or not SHARD_RE.match(name) or stamp_of_record:
            to_hash.append(name)

    # ---- 3. hash -------------------------------------------------------------------------------------
    hash_many(to_hash)
    changed_while_read = []
    for name, d in digests.items():
        algo, want = record_hash(files[name])
        if d["got"] is None:
            changed_while_read.append(name)
            wrong_content.append(name)
        elif d["got"].get(algo) != want:
            wrong_content.append(name)
        else:
            verified[name] = verified_entry(d["st"], files[name])
    wrong_content.sort()

    good = {n for n in present if n not in wrong_content}
    structural, problems = structure_checks(model_dir, files, shard_count=p["shard_count"],
                                            model_type=p["model_type"], present=good, found=set(found))
    stale = SCALES in wrong_content or SCALES in wrong_size
    if missing:
        problems.append(f"{len(missing)} files missing, e.g. {missing[:3]}")
    if wrong_size:
        problems.append(f"{len(wrong_size)} files of the wrong size (partial or damaged), e.g. {wrong_size[:3]}")
    if stale:
        problems.append(f"{SCALES} is not the recorded version: a copy from before its 2026-08-30 replacement "
                        "(stale) or damaged; it is fetched again")
    others = [n for n in wrong_content if n != SCALES]
    if others:
        problems.append(f"{len(others)} files whose content does not match the record, e.g. {others[:3]}")
    if changed_while_read:
        problems.append(f"{changed_while_read[:3]} changed while they were read: another process writes into "
                        f"{model_dir}")
    refetch = sorted(set(missing) | set(wrong_size) | set(wrong_content))
    ok = not problems and not structural
    complete = ok and set(verified) == set(files)

    result.update(
        ok=ok, problems=problems, structure_problems=structural, missing=missing, wrong_size=wrong_size,
        wrong_content=wrong_content, stale_scales=stale, refetch=refetch,
        refetch_bytes=sum(files[n]["size"] for n in refetch), hashed=sorted(digests),
        changed_since_verified=sorted(changed_since), hashed_bytes=hashed_bytes,
        seconds=round(time.monotonic() - started, 3),
    )

    # ---- 4. remember, stamp --------------------------------------------------------------------------
    if p["cache_path"]:
        cached = cache.get("files") if isinstance(cache, dict) and isinstance(cache.get("files"), dict) else {}
        keep = {n: e for n, e in cached.items() if n in files and n not in digests and n not in refetch}
        memory = {"format": 1, "files": dict(sorted({**keep, **verified}.items()))}
        if memory != cache and (memory["files"] or cache is not None) and not module.check_mode:
            # Only a cache (a pass without it hashes more): no fsync, and a full disk is no failure.
            try:
                atomic_write(p["cache_path"], (json.dumps(memory) + "\n").encode(), 0o644, durable=False)
            except OSError as err:
                module.warn(f"could not remember the verified files in {p['cache_path']}: {err}")
    if stamp_path:
        if not ok:
            drop_stamp()
        elif complete and (deep or stamp_of_record):
            memory = dict(sorted(verified.items()))
            if stamp_of_record and stamp.get("files") == memory and stamp.get("model_dir") == model_dir:
                result["stamp"] = stamp
            else:
                new = new_stamp(record, model_dir, files=memory)
                result["stamp"] = new
                result["changed"] = True
                if not module.check_mode:
                    atomic_write(stamp_path, json.dumps(new, indent=1).encode(), 0o644)

    if structural:
        module.fail_json(
            msg=f"the pinned revision {revision} of {record.get('repo_id')} is not the expected checkpoint: "
            + "; ".join(structural) + ". Fix: pin the right checkpoint_repo_id and checkpoint_revision.", **result)
    if p["fail_on_problems"] and not ok:
        module.fail_json(msg=f"{model_dir} does not match the record of {revision}: " + "; ".join(problems),
                         **result)
    module.exit_json(**result)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_size, a.st_mtime_ns, a.st_ctime_ns, a.st_ino) == (b.st_size, b.st_mtime_ns, b.st_ctime_ns, b.st_ino)


if __name__ == "__main__":
    main()

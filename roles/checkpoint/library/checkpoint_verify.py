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
    with the role. Other roles ask the role's C(stamp) entry point (M(checkpoint_stamp)) whether the
    stamp vouches.
  - Compares O(model_dir) with the record written by M(checkpoint_fetch) (file names, sizes, sha256 of
    LFS files, git blob sha1 of the others). Needs no network and no third-party Python package.
  - Fast mode (seconds) checks the exact file set (nothing missing, nothing extra), every size, the
    content of every file that is not a weight shard (so a stale C(model-input-scales.safetensors),
    replaced upstream on 2026-08-30, is caught), the shard count, that
    C(model.safetensors.index.json) references exactly the shards present, that C(config.json)
    declares O(model_type) with a C(quantization_config), and that C(processor_config.json) exists.
  - Deep mode also hashes every shard, on all cores.
  - Refuses (fails) when the directory holds a code-like file (C(*.py), C(*.sh), C(*.so), any file
    with an execute bit, any symlink) that the record does not list, because the server runs with
    C(--trust-remote-code) and would execute it.
  - Returns the files to fetch again (missing, wrong size, wrong content) so only those move.
  - With O(stamp_path), writes a verified-stamp after a successful deep verification and removes it
    whenever verification fails, so a consumer (the server role) can refuse an unverified checkpoint.
version_added: "1.0.0"
author: spark-deploy maintainers
options:
  model_dir:
    description: Absolute path of the local model directory.
    type: path
    required: true
  record_path:
    description: Record of the revision (JSON written by M(checkpoint_fetch)).
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
    description: V(fast) or V(deep).
    type: str
    choices: [fast, deep]
    default: fast
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
    description: Verified-stamp file to write after a passing deep check and to remove after any failing check.
    type: path
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
    details: The stamp is neither written nor removed; RV(changed) says whether it would be.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: checkpoint_stamp
    description: Reads the stamp for other roles.
"""

EXAMPLES = r"""
- name: Check the checkpoint quickly and learn what must be fetched again
  checkpoint_verify:
    model_dir: /opt/models/glm53
    record_path: /opt/models/glm53.record.json
    fail_on_problems: false
  register: verify

- name: Hash everything and stamp the directory as verified
  checkpoint_verify:
    model_dir: /opt/models/glm53
    record_path: /opt/models/glm53.record.json
    mode: deep
    stamp_path: /opt/models/glm53.verified
"""

RETURN = r"""
ok:
  description: Whether the checkpoint is complete and matches the record.
  returned: always
  type: bool
problems:
  description: One sentence per problem found.
  returned: always
  type: list
  elements: str
missing:
  description: Files in the record absent from the directory.
  returned: always
  type: list
  elements: str
wrong_size:
  description: Files whose size differs from the record.
  returned: always
  type: list
  elements: str
wrong_content:
  description: Files whose hash differs from the record.
  returned: always
  type: list
  elements: str
stale_scales:
  description: Whether model-input-scales.safetensors is present but not the recorded version.
  returned: always
  type: bool
extra:
  description: Files present but not in the record (never deleted by this role).
  returned: always
  type: list
  elements: str
refused:
  description: Code-like files present but not in the record.
  returned: always
  type: list
  elements: str
refetch:
  description: Files to fetch (or sync) again; fixing exactly these makes the directory complete.
  returned: always
  type: list
  elements: str
refetch_bytes:
  description: Bytes of the files in RV(refetch).
  returned: always
  type: int
total_bytes:
  description: Size of the checkpoint according to the record.
  returned: always
  type: int
free_bytes:
  description: Free bytes on the filesystem that holds (or will hold) O(model_dir).
  returned: always
  type: int
hashed_bytes:
  description: Bytes read and hashed by this run.
  returned: always
  type: int
revision:
  description: Revision of the record.
  returned: always
  type: str
mode:
  description: The O(mode) that ran.
  returned: always
  type: str
structure_problems:
  description: Problems of the record itself (not the expected model); fetching again cannot fix them.
  returned: always
  type: list
  elements: str
file_count:
  description: Files in the record.
  returned: always
  type: int
seconds:
  description: Wall time of the check.
  returned: always
  type: float
stamp:
  description: Content of the verified-stamp after this run, or null when there is none.
  returned: always
  type: dict
"""

import hashlib
import json
import os
import re
import stat
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.checkpoint_common import (
    atomic_write,
    free_bytes,
    load_json,
    new_stamp,
    read_json,
    stamp_matches,
)

SHARD_RE = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")
CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyx", ".sh", ".bash", ".so", ".dylib", ".dll", ".exe", ".pl", ".rb",
                 ".js", ".mjs", ".ipynb", ".pth", ".whl", ".egg")
SCALES = "model-input-scales.safetensors"
BLOCK = 8 * 1024 * 1024


def hash_file(path: str, entry: dict) -> tuple[str, str]:
    """Return (algorithm, hex digest) of the hash the record holds for this file.

    hashlib releases the GIL on large buffers, so threads hash on every core without forking
    the module process.
    """
    if entry.get("sha256"):
        h, algo = hashlib.sha256(), "sha256"
    else:
        h = hashlib.sha1(f"blob {entry['size']}\0".encode(), usedforsecurity=False)
        algo = "git_sha1"
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return algo, h.hexdigest()


def is_code_like(path: str, st: os.stat_result) -> bool:
    return (
        path.lower().endswith(CODE_SUFFIXES)
        or stat.S_ISLNK(st.st_mode)
        or (stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111))
        or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode))
    )


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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "model_dir": {"type": "path", "required": True},
            "record_path": {"type": "path", "required": True},
            "record": {"type": "dict"},
            "revision": {"type": "str"},
            "mode": {"type": "str", "choices": ["fast", "deep"], "default": "fast"},
            "shard_count": {"type": "int", "default": 120},
            "model_type": {"type": "str", "default": "glm5_next"},
            "ignore": {"type": "list", "elements": "str", "default": [".cache/huggingface/"]},
            "stamp_path": {"type": "path"},
            "workers": {"type": "int", "default": 0},
            "fail_on_problems": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    model_dir = os.path.normpath(p["model_dir"])
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
    files: dict = record["files"]
    started = time.monotonic()
    found = scan(model_dir, p["ignore"])

    missing, wrong_size, wrong_content, extra, refused = [], [], [], [], []
    for name, st in sorted(found.items()):
        if name in files:
            if not stat.S_ISREG(st.st_mode):
                refused.append(name)
            continue
        (refused if is_code_like(name, st) else extra).append(name)
    to_hash = []
    for name, entry in files.items():
        st = found.get(name)
        if st is None:
            missing.append(name)
        elif not stat.S_ISREG(st.st_mode):
            continue
        elif st.st_size != entry["size"]:
            wrong_size.append(name)
        elif p["mode"] == "deep" or not SHARD_RE.match(name):
            to_hash.append(name)

    workers = p["workers"] or os.cpu_count() or 1
    hashed_bytes = 0
    if to_hash:
        # Biggest first so one late large file does not leave every other core idle.
        to_hash.sort(key=lambda n: -files[n]["size"])
        with ThreadPoolExecutor(max_workers=workers) as pool:
            digests = dict(zip(to_hash, pool.map(lambda n: hash_file(os.path.join(model_dir, n), files[n]),
                                                 to_hash), strict=True))
        for name in sorted(to_hash):
            algo, digest = digests[name]
            hashed_bytes += files[name]["size"]
            if files[name].get(algo) != digest:
                wrong_content.append(name)

    present = {n for n in files if n in found and n not in wrong_size and n not in wrong_content}
    structural, problems = structure_checks(model_dir, files, shard_count=p["shard_count"],
                                            model_type=p["model_type"], present=present, found=set(found))
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
    if extra:
        problems.append(f"{len(extra)} files not in the record of {record['revision']}: {extra[:5]}. They are never "
                        "deleted automatically. Fix: remove them from the model directory (or move them elsewhere).")
    refetch = sorted(set(missing) | set(wrong_size) | set(wrong_content))
    ok = not problems and not refused and not structural

    result = {
        "changed": False,
        "ok": ok,
        "mode": p["mode"],
        "revision": record["revision"],
        "problems": problems,
        "structure_problems": structural,
        "missing": missing,
        "wrong_size": wrong_size,
        "wrong_content": wrong_content,
        "stale_scales": stale,
        "extra": extra,
        "refused": refused,
        "refetch": refetch,
        "refetch_bytes": sum(files[n]["size"] for n in refetch),
        "total_bytes": sum(e["size"] for e in files.values()),
        "file_count": len(files),
        "free_bytes": free_bytes(model_dir),
        "hashed_bytes": hashed_bytes,
        "seconds": round(time.monotonic() - started, 3),
        "stamp": None,
    }

    stamp_path = p["stamp_path"]
    if stamp_path:
        current = load_json(stamp_path)
        if not ok:
            if os.path.lexists(stamp_path):
                result["changed"] = True
                if not module.check_mode:
                    os.unlink(stamp_path)
        elif stamp_matches(current, record):
            # Fast or deep, a stamp of this very record still vouches; a deep pass leaves it as it is.
            result["stamp"] = current
        elif p["mode"] == "deep":
            stamp = new_stamp(record, model_dir)
            result["stamp"] = stamp
            result["changed"] = True
            if not module.check_mode:
                atomic_write(stamp_path, json.dumps(stamp, indent=1).encode(), 0o644)

    if structural:
        module.fail_json(
            msg=f"the pinned revision {record['revision']} of {record.get('repo_id')} is not the expected checkpoint: "
            + "; ".join(structural) + ". Fix: pin the right checkpoint_repo_id and checkpoint_revision.", **result)
    if refused:
        module.fail_json(
            msg=f"refusing {model_dir}: code-like files not in the pinned record {refused[:10]} would be executed "
            "by the server (--trust-remote-code). Fix: inspect and remove them; the role never deletes files.",
            **result)
    if p["fail_on_problems"] and not ok:
        module.fail_json(msg=f"{model_dir} does not match the record of {record['revision']}: " + "; ".join(problems),
                         **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()

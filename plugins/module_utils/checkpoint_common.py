"""What the checkpoint role's modules share, written once.

Formatting of bytes, durations and transfer progress (honest after a resume);
atomic writes; reading JSON files (the record, the stamp, progress files); the
record's paths beside a model directory; what counts as code; the one-transfer
lock; what a verification remembers of each file; and the verified-stamp: what
it holds, its record digest and when it vouches for a checkpoint. checkpoint_verify writes the stamp and
checkpoint_stamp reads it for other roles, both through this file, so the
stamp's meaning has one owner.

The standard library and the collection's own helpers only, no Ansible import: the modules import it as
``ansible_collections.dgx_spark.llm_serving.plugins.module_utils.checkpoint_common`` (Ansible ships it
with each module, also into the hub client's venv), the site's filter on the controller for the paths,
and the unit tests load the file directly.
"""

from __future__ import annotations

import calendar
import errno
import fcntl
import hashlib
import json
import os
import posixpath
import re
import stat
import threading
import time
from collections import deque

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.inputs import shown

# A pinned commit: anything shorter or symbolic can move or be ambiguous.
REVISION_RE = re.compile(r"^[0-9a-f]{40}$")
# A hub repository: owner/name.
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# What checkpoint_paths names beside a model directory <name>: <name>.record.json and <name>.verified.
RECORD_SUFFIX = ".record.json"
STAMP_SUFFIX = ".verified"
# The record's layout, as checkpoint_fetch writes it: a record of another format is read again from
# the hub, so the verification's probe does not vouch for it either.
RECORD_FORMAT = 1


# ---- formatting ----------------------------------------------------------------------------------

def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Rate:
    """Rate over the last samples (about 30 s at one sample a second) and the ETA it implies.

    A window rather than the average since the start, so a resumed transfer (bytes already on
    disk) or a stall shows in the rate within seconds.
    """

    def __init__(self, window: int = 30):
        self.samples: deque = deque(maxlen=window)

    def update(self, now: float, done: int, total: int) -> tuple[float, float | None]:
        self.samples.append((now, done))
        t0, d0 = self.samples[0]
        rate = (done - d0) / (now - t0) if now - t0 > 0.5 else 0.0
        eta = (total - done) / rate if rate > 0 else None
        return rate, eta


def progress_line(done: int, total: int, rate: float, eta: float | None, detail: str) -> str:
    """One line a play prints, e.g. '12.0 GiB / 181.0 GiB (6.6%), 9/131 files, 110.2 MiB/s, ETA 0:26:13'.

    Whatever the caller measured, the line never shows more than the total, more than 100 %, a
    negative rate or a negative ETA.
    """
    done = min(max(done, 0), total) if total else max(done, 0)
    rate = max(rate, 0.0)
    eta = None if eta is None else max(eta, 0.0)
    pct = 100.0 * done / total if total else 100.0
    return (f"{human_bytes(done)} / {human_bytes(total)} ({pct:.1f}%){detail}, "
            f"{human_bytes(rate)}/s, ETA {human_duration(eta)}")


class TransferMeter:
    """Progress of one transfer run, honest after a resume.

    The rate counts only the bytes this run moved (``add``), never bytes an earlier run left on
    disk, over a window of recent samples (so a stall shows within seconds); the ETA divides what
    is still missing by that rate. ``figures(done)`` takes the bytes on disk of the planned files
    (complete and partial) and clamps them to the total, so no figure exceeds 100 % or goes
    negative, whatever the disk shows (a partial file longer than its file, say). ``clock`` is
    injectable for tests.
    """

    def __init__(self, total: int, window: int = 30, clock=time.monotonic):
        self.total = max(int(total), 0)
        self.clock = clock
        self.started = clock()
        self.moved = 0
        self.samples: deque = deque(maxlen=window)
        self.samples.append((self.started, 0))
        self._lock = threading.Lock()

    def add(self, nbytes: int) -> None:
        """Bytes that arrived in this run, from any thread (once per received chunk)."""
        with self._lock:
            self.moved += nbytes

    def figures(self, done: int, final: bool = False) -> dict:
        """done (clamped), moved, rate, eta, percent and elapsed; ``final``: the whole run's average rate."""
        now = self.clock()
        moved = self.moved
        done = min(max(int(done), 0), self.total)
        elapsed = max(now - self.started, 0.0)
        self.samples.append((now, moved))
        t0, m0 = self.samples[0]
        if final:
            rate = moved / elapsed if elapsed > 0 else 0.0
        elif now - t0 > 0.5:
            rate = (moved - m0) / (now - t0)
        else:
            rate = 0.0
        rate = max(rate, 0.0)
        left = self.total - done
        eta = 0.0 if left <= 0 else (left / rate if rate > 0 else None)
        pct = 100.0 * done / self.total if self.total else 100.0
        return {"done": done, "moved": moved, "rate": rate, "eta": eta, "percent": pct, "elapsed": elapsed}


# ---- files ---------------------------------------------------------------------------------------

def atomic_write(path: str, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` in one rename, so a reader never sees half a file.

    ``durable`` also syncs the bytes before the rename (the record, the stamp); a progress file,
    rewritten every second and worthless after a crash, skips that.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        # A full disk, say: no half-written temporary file is left behind.
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_progress(path: str, data: dict) -> None:
    """Publish a transfer's progress for a poller; a failed write only costs one update."""
    try:
        atomic_write(path, json.dumps(data).encode(), 0o644, durable=False)
    except OSError:
        pass


def decode_json(raw: bytes | str) -> tuple[object, tuple[str, str] | None]:
    """(data, None), or (None, ("json", reason)) when ``raw`` is not JSON text."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        return json.loads(text), None
    except (UnicodeDecodeError, ValueError) as err:
        return None, ("json", str(err))


def read_json(path: str) -> tuple[object, tuple[str, str] | None]:
    """(data, None), or (None, (kind, reason)) with kind "missing", "unread" or "json"."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        if err.errno == errno.ENOENT:
            return None, ("missing", err.strerror or "not found")
        return None, ("unread", err.strerror or str(err))
    return decode_json(raw)


def load_json(path: str):
    """The JSON content of ``path``, or None when it is absent or not JSON."""
    data, problem = read_json(path)
    return None if problem else data


def free_bytes(path: str) -> int:
    """Free bytes on the filesystem that holds (or will hold) ``path``."""
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe or "/")
    return st.f_bavail * st.f_frsize


def safe_relpath(name: str) -> bool:
    """A path inside the checkpoint: relative, without empty, "." or ".." components."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def partial_bytes(directory: str) -> int:
    """Bytes in every partial file (``*.part``) under ``directory``: what a resumed fetch continues from."""
    total = 0
    for root, _dirs, names in os.walk(directory):
        for n in names:
            if n.endswith(".part"):
                try:
                    total += os.lstat(os.path.join(root, n)).st_size
                except OSError:
                    pass
    return total


def checkpoint_paths(model_dir: str) -> dict:
    """The record, verified-stamp and partial directories beside ``model_dir``, named after it.

    The modules use it for their defaults, and the roles' tasks through the ``spark_checkpoint_paths`` filter
    (plugins/filter/spark.py), which returns what this does.
    """
    parent, name = posixpath.split(model_dir)
    partial = posixpath.join(parent, f".{name}.partial")
    return {
        "model_dir": model_dir,
        "record": posixpath.join(parent, f"{name}{RECORD_SUFFIX}"),
        "stamp": posixpath.join(parent, f"{name}{STAMP_SUFFIX}"),
        "partial_dir": partial,
        "rsync_partial_dir": posixpath.join(partial, "rsync"),
    }


# Files the server would execute under --trust-remote-code (or a loader would import), by name.
CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyx", ".sh", ".bash", ".so", ".dylib", ".dll", ".exe", ".pl", ".rb",
                 ".js", ".mjs", ".ipynb", ".pth", ".whl", ".egg")


def is_code_name(name: str) -> bool:
    """A repository path whose name says it is code (the hub knows no execute bits)."""
    return name.lower().endswith(CODE_SUFFIXES)


def is_code_like(path: str, st: os.stat_result) -> bool:
    """A local entry that could run: code by name, any symlink, anything executable or not a plain file."""
    return (
        is_code_name(path)
        or stat.S_ISLNK(st.st_mode)
        or (stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111))
        or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode))
    )


def trusted_code_yaml(pins: dict) -> str:
    """The inventory lines that pin code files by name and sha256, ready to paste."""
    lines = ["checkpoint_trusted_code_files:"]
    lines += [f"  {json.dumps(name)}: {digest}" for name, digest in sorted(pins.items())]
    return "\n".join(lines)


# ---- what a verification remembers of each file ---------------------------------------------------

def file_state(st: os.stat_result) -> dict:
    """What changes whenever a file's bytes may have: size, mtime, inode and ctime.

    ctime matters: a tool can put an mtime back (touch -r, rsync -t) after writing in place, but
    only the kernel sets ctime, on every write, rename, chmod and link.
    """
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns}


def record_hash(entry: dict) -> tuple[str, str] | None:
    """(algorithm, hex digest) the record holds for a file: sha256 for LFS files, git blob sha1 otherwise."""
    if isinstance(entry, dict):
        for algo in ("sha256", "git_sha1"):
            if isinstance(entry.get(algo), str) and entry[algo]:
                return algo, entry[algo]
    return None


# Large reads (one system call and one hash update, during which hashlib drops the GIL, per MiB)
# that still fit a core's cache: the bytes the read copies are hashed from there, not from memory
# (16 MiB blocks hashed measurably slower on the 2-core test machine).
HASH_BLOCK = 1024 * 1024


def file_digests(path: str, size: int, algos) -> dict[str, str]:
    """{algorithm: hex digest} of a file, for any of "sha256" and "git_sha1" (git's blob id), in one read.

    hashlib releases the GIL while it hashes a large buffer, and so does the read, so threads that
    call this hash on every core without forking the module process.
    """
    hashers = {}
    for algo in algos:
        if algo == "git_sha1":
            hashers[algo] = hashlib.new("sha1", f"blob {size}\0".encode(), usedforsecurity=False)
        else:
            hashers[algo] = hashlib.new(algo)
    buf = bytearray(HASH_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        try:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        while n := f.readinto(buf):
            chunk = view[:n]
            for h in hashers.values():
                h.update(chunk)
    return {algo: h.hexdigest() for algo, h in hashers.items()}


def verified_entry(st: os.stat_result, entry: dict) -> dict:
    """A file's state when it hashed to the record's digest ``entry``, as the stamp and cache keep it."""
    algo, digest = record_hash(entry)
    return {**file_state(st), algo: digest}


def still_verified(known, st: os.stat_result, entry: dict) -> bool:
    """Whether ``known`` (a stamp's or the cache's entry) vouches for the file as it is now.

    Only when the file has exactly the state it had when it was hashed AND that hash is the one
    the record wants now (a file unchanged between two revisions stays verified).
    """
    want = record_hash(entry)
    if not isinstance(known, dict) or want is None or known.get(want[0]) != want[1]:
        return False
    return all(known.get(k) == v for k, v in file_state(st).items())


# ---- one transfer at a time -----------------------------------------------------------------------

def read_lock_info(path: str) -> dict | None:
    """What the last holder of a transfer lock wrote into it (pid, revision, state ...), if readable."""
    data = load_json(path)
    return data if isinstance(data, dict) else None


def lock_state(path: str) -> tuple[bool, dict | None]:
    """(held, info) of a transfer lock file (fcntl.flock), without waiting.

    Held while the process that took it lives: the kernel drops an flock however its holder ends,
    kill -9 and the OOM killer included, so a lock file whose info still says "running" while
    nobody holds it is the mark of a killed transfer. Peeks with a shared lock held for an instant.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False, None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            held = True
        else:
            held = False
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return held, read_lock_info(path)


class TransferLock:
    """An exclusive fcntl.flock on a file, with what the holder is doing written into it.

    The info is rewritten in place (never renamed: the lock is on the inode), so a reader may catch
    it half written and must retry.
    """

    def __init__(self, path: str):
        self.path = path
        self.fd: int | None = None

    def try_acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def write(self, info: dict) -> None:
        data = (json.dumps(info) + "\n").encode()
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.ftruncate(self.fd, 0)
        os.write(self.fd, data)

    def release(self, info: dict | None = None) -> None:
        if self.fd is None:
            return
        try:
            if info is not None:
                self.write(info)
        finally:
            os.close(self.fd)  # closing the only descriptor drops the flock
            self.fd = None


# ---- the verified-stamp --------------------------------------------------------------------------

def record_digest(files: dict) -> str:
    """The stamp's ``record_sha256``: SHA-256 of the record's ``files`` as canonical JSON.

    Deployed stamps carry this exact value: changing the serialisation would make every existing
    stamp refuse its checkpoint.
    """
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def new_stamp(record: dict, model_dir: str, files: dict | None = None) -> dict:
    """The stamp written after a passing deep verification of ``model_dir`` against ``record``.

    ``files`` (name -> verified_entry) lets the next fast verification notice any file changed since.
    """
    stamp = {"repo_id": record.get("repo_id"), "revision": record["revision"],
             "record_sha256": record_digest(record["files"]), "model_dir": model_dir, "mode": "deep",
             "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if files is not None:
        stamp["files"] = files
    return stamp


def stamp_time_ns(stamp: dict) -> int | None:
    """The stamp's verified_at (whole seconds, UTC) in ns, or None."""
    try:
        return calendar.timegm(time.strptime(stamp["verified_at"], "%Y-%m-%dT%H:%M:%SZ")) * 10**9
    except (KeyError, TypeError, ValueError):
        return None


def stamp_matches(stamp, record: dict) -> bool:
    """Whether ``stamp`` was written for this very record (its revision and its file list)."""
    return isinstance(stamp, dict) and stamp.get("revision") == record.get("revision") \
        and stamp.get("record_sha256") == record_digest(record["files"])


def _json_object(read, path, what, errors):
    """The object a read_json result holds; None (with the problem noted) when there is none."""
    data, problem = read
    if problem:
        kind, reason = problem
        if kind == "json":
            errors.append(f"{what} {path} is not valid JSON ({reason})")
        elif kind == "missing":
            errors.append(f"{what} {path} does not exist")
        else:
            errors.append(f"{what} {path} could not be read ({reason})")
        return None
    if not isinstance(data, dict):
        errors.append(f"{what} {path} is not a JSON object")
        return None
    return data


def stamp_problems(stamp_read, record_read, *, revision, model_dir, stamp_path, record_path,
                   model_dir_variable="checkpoint_model_dir", revision_variable="checkpoint_revision") -> list[str]:
    """What keeps the verified-stamp from vouching for ``model_dir`` at ``revision``.

    ``stamp_read`` and ``record_read`` are read_json results of the two files. The stamp vouches
    when it records a deep check of this directory at the pinned revision against the record
    beside it (same repository, revision and file list), read from the two small files; whether
    the files are still as it verified them is stamp_file_problems'. The ``*_variable`` names are
    the caller's, so a message names the variable the operator would fix. Returns every problem,
    empty when the two files vouch.
    """
    errors: list[str] = []
    if not isinstance(revision, str) or not REVISION_RE.fullmatch(revision):
        errors.append(
            f"{revision_variable} = {shown(revision)} is not a pinned 40-hex commit, so no stamp can "
            "be matched against it (set checkpoint_revision in the inventory)"
        )
    stamp = _json_object(stamp_read, stamp_path, "the verified-stamp", errors)
    record = _json_object(record_read, record_path, "the checkpoint record", errors)
    if stamp is not None:
        if stamp.get("mode") != "deep":
            errors.append(f"the stamp {stamp_path} records a {shown(stamp.get('mode'))} check, not a deep one")
        if isinstance(revision, str) and stamp.get("revision") != revision:
            errors.append(
                f"the stamp {stamp_path} is for revision {shown(stamp.get('revision'))}, the pinned revision is "
                f"{shown(revision)}"
            )
        stamped_dir = stamp.get("model_dir")
        if not isinstance(stamped_dir, str) or posixpath.normpath(stamped_dir) != posixpath.normpath(str(model_dir)):
            errors.append(
                f"the stamp {stamp_path} vouches for {shown(stamped_dir)}, not for {model_dir_variable} = "
                f"{shown(model_dir)}"
            )
    if stamp is not None and record is not None:
        files = record.get("files")
        if not isinstance(files, dict):
            errors.append(f"the checkpoint record {record_path} lists no files")
        elif stamp.get("record_sha256") != record_digest(files):
            errors.append(
                f"the stamp {stamp_path} was written for another record than {record_path} "
                "(the record changed after the last deep verification)"
            )
        if record.get("revision") != stamp.get("revision") or record.get("repo_id") != stamp.get("repo_id"):
            errors.append(
                f"the record {record_path} is of {shown(record.get('repo_id'))}@{shown(record.get('revision'))}, the "
                f"stamp of {shown(stamp.get('repo_id'))}@{shown(stamp.get('revision'))}"
            )
    return errors


def stamp_file_problems(stamp: dict, files: dict, model_dir: str, stamp_path: str) -> list[str]:
    """What the directory's files say against the stamp's memory of them, as the fast verification reads it.

    The stamp remembers each file's size, mtime, inode and ctime when it hashed to the record's
    digest: a file missing now, or whose state differs (a shard rewritten in place, its mtime put
    back or not), is not vouched for, exactly the files the fast check would hash again. A stamp
    written before stamps remembered each file vouches for the files whose ctime is older than its
    verified_at (the kernel sets ctime on any change); one without either vouches by its record.
    One lstat per file, no byte read. For a stamp stamp_problems found nothing against.
    """
    memory = stamp.get("files") if isinstance(stamp.get("files"), dict) else None
    before = None if memory is not None else stamp_time_ns(stamp)
    missing, changed = [], []
    for name in sorted(files):
        if not safe_relpath(name):
            continue
        try:
            st = os.lstat(posixpath.join(model_dir, name))
        except FileNotFoundError:
            missing.append(name)
            continue
        except OSError:
            changed.append(name)
            continue
        if memory is not None:
            if not still_verified(memory.get(name), st, files[name]):
                changed.append(name)
        elif before is not None and st.st_ctime_ns >= before:
            changed.append(name)
    problems = []
    if missing:
        problems.append(f"{len(missing)} files of the record are missing from {model_dir}, e.g. {missing[:3]}")
    if changed:
        problems.append(f"{len(changed)} files changed since the stamp {stamp_path} verified them (size, mtime, inode "
                        f"or ctime), e.g. {changed[:3]}")
    return problems

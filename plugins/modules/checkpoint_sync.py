#!/usr/bin/python
"""Copy checkpoint files from this node to another, in parallel rsync streams: over a one-time rsync daemon or ssh."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_sync
short_description: Send checkpoint files to another node with parallel, resumable rsync streams
description:
  - For the checkpoint role's internal use (its sync step); options and return values may change with
    the role.
  - Runs on the node that holds a verified checkpoint (the head) and sends the listed O(files) to
    O(dest_host), splitting them into O(streams) disjoint subsets balanced by size, one rsync process
    each.
  - With O(transport=rsyncd) the bytes go over plain TCP on the fabric, without ssh's encryption. The
    module starts an rsync daemon of its own, for this sync only, bound to O(listen_address):O(port),
    read only, serving O(src_dir) alone to O(dest_host) alone, with a secret generated for this run
    (in a 0600 file in a 0700 directory under O(runtime_dir)). The destination pulls, one
    C(rsync rsync://...) per stream started over ssh (O(ssh_command)), which carries the secret on its
    standard input to a pipe rsync reads as its password file, and rsync's progress back; the secret is
    never on a command line, in a file on the destination, or in the result. The daemon dies with the
    module (it is the module's child, with a parent-death signal) and its directory is removed
    whatever happens; a directory left by a killed run is removed by the next one.
  - When the daemon cannot start (the port is taken, the address is not here), or no stream could pull a
    byte from it (the destination cannot reach it, is refused, or lacks O(remote_python)), the files go over
    ssh instead (RV(transport), RV(fallback_reason)).
  - With O(transport=ssh) the files are pushed through rsync's remote shell O(ssh_command).
  - One sync per destination directory at a time; a second waits for the first (its progress says so).
  - Resumable. An interrupted file is kept in O(partial_dir) on the destination and used as the
    basis of the next attempt. A complete destination file is only replaced by a complete new one
    (rsync renames into place). Nothing is deleted on the destination.
  - The listed files are always compared in full, whatever their size and modification time, because
    the list is what verification found missing or bad.
  - Writes live progress (bytes, rate, ETA) to O(progress_path) on this node once a second.
version_added: "1.0.0"
author: LLM serving maintainers (@dgx-spark)
options:
  src_dir:
    description: Local checkpoint directory.
    type: path
    required: true
  dest_host:
    description: Address of the destination (its fabric address); with O(transport=rsyncd) the only client the daemon admits.
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
  transport:
    description:
      - C(rsyncd) moves the bytes over plain TCP from a one-time rsync daemon on this node (ssh starts the
        destination's rsync); C(ssh) pushes them through ssh.
    type: str
    choices: [rsyncd, ssh]
    default: ssh
  listen_address:
    description: This node's address the daemon binds to (its fabric address). Required with O(transport=rsyncd).
    type: str
  port:
    description: TCP port of the daemon.
    type: int
    default: 28730
  runtime_dir:
    description: Directory (created 0700) for the daemon's configuration and secret, one subdirectory per run.
    type: path
    default: /run/spark-checkpoint-sync
  remote_python:
    description: Python on the destination that hands the secret to rsync through a pipe.
    type: str
    default: python3
  ssh_command:
    description: Remote shell given to rsync C(-e) (options such as the cipher or the identity file go here).
    type: str
    default: ssh -o BatchMode=yes
  rsync_path:
    description: Local rsync binary (also the daemon).
    type: str
    default: rsync
  partial_dir:
    description: Absolute directory on the destination for partial files. Defaults to C(<parent>/.<name>.partial/rsync).
    type: path
  extra_args:
    description: More rsync arguments for the transferring side, appended as given.
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
    details: Reports what would be sent (RV(sent)) and sends nothing; no daemon starts.
  diff_mode:
    support: none
  platform:
    platforms: posix
requirements:
  - rsync on both nodes; SSH from this node to O(dest_user)@O(dest_host) without a password prompt.
  - For O(transport=rsyncd), Linux (the daemon's socket is found in /proc) and O(remote_python) on the destination.
"""

EXAMPLES = r"""
- name: Send the files the worker lacks over a one-time rsync daemon on the fabric
  dgx_spark.llm_serving.checkpoint_sync:
    src_dir: /opt/models/glm53
    dest_host: 192.168.100.11
    dest_dir: /opt/models/glm53
    files: "{{ worker_verify.refetch }}"
    transport: rsyncd
    listen_address: 192.168.100.10
    port: 28730
    streams: 4
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
  description: Bytes rsync moved over the wire from this node, all streams.
  returned: always
  type: int
seconds:
  description: Wall time of the transfer.
  returned: always
  type: float
streams:
  description: Per stream, its files count, bytes and rsync exit code.
  returned: always
  type: list
  elements: dict
transport:
  description: The transport that carried the files (C(ssh) after a fallback), or the one asked for when nothing was sent.
  returned: always
  type: str
fallback_reason:
  description: Why O(transport=rsyncd) was not used, or null.
  returned: always
  type: str
port:
  description: The daemon's port when the files went over C(rsyncd), else null.
  returned: always
  type: int
waited_seconds:
  description: Seconds spent waiting for another sync to the same destination to end.
  returned: always
  type: float
"""

import fcntl
import hashlib
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.checkpoint_common import (
    Rate,
    checkpoint_paths,
    progress_line,
    safe_relpath,
    write_progress,
)
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_commands import start

PROGRESS_RE = re.compile(rb"^\s*([\d,]+)\s+\d+%")
STAT_FILES_RE = re.compile(r"Number of regular files transferred:\s*([\d,]+)")
STAT_SENT_RE = re.compile(r"Total bytes sent:\s*([\d,]+)")
STAT_RECEIVED_RE = re.compile(r"Total bytes received:\s*([\d,]+)")

DAEMON_USER = "spark-sync"
DAEMON_MODULE = "checkpoint"
SECRET_BYTES = 32  # 64 hex characters
DAEMON_START_SECONDS = 15.0
# On the destination: read exactly the secret's length from stdin (the rest is rsync's --files-from list),
# put it into a pipe and let rsync read its password file from that pipe (mode 0600, owned by the caller),
# so the secret is never in an argv, an environment or a file there.
REMOTE_HELPER = (
    "import os,sys\n"
    "n=int(sys.argv[1]);s=b''\n"
    "while len(s)<n:\n"
    " b=os.read(0,n-len(s))\n"
    " if not b:raise SystemExit('checkpoint_sync: no secret on stdin')\n"
    " s+=b\n"
    "r,w=os.pipe();os.write(w,s+b'\\n');os.close(w);os.set_inheritable(r,True)\n"
    "a=[x.replace('@FD@',str(r)) for x in sys.argv[2:]]\n"
    "os.execvp(a[0],a)\n"
)


class DaemonUnavailable(Exception):
    """The one-time daemon cannot serve this sync; the files go over ssh."""


def split_balanced(files: list[str], sizes: dict[str, int], n: int) -> list[list[str]]:
    """Largest first onto the lightest bin: disjoint subsets of near-equal bytes."""
    bins: list[tuple[int, list[str]]] = [(0, []) for dummy in range(max(1, min(n, len(files))))]
    for name in sorted(files, key=lambda f: -sizes[f]):
        i = min(range(len(bins)), key=lambda k: bins[k][0])
        bins[i] = (bins[i][0] + sizes[name], bins[i][1] + [name])
    return [b[1] for b in bins if b[1]]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_runs(runtime_dir: str) -> list[str]:
    """Directories of earlier runs whose module no longer lives (killed -9): their secrets go now."""
    removed = []
    try:
        entries = os.listdir(runtime_dir)
    except OSError:
        return removed
    for name in entries:
        path = os.path.join(runtime_dir, name)
        if not name.startswith("rsyncd-") or not os.path.isdir(path):
            continue
        try:
            with open(os.path.join(path, "owner.pid"), encoding="ascii") as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            pid = 0
        if pid and _pid_alive(pid):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def group_pids(pgid: int) -> list[int]:
    """The processes of process group `pgid`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


def listening(pgid: int, port: int) -> bool:
    """Whether a process of group `pgid` holds a TCP socket listening on `port` (ours, not another program's)."""
    links = set()
    for pid in group_pids(pgid):
        try:
            links |= {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
    inodes = {link[8:-1] for link in links if link.startswith("socket:[")}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            col = row.split()
            if len(col) > 9 and col[3] == "0A" and int(col[1].rsplit(":", 1)[1], 16) == port and col[9] in inodes:
                return True
    return False


class Daemon:
    """An rsync daemon for one sync: read only, one module, one client address, one user with a one-time secret."""

    def __init__(self, *, rsync_path: str, src: str, listen: str, port: int, client: str, streams: int,
                 runtime_dir: str):
        self.rsync_path, self.src, self.listen, self.port = rsync_path, src, listen, port
        self.client, self.streams, self.runtime_dir = client, streams, runtime_dir
        self.dir: str | None = None
        self.proc: subprocess.Popen | None = None
        self.secret = ""

    def _write(self, name: str, text: str) -> str:
        path = os.path.join(self.dir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def log_tail(self, lines: int = 6) -> str:
        text = ""
        for name in ("rsyncd.log", "stderr"):
            try:
                with open(os.path.join(self.dir, name), encoding="utf-8", errors="replace") as f:
                    text += f.read()
            except (OSError, TypeError):
                pass
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def start(self) -> None:
        for value in (self.src, self.listen, self.client):
            if any(c in value for c in "\n\r#;"):
                raise DaemonUnavailable(f"{value!r} cannot go into an rsyncd.conf")
        try:
            os.makedirs(self.runtime_dir, mode=0o700, exist_ok=True)
            os.chmod(self.runtime_dir, 0o700)
            self.dir = tempfile.mkdtemp(prefix="rsyncd-", dir=self.runtime_dir)  # 0700
            self._write("owner.pid", f"{os.getpid()}\n")
            self.secret = secrets.token_hex(SECRET_BYTES)
            secrets_file = self._write("rsyncd.secrets", f"{DAEMON_USER}:{self.secret}\n")
            root = os.geteuid() == 0
            # As root: chrooted into the checkpoint, reading as root like the ssh push does, writing nothing.
            conf = self._write("rsyncd.conf", "\n".join([
                "# One sync of the checkpoint role; removed when the sync ends.",
                f"use chroot = {'yes' if root else 'no'}",
                *(["uid = 0", "gid = 0"] if root else []),
                "reverse lookup = no",
                f"max connections = {self.streams + 1}",
                f"lock file = {self.dir}/rsyncd.lock",
                f"log file = {self.dir}/rsyncd.log",
                # A client that vanished (a worker powered off) does not keep a child serving it.
                "timeout = 600",
                f"[{DAEMON_MODULE}]",
                f"path = {self.src}",
                "comment = checkpoint, read only, this sync only",
                "read only = yes",
                "write only = no",
                "list = no",
                f"hosts allow = {self.client}",
                "hosts deny = *",
                f"auth users = {DAEMON_USER}:ro",
                f"secrets file = {secrets_file}",
                "strict modes = yes",
                "",
            ]))
        except OSError as e:
            raise DaemonUnavailable(f"cannot write the daemon's configuration under {self.runtime_dir}: {e}") from e
        stderr = open(os.path.join(self.dir, "stderr"), "wb")  # noqa: SIM115 - the child keeps it
        try:
            # A shell leads the daemon's process group: when the module ends, however it ends, the shell gets
            # the parent-death signal and kills the group, the children serving connections included.
            self.proc = start(
                ["sh", "-c", 'trap "trap - TERM; kill -KILL 0" TERM; "$@" & wait $!', "checkpoint-rsyncd",
                 self.rsync_path, "--daemon", "--no-detach", f"--address={self.listen}", f"--port={self.port}",
                 f"--config={conf}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, close_fds=True,
                start_new_session=True)  # no threads yet
        except OSError as e:
            raise DaemonUnavailable(f"cannot run {self.rsync_path} --daemon: {e}") from e
        finally:
            stderr.close()
        deadline = time.monotonic() + DAEMON_START_SECONDS
        while not listening(self.proc.pid, self.port):
            if self.proc.poll() is not None:
                raise DaemonUnavailable(f"the rsync daemon could not listen on {url_host(self.listen)}:{self.port} "
                                        f"(exit {self.proc.returncode}: {self.log_tail()})")
            if time.monotonic() > deadline:
                raise DaemonUnavailable(f"the rsync daemon was not listening on {url_host(self.listen)}:{self.port} "
                                        f"after {DAEMON_START_SECONDS:.0f} s ({self.log_tail()})")
            time.sleep(0.05)

    def url(self) -> str:
        return f"rsync://{DAEMON_USER}@{url_host(self.listen)}:{self.port}/{DAEMON_MODULE}/"

    def stop(self) -> None:
        """Stop the daemon and the children serving connections, then remove its secret and configuration."""
        if self.proc is not None:
            # Read only, nothing to flush: killed at once with the children serving connections (its group),
            # rather than SIGTERM, which this daemon takes a noticeable part of a second to honour.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class Stream:
    def __init__(self, argv: list[str], files: list[str], stdin: bytes | None = None, shown: str = ""):
        self.argv = argv
        self.shown = shown or shlex.join(argv)
        self.files = files
        self.stdin = stdin
        self.done = 0
        self.out = bytearray()
        self.proc: subprocess.Popen | None = None
        self.rc: int | None = None
        self.stderr = b""

    def start(self) -> None:
        """In the module's main thread (the parent-death signal follows the thread that forks): a stream
        does not outlive the module."""
        self.proc = start(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          stdin=subprocess.PIPE if self.stdin is not None else subprocess.DEVNULL)

    def run(self) -> None:
        err_chunks = []
        t = threading.Thread(target=lambda: err_chunks.append(self.proc.stderr.read()), daemon=True)
        t.start()
        if self.stdin is not None:
            try:
                self.proc.stdin.write(self.stdin)
                self.proc.stdin.close()
            except OSError:
                pass  # the process ended early; its exit code and stderr tell why
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


def rsync_args(partial_dir: str) -> list[str]:
    """What both transports run: resumable, full comparison of every listed file, progress and stats."""
    return ["-a", "--partial", f"--partial-dir={partial_dir}", "--ignore-times", "--info=progress2",
            "--no-human-readable", "--stats"]


def pull_command(p: dict, daemon: Daemon, dest: str, rsync_argv: list[str]) -> tuple[list[str], str]:
    """ssh to the destination, which runs rsync pulling from the daemon; the secret and file list come on stdin.

    Returns the command and how to show it (the rsync part, without the helper that feeds it the secret).
    """
    pull = ["rsync", *rsync_argv, f"--address={p['dest_host']}", "--password-file=/dev/fd/@FD@", "--files-from=-",
            *p["extra_args"], daemon.url(), f"{dest}/"]
    remote = [p["remote_python"], "-c", REMOTE_HELPER, str(len(daemon.secret)), *pull]
    ssh = [*shlex.split(p["ssh_command"]), f"{p['dest_user']}@{p['dest_host']}"]
    return [*ssh, shlex.join(remote)], shlex.join([*ssh, *pull])


class Lock:
    """One sync per destination: a second one waits for the first, saying so in its progress."""

    def __init__(self, runtime_dir: str, dest_host: str, dest_dir: str):
        where = hashlib.sha256(dest_dir.encode()).hexdigest()[:12]
        self.path = os.path.join(runtime_dir, f"sync-{re.sub(r'[^0-9A-Za-z.]', '_', dest_host)}-{where}.lock")
        self.fd: int | None = None

    def acquire(self, on_wait) -> float:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        started = time.monotonic()
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                os.lseek(self.fd, 0, os.SEEK_SET)
                holder = os.read(self.fd, 64).decode(errors="replace").strip() or "?"
                on_wait(holder, time.monotonic() - started)
                time.sleep(1)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        return time.monotonic() - started

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "src_dir": {"type": "path", "required": True},
            "dest_host": {"type": "str", "required": True},
            "dest_user": {"type": "str", "default": "root"},
            "dest_dir": {"type": "path", "required": True},
            "files": {"type": "list", "elements": "str", "required": True},
            "streams": {"type": "int", "default": 4},
            "transport": {"type": "str", "choices": ["rsyncd", "ssh"], "default": "ssh"},
            "listen_address": {"type": "str"},
            "port": {"type": "int", "default": 28730},
            "runtime_dir": {"type": "path", "default": "/run/spark-checkpoint-sync"},
            "remote_python": {"type": "str", "default": "python3"},
            "ssh_command": {"type": "str", "default": "ssh -o BatchMode=yes"},
            "rsync_path": {"type": "str", "default": "rsync"},
            "partial_dir": {"type": "path"},
            "extra_args": {"type": "list", "elements": "str", "default": []},
            "progress_path": {"type": "path"},
            "progress_id": {"type": "str", "default": ""},
        },
        required_if=[("transport", "rsyncd", ("listen_address",))],
        supports_check_mode=True,
    )
    p = module.params
    src = os.path.normpath(p["src_dir"])
    dest = os.path.normpath(p["dest_dir"])
    partial_dir = p["partial_dir"] or checkpoint_paths(dest)["rsync_partial_dir"]
    files = sorted(set(p["files"]))
    result = {"changed": False, "sent": files, "transferred_files": 0, "bytes_sent": 0, "seconds": 0.0,
              "streams": [], "transport": p["transport"], "fallback_reason": None, "port": None,
              "waited_seconds": 0.0}
    if not files:
        module.exit_json(**result)
    bad = [f for f in files if not safe_relpath(f)]
    if bad:
        module.fail_json(msg=f"refusing paths outside the checkpoint: {bad}", **result)
    if not 1 <= p["port"] <= 65535:
        module.fail_json(msg=f"port={p['port']} is not a TCP port (1-65535)", **result)
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

    progress_path = p["progress_path"]

    def say(state: str, line: str, **extra) -> None:
        if progress_path:
            write_progress(progress_path, {"id": p["progress_id"], "kind": "sync", "state": state, "pid": os.getpid(),
                                           "total_bytes": total, "line": line, **extra})

    remove_stale_runs(p["runtime_dir"])
    lock = Lock(p["runtime_dir"], p["dest_host"], dest)
    daemon: Daemon | None = None
    try:
        try:
            result["waited_seconds"] = round(lock.acquire(lambda holder, waited: say(
                "running", f"waiting for the sync to {p['dest_host']} that process {holder} runs "
                f"({waited:.0f} s so far); it goes on after that one", done_bytes=0)), 3)
        except OSError as e:
            module.fail_json(msg=f"cannot take the sync's lock {lock.path} ({e}): runtime_dir={p['runtime_dir']} "
                             "must be a directory this user can create and write (the role runs as root).", **result)
        transport = p["transport"]
        if transport == "rsyncd":
            daemon = Daemon(rsync_path=p["rsync_path"], src=src, listen=p["listen_address"], port=p["port"],
                            client=p["dest_host"], streams=p["streams"], runtime_dir=p["runtime_dir"])
            try:
                daemon.start()
            except DaemonUnavailable as e:
                daemon.stop()
                daemon = None
                transport = "ssh"
                result["fallback_reason"] = str(e)
        job = {"files": files, "sizes": sizes, "total": total, "src": src, "dest": dest, "partial_dir": partial_dir,
               "say": say}
        streams = _transfer(p, result, transport=transport, daemon=daemon, **job)
        if daemon is not None and all(s.rc != 0 and s.done == 0 for s in streams) and not result["transferred_files"]:
            # Not one byte came over the daemon (the destination could not reach it, was refused, or lacks
            # remote_python): over ssh then. A failure of the destination itself fails there again, and is reported.
            result["fallback_reason"] = (f"{p['dest_host']} could not pull from {daemon.url()}: "
                                         f"{_errors(streams, daemon)[0]}; daemon log: {daemon.log_tail(3)}")
            daemon.stop()
            daemon = None
            result.update(transferred_files=0, bytes_sent=0, streams=[])
            streams = _transfer(p, result, transport="ssh", daemon=None, **job)
        result["port"] = p["port"] if daemon is not None else None
        _report(module, p, result, streams, daemon=daemon, say=say, partial_dir=partial_dir, dest=dest)
    finally:
        if daemon is not None:
            daemon.stop()
        lock.release()


def _errors(streams: list[Stream], daemon: Daemon | None) -> list[str]:
    out = []
    for s in streams:
        if s.rc != 0:
            err = s.stderr.decode(errors="replace").strip()
            if daemon is not None:
                err = err.replace(daemon.secret, "<secret>")
            out.append(f"rc={s.rc}: {' | '.join(err.splitlines()[-3:])[-800:]}")
    return out


def _transfer(p, result, *, transport, daemon, files, sizes, total, src, dest, partial_dir, say) -> list[Stream]:
    """Run the streams to their end, writing progress; the result gets the transport, counts and seconds."""
    result["transport"] = transport
    target = f"{p['dest_user']}@{p['dest_host']}:{dest}/"
    common = rsync_args(partial_dir)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="checkpoint-sync-") as tmp:
        streams = []
        for i, subset in enumerate(split_balanced(files, sizes, p["streams"])):
            listing = ("\n".join(subset) + "\n").encode()
            if daemon is not None:
                argv, shown = pull_command(p, daemon, dest, common)
                streams.append(Stream(argv, subset, stdin=daemon.secret.encode() + listing, shown=shown))
                continue
            listfile = os.path.join(tmp, f"stream-{i}.list")
            with open(listfile, "wb") as fh:
                fh.write(listing)
            argv = [p["rsync_path"], *common, f"--files-from={listfile}", "-e", p["ssh_command"], *p["extra_args"],
                    f"{src}/", target]
            streams.append(Stream(argv, subset))
        for stream in streams:
            stream.start()
        threads = [threading.Thread(target=s.run, daemon=True) for s in streams]
        for t in threads:
            t.start()
        rate_window = Rate()
        while any(t.is_alive() for t in threads):
            now = time.monotonic()
            done = sum(s.done for s in streams)
            rate, eta = rate_window.update(now, done, total)
            say("running", progress_line(done, total, rate, eta,
                                         f" to {p['dest_host']} over {transport}, {len(streams)} streams"),
                done_bytes=done, rate_bytes_per_s=rate, eta_s=eta)
            for t in threads:
                t.join(timeout=1.0 / len(threads))
        result["seconds"] = round(time.monotonic() - started, 3)
    # Pulling, the destination's rsync is the receiver: what it received is what moved.
    moved_re = STAT_RECEIVED_RE if daemon is not None else STAT_SENT_RE
    for s in streams:
        text = s.out.decode(errors="replace")
        nfiles = STAT_FILES_RE.search(text)
        moved = moved_re.search(text)
        result["transferred_files"] += int(nfiles.group(1).replace(",", "")) if nfiles else 0
        result["bytes_sent"] += int(moved.group(1).replace(",", "")) if moved else 0
        result["streams"].append({"files": len(s.files), "bytes": sum(sizes[f] for f in s.files), "rc": s.rc})
    return streams


def _report(module, p, result, streams, *, daemon, say, partial_dir, dest) -> None:
    failed = _errors(streams, daemon)
    total = sum(s["bytes"] for s in result["streams"])
    say("failed" if failed else "done", f"sync to {p['dest_host']} over {result['transport']} "
        + ("failed" if failed else f"done in {result['seconds']} s"), done_bytes=None if failed else total)
    if failed:
        how = (f"pulling from {daemon.url()} on {p['dest_host']}" if daemon is not None
               else f"pushing to {p['dest_user']}@{p['dest_host']}:{dest}/")
        if daemon is not None:
            failed[0] += f"; daemon log: {daemon.log_tail(4)}"
        module.fail_json(
            msg=f"{len(failed)} of {len(streams)} rsync streams {how} failed; partial files are kept in "
            f"{partial_dir} and resume on the next run. Command: {streams[0].shown}. First error: {failed[0]}",
            **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()

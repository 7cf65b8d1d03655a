"""checkpoint_sync's transports on this machine's loopback, run as Ansible runs the module.

The "destination" is this machine too: a remote shell that runs the far side locally (as ssh would
on the worker) and, for the checks, keeps what it saw while the daemon was up (the secret on its
standard input, the daemon's configuration and the mode of its secrets file).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from tests.lib.checkpoint_site import free_port
from tests.lib.role_module import module_command, run_module

FILES = {"model-00001-of-00003.safetensors": 700_000, "model-00002-of-00003.safetensors": 500_000,
         "model-00003-of-00003.safetensors": 300_000, "config.json": 1_200, "tokenizer.json": 90_000}


def run_sync(args: dict, tmp: Path) -> dict:
    return run_module("checkpoint_sync", args, tmp)


@pytest.fixture
def site(tmp_path):
    src = tmp_path / "head" / "glm53"
    src.mkdir(parents=True)
    for name, size in FILES.items():
        (src / name).write_bytes(os.urandom(size))
    dest = tmp_path / "worker" / "glm53"
    dest.mkdir(parents=True)
    seen = tmp_path / "seen"
    seen.mkdir()
    runtime = tmp_path / "run"
    rsh = tmp_path / "fake-rsh"
    # While a pull runs: what came on stdin, the daemon's configuration and its secrets file's mode.
    rsh.write_text(
        "#!/bin/sh\n"
        'while [ "$1" = "-l" ]; do shift 2; done\nshift\n'
        # rsync's own remote shell (the ssh transport) speaks its protocol on stdin: left alone.
        'case "$*" in *--password-file*) ;; *) exec sh -c "$*";; esac\n'
        f'in=$(mktemp -p {seen} stdin.XXXXXX)\ncat > "$in"\n'
        f"for d in {runtime}/rsyncd-*; do [ -d \"$d\" ] || continue; "
        f"stat -c '%a' \"$d\" >> {seen}/dir-modes; stat -c '%a' \"$d/rsyncd.secrets\" >> {seen}/secret-modes; "
        f"cp \"$d/rsyncd.conf\" {seen}/rsyncd.conf; done\n"
        'exec sh -c "$*" < "$in"\n')
    rsh.chmod(rsh.stat().st_mode | stat.S_IXUSR)
    args = {"src_dir": str(src), "dest_host": "127.0.0.1", "dest_dir": str(dest), "files": sorted(FILES),
            "streams": 2, "transport": "rsyncd", "listen_address": "127.0.0.1", "port": free_port(),
            "runtime_dir": str(runtime), "ssh_command": str(rsh), "progress_path": str(tmp_path / "p.json")}
    return {"src": src, "dest": dest, "seen": seen, "runtime": runtime, "args": args, "tmp": tmp_path}


def same_tree(a: Path, b: Path) -> bool:
    return {p.name: p.read_bytes() for p in a.iterdir()} == {p.name: p.read_bytes() for p in b.iterdir()}


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        # Connections of the finished sync may linger in TIME_WAIT; only a listener makes this fail.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_rsyncd_pull_copies_every_file_and_leaves_no_daemon_and_no_secret(site):
    res = run_sync(site["args"], site["tmp"])
    assert not res.get("failed"), res
    assert res["transport"] == "rsyncd" and res["fallback_reason"] is None and res["port"] == site["args"]["port"]
    assert res["transferred_files"] == len(FILES) and len(res["streams"]) == 2
    assert res["bytes_sent"] >= sum(FILES.values()), "the pulled bytes are counted"
    assert same_tree(site["src"], site["dest"])
    progress = json.loads(Path(site["args"]["progress_path"]).read_text())
    assert progress["state"] == "done" and "over rsyncd" in progress["line"]
    # What the daemon ran with, seen while it ran: its own 0700 directory and a 0600 secrets file.
    assert set((site["seen"] / "dir-modes").read_text().split()) == {"700"}
    assert set((site["seen"] / "secret-modes").read_text().split()) == {"600"}
    conf = (site["seen"] / "rsyncd.conf").read_text()
    for line in ("read only = yes", "hosts allow = 127.0.0.1", "hosts deny = *", "reverse lookup = no",
                 "list = no", f"path = {site['src']}", "auth users = spark-sync:ro"):
        assert line in conf.splitlines(), line
    # Afterwards: no daemon on the port, no directory holding the secret, the runtime directory private.
    assert port_is_free(site["args"]["port"])
    assert not list(site["runtime"].glob("rsyncd-*"))
    assert stat.S_IMODE(site["runtime"].stat().st_mode) == 0o700
    # The one-time secret reached the destination only on stdin: never in the result or the progress file.
    secrets = {p.read_bytes()[:64].decode() for p in site["seen"].glob("stdin.*")}
    assert len(secrets) == 1 and all(len(s) == 64 for s in secrets), secrets
    secret = secrets.pop()
    assert secret not in json.dumps(res) and secret not in Path(site["args"]["progress_path"]).read_text()


def test_a_second_run_sends_only_what_is_asked_and_repairs_a_damaged_file(site):
    assert not run_sync(site["args"], site["tmp"]).get("failed")
    name = "model-00002-of-00003.safetensors"
    damaged = site["dest"] / name
    data = bytearray(damaged.read_bytes())
    data[1000] ^= 0xFF
    st = damaged.stat()
    damaged.write_bytes(bytes(data))
    os.utime(damaged, ns=(st.st_atime_ns, st.st_mtime_ns))
    res = run_sync({**site["args"], "files": [name]}, site["tmp"])
    assert not res.get("failed"), res
    assert res["transport"] == "rsyncd" and res["transferred_files"] == 1 and res["sent"] == [name]
    assert same_tree(site["src"], site["dest"])


def test_falls_back_to_ssh_when_the_port_is_taken(site):
    with socket.create_server(("127.0.0.1", site["args"]["port"])):
        res = run_sync(site["args"], site["tmp"])
    assert not res.get("failed"), res
    assert res["transport"] == "ssh" and res["port"] is None
    assert "could not listen on 127.0.0.1:" in res["fallback_reason"], res["fallback_reason"]
    assert "Address already in use" in res["fallback_reason"]
    assert same_tree(site["src"], site["dest"])
    assert not list(site["runtime"].glob("rsyncd-*"))


def test_falls_back_to_ssh_when_the_destination_cannot_pull(site):
    res = run_sync({**site["args"], "remote_python": "/nonexistent/python3"}, site["tmp"])
    assert not res.get("failed"), res
    assert res["transport"] == "ssh"
    assert "127.0.0.1 could not pull from rsync://spark-sync@127.0.0.1:" in res["fallback_reason"]
    assert same_tree(site["src"], site["dest"])
    assert port_is_free(site["args"]["port"]) and not list(site["runtime"].glob("rsyncd-*"))


def test_the_secret_of_a_killed_run_is_removed_by_the_next(site):
    stale = site["runtime"] / "rsyncd-killed"
    stale.mkdir(parents=True, mode=0o700)
    (stale / "owner.pid").write_text("999999999\n")  # no such process
    (stale / "rsyncd.secrets").write_text("spark-sync:old\n")
    res = run_sync(site["args"], site["tmp"])
    assert not res.get("failed"), res
    assert not stale.exists()


def test_a_second_sync_to_the_same_destination_waits_for_the_first(site):
    runtime = site["runtime"]
    runtime.mkdir(mode=0o700)
    where = hashlib.sha256(str(site["dest"]).encode()).hexdigest()[:12]
    with open(runtime / f"sync-127.0.0.1-{where}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242\n")
        held.flush()
        out = {}
        worker = threading.Thread(target=lambda: out.update(run_sync(site["args"], site["tmp"])))
        worker.start()
        progress = Path(site["args"]["progress_path"])
        while not (progress.is_file() and "waiting for the sync to 127.0.0.1" in progress.read_text()):
            assert worker.is_alive(), out
            worker.join(0.05)
        assert "process 4242" in json.loads(progress.read_text())["line"]
        assert not list(site["dest"].iterdir()), "nothing moves while the other sync holds the destination"
    worker.join(120)
    assert not out.get("failed"), out
    assert out["waited_seconds"] > 0 and out["transport"] == "rsyncd"
    assert same_tree(site["src"], site["dest"])


def test_rsyncd_needs_the_listen_address(site):
    args = {k: v for k, v in site["args"].items() if k != "listen_address"}
    res = run_sync(args, site["tmp"])
    assert res["failed"] and "listen_address" in res["msg"]


def test_a_killed_sync_leaves_no_listening_daemon_and_the_next_run_finishes(site):
    """kill -9 of the module mid-transfer: its daemon dies with it (parent-death signal), nothing listens on
    the port, and the next run removes the dead run's secret and completes the files."""
    args = {**site["args"], "extra_args": ["--bwlimit=64"]}
    argsfile = site["tmp"] / "killed-args.json"
    argsfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": False}}))
    proc = subprocess.Popen(module_command("checkpoint_sync", argsfile),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        progress = Path(args["progress_path"])
        # Until bytes flow over the daemon.
        while not (progress.is_file() and json.loads(progress.read_text()).get("done_bytes")):
            assert proc.poll() is None, "the sync ended before it could be killed"
        assert not port_is_free(args["port"])
        assert list(site["runtime"].glob("rsyncd-*")), "the run's secret directory exists while it runs"
    finally:
        proc.kill()
        proc.wait()
    while not port_is_free(args["port"]):
        pass  # the daemon goes when its parent does
    res = run_sync(site["args"], site["tmp"])
    assert not res.get("failed"), res
    assert res["transport"] == "rsyncd"
    assert same_tree(site["src"], site["dest"])
    assert not list(site["runtime"].glob("rsyncd-*"))

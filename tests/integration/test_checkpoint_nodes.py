"""The checkpoint playbook on the simulated nodes, with the REAL huggingface_hub client on the head.

The fabric playbook runs first (the head's SSH trust to the worker over the fabric). The hub is
the emulator (tests/standins/hub_emulator.py) bound to the harness bridge address only, serving a
synthetic 120-shard checkpoint and counting the bytes it serves per file and who asked. Nodes are
observed over SSH only. The tests run in file order and build on each other's state, like an
operator's successive runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.harness import cluster as sim
from tests.lib.checkpoint_site import SCALES, SHARD, changed_tasks, serve_hub
from tests.lib.playbook import run_playbook
from tests.standins.hub_emulator import HubEmulator, _safetensors, build_checkpoint

PLAYBOOK = "playbooks/checkpoint.yml"
MODEL_DIR = "/opt/models/glm53"
PARENT = "/opt/models"
STAMP = f"{PARENT}/glm53.verified"
RECORD = f"{PARENT}/glm53.record.json"
VENV = "/opt/spark-checkpoint"
FAST = "Check the checkpoint quickly against the record"
DEEP = "Hash every file against the record"
PUSH = "Push the files from the source host over the fabric"
SYNCED = "Collect the sync result"
FETCH = "Fetch the files from the hub"
DISK = "Refuse a filesystem that cannot hold the missing bytes, before any byte moves"
FELL_BACK = "Say that the sync went over ssh instead of the rsync daemon"
RSYNCD_PORT = 28730  # checkpoint_sync_rsyncd_port; spark-1 is the first worker
RUNTIME = "/run/spark-checkpoint-sync"
# On the head while a sync runs: the daemon's sockets, its directories, their modes and contents. With a wait
# (seconds) it looks again on the node every 50 ms, reading the sockets only once a directory is there, until the
# daemon serves a peer (a peer connected and the daemon's child for it forked) or the wait is over: one SSH round
# trip waits for the event, instead of one round trip a look.
DAEMON_VIEW = f"""python3 - WAIT <<'EOF'
import glob, json, os, subprocess, sys, time
def ss(*a):
    return subprocess.run(["ss", "-Htn", *a], capture_output=True, text=True).stdout.split("\\n")
def view():
    procs = {{}}
    for p in glob.glob("/proc/[0-9]*"):
        try:
            argv = open(p + "/cmdline", "rb").read().split(b"\\0")
            if argv[:2] == [b"rsync", b"--daemon"]:
                procs[p[6:]] = open(p + "/stat").read().rsplit(")", 1)[1].split()[1]
        except OSError:
            pass
    # The daemon itself; the others are its children, one per connection.
    daemons = sum(1 for parent in procs.values() if parent not in procs)
    dirs = {{}}
    for d in glob.glob("{RUNTIME}/rsyncd-*"):
        try:
            dirs[d] = {{"mode": oct(os.stat(d).st_mode & 0o777),
                       "secrets_mode": oct(os.stat(d + "/rsyncd.secrets").st_mode & 0o777),
                       "secret": open(d + "/rsyncd.secrets").read().strip().split(":", 1)[1],
                       "conf": open(d + "/rsyncd.conf").read()}}
        except OSError:
            pass
    return {{"listening": [l.split()[3] for l in ss("-l", "sport = :{RSYNCD_PORT}") if l.strip()],
            "peers": [l.split()[3] for l in ss("state", "established", "sport = :{RSYNCD_PORT}") if l.strip()],
            "daemons": daemons, "serving": len(procs) - daemons,
            "dirs": dirs}}
deadline = time.monotonic() + float(sys.argv[1])
while True:
    seen = view() if glob.glob("{RUNTIME}/rsyncd-*") or time.monotonic() >= deadline else None
    serving = seen is not None and seen["listening"] and seen["peers"] and seen["dirs"] and seen["serving"] >= 1
    if seen is not None and (time.monotonic() >= deadline or serving):
        break
    time.sleep(0.05)
print(json.dumps(seen))
EOF"""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def commit_files(hub: HubEmulator, sha: str) -> dict[str, bytes]:
    base = Path(hub.store.root) / hub.info["repo_id"] / sha
    return {p.relative_to(base).as_posix(): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def put(node, path: str, data: bytes, keep_times_of: str | None = None) -> None:
    """Write bytes to a file on a node over SSH (optionally with the times of another file)."""
    touch = f" && touch -r {keep_times_of} {path}.new" if keep_times_of else ""
    subprocess.run([*sim.ssh_base(node), f"cat > {path}.new{touch} && mv {path}.new {path}"],
                   input=data, check=True, timeout=60)


def listing(node, directory: str = MODEL_DIR) -> dict[str, tuple[str, ...]]:
    """name -> (size, inode, mtime, ctime) of every file under directory, read over SSH."""
    out = sim.ssh(node, f"find {directory} -type f -printf '%P\\t%s\\t%i\\t%T@\\t%C@\\n'")
    return {line.split("\t")[0]: tuple(line.split("\t")[1:]) for line in out.splitlines()}


def digests(node, directory: str = MODEL_DIR) -> dict[str, str]:
    out = sim.ssh(node, f"cd {directory} && find . -type f -printf '%P\\0' | xargs -0 -r sha256sum")
    return {name: digest for digest, name in (line.split(None, 1) for line in out.splitlines())}


def stamp(node) -> dict | None:
    out = sim.ssh(node, f"cat {STAMP} 2>/dev/null || true").strip()
    return json.loads(out) if out else None


def exists(node, path: str) -> bool:
    return sim.ssh(node, f"test -e {path} && echo yes || echo no").strip() == "yes"


@pytest.fixture(scope="module")
def nodes(sim_cluster, sim_inventory):
    """The nodes with the fabric (and the head's SSH trust over it) configured and no checkpoint yet.

    The link's bandwidth is not what this module proves (test_fabric does): no iperf3 round here."""
    result = run_playbook("playbooks/fabric.yml", sim_inventory, extravars={"fabric_iperf_min_gbps": 0})
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    for n in sim_cluster.nodes:
        sim.ssh(n, f"umount -q {PARENT} 2>/dev/null; rm -rf {PARENT} {VENV}")
    head, worker = sim_cluster.nodes
    return {"cluster": sim_cluster, "inventory": sim_inventory, "head": head, "worker": worker}


@pytest.fixture(scope="module")
def hub(sim_cluster, tmp_path_factory):
    # The nodes reach this machine only through the harness bridge; the emulator listens there alone.
    with serve_hub(tmp_path_factory.mktemp("hub"), host=sim_cluster.bridge_ip) as emulator:
        assert emulator.server.server_address[0] == sim_cluster.bridge_ip
        emulator.expected = commit_files(emulator, emulator.info["new"])
        yield emulator


def play(nodes, hub, *, check: bool = False, limit: str | None = None, **extra):
    extravars = {"checkpoint_revision": hub.info["new"], "checkpoint_hf_endpoint": hub.url, **extra}
    return run_playbook(PLAYBOOK, nodes["inventory"], extravars=extravars, check=check, limit=limit, timeout=600)


def test_check_mode_on_fresh_nodes_changes_nothing(nodes, hub):
    hub.reset_counters()
    r = play(nodes, hub, check=True)
    assert r.rc == 0, r.failure_messages() or r.stdout[-3000:]
    assert "cannot be read" in r.stdout, "check mode says why it cannot tell what would be fetched"
    assert hub.served() == {}
    for n in (nodes["head"], nodes["worker"]):
        assert not exists(n, PARENT) and not exists(n, VENV), n.name


def test_fresh_fetch_on_the_head_and_sync_to_the_worker_over_the_fabric(nodes, hub):
    head, worker = nodes["head"], nodes["worker"]
    since = sim.ssh(worker, "date +%s").strip()
    hub.reset_counters()
    t0 = time.monotonic()
    r = play(nodes, hub)
    seconds = time.monotonic() - t0
    assert r.rc == 0, r.failure_messages() or r.stdout[-3000:]
    expected = {name: sha256(data) for name, data in hub.expected.items()}
    assert len([n for n in expected if n.endswith("-of-00120.safetensors")]) == 120
    # Every file exactly once from the hub, and only the head asked for anything.
    assert hub.served() == {name: len(data) for name, data in hub.expected.items()}
    assert hub.clients == {head.mgmt_ip}
    assert "fetch spark-0:" in r.stdout and "sync spark-1:" in r.stdout, "progress lines are printed"
    sync = r.results(SYNCED)
    assert set(sync) == {"spark-1"}
    assert sync["spark-1"]["transport"] == "rsyncd" and sync["spark-1"]["fallback_reason"] is None
    assert sync["spark-1"]["sent"] == sorted(expected)
    assert sync["spark-1"]["transferred_files"] == len(expected)
    for n in (head, worker):
        assert digests(n) == expected, n.name
        assert stamp(n)["revision"] == hub.info["new"], n.name
    facts = r.results("Export that this host holds the verified checkpoint")
    assert {h: f["ansible_facts"]["checkpoint_verified"] for h, f in facts.items()} == {"spark-0": True,
                                                                                      "spark-1": True}
    # The pull was started from the head's fabric address, authenticated by the fabric role's key.
    fingerprint = sim.ssh(head, "ssh-keygen -lf /root/.ssh/id_spark_fabric.pub").split()[1]
    log = sim.ssh(worker, f"journalctl -o cat --since @{since} | grep 'Accepted publickey' || true")
    assert f"for root from {head.fabric_ip} " in log and fingerprint in log, log
    print(f"fresh fetch + sync: {seconds:.1f} s")


def test_second_run_transfers_nothing_and_reports_no_change(nodes, hub):
    before = {n.name: listing(n) for n in (nodes["head"], nodes["worker"])}
    hub.reset_counters()
    r = play(nodes, hub)
    assert r.rc == 0, r.failure_messages()
    assert changed_tasks(r) == []
    assert hub.served() == {}
    assert r.results(PUSH) == {} and r.results(FETCH) == {}
    assert {n.name: listing(n) for n in (nodes["head"], nodes["worker"])} == before
    r = play(nodes, hub, check=True)
    assert r.rc == 0, r.failure_messages()
    assert changed_tasks(r) == [], "check mode on a converged site reports no change"


def test_corrupted_worker_shard_is_found_by_the_fast_check_and_resynced_alone(nodes, hub):
    worker = nodes["worker"]
    path = f"{MODEL_DIR}/{SHARD}"
    sim.ssh(worker, "python3 -c \"import os, sys; p = sys.argv[1]; st = os.stat(p); f = open(p, 'r+b'); "
                    "f.seek(st.st_size // 2); b = f.read(1); f.seek(st.st_size // 2); f.write(bytes([b[0] ^ 0x5A])); "
                    f"f.close(); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\" {path}")
    before = listing(worker)
    assert digests(worker)[SHARD] != sha256(hub.expected[SHARD]), "the shard was not damaged"
    hub.reset_counters()
    r = play(nodes, hub, checkpoint_deep_verify=True)
    assert r.rc == 0, r.failure_messages()
    # Same size, inode and mtime, but the stamp remembers the ctime it was verified with.
    fast = r.results(FAST)["spark-1"]
    assert fast["refetch"] == [SHARD] and fast["changed_since_verified"] == [SHARD] and fast["hashed"] == [SHARD]
    deep = r.results(DEEP)
    assert deep["spark-1"]["ok"] and deep["spark-0"]["ok"]
    assert deep["spark-1"]["hashed_bytes"] == deep["spark-1"]["total_bytes"], "checkpoint_deep_verify: every byte"
    sync = r.results(SYNCED)["spark-1"]
    assert sync["sent"] == [SHARD] and sync["transferred_files"] == 1
    assert hub.served() == {}, "the head's copy is good: nothing comes from the hub"
    after = listing(worker)
    assert {k: v for k, v in after.items() if k != SHARD} == {k: v for k, v in before.items() if k != SHARD}, \
        "another file was rewritten"
    assert after[SHARD][1] != before[SHARD][1], "the shard was replaced by a new file"
    assert digests(worker)[SHARD] == sha256(hub.expected[SHARD])
    assert stamp(worker)["revision"] == hub.info["new"]


def daemon_view(head, wait: float = 0) -> dict:
    """The daemon as the head shows it now; with `wait`, once it serves a peer (or when `wait` seconds are over)."""
    return json.loads(sim.ssh(head, DAEMON_VIEW.replace("WAIT", str(wait), 1), timeout=wait + 60))


@pytest.fixture(scope="module")
def worker_resynced_alone(nodes, hub):
    """One run for two tests: a worker that lost a shard, re-provisioned alone (--limit, the head outside the run
    only read), while something else holds the rsync daemon's port on the head's fabric address, so that its sync
    falls back to ssh. Returns the run, the head's files before it and what the hub served during it."""
    head, worker = nodes["head"], nodes["worker"]
    sim.ssh(head, "systemd-run --unit=spark-test-port-taken --collect python3 -c 'import socket, time; "
                  f"s = socket.create_server((\"{head.fabric_ip}\", {RSYNCD_PORT})); time.sleep(3600)'")
    try:
        while daemon_view(head)["listening"] != [f"{head.fabric_ip}:{RSYNCD_PORT}"]:
            pass
        sim.ssh(worker, f"rm {MODEL_DIR}/{SHARD}")
        head_before = listing(head)
        hub.reset_counters()
        r = play(nodes, hub, limit=worker.name)
        served = hub.served()
    finally:
        sim.ssh(head, "systemctl stop spark-test-port-taken", check=False)
    return {"result": r, "head_before": head_before, "served": served}


def test_sync_falls_back_to_ssh_when_the_daemon_cannot_start(nodes, hub, worker_resynced_alone):
    head, worker = nodes["head"], nodes["worker"]
    # Something else held the daemon's port on the head's fabric address while the worker synced alone.
    r = worker_resynced_alone["result"]
    assert r.rc == 0, r.failure_messages()
    sync = r.results(SYNCED)["spark-1"]
    assert sync["transport"] == "ssh" and sync["sent"] == [SHARD] and sync["port"] is None
    reason = sync["fallback_reason"]
    assert f"could not listen on {head.fabric_ip}:{RSYNCD_PORT}" in reason and "Address already in use" in reason
    said = r.results(FELL_BACK)["spark-1"]["msg"]
    assert "checkpoint_sync_transport=rsyncd could not be used" in said and "went over ssh" in said, said
    assert "checkpoint_sync_transport=rsyncd could not be used" in r.stdout
    assert digests(worker)[SHARD] == sha256(hub.expected[SHARD])
    assert stamp(worker)["revision"] == hub.info["new"]
    assert daemon_view(head)["dirs"] == {}


def test_worker_alone_under_limit_syncs_from_the_head_outside_the_run(nodes, hub, worker_resynced_alone):
    """Re-provisioning one worker: the head is only read, and only when its checkpoint is verified."""
    head, worker = nodes["head"], nodes["worker"]
    resynced = worker_resynced_alone  # rm SHARD on the worker, then the worker alone under --limit
    head_before = resynced["head_before"]
    r = resynced["result"]
    assert r.rc == 0, r.failure_messages()
    assert r.results(SYNCED)["spark-1"]["sent"] == [SHARD]
    assert resynced["served"] == {}
    assert digests(worker)[SHARD] == sha256(hub.expected[SHARD])
    assert stamp(worker)["revision"] == hub.info["new"]
    assert listing(head) == head_before

    source_stamp = sim.ssh(head, f"cat {STAMP}")
    sim.ssh(head, f"rm {STAMP}")
    sim.ssh(worker, f"rm {MODEL_DIR}/{SHARD}")
    try:
        r = play(nodes, hub, limit=worker.name)
        assert r.rc != 0
        assert {d["task"] for d in r.failed} == {"Refuse to sync from a source host that does not hold the verified checkpoint"}
        assert r.changed_before_first_failure() == []
        message = r.failure_messages()
        assert "checkpoint_source_host=spark-0 is outside this run (--limit spark-1)" in message
        assert "no verified-stamp" in message and "without --limit" in message
        assert not exists(worker, f"{MODEL_DIR}/{SHARD}")
    finally:
        sim.ssh(head, f"cat > {STAMP} <<'EOF'\n{source_stamp}\nEOF")
        r = play(nodes, hub, limit=worker.name)
        assert r.rc == 0, r.failure_messages()


def test_sync_over_the_rsync_daemon_listens_only_on_the_head_fabric_address_for_the_sync_only(nodes, hub):
    head, worker = nodes["head"], nodes["worker"]
    since = sim.ssh(head, "date +%s").strip()
    shards = sorted(n for n in hub.expected if n.endswith("-of-00120.safetensors"))[:40]
    sim.ssh(worker, f"cd {MODEL_DIR} && rm " + " ".join(shards))
    assert daemon_view(head)["listening"] == [], "no daemon before the sync"
    done: dict = {}
    # Slowed down (4 KiB/s a stream) so that the daemon can be looked at while it serves.
    # The worker alone (the head outside the run is only read): the daemon is started on it all the same.
    run = threading.Thread(target=lambda: done.update(r=play(nodes, hub, limit=worker.name,
                                                              checkpoint_sync_extra_args=["--bwlimit=4"])))
    run.start()
    seen = None
    while run.is_alive():
        view = daemon_view(head, wait=20)
        if view["listening"] and view["peers"] and view["dirs"]:
            seen = view
            break
    run.join(600)
    r = done["r"]
    assert r.rc == 0, r.failure_messages()
    assert seen is not None, "the sync ended before the daemon was seen serving"
    # Bound to the head's fabric address alone, serving the worker's fabric address alone.
    assert seen["listening"] == [f"{head.fabric_ip}:{RSYNCD_PORT}"], seen
    assert {peer.rsplit(":", 1)[0] for peer in seen["peers"]} == {worker.fabric_ip}, seen
    assert seen["daemons"] == 1 and seen["serving"] >= 1, seen
    (directory, files), = seen["dirs"].items()
    assert files["mode"] == "0o700" and files["secrets_mode"] == "0o600", files
    conf = files["conf"].splitlines()
    for line in (f"hosts allow = {worker.fabric_ip}", "hosts deny = *", "read only = yes", f"path = {MODEL_DIR}",
                 "list = no", "reverse lookup = no"):
        assert line in conf, (line, conf)
    sync = r.results(SYNCED)["spark-1"]
    assert sync["transport"] == "rsyncd" and sync["port"] == RSYNCD_PORT and sync["fallback_reason"] is None
    assert sync["sent"] == shards and sync["transferred_files"] == len(shards)
    assert "could not be used" not in r.stdout, "no word of a fallback"
    assert digests(worker) == {name: sha256(data) for name, data in hub.expected.items()}
    assert stamp(worker)["revision"] == hub.info["new"]
    # Afterwards: no daemon, no listener, no secret left on the head.
    after = daemon_view(head)
    assert after["listening"] == [] and after["daemons"] == after["serving"] == 0 and after["dirs"] == {}, after
    assert not exists(head, directory)
    # The one-time secret appears in no output, no journal, and on no disk of the worker.
    secret = files["secret"]
    assert len(secret) == 64
    assert secret not in r.stdout and secret not in json.dumps(r.events)
    for n in (head, worker):
        assert secret not in sim.ssh(n, f"journalctl -o cat --since @{since}"), n.name
    assert sim.ssh(worker, f"grep -rlF {secret} /root /tmp /var/tmp /run /opt 2>/dev/null || true").strip() == ""


def test_extra_python_file_in_the_worker_model_dir_is_refused(nodes, hub):
    worker = nodes["worker"]
    evil = f"{MODEL_DIR}/modeling_evil.py"
    sim.ssh(worker, f"echo 'import os; os.system(\"id\")' > {evil}")
    try:
        r = play(nodes, hub)
        assert r.rc != 0
        assert [(d["host"], d["task"]) for d in r.failed] == [("spark-1", FAST)]
        msg = r.failure_messages()
        assert "modeling_evil.py" in msg and "--trust-remote-code" in msg and "Fix:" in msg, msg
        assert r.results(PUSH) == {}
        assert exists(worker, evil), "the role never deletes a file"
        assert stamp(worker) is None, "a refused copy loses its stamp, so no server starts on it"
        assert stamp(nodes["head"])["revision"] == hub.info["new"]
    finally:
        sim.ssh(worker, f"rm -f {evil}")
    r = play(nodes, hub)
    assert r.rc == 0, r.failure_messages()
    assert r.results(PUSH) == {}
    assert stamp(worker)["revision"] == hub.info["new"]


def test_stale_input_scales_are_replaced_alone(nodes, hub):
    head, worker = nodes["head"], nodes["worker"]
    old = commit_files(hub, hub.info["old"])[SCALES]
    new = hub.expected[SCALES]
    assert old != new and len(old) == len(new)
    for n in (head, worker):
        # A copy downloaded before 2026-08-30: same name, same size, other bytes.
        put(n, f"{MODEL_DIR}/{SCALES}", old, keep_times_of=f"{MODEL_DIR}/{SCALES}")
    before = {n.name: listing(n) for n in (head, worker)}
    hub.reset_counters()
    r = play(nodes, hub)
    assert r.rc == 0, r.failure_messages()
    fast = r.results(FAST)
    assert all(fast[h]["stale_scales"] and fast[h]["refetch"] == [SCALES] for h in ("spark-0", "spark-1")), fast
    assert hub.served() == {SCALES: len(new)}
    assert r.results(SYNCED)["spark-1"]["sent"] == [SCALES]
    for n in (head, worker):
        after = listing(n)
        assert {k: v for k, v in after.items() if k != SCALES} == \
            {k: v for k, v in before[n.name].items() if k != SCALES}, n.name
        assert digests(n)[SCALES] == sha256(new), n.name
        assert stamp(n)["revision"] == hub.info["new"], n.name


def test_nodes_whose_filesystem_is_too_small_are_refused_before_any_byte_moves(nodes, hub):
    total = sum(len(d) for d in hub.expected.values())
    size_kib = 128
    assert size_kib * 1024 < total, "the tmpfs must be smaller than the checkpoint"
    mounted = []
    try:
        for n in (nodes["head"], nodes["worker"]):
            sim.ssh(n, f"mount -t tmpfs -o size={size_kib}k spark-ckpt-test {PARENT}")
            mounted.append(n)
            assert sim.ssh(n, f"findmnt -no FSTYPE {PARENT}").strip() == "tmpfs"
            free = int(sim.ssh(n, f"df -B1 --output=avail {PARENT} | tail -1"))
            assert 0 < free < total
        hub.reset_counters()
        # No reserve: the refusal must come from the checkpoint itself not fitting. The declared size that
        # checkpoint.yml's first play (preflight's disk rule) checks is made tiny, so that the role's own check
        # against the record is what refuses here.
        r = play(nodes, hub, checkpoint_disk_reserve_bytes=0, preflight_checkpoint_bytes=1, preflight_disk_headroom_bytes=0)
        assert r.rc != 0
        assert sorted((d["host"], d["task"]) for d in r.failed) == [("spark-0", DISK), ("spark-1", DISK)]
        msg = r.failure_messages()
        for host in ("spark-0", "spark-1"):
            assert f"checkpoint_model_dir={MODEL_DIR} on {host}" in msg, msg
        assert "Fix:" in msg
        assert hub.served() == {}, "no byte came from the hub"
        assert r.results(FETCH) == {} and r.results(PUSH) == {}
        for n in mounted:
            # Only the record (metadata, kilobytes) is there; no checkpoint byte moved.
            assert sim.ssh(n, f"find {PARENT} -type f").split() == [RECORD], n.name
    finally:
        for n in mounted:
            sim.ssh(n, f"umount {PARENT}", check=False)
    for n in (nodes["head"], nodes["worker"]):
        assert stamp(n)["revision"] == hub.info["new"], "the verified copy under the tmpfs is untouched"


def test_interrupted_fetch_resumes_without_refetching_completed_files(nodes, tmp_path):
    head = nodes["head"]
    model_dir = "/opt/models/resume/glm53"
    # The client writes in 10 MiB chunks: the cut shard must be bigger for partial bytes to stay.
    root = tmp_path / "hub"
    info = build_checkpoint(root, seed=7)
    shard_path = root / info["repo_id"] / info["new"] / SHARD
    shard_path.unlink()
    shard_path.write_bytes(_safetensors({"model.layers.41.mlp.experts.weight_packed": os.urandom(24 << 20)}))
    size = shard_path.stat().st_size
    cut = 16 << 20
    with HubEmulator(root, host=nodes["cluster"].bridge_ip) as hub:
        hub.info = info
        files = commit_files(hub, info["new"])
        try:
            hub.fault(SHARD, drop_at=cut)
            r = play(nodes, hub, limit="spark-0", checkpoint_model_dir=model_dir)
            hub.clear_faults()
            assert r.rc != 0
            assert [(d["host"], d["task"]) for d in r.failed] == [("spark-0", "Collect the fetch result")]
            assert SHARD in r.failure_messages()
            first = hub.served()
            assert first[SHARD] == cut
            assert first == {**{n: len(d) for n, d in files.items()}, SHARD: cut}
            completed = set(listing(head, model_dir))
            assert completed == set(files) - {SHARD}
            partial = int(sim.ssh(head, f"stat -c %s /opt/models/resume/.glm53.partial/{SHARD}.part"))
            assert 0 < partial <= cut
            hub.reset_counters()
            r = play(nodes, hub, limit="spark-0", checkpoint_model_dir=model_dir)
            assert r.rc == 0, r.failure_messages()
            assert hub.served() == {SHARD: size - partial}, "completed files and partial bytes are not fetched again"
            ranges = [rng for method, path, rng in hub.requests if path.endswith(SHARD) and method == "GET"]
            assert ranges == [f"bytes={partial}-"]
            assert digests(head, model_dir)[SHARD] == sha256(files[SHARD])
            assert json.loads(sim.ssh(head, "cat /opt/models/resume/glm53.verified"))["revision"] == info["new"]
        finally:
            sim.ssh(head, "rm -rf /opt/models/resume")

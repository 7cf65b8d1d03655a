"""The checkpoint playbook as an operator drives it: Ctrl-C, kill -9, code in the revision, a stray file.

On this machine (controller-local: the role fetches on the head, and here the head is a local
host), with the REAL huggingface_hub client and the hub emulator, which counts the bytes it serves
and can hold a file's body at a byte offset, so a test catches a fetch in the middle. Issue 14's
findings 1, 2, 6 and 7 through the role; the modules' side is in tests/unit/test_checkpoint_findings.py.

A site's first run is checkpoint.yml as an operator runs it, the inventory check and the room play
included; its later runs are the checkpoint step as site.yml runs it (SITE_STEP: both were judged).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.lib.checkpoint_site import CODE, CODE_TEXT, SHARD, SITE_STEP, Operator, make_site, play, serve_hub
from tests.lib.role_module import module_utils

# The client writes what arrives in 10 MiB chunks: held there, the partial file holds exactly that.
HOLD = 10 << 20
FAST = "Check the checkpoint quickly against the record"
DEEP = "Hash every file against the record"


def wait_for(predicate, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def tree(directory: Path) -> dict[str, str]:
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def lock_state(site: dict):
    return module_utils("checkpoint_common").lock_state(str(site["partial"] / "fetch.lock"))


def fetch_pid(site: dict) -> int | None:
    """The pid of the fetch running on the head, as its progress file says."""
    try:
        data = json.loads((site["partial"] / "progress.json").read_text())
    except (OSError, ValueError):
        return None
    return data.get("pid") if data.get("state") == "running" else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_fetch_left_running(site: dict) -> None:
    """Teardown of a failed test: the fetch this test started, if it still runs."""
    pid = fetch_pid(site)
    if pid is not None and alive(pid):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    # One shard bigger than the client's write chunk, so that a fetch held in it has bytes on disk.
    with serve_hub(tmp_path_factory.mktemp("hub"), seed=31, big_shard=True) as emulator:
        yield emulator


def test_ctrl_c_then_run_again_follows_the_fetch_left_running(hub, tmp_path):
    site = make_site(tmp_path / "site", hub)
    hub.reset_counters()
    hub.hold(SHARD, HOLD)
    first = Operator(site, "first")
    second = None
    try:
        assert hub.wait_held(SHARD, 300), first.output()[-3000:]
        wait_for(lambda: size(site["partial"] / f"{SHARD}.part") == HOLD, "the held bytes on disk")
        pid = wait_for(lambda: fetch_pid(site), "the fetch's progress")
        first.interrupt()  # Ctrl-C
        assert first.wait(120) != 0
        assert alive(pid), "the async fetch outlives the interrupted playbook"
        second = Operator(site, "second", **SITE_STEP)
        assert second.wait_output(f"waiting for the fetch that an earlier run started (pid {pid}", 120), \
            second.output()[-4000:]
        hub.release(SHARD)
        assert second.wait(600) == 0, second.output()[-4000:]
    finally:
        hub.release()
        for run in (first, second):
            if run is not None:
                run.kill()
        stop_fetch_left_running(site)
    out = second.output()
    assert f"A fetch that an earlier run started and left running (pid {pid}" in out
    expected = tree(hub.source)
    assert tree(site["head"]) == expected and tree(site["worker"]) == expected
    # One checkpoint served, each file once: no second fetch ran beside the first.
    assert hub.served() == {name: (hub.source / name).stat().st_size for name in expected}
    assert not list(site["partial"].rglob("*.part"))
    assert lock_state(site) == (False, {**lock_state(site)[1], "state": "ended", "outcome": "done"})
    for node in ("head", "worker"):
        assert json.loads(Path(f"{site[node]}.verified").read_text())["revision"] == hub.info["new"]


def test_kill_9_is_reported_and_the_next_run_resumes_from_the_bytes_on_disk(hub, tmp_path):
    site = make_site(tmp_path / "site", hub)
    progress = site["partial"] / "progress.json"
    hub.reset_counters()
    hub.hold(SHARD, HOLD)
    first = Operator(site, "first")
    try:
        assert hub.wait_held(SHARD, 300), first.output()[-3000:]
        wait_for(lambda: size(site["partial"] / f"{SHARD}.part") == HOLD, "the held bytes on disk")

        def all_but_the_held_shard():
            data = json.loads(progress.read_text()) if progress.exists() else {}
            return data.get("files_total") and data.get("files_done") == data["files_total"] - 1

        wait_for(all_but_the_held_shard, "every other file to arrive")
        pid = fetch_pid(site)
        os.kill(pid, signal.SIGKILL)  # as the OOM killer does
        hub.release(SHARD, abort=True)  # its client is gone: nothing more goes out on that stream
        rc = first.wait(300)
    finally:
        hub.release()
        first.kill()
        stop_fetch_left_running(site)
    out = first.output()
    assert rc != 0
    on_disk = sum(p.stat().st_size for p in site["head"].rglob("*") if p.is_file()) + HOLD
    assert f"the fetch (pid {pid}) was killed" in out, out[-4000:]
    assert f"run again: it resumes from the {on_disk} bytes on disk" in out, out[-4000:]
    assert "No start of json char found" not in out
    hub.reset_counters()
    r = play(site, **SITE_STEP)
    assert r.rc == 0, r.failure_messages()
    size_of_shard = (hub.source / SHARD).stat().st_size
    assert hub.served() == {SHARD: size_of_shard - HOLD}, "only the bytes that were not on disk"
    assert [rng for method, path, rng in hub.requests if path.endswith(SHARD) and method == "GET"] == [f"bytes={HOLD}-"]
    assert f"An earlier fetch (pid {pid}" in r.stdout and "had been killed" in r.stdout
    expected = tree(hub.source)
    assert tree(site["head"]) == expected and tree(site["worker"]) == expected


@pytest.fixture(scope="module")
def code_hub(tmp_path_factory):
    with serve_hub(tmp_path_factory.mktemp("code-hub"), seed=32, code=True) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def code_site(code_hub, tmp_path_factory):
    return make_site(tmp_path_factory.mktemp("code-site"), code_hub)


def test_a_code_file_of_the_revision_is_refused_then_accepted_once_pinned(code_hub, code_site):
    code_hub.reset_counters()
    r = play(code_site)
    assert r.rc != 0
    msg = r.results("Record what the pinned revision contains")["spark-0"]["msg"]
    assert CODE in msg and "--trust-remote-code" in msg and "checkpoint_trusted_code_files" in msg
    pins = yaml.safe_load(msg.split("\n\n", 1)[1])
    assert pins == {"checkpoint_trusted_code_files": {CODE: hashlib.sha256(CODE_TEXT.encode()).hexdigest()}}
    assert not code_site["head"].exists() and not code_site["worker"].exists(), "no weight moved"
    r = play(code_site, **pins, **SITE_STEP)
    assert r.rc == 0, r.failure_messages()
    assert "The pinned revision holds code files" in r.stdout and CODE in r.stdout
    expected = tree(code_hub.source)
    assert tree(code_site["head"]) == expected and tree(code_site["worker"]) == expected
    assert code_hub.served()[CODE] == len(CODE_TEXT), "the reviewed copy is the one put in place"
    for node in ("head", "worker"):
        assert json.loads(Path(f"{code_site[node]}.verified").read_text())["revision"] == code_hub.info["new"]


def test_a_stray_file_is_refused_by_the_fast_check_before_any_hashing(code_hub, code_site):
    pins = {"checkpoint_trusted_code_files": {CODE: hashlib.sha256(CODE_TEXT.encode()).hexdigest()}}
    stray = code_site["worker"] / "notes.txt"
    stray.write_text("mine\n")
    try:
        r = play(code_site, **pins, **SITE_STEP)
        assert r.rc != 0
        failed = {d["host"]: d["task"] for d in r.failed}
        assert failed == {"spark-1": FAST}, failed
        fast = r.results(FAST)["spark-1"]
        assert fast["extra"] == ["notes.txt"] and fast["hashed_bytes"] == 0
        assert "notes.txt" in fast["msg"] and "before hashing anything" in fast["msg"]
        assert "spark-1" not in r.results(DEEP), "no deep pass on a directory hashing cannot fix"
        assert stray.exists() and not Path(f"{code_site['worker']}.verified").exists()
    finally:
        stray.unlink()

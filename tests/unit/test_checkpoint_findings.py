"""Issue 14's findings on the checkpoint role's modules, each as a new user met it.

The modules run as Ansible runs them (tests/lib/role_module.py) with the REAL huggingface_hub
client against the local hub emulator (tests/standins/hub_emulator.py), which behaves like the hub
(status codes, X-Error-* headers) and counts the bytes it serves. The interrupted and killed fetch
through the playbook are in tests/integration/test_checkpoint_interrupted.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.lib.checkpoint_site import CODE, CODE_TEXT, SHARD, free_port, serve_hub
from tests.lib.role_module import module_utils, run_module
from tests.standins.hub_emulator import HubEmulator


def common():
    return module_utils("checkpoint_common")


def fetch(hub_url: str, info: dict, base: Path, tmp: Path, **kw) -> dict:
    return run_module("checkpoint_fetch", {
        "repo_id": info["repo_id"], "revision": info["new"], "model_dir": str(base / "glm53"),
        "endpoint": hub_url, **kw}, tmp)


def verify(model: Path, tmp: Path, **kw) -> dict:
    return run_module("checkpoint_verify", {
        "model_dir": str(model), "record_path": f"{model}.record.json", "fail_on_problems": False, **kw}, tmp)



@pytest.fixture(scope="module")
def pristine(hub, tmp_path_factory):
    base = tmp_path_factory.mktemp("pristine")
    res = fetch(hub.url, hub.info, base, base)
    assert not res.get("failed"), res
    return base


@pytest.fixture
def ckpt(pristine, tmp_path):
    """A fresh copy of the fetched checkpoint and its record (new inodes: no stamp vouches for it yet)."""
    shutil.copytree(pristine, tmp_path / "m", symlinks=True)
    return tmp_path / "m" / "glm53"


# ---- finding 3: hub errors name the variable and the fix, and write nothing ------------------------

@pytest.mark.parametrize("case", ["refused", "no_token", "bad_token", "unknown_revision"])
def test_hub_errors_name_the_variable_and_the_fix_and_write_nothing(hub, tmp_path, case):
    endpoint, kw, variable, why = hub.url, {}, None, None
    if case == "refused":
        endpoint, variable, why = f"http://127.0.0.1:{free_port()}", "checkpoint_hf_endpoint", "cannot reach"
    elif case == "no_token":
        hub.require_token({"hf_TheRightOne"})
        variable, why = "checkpoint_hf_token", "without a token"
    elif case == "bad_token":
        hub.require_token({"hf_TheRightOne"})
        kw["token"] = "hf_AWrongOne"  # noqa: S105 - a made-up token
        variable, why = "checkpoint_hf_token", "Invalid credentials in Authorization header"
    else:
        kw["revision"] = "0123456789abcdef0123456789abcdef01234567"
        variable, why = "checkpoint_revision", "is unknown to checkpoint_repo_id"
    try:
        res = fetch(endpoint, hub.info, tmp_path, tmp_path, **kw)
    finally:
        hub.require_token(None)
    assert res["failed"], res
    msg = res["msg"]
    assert variable in msg and why in msg and "Fix:" in msg, msg
    assert "Traceback" not in msg and "hf_AWrongOne" not in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_fetch-args.json"], "nothing was written"


# ---- finding 4: a mirror that serves only what `hf download` reads --------------------------------

@pytest.mark.parametrize("mode", ["absent", "no_files_metadata"])
def test_a_mirror_without_per_file_metadata_gives_the_same_record(hub, pristine, tmp_path, mode):
    with HubEmulator(hub.store.root, model_info=mode) as mirror:
        if mode == "absent":
            # The mode is faithful: the real `hf download` of the pinned commit needs nothing more.
            env = {**os.environ, "HF_ENDPOINT": mirror.url, "HF_HOME": str(tmp_path / "hf-home"),
                   "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
            env.pop("HF_TOKEN", None)
            done = subprocess.run([str(Path(sys.executable).parent / "hf"), "download", hub.info["repo_id"],
                                   "--revision", hub.info["new"], "--local-dir", str(tmp_path / "hf")],
                                  env=env, capture_output=True, text=True, timeout=300, check=False)
            assert done.returncode == 0, done.stderr[-2000:]
            assert len(list((tmp_path / "hf").glob("*.safetensors"))) == 121
            assert all("/revision/" not in path for _m, path, _r in mirror.requests)
            mirror.reset_counters()
        res = fetch(mirror.url, hub.info, tmp_path / "m", tmp_path, record_only=True)
        assert not res.get("failed"), res.get("msg")
        api = sorted({path.split("/")[5] for _m, path, _r in mirror.requests if path.startswith("/api/")})
        assert api == ["tree"], api
    reference = json.loads((pristine / "glm53.record.json").read_text())
    record = json.loads((tmp_path / "m" / "glm53.record.json").read_text())
    assert record["files"] == reference["files"]
    assert sorted(record) == sorted(reference)


# ---- finding 5: the fast check notices a file changed in place since it was verified --------------

def change_in_place(path: Path) -> bytes:
    """Flip one byte without changing the size or the inode, and put the mtime back; the good bytes."""
    before = path.stat()
    good = path.read_bytes()
    with open(path, "r+b") as f:
        f.seek(len(good) // 2)
        f.write(bytes([good[len(good) // 2] ^ 0x01]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_ino, after.st_mtime_ns) == (before.st_size, before.st_ino, before.st_mtime_ns)
    return good


def put_right(path: Path, good: bytes) -> None:
    """As a fetch or sync does: a new file moved into place."""
    path.with_name(path.name + ".new").write_bytes(good)
    os.replace(path.with_name(path.name + ".new"), path)


def test_the_fast_check_notices_a_shard_changed_in_place_and_hashes_only_it(ckpt, tmp_path):
    stamp, cache = f"{ckpt}.verified", str(tmp_path / "verified-files.json")
    path = ckpt / SHARD
    deep = verify(ckpt, tmp_path, mode="deep", stamp_path=stamp)
    assert deep["ok"] and deep["changed"] and deep["hashed_bytes"] == deep["total_bytes"]
    good = change_in_place(path)
    fast = verify(ckpt, tmp_path, stamp_path=stamp)
    assert not fast["ok"] and fast["wrong_content"] == [SHARD] and fast["refetch"] == [SHARD]
    assert fast["stamp"] is None and not Path(stamp).exists()
    assert fast["changed_since_verified"] == [SHARD] and fast["hashed"] == [SHARD], "the others are not read"
    put_right(path, good)
    # With the cache a pass keeps, the pass after a repair hashes the repaired file alone.
    assert verify(ckpt, tmp_path, mode="deep", stamp_path=stamp, cache_path=cache)["ok"]
    quiet = verify(ckpt, tmp_path, stamp_path=stamp, cache_path=cache)
    assert quiet["ok"] and quiet["stamp"] is not None and quiet["hashed_bytes"] == 0 and not quiet["changed"]
    good = change_in_place(path)
    fast = verify(ckpt, tmp_path, stamp_path=stamp, cache_path=cache)
    assert fast["wrong_content"] == [SHARD] and fast["hashed"] == [SHARD]
    put_right(path, good)
    again = verify(ckpt, tmp_path, mode="deep", stamp_path=stamp, cache_path=cache)
    assert again["ok"] and again["hashed"] == [SHARD] and again["stamp"] is not None
    # checkpoint_deep_verify: every byte, whatever is remembered.
    assert verify(ckpt, tmp_path, mode="deep", rehash=True, stamp_path=stamp)["hashed_bytes"] == again["total_bytes"]


# ---- finding 6: a stray file is refused before any hashing -----------------------------------------

@pytest.mark.parametrize("mode", ["fast", "deep"])
def test_a_stray_file_is_refused_before_any_hashing(ckpt, tmp_path, mode):
    (ckpt / "notes.txt").write_text("mine\n")
    res = verify(ckpt, tmp_path, mode=mode)
    assert res["failed"] and res["extra"] == ["notes.txt"]
    assert res["hashed_bytes"] == 0 and res["hashed"] == [], "hashing cannot fix a stray file"
    assert "before hashing anything" in res["msg"] and "notes.txt" in res["msg"] and "Fix:" in res["msg"]
    assert (ckpt / "notes.txt").read_text() == "mine\n", "never deleted"


# ---- finding 7: code files of the revision are refused until pinned by name and sha256 -------------

@pytest.fixture(scope="module")
def code_hub(tmp_path_factory):
    with serve_hub(tmp_path_factory.mktemp("code-hub"), seed=21, code=True) as emulator:
        yield emulator


def test_code_files_of_the_revision_are_refused_until_pinned_then_fetched_once(code_hub, tmp_path):
    info, want = code_hub.info, hashlib.sha256(CODE_TEXT.encode()).hexdigest()
    code_hub.reset_counters()
    res = fetch(code_hub.url, info, tmp_path, tmp_path, record_only=True)
    assert res["failed"] and "--trust-remote-code" in res["msg"] and CODE in res["msg"]
    assert res["code_files"] == [{"name": CODE, "size": len(CODE_TEXT), "sha256": want,
                                  "review_path": str(tmp_path / ".glm53.partial" / "review" / info["new"] / CODE),
                                  "pinned": None, "trusted": False}]
    # The lines to paste after review, exactly.
    pasted = yaml.safe_load(res["msg"].split("\n\n", 1)[1])
    assert pasted == {"checkpoint_trusted_code_files": {CODE: want}}
    assert Path(res["code_files"][0]["review_path"]).read_text() == CODE_TEXT
    assert not (tmp_path / "glm53").exists() and code_hub.served() == {CODE: len(CODE_TEXT)}
    # A pin of other content is refused too.
    wrong = fetch(code_hub.url, info, tmp_path, tmp_path, trusted_code_files={CODE: "0" * 64})
    assert wrong["failed"] and f"pins {'0' * 64}" in wrong["msg"] and not (tmp_path / "glm53").exists()
    # Pinned: fetched, the reviewed copy put in place rather than downloaded again.
    ok = fetch(code_hub.url, info, tmp_path, tmp_path, **pasted_as_args(pasted))
    assert not ok.get("failed"), ok.get("msg")
    assert (tmp_path / "glm53" / CODE).read_text() == CODE_TEXT and CODE in ok["fetched"]
    assert code_hub.served()[CODE] == len(CODE_TEXT), "the code file crossed the network once"
    # Verification everywhere else: refused unless pinned, before any weight is hashed.
    model = tmp_path / "glm53"
    refused = verify(model, tmp_path, mode="deep")
    assert refused["failed"] and refused["refused"] == [CODE] and refused["hashed"] == [CODE]
    assert yaml.safe_load(refused["msg"].split("\n\n", 1)[1]) == pasted
    passed = verify(model, tmp_path, mode="deep", stamp_path=f"{model}.verified", **pasted_as_args(pasted))
    assert passed["ok"] and passed["code_files"][0]["sha256"] == want, passed.get("msg")


def pasted_as_args(pasted: dict) -> dict:
    return {"trusted_code_files": pasted["checkpoint_trusted_code_files"]}


# ---- finding 8: progress after a resume counts the bytes this run moved -----------------------------

def test_the_transfer_meter_counts_only_the_bytes_this_run_moved():
    clock = [100.0]
    meter = common().TransferMeter(total=20_000_000, clock=lambda: clock[0])
    # 10 MB were on disk from an earlier run: half done, nothing moved yet, no rate to show.
    start = meter.figures(10_000_000)
    assert (start["percent"], start["rate"], start["eta"]) == (50.0, 0.0, None)
    clock[0] += 1.0
    meter.add(3_800_000)
    now = meter.figures(13_800_000)
    assert now["rate"] == pytest.approx(3_800_000) and now["moved"] == 3_800_000
    assert now["eta"] == pytest.approx(6_200_000 / 3_800_000)
    # A disk figure past the total (a partial file longer than its file) is clamped.
    over = meter.figures(25_000_000)
    assert (over["done"], over["percent"], over["eta"]) == (20_000_000, 100.0, 0.0)
    line = common().progress_line(25_000_000, 20_000_000, -1_153_434.0, -7199.0, "")
    assert "(100.0%)" in line and "-" not in line.split("%)", 1)[1], line


def test_fetch_progress_after_a_resume(tmp_path):
    progress = tmp_path / "progress.json"
    with serve_hub(tmp_path / "hub", seed=13, big_shard=True) as hub:
        info, source = hub.info, hub.source / SHARD
        size, had = source.stat().st_size, 16 << 20
        # What an interrupted run left: the revision's partial file with its first 16 MiB.
        staging = tmp_path / ".glm53.partial"
        staging.mkdir()
        (staging / "revision").write_text(info["new"] + "\n")
        (staging / f"{SHARD}.part").write_bytes(source.read_bytes()[:had])
        res = fetch(hub.url, info, tmp_path, tmp_path, files=[SHARD], progress_path=str(progress),
                    progress_id="resumed")
        assert not res.get("failed"), res.get("msg")
        assert hub.served() == {SHARD: size - had}
    assert res["fetched_bytes"] == size - had
    last = json.loads(progress.read_text())
    assert last["id"] == "resumed" and last["state"] == "done"
    assert (last["done_bytes"], last["total_bytes"], last["percent"]) == (size, size, 100.0)
    assert last["resumed_bytes"] == had and last["moved_bytes"] == size - had
    # The rate of the bytes that moved, not of the 16 MiB that were already there.
    assert last["rate_bytes_per_s"] == pytest.approx(last["moved_bytes"] / last["elapsed_s"], rel=0.01)
    assert last["eta_s"] == 0.0 and "resumed with 16.0 MiB on disk" in last["line"]
    assert (tmp_path / "glm53" / SHARD).read_bytes() == source.read_bytes()


# ---- findings 1 and 2 at the module: one fetch at a time, a killed one reported -------------------

def test_a_fetch_refuses_to_share_the_partial_files_with_one_of_another_revision(hub, tmp_path):
    staging = tmp_path / ".glm53.partial"
    staging.mkdir()
    lock = common().TransferLock(str(staging / "fetch.lock"))
    assert lock.try_acquire()
    lock.write({"state": "running", "pid": os.getpid(), "repo_id": hub.info["repo_id"], "revision": hub.info["old"],
                "model_dir": str(tmp_path / "glm53"), "started_at": "2026-11-30T10:00:00Z"})
    hub.reset_counters()
    try:
        res = fetch(hub.url, hub.info, tmp_path, tmp_path, files=[SHARD])
    finally:
        lock.release()
    assert res["failed"] and f"another fetch (pid {os.getpid()})" in res["msg"]
    assert f"kill {os.getpid()}" in res["msg"] and hub.info["old"] in res["msg"]
    assert SHARD not in hub.served() and not list(staging.glob("*.part"))


def test_a_fetch_killed_earlier_is_reported_and_resumed_from_its_bytes(hub, pristine, tmp_path):
    staging = tmp_path / ".glm53.partial"
    staging.mkdir()
    (staging / "revision").write_text(hub.info["new"] + "\n")
    (staging / f"{SHARD}.part").write_bytes((pristine / "glm53" / SHARD).read_bytes()[:1000])
    # The lock file of a fetch that was killed: it says running, and nobody holds it.
    (staging / "fetch.lock").write_text(json.dumps({
        "state": "running", "pid": 4242, "repo_id": hub.info["repo_id"], "revision": hub.info["new"],
        "model_dir": str(tmp_path / "glm53"), "started_at": "2026-11-30T10:00:00Z"}))
    hub.reset_counters()
    res = fetch(hub.url, hub.info, tmp_path, tmp_path, files=[SHARD])
    assert not res.get("failed"), res.get("msg")
    assert res["previous_fetch"] == {"pid": 4242, "started_at": "2026-11-30T10:00:00Z", "revision": hub.info["new"],
                                     "state": "killed", "bytes_on_disk": 1000}
    size = (pristine / "glm53" / SHARD).stat().st_size
    assert hub.served() == {SHARD: size - 1000}
    assert json.loads((staging / "fetch.lock").read_text())["state"] == "ended"

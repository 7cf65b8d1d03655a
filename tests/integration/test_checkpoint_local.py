"""The checkpoint playbook end to end on this machine, with the REAL huggingface_hub client.

Two inventory hosts with a local connection stand for the head and a worker, each with its own
model directory; the worker's "fabric" is a remote shell that runs rsync's far side locally (the
site: tests/lib/checkpoint_site.py). The hub is the local emulator on 127.0.0.1, which counts the
bytes it serves per file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.lib.checkpoint_site import SCALES, SHARD, changed_tasks, make_site, play, serve_hub
from tests.lib.playbook import REPO, run_playbook

REFUSE_SOURCE = "Refuse to sync from a source host that does not hold the verified checkpoint"
PUSH = "Push the files from the source host over the fabric"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with serve_hub(tmp_path_factory.mktemp("hub")) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def site(hub, tmp_path_factory):
    return make_site(tmp_path_factory.mktemp("site"), hub)


def test_refusals_happen_before_any_change(hub, tmp_path):
    s = make_site(tmp_path, hub)
    cases = {
        "checkpoint_model_dir": ["LibertAIDAI/GLM-5.3-Flash-NVFP4", "models/glm53", "/opt/models/glm53;reboot",
                                 "/opt/models/glm 53", "/opt/models/$(id)", "/opt/models/glm53/"],
        "checkpoint_revision": ["main", "7ce4007", "", "7CE4007804DDBB1B33185FEBC1669F76F90FB53E"],
    }
    for var, values in cases.items():
        for value in values:
            r = play(s, **{var: value})
            assert r.rc != 0, (var, value)
            msg = r.failure_messages()
            assert var in msg and "Fix" in msg, msg
            assert r.changed_before_first_failure() == [], (var, value)
    assert not (tmp_path / "head").exists() and not (tmp_path / "worker").exists()
    r = play(s, checkpoint_model_dir="LibertAIDAI/GLM-5.3-Flash-NVFP4")
    assert "hub repo id" in r.failure_messages()


def test_fresh_fetch_of_an_old_copy_then_stale_scales_replaced_alone(site, hub):
    # First the copy an operator would have fetched before 2026-08-30 ...
    hub.reset_counters()
    r = play(site, checkpoint_revision=hub.info["old"])
    assert r.rc == 0, r.failure_messages() or r.stdout[-3000:]
    total = sum(p.stat().st_size for p in site["head"].iterdir())
    assert sum(hub.served().values()) == total, "each file is fetched exactly once from the hub"
    assert "fetch spark-0:" in r.stdout and "/s, ETA" in r.stdout, "progress lines are printed"
    for node in ("head", "worker"):
        stamp = json.loads((site[node].parent / "glm53.verified").read_text())
        assert stamp["revision"] == hub.info["old"]
    # ... then the pin moves to the 2026-08-30 commit: only the scales file changes.
    hub.reset_counters()
    r = play(site)
    assert r.rc == 0, r.failure_messages() or r.stdout[-3000:]
    assert hub.served() == {SCALES: (site["head"] / SCALES).stat().st_size}
    sync = [d["res"] for d in r.changed if d["task"] == "Collect the sync result"]
    assert [s["sent"] for s in sync] == [[SCALES]]
    # Pulled by the worker from the head's one-time rsync daemon, on the site's two loopback "fabric" addresses.
    assert [(s["transport"], s["fallback_reason"]) for s in sync] == [("rsyncd", None)]
    new_scales = Path(hub.store.root) / hub.info["repo_id"] / hub.info["new"] / SCALES
    for node in ("head", "worker"):
        assert (site[node] / SCALES).read_bytes() == new_scales.read_bytes()
        assert json.loads((site[node].parent / "glm53.verified").read_text())["revision"] == hub.info["new"]


def test_second_run_transfers_nothing_and_changes_nothing(site, hub):
    hub.reset_counters()
    r = play(site)
    assert r.rc == 0, r.failure_messages()
    assert changed_tasks(r) == []
    assert hub.served() == {}
    facts = r.results("Export that this host holds the verified checkpoint")
    assert all(f["ansible_facts"]["checkpoint_verified"] for f in facts.values()) and len(facts) == 2


def test_check_mode_on_a_converged_site_reports_no_change(site, hub):
    r = play(site, check=True)
    assert r.rc == 0, r.failure_messages()
    assert changed_tasks(r) == []


def test_corrupted_worker_shard_found_by_the_fast_check_and_resynced_alone(site, hub):
    # Changed in place with its mtime put back: the stamp's memory of its ctime gives it away.
    path = site["worker"] / SHARD
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    hub.reset_counters()
    r = play(site, checkpoint_deep_verify=True)
    assert r.rc == 0, r.failure_messages()
    assert hub.served() == {}, "the head's copy is good: nothing comes from the hub"
    fast = r.results("Check the checkpoint quickly against the record")
    assert fast["spark-1"]["refetch"] == [SHARD] and fast["spark-1"]["changed_since_verified"] == [SHARD]
    deep = r.results("Hash every file against the record")
    assert deep["spark-1"]["ok"] and deep["spark-0"]["ok"]
    assert deep["spark-0"]["hashed_bytes"] == deep["spark-0"]["total_bytes"], "checkpoint_deep_verify hashes all"
    sync = [d["res"] for d in r.changed if d["task"] == "Collect the sync result"]
    assert [s["sent"] for s in sync] == [[SHARD]]
    assert path.read_bytes() == (site["head"] / SHARD).read_bytes()


def test_extra_python_file_is_refused_and_kept(site):
    evil = site["worker"] / "modeling_evil.py"
    evil.write_text("import os; os.system('id')\n")
    try:
        r = play(site)
        assert r.rc != 0
        assert "modeling_evil.py" in r.failure_messages() and "--trust-remote-code" in r.failure_messages()
        assert evil.exists()
        assert not (site["worker"].parent / "glm53.verified").exists(), "a refused copy is not stamped"
    finally:
        evil.unlink()
    r = play(site)
    assert r.rc == 0 and (site["worker"].parent / "glm53.verified").exists()


def test_interrupted_fetch_resumes_without_refetching_completed_files(tmp_path):
    # The client writes in 10 MiB chunks, so the cut shard must be bigger than that for the
    # interrupted run to leave partial bytes behind.
    cut = 16 << 20
    with serve_hub(tmp_path / "hub", seed=7, big_shard=True) as hub:
        shard_path = hub.source / SHARD
        size = shard_path.stat().st_size
        s = make_site(tmp_path / "site", hub)
        hub.fault(SHARD, drop_at=cut)
        r = play(s)
        hub.clear_faults()
        assert r.rc != 0 and SHARD in r.failure_messages()
        # The worker gets nothing from a head whose fetch failed: its room judged, then no sync of partial bytes.
        on_worker = [d for d in r.failed if d["host"] == "spark-1"]
        assert [d["task"] for d in on_worker] == [REFUSE_SOURCE], r.failure_messages()
        assert "spark-0 does not hold the verified checkpoint" in on_worker[0]["res"]["msg"]
        assert "its fetch or verification failed" in on_worker[0]["res"]["msg"]
        assert not [e for e in r.task_events() if e["event_data"]["task"] == PUSH
                    and e["event"] != "runner_on_skipped"], "a sync ran after the head's failed fetch"
        assert not s["worker"].exists()
        first = hub.served()
        assert first[SHARD] == cut
        completed = {p.name for p in s["head"].iterdir()}
        assert SHARD not in completed and len(completed) == len(hub.info["files"]) - 1
        partial = (s["head"].parent / ".glm53.partial" / f"{SHARD}.part").stat().st_size
        assert 0 < partial <= cut
        hub.reset_counters()
        r = play(s)
        assert r.rc == 0, r.failure_messages()
        assert hub.served() == {SHARD: size - partial}, "completed files and partial bytes are not fetched again"
        ranges = [rng for method, path, rng in hub.requests if path.endswith(SHARD) and method == "GET"]
        assert ranges == [f"bytes={partial}-"]
        assert (s["head"] / SHARD).read_bytes() == shard_path.read_bytes()
        assert (s["worker"] / SHARD).read_bytes() == shard_path.read_bytes()


def test_token_is_sent_but_never_printed(hub, tmp_path):
    s = make_site(tmp_path, hub)
    token = "hf_SeCrEtTokenValue0123456789"  # noqa: S105 - a made-up token the test hunts for
    hub.tokens_seen.clear()
    r = run_playbook("playbooks/checkpoint.yml", s["inventory"], extravars={**s["vars"], "checkpoint_hf_token": token},
                     envvars={"ANSIBLE_VERBOSITY": "3"}, timeout=900)
    assert r.rc == 0, r.failure_messages()
    assert f"Bearer {token}" in hub.tokens_seen
    assert token not in r.stdout and token not in json.dumps(r.events)
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.stat().st_size < 1 << 20:
            assert token.encode() not in path.read_bytes(), path


def test_lead_wiring_still_feeds_the_role():
    spark = yaml.safe_load((REPO / "group_vars" / "all" / "spark.yml").read_text())
    assert spark["checkpoint_model_dir"] == "{{ spark_model_dir }}"
    assert shutil.which("rsync"), "rsync is needed on the nodes and here"

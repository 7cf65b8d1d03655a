"""The checkpoint playbook end to end on this machine, with the REAL huggingface_hub client.

Two inventory hosts with a local connection stand for the head and a worker, each with its own
model directory; the worker's "fabric" is a remote shell that runs rsync's far side locally (the
site: tests/lib/checkpoint_site.py). The hub is the local emulator on 127.0.0.1, which counts the
bytes it serves per file.

A site's first run is checkpoint.yml as an operator runs it, the inventory check and the room play
included; its later runs are the checkpoint step as site.yml runs it (SITE_STEP: both were judged).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.lib.checkpoint_site import PLAYBOOK, SCALES, SHARD, SITE_STEP, changed_tasks, make_site, play, serve_hub
from tests.lib.playbook import REPO, run_playbook

REFUSE_SOURCE = "Refuse to sync from a source host that does not hold the verified checkpoint"
PUSH = "Push the files from the source host over the fabric"



@pytest.fixture(scope="module")
def site(hub, tmp_path_factory):
    return make_site(tmp_path_factory.mktemp("site"), hub)


TOKEN = "hf_SeCrEtTokenValue0123456789"  # noqa: S105 - a made-up token the tests hunt for


@pytest.fixture(scope="module")
def first_fetch(site, hub):
    """The site's first run: the copy an operator would have fetched before 2026-08-30, fetched with a hub
    token at verbosity 3 (test_token_is_sent_but_never_printed reads the same run). Returns the run and
    the bytes each file took from the hub."""
    hub.reset_counters()
    hub.tokens_seen.clear()
    r = run_playbook(PLAYBOOK, site["inventory"],
                     extravars={**site["vars"], "checkpoint_revision": hub.info["old"], "checkpoint_hf_token": TOKEN},
                     envvars={"ANSIBLE_VERBOSITY": "3"}, timeout=900)
    return r, hub.served(), set(hub.tokens_seen)


# Every bad value of each variable, refused before any change. The role judges each host's settings on
# its own and names every broken one at once, so each run gives the head and the worker a bad value of
# both variables (inventory host vars; a value left out is a good one) and each host's message must name
# each of its values: 3 runs instead of one per value.
REFUSED = {
    "checkpoint_model_dir": ["LibertAIDAI/GLM-5.3-Flash-NVFP4", "models/glm53", "/opt/models/glm53;reboot",
                             "/opt/models/glm 53", "/opt/models/$(id)", "/opt/models/glm53/"],
    "checkpoint_revision": ["main", "7ce4007", "", "7CE4007804DDBB1B33185FEBC1669F76F90FB53E"],
}


def refusal_rounds() -> list[dict[str, dict]]:
    """Per run, each host's bad values: {host: {var: value}}, every value of REFUSED in exactly one."""
    slots = [(run, host) for run in range(3) for host in ("spark-0", "spark-1")]
    rounds: list[dict[str, dict]] = [{"spark-0": {}, "spark-1": {}} for _ in range(3)]
    for var, values in REFUSED.items():
        for (run, host), value in zip(slots, values, strict=False):
            rounds[run][host][var] = value
    return rounds


def test_refusals_happen_before_any_change(hub, tmp_path):
    judged = []
    for number, bad in enumerate(refusal_rounds()):
        # The revision comes from the inventory here, per host: a good one where this round has none to try.
        s = make_site(tmp_path, hub, host_vars={host: {"checkpoint_revision": hub.info["new"], **values}
                                                for host, values in bad.items()})
        extra = {k: v for k, v in s["vars"].items() if k != "checkpoint_revision"}
        r = run_playbook("playbooks/checkpoint.yml", s["inventory"], extravars=extra, timeout=900)
        assert r.rc != 0, (number, bad)
        assert r.changed_before_first_failure() == [], (number, bad)
        msg = {d["host"]: str(d.get("res", {}).get("msg", "")) for d in r.failed}
        for host, values in bad.items():
            for var, value in values.items():
                # The host's own refusal names the variable with this very value, and the fix.
                assert f"{var}={json.dumps(value)}" in msg.get(host, "") and "Fix" in msg[host], (var, value, msg)
                judged.append((var, value))
        if "LibertAIDAI/GLM-5.3-Flash-NVFP4" in [v.get("checkpoint_model_dir") for v in bad.values()]:
            host = next(h for h, v in bad.items() if v.get("checkpoint_model_dir") == "LibertAIDAI/GLM-5.3-Flash-NVFP4")
            assert "hub repo id" in msg[host]
    assert sorted(judged) == sorted((var, value) for var, values in REFUSED.items() for value in values)
    assert not (tmp_path / "head").exists() and not (tmp_path / "worker").exists()


def test_fresh_fetch_of_an_old_copy_then_stale_scales_replaced_alone(site, hub, first_fetch):
    # First the copy an operator would have fetched before 2026-08-30 ...
    r, served, _ = first_fetch
    assert r.rc == 0, r.failure_messages() or r.stdout[-3000:]
    total = sum(p.stat().st_size for p in site["head"].iterdir())
    assert sum(served.values()) == total, "each file is fetched exactly once from the hub"
    assert "fetch spark-0:" in r.stdout and "/s, ETA" in r.stdout, "progress lines are printed"
    for node in ("head", "worker"):
        stamp = json.loads((site[node].parent / "glm53.verified").read_text())
        assert stamp["revision"] == hub.info["old"]
    # ... then the pin moves to the 2026-08-30 commit: only the scales file changes.
    hub.reset_counters()
    r = play(site, **SITE_STEP)
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
    r = play(site, **SITE_STEP)
    assert r.rc == 0, r.failure_messages()
    assert changed_tasks(r) == []
    assert hub.served() == {}
    facts = r.results("Export that this node holds the verified checkpoint")
    assert all(f["ansible_facts"]["checkpoint_verified"] for f in facts.values()) and len(facts) == 2


def test_check_mode_on_a_converged_site_reports_no_change(site, hub):
    r = play(site, check=True, **SITE_STEP)
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
    r = play(site, checkpoint_deep_verify=True, **SITE_STEP)
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
        r = play(site, **SITE_STEP)
        assert r.rc != 0
        assert "modeling_evil.py" in r.failure_messages() and "--trust-remote-code" in r.failure_messages()
        assert evil.exists()
        assert not (site["worker"].parent / "glm53.verified").exists(), "a refused copy is not stamped"
    finally:
        evil.unlink()
    r = play(site, **SITE_STEP)
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
        r = play(s, **SITE_STEP)
        assert r.rc == 0, r.failure_messages()
        assert hub.served() == {SHARD: size - partial}, "completed files and partial bytes are not fetched again"
        ranges = [rng for method, path, rng in hub.requests if path.endswith(SHARD) and method == "GET"]
        assert ranges == [f"bytes={partial}-"]
        assert (s["head"] / SHARD).read_bytes() == shard_path.read_bytes()
        assert (s["worker"] / SHARD).read_bytes() == shard_path.read_bytes()


def test_token_is_sent_but_never_printed(site, first_fetch):
    # The site's first fetch (first_fetch) sent a token at verbosity 3; every file of the site since, too.
    r, _, tokens_seen = first_fetch
    assert r.rc == 0, r.failure_messages()
    assert f"Bearer {TOKEN}" in tokens_seen
    assert TOKEN not in r.stdout and TOKEN not in json.dumps(r.events)
    for path in site["base"].rglob("*"):
        if path.is_file() and path.stat().st_size < 1 << 20:
            assert TOKEN.encode() not in path.read_bytes(), path


def test_lead_wiring_still_feeds_the_role():
    spark = yaml.safe_load((REPO / "playbooks" / "group_vars" / "all" / "spark.yml").read_text())
    assert spark["checkpoint_model_dir"] == "{{ spark_model_dir }}"
    assert shutil.which("rsync"), "rsync is needed on the nodes and here"

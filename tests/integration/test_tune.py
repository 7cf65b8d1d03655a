"""playbooks/tune.yml on simulated nodes: the capacity frontier, found through the server role's restarts.

ONE representative case on the nodes, each trial a real restart of every rank; the search space
(doubling and bisection over many budgets, contexts, caps and running points, resuming midway) is
proven against a simulated engine in tests/unit/test_tune_search.py, with this very case among them.
The stand-in SGLang server (tests/standins/lib/sglang_server.py) holds a hybrid state cache of
`state_budget` request-tokens: a start whose max-running-requests x context-length is above it
fails with the real fingerprint. With 2 x 65536 and at most 2 requests the frontier is 65536 -> 2
(the seed's point, which the group runs: no restart), 131072 -> 1, and 262144 does not start; the
group must end on what it ran before (65536 x 2), answering the verify questions. Every kind of
trial happens once on real restarts: a fit, a failure above a fit, a context that does not start.
A second run resumes from the record (no trial again) and ends on the profile tune_apply names.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook
from tests.lib.supervised import MODEL_DIR, REVISION, checkpoint_files, generate

CONTEXTS = [65536, 131072, 262144]
BUDGET = 2 * 65536
# At most 2, the running point's: each restart of the group is the module's cost, and a failure above a fit
# is tried at 131072 (2 does not start there); the failure right above the running point (a cap of 3, one
# restart more) is the unit test's (test_a_cap_above_the_running_point_tries_the_failure_above_it_first).
CAP = 2
TUNE = {"tune_contexts": CONTEXTS, "tune_max_requests": CAP}
ARGS = "/etc/spark-llm/server-args.json"
UNIT = "spark-llm.service"
PINNED = {"checkpoint_revision": REVISION}


def sh(node, command: str) -> str:
    return sim.ssh(node, command, timeout=120)


def running(node) -> tuple[int, int]:
    args = json.loads(sh(node, f"cat {ARGS}"))
    return int(args[args.index("--context-length") + 1]), int(args[args.index("--max-running-requests") + 1])


def started(node) -> str:
    return sh(node, f"systemctl show {UNIT} -p ActiveEnterTimestampMonotonic --value").strip()


@pytest.fixture(scope="module")
def site(sim_cluster):
    for n in sim_cluster.nodes:
        # What checkpoint.yml and fabric.yml leave behind, in the smallest form the server role and stand-in accept.
        sh(n, checkpoint_files() + " && (ip -o addr show dev enp1s0f1np1 | grep -q ' "
              f"{n.fabric_ip}/' || ip addr add {n.fabric_ip}/24 dev enp1s0f1np1)")
        # token_seconds: a decode rate for the single-stream figures (tune_benchmark) to report.
        sim.set_knobs(sim_cluster.instance, n.name, {"sglang": {"load_seconds": 0.2, "state_budget": BUDGET,
                                                                "token_seconds": 0.01}})
    result = run_playbook("playbooks/server.yml", sim_cluster.inventory, extravars=PINNED)
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    assert [running(n) for n in sim_cluster.nodes] == [(65536, 2)] * 2
    return sim_cluster


@pytest.fixture(scope="module")
def tuned(site, tmp_path_factory):
    out = tmp_path_factory.mktemp("tune")
    result = run_playbook("playbooks/tune.yml", site.inventory, timeout=1800, extravars={
        **PINNED, **TUNE, "tune_dir": str(out), "tune_benchmark": True,
        "benchmark_max_tokens": 8, "benchmark_min_requests": 2, "benchmark_rounds": 1})
    assert result.rc == 0, result.failure_messages() or result.stdout[-5000:]
    (report,) = out.glob("tune-*Z.json")
    return result, json.loads(report.read_text()), out


def test_the_frontier_is_found_exactly(tuned):
    _result, report, _out = tuned
    assert [(r["context"], r["max_requests"]) for r in report["frontier"]] == [(65536, 2), (131072, 1), (262144, 0)]
    assert [r["startable"] for r in report["frontier"]] == [True, True, False]
    # Both sides of each frontier were tried: a fit at the frontier and a failure one above it (at 65536 the
    # cap is the frontier's upper side: nothing above it is tried).
    tried = {(t["context"], t["requests"]): t["fits"] for t in report["trials"]}
    assert tried == {(65536, 2): True, (131072, 1): True, (131072, 2): False, (262144, 1): False}, tried
    assert all(t["requests"] <= CAP for t in report["trials"]), report["trials"]
    failed = [t for t in report["trials"] if not t["fits"]]
    assert failed and all("hybrid (mamba/linear-attention) state cache" in t["reason"] for t in failed), failed
    # Every trial is one real candidate: none repeated, none the budget contradicts.
    tried = [(t["context"], t["requests"]) for t in report["trials"]]
    assert len(tried) == len(set(tried))
    assert all(t["fits"] == (t["context"] * t["requests"] <= BUDGET) for t in report["trials"])
    # The single-stream figures of every frontier point (tune_benchmark), the running one's too; a start time
    # only where the tune started the group (65536 x 2 served before the tune began).
    for row in report["frontier"][:2]:
        assert row["figures"]["decode_tok_s"] > 0, row
    assert [row["start_seconds"] is None for row in report["frontier"][:2]] == [True, False], report["frontier"]
    assert report["frontier"][1]["start_seconds"] > 0


def test_the_profiles_file_holds_one_profile_per_startable_point(tuned):
    result, _report, out = tuned
    (path,) = out.glob("tune-*-profiles.yml")
    text = path.read_text()
    assert text.startswith("#") and "server_profile: <name>" in text
    assert yaml.safe_load(text) == {"server_profiles": {
        "ctx65536-req2": {"context-length": 65536, "max-running-requests": 2},
        "ctx131072-req1": {"context-length": 131072, "max-running-requests": 1}}}
    table = "\n".join(next(iter(result.results("Show the frontier").values()))["msg"])
    assert "| 262144 | not startable |" in table and "| 65536 | 2 |" in table


def test_the_group_runs_its_previous_configuration_and_verifies(tuned, site):
    _result, _report, out = tuned
    assert [running(n) for n in site.nodes] == [(65536, 2)] * 2
    after = json.loads(next(out.glob("tune-*/verify-after.json")).read_text())
    assert after["ok"] is True, after["checks"]
    assert generate(site)


def test_progress_names_the_candidate_the_trials_left_and_the_time(tuned):
    result, report, _out = tuned
    lines = [e["event_data"]["res"]["msg"] for e in result.task_events("runner_on_ok")
             if e["event_data"].get("task") == "Show the candidate"]
    assert len(lines) == len(report["trials"]) - 1  # the running configuration needed no restart
    assert all(re.search(r"^Candidate context-length \d+ x max-running-requests \d+ .* about \d+ left; \d+ s elapsed$", m)
               for m in lines), lines


def test_a_second_run_resumes_and_ends_on_the_profile_tune_apply_names(tuned, site):
    _result, report, out = tuned
    before = [started(n) for n in site.nodes]
    result = run_playbook("playbooks/tune.yml", site.inventory, timeout=1800, extravars={
        **PINNED, **TUNE, "tune_dir": str(out), "tune_apply": "ctx131072-req1"})
    assert result.rc == 0, result.failure_messages() or result.stdout[-5000:]
    assert [e for e in result.task_events("runner_on_ok") if e["event_data"].get("task") == "Show the candidate"] == []
    assert "Resuming:" in " ".join(next(iter(result.results("Show where the tune starts").values()))["msg"])
    # Only the apply restarted the group, once: the record answered every candidate.
    assert [started(n) for n in site.nodes] != before
    assert [running(n) for n in site.nodes] == [(131072, 1)] * 2
    assert generate(site)
    newest = sorted(out.glob("tune-*Z.json"))[-1]
    assert [(r["context"], r["max_requests"]) for r in json.loads(newest.read_text())["frontier"]] == \
        [(r["context"], r["max_requests"]) for r in report["frontier"]]


# Speculative profiles (tune_speculative): two next-token-head chains measured against what the group runs. At the
# stand-in's acceptance of 0.6 per drafted token a 1-step chain yields 1.6 tokens per step for 1.29 steps' time
# and an 8-step chain 2.48 tokens for 3.18 steps' time (tests/standins/lib/sglang_server.py, speculation()): the
# first beats the base, the second is slower than it, whatever the machine's load adds to every step alike.
# mtp1 last: the tune then ends on it (tune_apply) without another restart.
SPECULATIVE = {
    "mtp8": {"speculative-algorithm": "NEXTN", "speculative-num-steps": 8, "speculative-eagle-topk": 1,
             "speculative-num-draft-tokens": 9},
    "mtp1": {"speculative-algorithm": "EAGLE", "speculative-num-steps": 1, "speculative-eagle-topk": 1,
             "speculative-num-draft-tokens": 2},
}


def speculative_inventory(site, tmp_path_factory, profiles=None, **group_vars):
    """The site's inventory with the profiles (SPECULATIVE and `profiles`) and the running point (ctx131072-req1,
    which the last frontier run applied, unless group_vars name another server_profile)."""
    inv = tmp_path_factory.mktemp("inventory")
    data = json.loads((site.inventory / "hosts.json").read_text())
    data["spark"].setdefault("vars", {}).update({
        "server_profile": "ctx131072-req1",
        "server_profiles": {"ctx131072-req1": {"context-length": 131072, "max-running-requests": 1}, **SPECULATIVE,
                            **(profiles or {})},
        **group_vars})
    (inv / "hosts.json").write_text(json.dumps(data))
    (inv / "group_vars").symlink_to((site.inventory / "group_vars").resolve())
    for extra in site.inventory.iterdir():
        if extra.name.startswith(".") and not (inv / extra.name).exists():
            (inv / extra.name).symlink_to(extra.resolve())
    return inv


def refused_before_any_change(site, inv, profiles) -> str:
    """The failure messages of a speculative tune of `profiles` that must change nothing: no task changed before
    the refusal, and no rank restarted."""
    before = [started(n) for n in site.nodes]
    result = run_playbook("playbooks/tune.yml", inv, extravars={**PINNED, "tune_speculative": profiles})
    assert result.rc != 0
    assert result.changed_before_first_failure() == []
    assert [started(n) for n in site.nodes] == before
    return result.failure_messages()


def test_a_speculative_profile_without_the_gb10_tile_is_refused_before_any_change(site, tmp_path_factory):
    message = refused_before_any_change(site, speculative_inventory(site, tmp_path_factory), ["mtp1"])
    assert "Refusing the speculative profiles tune_speculative names" in message, message
    assert "server_profiles['mtp1'] with server_flag_overrides: --speculative-algorithm EAGLE with " \
           "server_speculative_tile = false" in message, message


def test_a_speculative_profile_is_promoted_or_refused_by_measurement(site, tmp_path_factory):
    inv = speculative_inventory(site, tmp_path_factory, server_speculative_tile=True)
    out = tmp_path_factory.mktemp("speculative")
    for n in site.nodes:
        # The image carries the GB10 tile for the drafter's verify shapes (what server_speculative_tile declares),
        # and the checkpoint its next-token heads.
        sim.set_knobs(site.instance, n.name, {"sglang": {"tilelang_verify_tile": "gb10"}})
        sh(n, f"echo '{{\"num_nextn_predict_layers\": 1}}' > {MODEL_DIR}/config.json")
    result = run_playbook("playbooks/tune.yml", inv, timeout=1800, extravars={
        **PINNED, "tune_speculative": list(SPECULATIVE), "tune_apply": "mtp1", "tune_dir": str(out),
        "benchmark_max_tokens": 64, "benchmark_min_requests": 2, "benchmark_rounds": 1})
    assert result.rc == 0, result.failure_messages() or result.stdout[-5000:]
    report = json.loads(next(out.glob("tune-*-speculative.json")).read_text())
    rows = {r["name"]: r for r in report["profiles"]}
    assert report["base"]["metrics"] == {"sglang:spec_accept_length": 0.0, "sglang:spec_accept_rate": 0.0}
    assert rows["mtp1"]["accept_length"] == pytest.approx(1.6) and rows["mtp1"]["accept_rate"] == pytest.approx(0.6)
    assert rows["mtp8"]["accept_length"] == pytest.approx(2.4748, abs=1e-3)
    assert rows["mtp1"]["promoted"] is True and rows["mtp1"]["speedup"] > 1.05, rows["mtp1"]
    assert rows["mtp8"]["promoted"] is False and rows["mtp8"]["speedup"] < 1.0, rows["mtp8"]
    assert "below tune_speculative_min_speedup 1.05" in rows["mtp8"]["why"]
    assert report["promoted"] == ["mtp1"]
    # Each profile answered the verify questions at the running point (131072 x 1) with its own flags.
    for name in SPECULATIVE:
        verified = json.loads(next(out.glob(f"tune-*/verify-{name}.json")).read_text())
        assert verified["ok"] is True, verified["checks"]
    # The group ends on the promoted profile, exactly as measured, and serves.
    args = json.loads(sh(site.nodes[0], f"cat {ARGS}"))
    assert args[args.index("--speculative-algorithm") + 1] == "EAGLE"
    assert args[args.index("--speculative-num-steps") + 1] == "1"
    assert running(site.nodes[0]) == (131072, 1)
    assert generate(site)
    table = (next(out.glob("tune-*-speculative.md"))).read_text()
    assert "| base (what the group ran) |" in table and "| mtp8 |" in table


def test_a_group_left_on_another_drafter_is_refused_as_the_base(site, tmp_path_factory):
    # The group runs mtp1 (the last test applied it); this inventory deploys no drafter at the same point.
    inv = speculative_inventory(site, tmp_path_factory, server_speculative_tile=True)
    message = refused_before_any_change(site, inv, ["mtp8"])
    assert "spark-0 runs --speculative-algorithm EAGLE, the inventory deploys (unset)" in message, message
    assert "Fix: deploy the inventory first" in message


def test_tune_apply_of_a_profile_that_does_not_beat_the_base_is_refused_and_the_base_kept(site, tmp_path_factory):
    # The inventory now deploys what runs: mtp1 at 131072 x 1, the base mtp8 must beat on acceptance and speed.
    mtp1 = {"context-length": 131072, "max-running-requests": 1, **SPECULATIVE["mtp1"]}
    inv = speculative_inventory(site, tmp_path_factory, {"mtp1-131072": mtp1}, server_speculative_tile=True,
                                server_profile="mtp1-131072")
    out = tmp_path_factory.mktemp("speculative")
    result = run_playbook("playbooks/tune.yml", inv, timeout=1800, extravars={
        **PINNED, "tune_speculative": ["mtp8"], "tune_apply": "mtp8", "tune_dir": str(out),
        "benchmark_max_tokens": 64, "benchmark_min_requests": 2, "benchmark_rounds": 1})
    assert result.rc != 0
    assert {d["task"] for d in result.failed} == {"Refuse to apply a profile the figures did not promote"}
    message = result.failure_messages()
    assert "tune_apply = mtp8: not applied, not promoted:" in message, message
    report = json.loads(next(out.glob("tune-*-speculative.json")).read_text())
    assert report["base"]["metrics"]["sglang:spec_accept_length"] == pytest.approx(1.6)
    [row] = report["profiles"]
    assert row["accept_length"] > 1.6 and row["speedup"] < 1.0 and row["promoted"] is False, row
    # Back on the base, the inventory's mtp1, and serving.
    args = json.loads(sh(site.nodes[0], f"cat {ARGS}"))
    assert args[args.index("--speculative-num-steps") + 1] == "1"
    assert running(site.nodes[0]) == (131072, 1)
    assert generate(site)

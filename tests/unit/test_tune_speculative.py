"""The speculative tune's checks and verdict: a profile is promoted only by its figures against the base's.

The figures come from the SGLang stand-in's own model of speculative decoding (tests/standins/lib/sglang_server.py,
speculation()): the accept length and the decoding step's cost for each setting, so a verdict here is the one the
tune reaches on the simulated pair for the same settings.
"""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.lib.roles import filter_plugin, flag_model, flag_models

REPO = Path(__file__).resolve().parents[2]
TUNE = filter_plugin("tune")
MODEL = flag_model()
_spec = importlib.util.spec_from_file_location("spec_standin_server", REPO / "tests" / "standins" / "lib" / "sglang_server.py")
STANDIN = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(STANDIN)

PROFILES = {"mtp3": {"speculative-algorithm": "EAGLE", "speculative-num-steps": 3, "speculative-eagle-topk": 1,
                     "speculative-num-draft-tokens": 4},
            "ctx131072-req1": {"context-length": 131072, "max-running-requests": 1}}
TOKEN_SECONDS = 0.01


def measured(flags, acceptance=0.6):
    """The row the tune records for a profile, with the stand-in's figures: decode speed and its gauges."""
    args = SimpleNamespace(speculative_algorithm=flags.get("speculative-algorithm"),
                           speculative_num_steps=flags.get("speculative-num-steps"),
                           speculative_eagle_topk=flags.get("speculative-eagle-topk"),
                           speculative_num_draft_tokens=flags.get("speculative-num-draft-tokens"))
    spec = STANDIN.speculation(args, {**STANDIN.DEFAULTS, "speculative_acceptance": acceptance})
    factor = spec.time_factor if spec else 1.0
    metrics = {"sglang:spec_accept_length": round(spec.accept_length, 4) if spec else 0.0,
               "sglang:spec_accept_rate": round(spec.accept_rate, 4) if spec else 0.0}
    return {"started": True, "figures": {"decode_tok_s": round(1 / (TOKEN_SECONDS * factor), 1)}, "metrics": metrics}


BASE = measured({})


def verdict(row, min_speedup=1.05):
    return TUNE.tune_speculative_verdict(dict(row, name="p"), BASE, min_speedup, MODEL)


def test_a_light_drafter_that_is_accepted_is_promoted_with_both_figures():
    row = verdict(measured(PROFILES["mtp3"]))
    assert row["promoted"] is True
    assert row["accept_length"] == pytest.approx(2.176)
    assert row["accept_rate"] == pytest.approx(0.392)
    # 3 drafting steps at 0.25 and 4 verified tokens at 0.02 of a step: 1.83 steps' time for 2.176 tokens.
    assert row["speedup"] == pytest.approx(1.189, abs=0.002)
    assert row["why"].startswith("promoted: accept length 2.18")


def test_a_deep_chain_whose_drafting_costs_more_than_it_saves_is_not_promoted():
    deep = {"speculative-algorithm": "EAGLE", "speculative-num-steps": 6, "speculative-eagle-topk": 1,
            "speculative-num-draft-tokens": 7}
    row = verdict(measured(deep))
    assert row["accept_length"] > 1 and row["speedup"] < 1
    assert row["promoted"] is False
    assert "below tune_speculative_min_speedup 1.05" in row["why"]


def test_rejected_drafts_are_not_promoted_whatever_the_speed():
    row = verdict(dict(measured(PROFILES["mtp3"]), metrics={"sglang:spec_accept_length": 1.0}))
    assert row["promoted"] is False and "no better than the base's one token" in row["why"]
    assert verdict(dict(measured(PROFILES["mtp3"]), metrics={}))["promoted"] is False


def test_against_a_base_that_drafts_itself_the_acceptance_must_beat_its_own():
    mtp3 = measured(PROFILES["mtp3"])
    shallow = dict(measured({"speculative-algorithm": "EAGLE", "speculative-num-steps": 1}), name="mtp1")
    row = TUNE.tune_speculative_verdict(shallow, mtp3, 1.0, MODEL)
    assert row["promoted"] is False
    assert row["why"] == "not promoted: accept length 1.6 is no better than the base's accept length 2.176"


def test_a_speedup_under_the_threshold_is_not_promoted():
    assert verdict(measured(PROFILES["mtp3"]), min_speedup=1.2)["promoted"] is False
    assert verdict(measured(PROFILES["mtp3"]), min_speedup=1.15)["promoted"] is True
    assert verdict(measured(PROFILES["mtp3"], acceptance=0.2))["promoted"] is False


def test_a_profile_that_did_not_start_is_not_promoted_and_says_why():
    row = verdict({"started": False, "reason": "Capture draft cuda graph failed", "figures": None, "metrics": {}})
    assert row["promoted"] is False and row["why"] == "not promoted: Capture draft cuda graph failed"


def test_the_table_shows_the_base_and_each_profile_with_its_verdict():
    rows = [TUNE.tune_speculative_verdict(dict(measured(PROFILES["mtp3"]), name="mtp3"), BASE, 1.05, MODEL)]
    lines = TUNE.tune_speculative_table(rows, BASE, MODEL)
    assert lines[0].startswith("| profile | SGLang decode tok/s (1 stream) |")
    assert lines[2].startswith("| base (what the group ran) | 100.0 | 1.0 | - | - |")
    drafting = TUNE.tune_speculative_table([], measured(PROFILES["mtp3"]), MODEL)
    assert drafting[2].startswith("| base (what the group ran) | 118.9 | 1.0 | 2.176 | 0.392 |")
    assert lines[3].startswith("| mtp3 | 118.9 | 1.189 | 2.176 | 0.392 |") and "promoted" in lines[3]


def problems(names, **kw):
    return TUNE.tune_speculative_problems(names, PROFILES, MODEL, **kw)


def test_the_names_must_be_speculative_profiles_of_the_inventory():
    assert problems([]) == [] and problems(["mtp3"], min_speedup=1.05, apply="mtp3") == []
    [error] = problems(["mtp4"])
    assert "'mtp4' is not in server_profiles (ctx131072-req1, mtp3)" in error
    [error] = problems(["ctx131072-req1"])
    assert "sets no speculative-algorithm" in error
    assert "names a profile twice" in problems(["mtp3", "mtp3"])[0]
    assert "must be a list of profile names" in problems("mtp3")[0]


@pytest.mark.parametrize("value", [0.9, "fast", True])
def test_the_speedup_threshold_is_a_number_of_at_least_one(value):
    [error] = problems(["mtp3"], min_speedup=value)
    assert error.startswith("tune_speculative_min_speedup = ")


def test_tune_apply_may_name_only_a_profile_this_run_measures():
    [error] = problems(["mtp3"], min_speedup=1.05, apply="ctx131072-req1")
    assert "only a profile this run measures can be promoted" in error


def test_an_engine_without_a_speculative_model_is_refused():
    [error] = TUNE.tune_speculative_problems(["mtp3"], PROFILES, flag_models()["vllm"])
    assert "speculative decoding on vLLM is not modelled" in error


def slurped(args):
    return base64.b64encode(json.dumps(args).encode()).decode()


def test_a_group_running_another_drafter_than_the_inventorys_is_told_per_rank_and_flag():
    seed = ["--model-path", "/models/glm53", "--context-length", "131072"]
    mtp1 = [*seed, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1"]
    assert TUNE.tune_speculative_running({"spark-0": slurped(seed), "spark-1": slurped(seed)}, {}, MODEL) == []
    base = {"speculative-algorithm": "EAGLE", "speculative-num-steps": 1, "context-length": 131072}
    assert TUNE.tune_speculative_running({"spark-0": slurped(mtp1)}, base, MODEL) == []
    assert TUNE.tune_speculative_running({"spark-0": slurped(mtp1), "spark-1": slurped(seed)}, {}, MODEL) == [
        "spark-0 runs --speculative-algorithm EAGLE, the inventory deploys (unset)",
        "spark-0 runs --speculative-num-steps 1, the inventory deploys (unset)"]
    assert TUNE.tune_speculative_running({"spark-1": slurped(seed)}, base, MODEL) == [
        "spark-1 runs --speculative-algorithm (unset), the inventory deploys EAGLE",
        "spark-1 runs --speculative-num-steps (unset), the inventory deploys 1"]

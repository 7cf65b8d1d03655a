"""Speculative decoding as a profile: the guard rails the server plan holds before any change.

The profile names the flags by SGLang's launch_server names; what a wrong one does on a real pair (a drafter that
never runs, settings SGLang rewrites, the draft cuda graph capture failing without the GB10 tile, no next-token
heads in the checkpoint) is written out here rather than read from the flag model's own text.
"""

from __future__ import annotations

import base64
import json

import pytest

from tests.lib.roles import flag_models
from tests.lib.server_plan import FILTER, MODEL, ctx

MTP = {"speculative-algorithm": "EAGLE", "speculative-num-steps": 3, "speculative-eagle-topk": 1,
       "speculative-num-draft-tokens": 4}


def plan(flags, *, tile=True, config=None, **changes):
    c = ctx(server_profile="mtp", server_profiles={"mtp": flags}, server_speculative_tile=tile, **changes)
    if config is not None:
        c["model_config"] = {"content": base64.b64encode(json.dumps(config).encode()).decode()}
    return FILTER.server_plan(c, MODEL)


def only_error(flags, **kw):
    errors = plan(flags, **kw)["errors"]
    assert len(errors) == 1, errors
    return errors[0]


def test_a_next_token_heads_profile_renders_its_flags():
    result = plan(MTP, config={"num_attention_heads": 64, "num_nextn_predict_layers": 1})
    assert result["errors"] == []
    args = result["args"]
    for name, value in MTP.items():
        assert args[args.index("--" + name) + 1] == str(value)


def test_the_default_profile_has_no_speculative_flags_and_needs_no_tile():
    result = FILTER.server_plan(ctx(server_speculative_tile=False), MODEL)
    assert result["errors"] == []
    assert not [a for a in result["args"] if a.startswith("--speculative")]


def test_without_the_gb10_tile_in_the_image_the_profile_is_refused():
    error = only_error(MTP, tile=False)
    assert "server_profiles['mtp']" in error
    assert "server_speculative_tile = false" in error
    assert "block_I=32, num_stages=1, threads=128" in error
    assert "draft cuda graph" in error


def test_a_checkpoint_without_next_token_heads_is_refused_and_an_unread_one_is_judged_at_deploy():
    error = only_error(MTP, config={"num_attention_heads": 64})
    assert "has none (its config.json names no num_nextn_predict_layers)" in error
    error = only_error(MTP, config={"num_attention_heads": 64, "num_nextn_predict_layers": 0})
    assert "num_nextn_predict_layers = 0" in error
    # The inventory check runs before the download: no config.json to read, nothing to judge yet.
    assert plan(MTP)["errors"] == []


def test_settings_without_the_algorithm_shape_a_drafter_that_never_runs():
    error = only_error({"speculative-num-steps": 3})
    assert "without --speculative-algorithm" in error
    assert "EAGLE or NEXTN" in error


@pytest.mark.parametrize(("algorithm", "why"), [("EAGLE3", "separate EAGLE-3 model"),
                                                ("STANDALONE", "separate smaller model"),
                                                ("NGRAM", "n-grams")])
def test_algorithms_that_need_another_model_are_refused_with_their_reason(algorithm, why):
    error = only_error({"speculative-algorithm": algorithm})
    assert f"--speculative-algorithm {algorithm} is not offered" in error
    assert why in error


def test_an_unknown_algorithm_is_refused_by_its_exact_name():
    assert "'eagle' is not one of EAGLE, NEXTN" in only_error({"speculative-algorithm": "eagle"})


def test_a_separate_drafter_directory_is_refused():
    error = only_error({**MTP, "speculative-draft-model-path": "/srv/drafter"})
    assert "--speculative-draft-model-path /srv/drafter" in error
    assert "does not mount" in error


def test_draft_tokens_sglang_would_rewrite_are_refused():
    error = only_error({**MTP, "speculative-num-draft-tokens": 8})
    assert "--speculative-num-draft-tokens 8 with --speculative-eagle-topk 1 and --speculative-num-steps 3" in error
    assert "speculative-num-draft-tokens: 4" in error
    # Branching (topk above 1) verifies a tree: any count SGLang takes as given.
    assert plan({**MTP, "speculative-eagle-topk": 4, "speculative-num-draft-tokens": 8})["errors"] == []


@pytest.mark.parametrize("value", [0, "three", -1])
def test_settings_are_whole_numbers_of_at_least_one(value):
    assert "must be a whole number of at least 1" in only_error({**MTP, "speculative-num-steps": value})


def test_an_override_names_itself_and_an_engine_without_the_model_refuses():
    c = ctx(server_flag_overrides={"speculative-algorithm": "EAGLE"}, server_speculative_tile=False)
    [error] = FILTER.server_plan(c, MODEL)["errors"]
    assert error.startswith("server_flag_overrides: --speculative-algorithm EAGLE")
    vllm = flag_models()["vllm"]
    assert "speculative" not in vllm
    c = ctx(spark_engine="vllm", server_flag_overrides={"speculative-algorithm": "EAGLE"})
    assert any("not modelled by this version" in e for e in FILTER.server_plan(c, vllm)["errors"])

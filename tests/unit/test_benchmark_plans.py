"""The benchmark client's figures and prompts, the benchmark's and the tune's plans, and server profiles.

Pure functions only (no server): the client against the stand-in and the playbooks run in
tests/integration/test_benchmark.py and test_tune.py.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.lib.role_module import module_utils
from tests.lib.roles import filter_plugin, flag_models
from tests.lib.server_plan import FILTER, MODEL, ctx

CLIENT = module_utils("benchmark_client")
BENCH = filter_plugin("benchmark")
TUNE = filter_plugin("tune")
HYBRID = ("RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
          "max_mamba_cache_size=1, mamba_ratio=5, resulting max_num_reqs=0.")


# ---- the client's figures -----------------------------------------------------------------------


def record(ttft, itl, tokens, error=None, usage=True):
    chunks = [ttft + i * itl for i in range(tokens)]
    return {"ttft": ttft, "chunks": chunks, "error": error, "end": chunks[-1] if chunks else 0,
            "usage": {"completion_tokens": tokens, "prompt_tokens": 100} if usage and not error else None}


def test_percentiles_interpolate_between_ranks():
    assert CLIENT.percentile([], 50) is None
    assert CLIENT.percentile([3.0], 99) == 3.0
    assert CLIENT.percentile([1, 2, 3, 4], 50) == 2.5
    assert CLIENT.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)


def test_summary_counts_errors_by_kind_and_times_from_the_stream():
    records = [record(0.3, 0.04, 20), record(0.5, 0.04, 20), record(0.3, 0.04, 5, error="truncated"),
               {"error": "http_503", "chunks": [], "ttft": None, "usage": None},
               {"error": "cancelled", "chunks": [], "ttft": None}]
    s = CLIENT.summarize(records, wall=2.0)
    assert s["requests"] == 4 and s["ok"] == 2 and s["cancelled"] == 1
    assert s["errors"] == {"truncated": 1, "http_503": 1} and s["error_count"] == 2
    assert s["ttft_ms"]["p50"] == pytest.approx(300.0)
    assert s["itl_ms"]["p50"] == pytest.approx(40.0)
    assert s["decode_tok_s_per_stream"]["p50"] == pytest.approx(25.0)
    # 20 + 20 from usage, 5 deltas of the cut stream, over 2 s.
    assert s["output_tok_s"] == pytest.approx(22.5)
    assert s["requests_per_s"] == pytest.approx(1.0)
    assert s["tokens_from"] == "usage"


def test_without_usage_the_deltas_are_counted():
    s = CLIENT.summarize([record(0.1, 0.01, 10, usage=False)], wall=1.0)
    assert s["tokens_from"] == "deltas" and s["output_tokens"] == 10


def test_chunked_transfer_coding_is_decoded_whatever_the_reads():
    payload = b"data: {\"a\": 1}\n\n" * 3
    wire = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (payload[:5], payload[5:30], payload[30:])) + b"0\r\n\r\n"
    for step in (1, 2, 3, 7, len(wire)):
        d = CLIENT._Chunked()
        out = b"".join(d.feed(wire[i:i + step]) for i in range(0, len(wire), step))
        assert out == payload and d.finished, step


def test_prompts_have_the_calibrated_size_and_no_shared_prefix():
    cal = {"tokens_per_word": 1.0, "overhead": 8}
    a, b = CLIENT.level_prompt(500, cal, 1), CLIENT.level_prompt(500, cal, 2)
    assert abs(len(a.split()) + 8 - 500) <= 2
    assert a.split()[:3] != b.split()[:3]


def test_recall_facts_sit_at_their_depths_and_only_their_codes_count():
    cal = {"tokens_per_word": 1.0, "overhead": 8}
    text, facts = CLIENT.recall_prompt(6000, cal, [0.1, 0.5, 0.9], 7)
    words = text.split()
    for fact in facts:
        at = next(i for i in range(len(words)) if words[i] == fact["item"] and words[i + 2] == "is")
        assert abs(at / len(words) - fact["depth"]) < 0.02, fact
    assert text.rstrip().endswith("Answer with the numbers only.")
    found = CLIENT.recalled(facts, f"The codes are {facts[0]['code']} and {facts[2]['code']}0.")
    assert [f["recalled"] for f in found] == [True, False, False]
    # No filler word is a word of the facts or of the question, so nothing else can point at them.
    assert not {w for w in CLIENT.WORDS if len(w) >= 5} & {"passcode", "locker", *CLIENT.ITEMS}


# ---- the benchmark's input and plan -------------------------------------------------------------


SETTINGS = {"endpoint": "", "concurrency": "auto", "prompts": ["short", "medium", "long"], "short_tokens": 128,
            "medium_tokens": 2048, "long_fraction": 0.5, "max_tokens": 256, "rounds": 3, "min_requests": 6,
            "max_requests": 2000, "max_seconds": 1800, "stall_timeout": 120, "request_timeout": 900, "recall": True,
            "recall_fraction": 0.9, "recall_depths": [0.1, 0.5, 0.9], "recall_max_tokens": 1024, "context_length": 0,
            "max_running_requests": 0, "compare": ""}


@pytest.mark.parametrize(("value", "why"), [
    ([], "is empty"),
    ([1, 2, 2], "not strictly increasing"),
    ([4, 2], "not strictly increasing"),
    ([0, 1], "not a whole number from 1"),
    ("2", "must be auto or a list"),
])
def test_bad_concurrency_is_refused_with_the_fix(value, why):
    problems = BENCH.benchmark_problems({**SETTINGS, "concurrency": value})
    assert len(problems) == 1 and why in problems[0] and "Fix:" in problems[0], problems


def test_a_compare_file_must_be_a_benchmark_report(tmp_path):
    verify = tmp_path / "verify.json"
    verify.write_text(json.dumps({"kind": "spark-llm-verify", "ok": True}))
    good = tmp_path / "benchmark.json"
    good.write_text(json.dumps({"kind": "spark-llm-benchmark", "levels": [{"prompt": "short", "concurrency": 1}]}))
    (tmp_path / "text.json").write_text("not json")
    for path, why in ((verify, "is not a benchmark report (kind 'spark-llm-verify'"), (tmp_path / "text.json", "is not JSON"),
                      (tmp_path / "missing.json", "cannot be read")):
        problems = BENCH.benchmark_problems({**SETTINGS, "compare": str(path)})
        assert len(problems) == 1 and why in problems[0] and "benchmark_compare" in problems[0], problems
    assert BENCH.benchmark_problems({**SETTINGS, "compare": str(good)}) == []
    # A report written before 1.3.0, under the kind that named the engine, is still one.
    older = tmp_path / "older.json"
    older.write_text(json.dumps({"kind": "sglang-benchmark", "levels": [{"prompt": "short", "concurrency": 1}]}))
    assert BENCH.benchmark_problems({**SETTINGS, "compare": str(older)}) == []


def test_every_problem_is_reported_at_once():
    problems = BENCH.benchmark_problems({**SETTINGS, "concurrency": [], "prompts": ["huge"], "max_tokens": 0,
                                                "endpoint": "http://user:pw@spark-0:30000"})
    assert len(problems) == 4
    assert "pw" not in " ".join(problems)


@pytest.mark.parametrize(("limit", "levels"), [(1, [1, 2]), (2, [1, 2, 3]), (4, [1, 2, 4, 5]),
                                               (48, [1, 2, 4, 8, 16, 32, 48, 49])])
def test_auto_levels_go_one_step_beyond_max_running_requests(limit, levels):
    assert BENCH.auto_levels(limit) == levels


def slurped(args):
    import base64  # noqa: PLC0415

    return {"content": base64.b64encode(json.dumps(args).encode()).decode(), "source": "/etc/spark-llm/server-args.json"}


def test_the_plan_follows_what_the_head_runs_and_respects_the_request_cap():
    args = ["--model-path", "/models/glm53", "--context-length", "131072", "--max-running-requests", "4", "--trust-remote-code"]
    plan = BENCH.benchmark_cells({**SETTINGS, "max_requests": 40}, slurped(args), MODEL)
    assert plan["problems"] == [] and plan["context_length"] == 131072 and plan["levels"] == [1, 2, 4, 5]
    long = [c for c in plan["cells"] if c["prompt"] == "long"]
    assert long[0]["prompt_tokens"] == 131072 // 2 - 256
    assert sum(c["requests"] for c in plan["cells"]) == 40
    assert plan["cells"][-1].get("skipped", "").startswith("the total request cap")
    assert plan["recall"]["prompt_tokens"] == int(131072 * 0.9)


def test_in_front_of_several_heads_their_caps_add_up_and_the_smallest_context_holds():
    """The model gateway's endpoint: every group's head read, as benchmark_heads names them."""
    a = ["--model-path", "/models/glm53", "--context-length", "131072", "--max-running-requests", "2"]
    b = ["--model-path", "/models/glm53", "--context-length", "65536", "--max-running-requests", "2"]
    plan = BENCH.benchmark_cells(SETTINGS, [slurped(a), slurped(b)], MODEL)
    assert plan["problems"] == [] and (plan["max_running_requests"], plan["context_length"]) == (4, 65536)
    assert plan["levels"] == [1, 2, 4, 5]
    gone = {"failed": True, "msg": "file not found", "source": "/etc/spark-llm/server-args.json on spark-2"}
    refused = BENCH.benchmark_cells(SETTINGS, [slurped(a), gone], MODEL)["problems"]
    assert len(refused) == 1 and "/etc/spark-llm/server-args.json on spark-2 could not be read (file not found)" \
        in refused[0], refused


def test_on_vllm_the_plan_follows_max_num_seqs_and_max_model_len():
    vllm = flag_models()["vllm"]
    args = ["/models/glm53", "--tensor-parallel-size", "2", "--max-model-len", "32768", "--max-num-seqs", "4",
            "--host", "192.168.100.10"]
    plan = BENCH.benchmark_cells(SETTINGS, slurped(args), vllm)
    assert plan["problems"] == [] and plan["levels"] == [1, 2, 4, 5] and plan["context_length"] == 32768
    assert plan["flags"] == {"context": "max-model-len", "concurrency": "max-num-seqs"}
    assert next(c for c in plan["cells"] if c["prompt"] == "long")["prompt_tokens"] == 32768 // 2 - 256
    # SGLang's names in a vLLM group's arguments are not what it runs: unknown, refused naming vLLM's flags.
    sglang_args = ["--model-path", "/models/glm53", "--context-length", "65536", "--max-running-requests", "2"]
    refused = BENCH.benchmark_cells(SETTINGS, slurped(sglang_args), vllm)["problems"]
    assert len(refused) == 1 and "it names no --max-model-len or --max-num-seqs" in refused[0], refused
    assert "the server's max-model-len and max-num-seqs are unknown" in refused[0]
    small = BENCH.benchmark_cells({**SETTINGS, "context_length": 2048, "max_running_requests": 2}, None, vllm)
    assert any("does not fit the server's max-model-len 2048" in p for p in small["problems"]), small["problems"]


def test_an_unknown_server_or_a_prompt_that_does_not_fit_is_refused():
    plan = BENCH.benchmark_cells(SETTINGS, {"failed": True, "msg": "file not found", "source": "/etc/spark-llm/x"}, MODEL)
    assert "could not be read (file not found)" in plan["problems"][0]
    plan = BENCH.benchmark_cells({**SETTINGS, "context_length": 2048, "max_running_requests": 2}, None, MODEL)
    assert any("benchmark_medium_tokens" in p for p in plan["problems"]), plan["problems"]


# ---- the tune's search --------------------------------------------------------------------------


def search(budget, contexts, known=(), cap=64):
    trials = [dict(t) for t in known]
    asked = []
    while True:
        nxt = TUNE.tune_next(trials, contexts, cap)
        if nxt["done"]:
            return TUNE.tune_frontier(trials, contexts, cap), asked
        fits = nxt["context"] * nxt["requests"] <= budget
        asked.append((nxt["context"], nxt["requests"]))
        trials.append({"context": nxt["context"], "requests": nxt["requests"], "fits": fits})


def test_the_issue_budget_gives_the_frontier_in_nine_trials_from_the_seed():
    contexts = [65536, 131072, 262144, 524288, 1048576]
    frontier, asked = search(4 * 65536, contexts, known=[{"context": 65536, "requests": 2, "fits": True}])
    assert frontier == {65536: 4, 131072: 2, 262144: 1, 524288: 0, 1048576: 0}
    assert asked == [(65536, 4), (65536, 8), (65536, 6), (65536, 5), (131072, 2), (131072, 3), (262144, 1),
                     (262144, 2), (524288, 1)]


def test_the_integration_scenario_tries_each_kind_of_candidate_once():
    # The cap-3 variant of tests/integration/test_tune.py's case (which runs with cap 2, one restart fewer):
    # a failure above the running point, a fit, a failure above it, and a context that does not start;
    # four restarts, none repeated.
    frontier, asked = search(2 * 65536, [65536, 131072, 262144], known=[{"context": 65536, "requests": 2, "fits": True}],
                             cap=3)
    assert frontier == {65536: 2, 131072: 1, 262144: 0}
    assert asked == [(65536, 3), (131072, 1), (131072, 2), (262144, 1)]


@pytest.mark.parametrize("budget", [1, 65536, 3 * 65536 + 7, 7 * 65536, 40 * 131072, 64 * 1048576])
def test_the_search_finds_the_true_frontier_whatever_the_budget(budget):
    contexts = [65536, 131072, 262144, 524288, 1048576]
    frontier, asked = search(budget, contexts, cap=64)
    assert frontier == {c: min(64, budget // c) for c in contexts}
    assert len(asked) == len(set(asked)) <= 25


def test_results_name_one_profile_per_startable_point():
    trials = [{"context": 65536, "requests": 4, "fits": True, "seconds": 12.5}, {"context": 65536, "requests": 5,
                                                                                  "fits": False},
              {"context": 131072, "requests": 1, "fits": False}]
    rows = TUNE.tune_results(trials, [65536, 131072], 64)
    assert [(r["context"], r["max_requests"], r["profile"]) for r in rows] == [(65536, 4, "ctx65536-req4"),
                                                                               (131072, 0, None)]
    profiles = TUNE.tune_profiles(rows, {"mine": {"context-length": 32768}}, flag_models())
    assert profiles == {"mine": {"context-length": 32768},
                        "ctx65536-req4": {"context-length": 65536, "max-running-requests": 4}}
    assert "not startable" in "\n".join(TUNE.tune_table(rows, False))


def test_a_failure_counts_against_the_candidate_only_for_capacity_or_verify():
    journal = {"results": [{"stdout": f"[2026] TP0 Load weight end.\n{HYBRID}\n"}, {"stdout": "ok"}]}
    out = TUNE.tune_failure(journal, "Fail with a summary", "SGLang did not come up", MODEL)
    assert out["capacity"] and "hybrid" in out["reason"]
    out = TUNE.tune_failure({"results": []}, "Fail when a check failed", "Verification of http://x failed: reasoning", MODEL)
    assert out["capacity"] and "verify" in out["reason"]
    out = TUNE.tune_failure({"results": [{"stdout": "torch.distributed.DistNetworkError: timed out"}]},
                                   "Fail with a summary", "SGLang did not come up", MODEL)
    assert not out["capacity"] and "DistNetworkError" in out["reason"]


@pytest.mark.parametrize(("contexts", "why"), [
    ([], "non-empty list"),
    ([65536, 2097152], "above the model's window of 1048576"),
    ([131072, 65536], "not strictly increasing"),
    ([512], "below context-length's minimum"),
])
def test_bad_contexts_are_refused(contexts, why):
    problems = TUNE.tune_problems({"contexts": contexts, "max_requests": 64, "apply": ""}, MODEL)
    assert len(problems) == 1 and why in problems[0] and "Fix:" in problems[0], problems


def test_the_tune_varies_two_flags_on_top_of_the_inventorys_others():
    profiles = {"big": {"context-length": 131072, "max-running-requests": 2, "mem-fraction-static": 0.8}}
    assert TUNE.tune_base("big", profiles, {"log-level": "info"}, MODEL) == {"mem-fraction-static": 0.8, "log-level": "info"}
    assert TUNE.tune_effective("big", profiles, {}, MODEL) == [131072, 2]
    assert TUNE.tune_effective("default", profiles, {"max-running-requests": 3}, MODEL) == [65536, 3]


# ---- profiles in the server's plan --------------------------------------------------------------


def flags_of(plan):
    return dict(re.findall(r"--([a-z-]+) ([^-\s]\S*)", " ".join(plan["args"])))


def test_a_profile_sets_its_flags_through_the_same_guard_rails():
    profiles = {"ctx131072-req2": {"context-length": 131072, "max-running-requests": 2}}
    plan = FILTER.server_plan(ctx(server_profiles=profiles, server_profile="ctx131072-req2"), MODEL)
    assert plan["errors"] == []
    assert flags_of(plan)["context-length"] == "131072" and flags_of(plan)["max-running-requests"] == "2"
    seed = FILTER.server_plan(ctx(server_profiles=profiles), MODEL)
    assert flags_of(seed)["context-length"] == "65536" and flags_of(seed)["max-running-requests"] == "2"


@pytest.mark.parametrize(("changes", "expected"), [
    ({"server_profile": "nope"}, "server_profile = 'nope': no such profile. Fix: choose one of default, bad, p"),
    ({"server_profile": "p", "server_flag_overrides": {"context-length": 32768}},
     "two values for one flag"),
    ({"server_profile": "bad"},
     "server_profiles['bad']['context-length'] = 4194304: --context-length must be between"),
    ({"server_profiles": {"default": {}}}, "`default` is the built-in profile"),
])
def test_profile_mistakes_are_refused_naming_the_profile(changes, expected):
    profiles = {"p": {"context-length": 131072}, "bad": {"context-length": 4194304}}
    plan = FILTER.server_plan(ctx(**{"server_profiles": profiles, **changes}), MODEL)
    assert any(expected in e for e in plan["errors"]), plan["errors"]

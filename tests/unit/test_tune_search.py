"""The tune's search space, proven against a simulated engine: every case the nodes cannot afford.

tests/integration/test_tune.py runs one case on simulated nodes (each candidate is a real restart of
the group: a fit, a failure above a fit, a context that does not start, and the running point
counted without a restart). Here the role's own search code (roles/tune's filter plugin:
next candidate, failure reading, frontier, results, profiles, table) is driven the way
roles/tune/tasks/trial.yml drives it, over many budgets, context lists, caps and running
points, against an engine that answers as the stand-in SGLang server does: its own state cache
arithmetic (tests/standins/lib/sglang_server.py `state_slots`) decides whether a start fits, and a
start that does not fit leaves the stand-in's hybrid state cache error in the journal.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import io
import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.lib.roles import filter_plugin, flag_model, flag_models

REPO = Path(__file__).resolve().parents[2]
TUNE = filter_plugin("tune")
_spec = importlib.util.spec_from_file_location("tune_standin_server", REPO / "tests" / "standins" / "lib" / "sglang_server.py")
STANDIN = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(STANDIN)

MODEL = flag_model()
WINDOW = [65536, 131072, 262144, 524288, 1048576]


class Engine:
    """The stand-in's answer to a start of `context` x `requests`, for a state budget in request-tokens."""

    def __init__(self, budget: int):
        self.budget = budget
        self.starts: list[tuple[int, int]] = []

    def fits(self, context: int, requests: int) -> bool:
        _size, reqs = STANDIN.state_slots(SimpleNamespace(context_length=context), {"state_budget": self.budget})
        return requests <= reqs

    def journal(self, context: int) -> dict:
        """What the rescue's journalctl loop reads from the ranks after a start that does not fit."""
        size, reqs = STANDIN.state_slots(SimpleNamespace(context_length=context), {"state_budget": self.budget})
        line = "[2026-01-01 00:00:00 TP0] " + STANDIN.HYBRID_ERROR.format(size=size, ratio=STANDIN.MAMBA_RATIO, reqs=reqs)
        return {"results": [{"stdout": f"[2026-01-01 00:00:00 TP0] Load weight end.\n{line}\n"}, {"stdout": line}]}

    def trial(self, context: int, requests: int) -> dict:
        """One candidate as trial.yml records it: a fit with its start time, or the rescue's reading of the failure."""
        self.starts.append((context, requests))
        if self.fits(context, requests):
            return {"context": context, "requests": requests, "fits": True, "capacity": True,
                    "reason": "started and answered the verify questions", "seconds": 1.5 + len(self.starts),
                    "figures": {"ttft_ms_p50": 10, "itl_ms_p50": 5, "decode_tok_s": 100.0}}
        out = TUNE.tune_failure(self.journal(context), "Fail with a summary", "SGLang did not come up", MODEL)
        return {**out, "context": context, "requests": requests, "seconds": 0.5}


def tune(engine: Engine, contexts, cap, running=None, record=()):
    """main.yml and trial.yml: the running point counted as a fit without a start, then candidates until done.
    Returns (trials, progress lines' `left` figures)."""
    trials = [dict(t) for t in record]
    if running is not None and not trials:
        trials.append({"context": running[0], "requests": running[1], "fits": True, "capacity": True,
                       "reason": "the configuration the group ran before the tune, verified", "seconds": None,
                       "figures": {"ttft_ms_p50": 9, "itl_ms_p50": 4, "decode_tok_s": 120.0}})
    lefts = []
    for _ in range(200):
        nxt = TUNE.tune_next(trials, contexts, cap)
        if nxt["done"]:
            return trials, lefts
        assert nxt["lo"] < nxt["requests"] < nxt["hi"], nxt
        lefts.append(nxt["left"])
        outcome = engine.trial(nxt["context"], nxt["requests"])
        # Only capacity failures are the search's answer; anything else stops the tune (trial.yml).
        assert outcome["capacity"], outcome
        trials.append(outcome)
    raise AssertionError("the search did not end")


def truth(budget, contexts, cap):
    return {c: min(cap, budget // c) for c in contexts}


def check(budget, contexts, cap, running=None):
    """Everything tests/integration/test_tune.py asserts of its one case, for this case."""
    engine = Engine(budget)
    trials, lefts = tune(engine, contexts, cap, running)
    want = truth(budget, contexts, cap)
    frontier = TUNE.tune_frontier(trials, contexts, cap)
    assert frontier == want, (budget, contexts, cap, running, trials)

    # Every trial is one real candidate: none repeated, none the budget contradicts, the running one not started.
    tried = [(t["context"], t["requests"]) for t in trials]
    assert len(tried) == len(set(tried)), tried
    assert all(t["fits"] == engine.fits(t["context"], t["requests"]) for t in trials), trials
    assert engine.starts == (tried[1:] if running is not None else tried), (engine.starts, tried)
    failed = [t for t in trials if not t["fits"]]
    assert all("hybrid (mamba/linear-attention) state cache" in t["reason"] for t in failed), failed
    # A bounded search: a doubling and a bisection per context at most, in practice far fewer.
    assert len(engine.starts) <= len(contexts) * 2 * max(1, cap.bit_length()), (len(engine.starts), tried)

    # Both sides of each frontier are proven by a trial (itself, or one that implies it): a fit at the
    # frontier at this context or a longer one, a failure one above it at this context or a shorter one.
    for c, n in frontier.items():
        if n:
            assert any(t["fits"] and t["context"] >= c and t["requests"] >= n for t in trials), (c, n, trials)
        if n < cap:
            assert any(not t["fits"] and t["context"] <= c and t["requests"] <= n + 1 for t in trials), (c, n, trials)

    # The progress estimate counts down to the last candidate: never 0 while one is still to come.
    assert all(left >= 1 for left in lefts), lefts

    # The results, the profiles file's entries and the table.
    rows = TUNE.tune_results(trials, contexts, cap)
    assert [(r["context"], r["max_requests"]) for r in rows] == list(frontier.items())
    assert [r["startable"] for r in rows] == [n > 0 for n in frontier.values()]
    for r in rows:
        proof = next((t for t in trials if t["fits"] and t["context"] == r["context"] and t["requests"] == r["max_requests"]),
                     None)
        assert r["start_seconds"] == (proof["seconds"] if proof else None), (r, proof)
        assert r["figures"] == (proof["figures"] if proof else None), (r, proof)
        assert r["proved_by"] == ("a trial" if proof else "implied by other trials"), r
    if running is not None:
        row = next(r for r in rows if r["context"] == running[0])
        if row["max_requests"] == running[1]:
            assert row["start_seconds"] is None and row["figures"]["decode_tok_s"] == 120.0, row
    profiles = TUNE.tune_profiles(rows, {"mine": {"context-length": 32768}}, flag_models())
    assert profiles == {"mine": {"context-length": 32768}, **{
        f"ctx{c}-req{n}": {"context-length": c, "max-running-requests": n} for c, n in frontier.items() if n}}
    table = TUNE.tune_table(rows, True)
    for c, n in frontier.items():
        assert sum(line.startswith(f"| {c} | {'not startable' if n == 0 else n} |") for line in table) == 1, table

    # A second run resumes from the record: no candidate is started again, the frontier is the same.
    again = Engine(budget)
    resumed, _ = tune(again, contexts, cap, running, record=trials)
    assert again.starts == [] and resumed == trials
    return trials


# The integration case with a cap at the running point: every kind of trial once, in three restarts.
def test_a_cap_at_the_running_point_tries_a_fit_a_failure_above_it_and_a_context_that_does_not_start():
    trials = check(2 * 65536, [65536, 131072, 262144], 2, running=(65536, 2))
    assert [(t["context"], t["requests"], t["fits"]) for t in trials] == [
        (65536, 2, True), (131072, 1, True), (131072, 2, False), (262144, 1, False)]


# The case tests/integration/test_tune.py runs (a cap above the running point): a failure right above it too.
def test_a_cap_above_the_running_point_tries_the_failure_above_it_first():
    trials = check(2 * 65536, [65536, 131072, 262144], 3, running=(65536, 2))
    assert [(t["context"], t["requests"], t["fits"]) for t in trials] == [
        (65536, 2, True), (65536, 3, False), (131072, 1, True), (131072, 2, False), (262144, 1, False)]


BUDGETS = [1, 65535, 65536, 2 * 65536, 2 * 65536 + 1, 3 * 65536 + 7, 5 * 65536, 7 * 65536, 12 * 65536, 40 * 131072,
           63 * 65536, 64 * 65536, 64 * 1048576, 100 * 1048576]
CONTEXT_LISTS = [[65536], [131072], [65536, 131072], [65536, 262144], [65536, 131072, 262144], [131072, 524288],
                 [65536, 98304, 131072, 196608], WINDOW]
CAPS = [1, 2, 3, 5, 8, 48, 64]


@pytest.mark.parametrize("contexts", CONTEXT_LISTS, ids=lambda c: "-".join(str(x // 1024) for x in c))
@pytest.mark.parametrize("cap", CAPS)
def test_the_search_finds_the_true_frontier_from_nothing(contexts, cap):
    for budget in BUDGETS:
        check(budget, contexts, cap)


@pytest.mark.parametrize("contexts", CONTEXT_LISTS, ids=lambda c: "-".join(str(x // 1024) for x in c))
@pytest.mark.parametrize("cap", CAPS)
def test_the_search_finds_the_true_frontier_from_a_running_point_that_serves(contexts, cap):
    """The tune starts on what the group runs: a point that fits, counted without a restart."""
    for budget in BUDGETS:
        c = contexts[0]
        for n in sorted({1, 2, cap, budget // c} - {0}):
            if n <= min(cap, budget // c):
                check(budget, contexts, cap, running=(c, n))


def test_every_cap_and_budget_on_the_seeds_contexts():
    """Exhaustive over small figures: every budget from 0 to 9 request-slots of the shortest context, every cap to 9."""
    contexts = [65536, 131072, 262144]
    for slots, cap in itertools.product(range(10), range(1, 10)):
        check(slots * 65536, contexts, cap)
        if 1 <= min(slots, cap):
            check(slots * 65536, contexts, cap, running=(65536, min(slots, cap)))


def test_a_record_under_the_same_settings_resumes_midway():
    """An interrupted tune resumes from however many trials it recorded, and asks only what is still unknown."""
    contexts, cap, budget = WINDOW, 64, 3 * 65536 + 7
    full = check(budget, contexts, cap, running=(65536, 2))
    for cut in range(1, len(full)):
        engine = Engine(budget)
        trials, _ = tune(engine, contexts, cap, running=(65536, 2), record=full[:cut])
        assert [(t["context"], t["requests"]) for t in trials[:cut]] == [(t["context"], t["requests"]) for t in full[:cut]]
        assert engine.starts == [(t["context"], t["requests"]) for t in full[cut:]]
        assert TUNE.tune_frontier(trials, contexts, cap) == truth(budget, contexts, cap)



# ---- vLLM: its two flags, its stand-in's KV cache, its failures ----------------------------------

VLLM = flag_model("vllm")
_vllm_spec = importlib.util.spec_from_file_location("tune_standin_vllm", REPO / "tests" / "standins" / "lib" / "vllm_server.py")
VLLM_STANDIN = importlib.util.module_from_spec(_vllm_spec)
_vllm_spec.loader.exec_module(VLLM_STANDIN)


class VllmEngine:
    """The vLLM stand-in's start of max-model-len x max-num-seqs at the flag model's gpu-memory-utilization: its own
    KV cache arithmetic and its own failure, as the rescue's journalctl loop reads them."""

    def __init__(self, **knobs):
        self.knobs = {**VLLM_STANDIN.DEFAULTS, **knobs}
        self.share = next(f["default"] for f in VLLM["flags"] if f["name"] == "gpu-memory-utilization")
        self.starts: list[tuple[int, int]] = []

    def start(self, context: int, requests: int) -> str | None:
        """None when the engine core starts, else the journal of the failed start."""
        args = SimpleNamespace(gpu_memory_utilization=self.share, max_num_seqs=requests, max_model_len=context)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                VLLM_STANDIN.kv_cache(args, self.knobs)
        except SystemExit:
            return out.getvalue()
        return None

    def trial(self, context: int, requests: int) -> dict:
        self.starts.append((context, requests))
        journal = self.start(context, requests)
        if journal is None:
            return {"context": context, "requests": requests, "fits": True, "capacity": True, "seconds": 2.0}
        out = TUNE.tune_failure({"results": [{"stdout": journal}, {"stdout": ""}]}, "Fail with a summary",
                                "vLLM did not come up", VLLM)
        return {**out, "context": context, "requests": requests, "seconds": 0.5}


@pytest.mark.parametrize("knobs", [{}, {"state_gib_per_seq": 2.0}, {"kv_mib_per_token": 0.03}, {"weights_gib": 99.0}])
def test_vllm_s_frontier_is_found_against_its_stand_in_s_kv_cache(knobs):
    contexts, cap = [32768, 65536, 131072, 262144], 16
    engine = VllmEngine(**knobs)
    # What every start would answer: a start fits while its max-model-len fits the KV cache the others leave.
    want = {c: max([n for n in range(1, cap + 1) if engine.start(c, n) is None], default=0) for c in contexts}
    trials = [{"context": 65536, "requests": 2, "fits": engine.start(65536, 2) is None, "capacity": True}]
    for _ in range(100):
        nxt = TUNE.tune_next(trials, contexts, cap)
        if nxt["done"]:
            break
        outcome = engine.trial(nxt["context"], nxt["requests"])
        assert outcome["capacity"], outcome
        trials.append(outcome)
    assert TUNE.tune_frontier(trials, contexts, cap) == want, trials
    failed = [t for t in trials[1:] if not t["fits"]]
    assert failed and all(t["reason"].startswith(("the KV cache does not hold max-model-len tokens: ValueError",
                                                  "no memory is left for the KV cache: ValueError")) for t in failed)
    assert len(engine.starts) == len(set(engine.starts))


def test_the_default_vllm_point_is_where_the_seed_runs():
    # The stand-in's documented figures (tests/standins/README.md): at 0.84, 2 x 64k and 4 x 64k fit, 8 x 64k and
    # 1 x 128k do not - the search's answer under the seed's flags.
    engine = VllmEngine()
    assert [engine.start(65536, n) is None for n in (2, 4, 8)] == [True, True, False]
    assert engine.start(131072, 1) is not None


def test_vllm_s_free_memory_check_stops_the_tune_with_its_fix():
    # The check is against gpu-memory-utilization alone, which the tune keeps: every candidate would fail it, so
    # it is no frontier - the tune stops (trial.yml) and says what to do.
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        VLLM_STANDIN.free_memory_check(SimpleNamespace(gpu_memory_utilization=0.84), {"os_reserved_gib": 30.0}, 1)
    journal = {"results": [{"stdout": ""}, {"stdout": out.getvalue()}]}
    outcome = TUNE.tune_failure(journal, "Fail with a summary", "vLLM did not come up", VLLM)
    assert outcome["capacity"] is False, outcome
    for fragment in ("vLLM's free-memory check", "whatever the context and concurrency",
                     "ValueError: Free memory on device (89.70/119.70 GiB)", "Fix: free the GPU"):
        assert fragment in outcome["reason"], outcome["reason"]
    # SGLang's model knows no such check: the same line is another failure there, and stops the tune too.
    assert TUNE.tune_failure(journal, "Fail with a summary", "x", MODEL)["capacity"] is False


def test_later_vllm_s_wording_of_the_kv_cache_check_is_read_too():
    line = ("ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (10.60 GiB).")
    outcome = TUNE.tune_failure({"results": [{"stdout": line}]}, "Fail with a summary", "vLLM did not come up", VLLM)
    assert outcome["capacity"] and outcome["reason"].startswith("the KV cache does not hold max-model-len tokens")
    # SGLang's hybrid state cache line is no vLLM failure: not this engine's capacity answer.
    hybrid = Engine(65536).journal(131072)
    assert TUNE.tune_failure(hybrid, "Fail with a summary", "x", VLLM)["capacity"] is False


def test_a_vllm_candidate_sets_vllm_s_flags_and_the_inventory_s_others():
    profiles = {"p": {"context-length": 131072, "max-num-seqs": 2, "gpu-memory-utilization": 0.8}}
    base = TUNE.tune_base("p", profiles, {"enforce-eager": True, "max-model-len": 131072}, VLLM)
    assert base == {"gpu-memory-utilization": 0.8, "enforce-eager": True}
    assert TUNE.tune_effective("p", profiles, {"max-model-len": 131072}, VLLM) == [131072, 2]
    assert TUNE.tune_effective("default", {}, {}, VLLM) == [65536, 2]
    assert TUNE.tune_candidate(base, 65536, 3, VLLM) == {"gpu-memory-utilization": 0.8, "enforce-eager": True,
                                                         "max-model-len": 65536, "max-num-seqs": 3}
    assert TUNE.tune_candidate({}, 65536, 3, MODEL) == {"context-length": 65536, "max-running-requests": 3}
    assert TUNE.tune_flags(VLLM) == {"context": "max-model-len", "concurrency": "max-num-seqs"}


def test_the_running_point_is_read_by_the_engine_s_flags():
    def slurped(args):
        return base64.b64encode(json.dumps(args).encode()).decode()

    vllm_args = ["/models/glm53", "--tensor-parallel-size", "2", "--max-model-len", "131072", "--max-num-seqs", "3",
                 "--headless"]
    assert TUNE.tune_args_point(slurped(vllm_args), VLLM) == [131072, 3]
    # A group still on SGLang's flags does not run what a vLLM inventory deploys: unknown, and refused by main.yml.
    sglang_args = ["--model-path", "/models/glm53", "--context-length", "65536", "--max-running-requests", "2"]
    assert TUNE.tune_args_point(slurped(sglang_args), VLLM) == [None, None]
    assert TUNE.tune_args_point(slurped(sglang_args), MODEL) == [65536, 2]
    assert TUNE.tune_args_point("", VLLM) == [None, None]


def test_a_window_or_cap_problem_names_vllm_s_flags():
    problems = TUNE.tune_problems({"contexts": [65536, 2097152], "max_requests": 65, "apply": ""}, VLLM)
    assert len(problems) == 2, problems
    assert "the flag model's max-model-len maximum): vLLM would refuse the start" in problems[0]
    assert "the most max-num-seqs to try" in problems[1] and "Fix:" in problems[1]
    assert TUNE.tune_problems({"contexts": [65536], "max_requests": 4, "apply": ""}, VLLM) == []


def test_the_profiles_file_deploys_on_either_engine():
    from tests.lib.server_plan import FILTER, ctx  # noqa: PLC0415 - the server plan, only for this check

    rows = TUNE.tune_results([{"context": 65536, "requests": 5, "fits": True}, {"context": 65536, "requests": 6,
                                                                              "fits": False}], [65536], 64)
    profiles = TUNE.tune_profiles(rows, {}, flag_models())
    assert profiles == {"ctx65536-req5": {"context-length": 65536, "max-running-requests": 5}}
    for engine, flags in (("sglang", ("--context-length", "--max-running-requests")),
                          ("vllm", ("--max-model-len", "--max-num-seqs"))):
        plan = FILTER.server_plan(ctx(spark_engine=engine, server_render_only=True, server_profiles=profiles,
                                      server_profile="ctx65536-req5"), flag_model(engine))
        assert plan["errors"] == [], (engine, plan["errors"])
        args = plan["args"]
        assert [args[args.index(f) + 1] for f in flags] == ["65536", "5"], (engine, args)


def test_a_flag_model_without_a_shared_name_for_a_capacity_flag_is_a_defect_named():
    models = flag_models()
    renamed = {**models["vllm"], "flags": [{**f, "aliases": []} if f.get("capacity") == "concurrency" else f
                                           for f in models["vllm"]["flags"]]}
    with pytest.raises(ValueError, match="no name of the concurrency flag is known to every engine's flag model"):
        TUNE.tune_profile_keys({**models, "vllm": renamed})


def test_a_record_made_under_another_build_of_the_image_is_not_resumed():
    """The derived image's context pins are part of the record's ID; a site without a build keeps its old ID."""
    base_id = TUNE.tune_base_id
    flags = {"context-length": 65536}
    without = base_id(flags, "vllm/vllm-openai:glm51-cu130", "")
    assert base_id(flags, "vllm/vllm-openai:glm51-cu130", "", {}) == without
    one = base_id(flags, "vllm/vllm-openai:glm51-cu130", "", {"Dockerfile": "a" * 64})
    other = base_id(flags, "vllm/vllm-openai:glm51-cu130", "", {"Dockerfile": "b" * 64})
    assert len({without, one, other}) == 3

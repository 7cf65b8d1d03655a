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

import importlib.util
import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.lib.roles import filter_plugin

REPO = Path(__file__).resolve().parents[2]
TUNE = filter_plugin("tune")
_spec = importlib.util.spec_from_file_location("tune_standin_server", REPO / "tests" / "standins" / "lib" / "sglang_server.py")
STANDIN = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(STANDIN)

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
        out = TUNE.tune_failure(self.journal(context), "Fail with a summary", "SGLang did not come up")
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
    profiles = TUNE.tune_profiles(rows, {"mine": {"context-length": 32768}})
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


"""What the benchmark measures for which engine (benchmarks/run.py's plan), and the restart figure's watch
(benchmarks/restart.py): pure logic, no node. No time is asserted."""

from __future__ import annotations

import pytest

from benchmarks.nodes import BenchError
from benchmarks.restart import Watch
from benchmarks.run import measurement_plan


def test_both_engines_measure_the_server_figures_each_and_the_others_once_first():
    assert measurement_plan(None, "both") == [
        ("sglang", "sync"), ("sglang", "verify"), ("sglang", "fetch"), ("sglang", "floor"),
        ("sglang", "nochange"), ("sglang", "restart"), ("sglang", "recovery"),
        ("vllm", "nochange"), ("vllm", "restart"), ("vllm", "recovery")]


def test_one_engine_and_only_keep_the_canonical_order():
    # Recovery turns the supervisor on: it stays after restart whatever order --only names them in.
    assert measurement_plan(["recovery", "restart"], "vllm") == [("vllm", "restart"), ("vllm", "recovery")]
    assert measurement_plan(["recovery", "sync"], "vllm") == [("vllm", "sync"), ("vllm", "recovery")]


def test_an_engine_no_chosen_figure_needs_is_never_deployed():
    assert measurement_plan(["sync", "verify"], "both") == [("sglang", "sync"), ("sglang", "verify")]


class Answers:
    """A probe that answers as told, then as its last answer for ever; counts its calls."""

    def __init__(self, *seen):
        self.seen, self.calls = seen, 0

    def __call__(self):
        self.calls += 1
        return self.seen[min(self.calls, len(self.seen)) - 1]


def test_the_watch_takes_the_first_answer_after_a_failed_one():
    probe = Answers(True, True, False, False, True, True)
    watch = Watch(probe).start()
    assert watch.result("restart") > 0
    # The group before its stop (the first two answers) is not the group serving again.
    assert watch.missed and probe.calls == 5


def test_a_watch_that_never_saw_the_head_stop_gives_no_figure():
    watch = Watch(Answers(True)).start()
    watch.cancel()
    with pytest.raises(BenchError, match="never stopped answering"):
        watch.result("restart")

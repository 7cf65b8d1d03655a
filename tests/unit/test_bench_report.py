"""Pure helpers of benchmarks/report.py: medians, paired ratios, verdicts, the table.

No timing is asserted here: the benchmarks themselves run with scripts/bench, never in the tests.
"""

from __future__ import annotations

from benchmarks.report import Figure, markdown_table, median, paired_ratio, verdict


def test_median_ignores_missing_samples():
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0]) == 2.5
    assert median([None, None]) is None
    assert median([]) is None


def test_paired_ratio_is_the_median_of_per_round_ratios():
    # Round 2 ran under heavy load on both sides: its ratio is still 0.5 and a ratio of medians
    # (2/3 = 0.67) would not be.
    assert paired_ratio([1.0, 10.0, 1.0], [2.0, 20.0, 2.0]) == 0.5
    assert paired_ratio([1.0, None, 3.0], [2.0, 5.0, 3.0]) == 0.75
    assert paired_ratio([None], [1.0]) is None
    assert paired_ratio([1.0], [0.0]) is None


def test_verdict_operators_and_missing_value():
    assert verdict(0.5, "<=", 0.5) == "pass"
    assert verdict(0.51, "<=", 0.5) == "fail"
    assert verdict(0.99, "<", 1.0) == "pass"
    assert verdict(2.0, ">=", 2.0) == "pass"
    assert verdict(1.9, ">", 2.0) == "fail"
    assert verdict(None, ">=", 0.0) == "fail"


def figure(**kw) -> Figure:
    base = {"key": "k", "name": "sync", "unit": "MiB/s", "measured": [300.0, 310.0, 290.0],
            "baseline_name": "cp -a", "baseline": [330.0, 340.0, 320.0], "target_op": ">=", "target": 0.8}
    return Figure(**{**base, **kw})


def test_figure_judged_on_ratio_or_on_measured_value_and_conditions():
    assert figure().result == "pass"
    assert figure(target=0.95).result == "fail"
    fast = figure(unit="s", measured=[0.3, 0.4, 1.5], baseline=[4.0, 4.0, 4.0], target_op="<", target=1.0,
                  judged_on="measured")
    assert fast.result == "pass"
    cond = figure()
    cond.conditions["0 changed tasks on nodes"] = False
    assert cond.result == "fail"
    assert figure(measured=[None, None, None]).result == "fail"


def test_to_dict_carries_samples_medians_and_result():
    d = figure().to_dict()
    assert d["measured"] == [300.0, 310.0, 290.0]
    assert d["measured_median"] == 300.0 and d["baseline_median"] == 330.0
    assert d["result"] == "pass"
    assert round(d["ratio"], 4) == round(300 / 330, 4)


def test_markdown_table_rows_and_machine_line():
    machine = {"cores": 2, "cpu": "AMD EPYC", "memory_gib": 23.5, "kernel": "6.18.44",
               "load_before": [4.5, 4.2, 4.0], "load_after": [3.1, 3.9, 4.1]}
    fast = figure(name="fast verify", unit="s", measured=[0.27], baseline_name="deep verify", baseline=[4.1],
                  target_op="<", target=1.0, judged_on="measured", target_text="< 1 s", notes=["a note"])
    text = markdown_table([figure(), fast], machine, runs=3, smoke=False)
    lines = text.splitlines()
    assert lines[0].startswith("Median of 3 runs. Machine: 2 cores (AMD EPYC); 23.5 GiB memory; kernel 6.18.44")
    assert "before 4.50/4.20/4.00, after 3.10/3.90/4.10" in lines[0]
    assert lines[2] == "| figure | engine | measured | baseline | ratio | target | result |"
    assert lines[4] == "| sync | any | 300 MiB/s | cp -a: 330 MiB/s | 0.91x | >= 0.8x | pass |"
    assert lines[5] == "| fast verify | any | 0.270 s | deep verify: 4.1 s | 0.07x | < 1 s | pass |"
    assert "- fast verify: a note" in lines
    assert "smoke" in markdown_table([], machine, runs=1, smoke=True).splitlines()[0]


def test_markdown_table_labels_each_row_with_its_engine():
    machine = {"cores": 2}
    rows = [figure(name="fault to serving again: head rank SIGKILL", unit="s", engine=engine, notes=["watch 2 s"])
            for engine in ("sglang", "vllm")]
    lines = markdown_table(rows, machine, runs=1, smoke=False).splitlines()
    assert lines[4].startswith("| fault to serving again: head rank SIGKILL | sglang | ")
    assert lines[5].startswith("| fault to serving again: head rank SIGKILL | vllm | ")
    assert "- fault to serving again: head rank SIGKILL (vllm): watch 2 s" in lines
    assert figure(engine="vllm").to_dict()["engine"] == "vllm"

"""The verify role's plan (plugins/filter/verify.py): the corruption gate's settings refused before any change, each
refusal naming the variable, the value, why and the fix; the role's defaults pass."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from tests.lib.roles import filter_plugin

REPO = Path(__file__).resolve().parents[2]
verify = filter_plugin("verify")
DEFAULTS = {k: v for k, v in yaml.safe_load((REPO / "roles/verify/defaults/main.yml").read_text()).items()
            if k in yaml.safe_load((REPO / "roles/verify/vars/main.yml").read_text())["__verify_ctx"]}


def errors(**changes):
    return verify.verify_plan({**DEFAULTS, **changes})["errors"]


def test_the_defaults_pass_and_the_gate_can_be_off():
    assert len(DEFAULTS) == 15
    assert errors() == []
    assert errors(verify_gate_rounds=0, verify_max_fffd_rate="0.01", verify_max_bad_tool_call_rate=1) == []


@pytest.mark.parametrize(("name", "value", "says"), [
    ("verify_max_fffd_rate", 2, "verify_max_fffd_rate = 2: must be a share from 0 to 1"),
    ("verify_max_fffd_rate", "1%", "verify_max_fffd_rate = '1%': must be a share from 0 to 1"),
    ("verify_max_bad_tool_call_rate", -0.1, "verify_max_bad_tool_call_rate = -0.1: must be a share"),
    ("verify_max_bad_tool_call_rate", True, "verify_max_bad_tool_call_rate = true: must be a share"),
    ("verify_gate_rounds", -1, "verify_gate_rounds = -1: must be a whole number from 0"),
    ("verify_gate_rounds", 1.5, "verify_gate_rounds = 1.5: must be a whole number from 0"),
    ("verify_quality_rounds", 0, "verify_quality_rounds = 0: must be a whole number from 1"),
    ("verify_gate_max_tokens", 0, "verify_gate_max_tokens = 0: must be a whole number from 1 (a token budget)"),
    ("verify_report_prefix", "../x", "verify_report_prefix = '../x': must be letters, digits"),
    ("verify_soak_seconds", -5, "verify_soak_seconds = -5: must be a number of seconds, 0 for no soak"),
    ("verify_soak_burst_seconds", 0, "verify_soak_burst_seconds = 0: must be a number above 0"),
    ("verify_soak_idle_seconds", "soon", "verify_soak_idle_seconds = 'soon': must be a number, 0 or more"),
    ("verify_soak_concurrency", 0, "verify_soak_concurrency = 0: must be a whole number from 1"),
    ("verify_soak_max_error_rate", 1.5, "verify_soak_max_error_rate = 1.5: must be a share from 0 to 1"),
    ("verify_soak_max_latency_drift", 0, "verify_soak_max_latency_drift = 0: must be a number above 0"),
    ("verify_soak_max_memory_growth_gib", -1, "verify_soak_max_memory_growth_gib = -1: must be a number, 0 or more"),
])
def test_a_bad_value_is_refused_with_the_fix(name, value, says):
    (error,) = errors(**{name: value})
    assert error.startswith(says), error
    assert f"Fix: e.g. {name}: " in error


SOAK = {"bursts": [{}, {}, {}], "requests": 40, "errors": 0, "error_rate": 0.0, "latency_drift": 1.1,
        "first_latency_p50_ms": 100.0, "last_latency_p50_ms": 110.0}
LIMITS = {"max_error_rate": 0.0, "max_latency_drift": 1.5, "max_memory_growth_gib": 2.0}


def test_a_steady_soak_crosses_nothing():
    assert verify.verify_soak_failures(SOAK, {"spark-0": 0.1, "spark-1": None}, LIMITS) == []


def test_each_crossed_threshold_is_named_with_its_figure_and_variable():
    soak = {**SOAK, "errors": 4, "error_rate": 0.1, "latency_drift": 2.5, "last_latency_p50_ms": 250.0}
    failed = verify.verify_soak_failures(soak, {"spark-0": 0.5, "spark-1": 3.25}, LIMITS)
    assert failed == [
        "4 of 40 requests failed, rate 0.1 above verify_soak_max_error_rate 0",
        "the latency p50 went from 100.0 to 250.0 ms, drift 2.5 above verify_soak_max_latency_drift 1.5",
        "spark-1 lost 3.25 GiB of available memory, above verify_soak_max_memory_growth_gib 2",
    ]
    assert verify.verify_soak_failures({**SOAK, "requests": 0, "error_rate": None}, {}, LIMITS) == [
        "no request was sent (verify_soak_seconds, verify_soak_burst_seconds)"]


def test_memory_growth_is_read_from_both_slurps_of_meminfo():
    def slurp(kib):
        return {"content": base64.b64encode(f"MemTotal: 999 kB\nMemAvailable:   {kib} kB\n".encode()).decode()}

    hostvars = {"spark-0": {"__verify_memory_before": slurp(10 * 1024 * 1024),
                            "__verify_memory_after": slurp(8 * 1024 * 1024)},
                "spark-1": {"__verify_memory_before": slurp(1024)}}
    assert verify.verify_memory_growth(["spark-0", "spark-1"], hostvars) == {"spark-0": 2.0, "spark-1": None}

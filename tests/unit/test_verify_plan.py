"""The verify role's plan (plugins/filter/verify.py): the corruption gate's settings refused before any change, each
refusal naming the variable, the value, why and the fix; the role's defaults pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.lib.roles import filter_plugin

REPO = Path(__file__).resolve().parents[2]
verify = filter_plugin("verify")
DEFAULTS = {k: v for k, v in yaml.safe_load((REPO / "roles/verify/defaults/main.yml").read_text()).items()
            if k in ("verify_gate_rounds", "verify_quality_rounds", "verify_gate_max_tokens", "verify_max_fffd_rate",
                     "verify_max_bad_tool_call_rate")}


def errors(**changes):
    return verify.verify_plan({**DEFAULTS, **changes})["errors"]


def test_the_defaults_pass_and_the_gate_can_be_off():
    assert len(DEFAULTS) == 5
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
])
def test_a_bad_value_is_refused_with_the_fix(name, value, says):
    (error,) = errors(**{name: value})
    assert error.startswith(says), error
    assert f"Fix: e.g. {name}: " in error

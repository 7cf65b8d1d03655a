"""The guard role's plan (plugins/filter/guard.py): earlyoom's settings refused before any change, each refusal
naming the variable, the value, why and the fix; the role's defaults pass. The messages are written out here, as
an operator reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.lib.roles import filter_plugin

REPO = Path(__file__).resolve().parents[2]
guard = filter_plugin("guard")
DEFAULTS = yaml.safe_load((REPO / "roles/guard/defaults/main.yml").read_text())


def errors(**changes):
    return guard.guard_plan({**DEFAULTS, **changes})["errors"]


def test_the_defaults_pass():
    assert errors() == []


@pytest.mark.parametrize(("changes", "expected"), [
    ({"guard_earlyoom": "sometimes"}, "guard_earlyoom = 'sometimes': must be true or false. Fix: a YAML boolean."),
    ({"guard_earlyoom_memory_percent": 0}, "guard_earlyoom_memory_percent = 0: must be a whole percent from 1 to 100"),
    ({"guard_earlyoom_memory_percent": "4.5"}, "guard_earlyoom_memory_percent = '4.5': must be a whole percent"),
    ({"guard_earlyoom_kill_percent": -1}, "guard_earlyoom_kill_percent = -1: must be a whole percent from 0 to 100"),
    ({"guard_earlyoom_kill_percent": 9}, "guard_earlyoom_kill_percent = 9: above guard_earlyoom_memory_percent (4); "
                                         "earlyoom refuses a SIGKILL floor above its SIGTERM floor and would not start. "
                                         "Fix: set guard_earlyoom_kill_percent <= 4."),
    ({"guard_earlyoom_avoid": "^(sshd"}, "guard_earlyoom_avoid = '^(sshd': does not parse as a regular expression"),
    ({"guard_earlyoom_avoid": ""}, "guard_earlyoom_avoid = '': must be one regular expression on one line"),
    ({"guard_earlyoom_report_interval": -5}, "guard_earlyoom_report_interval = -5: must be a whole number of seconds"),
    ({"guard_never_autoremove": "^nvidia-.*"}, "guard_never_autoremove = '^nvidia-.*': must be a list of regular "
                                              "expressions"),
    ({"guard_never_autoremove": ["^nvidia-.*", "^dgx-(.*"]}, "guard_never_autoremove entry '^dgx-(.*': does not "
                                                             "parse as a regular expression"),
    ({"guard_never_autoremove": ['^nvidia-.*";']}, "guard_never_autoremove entry '^nvidia-.*\";': holds a character "
                                                   "apt's configuration cannot carry"),
])
def test_a_bad_setting_is_refused_with_its_fix(changes, expected):
    found = errors(**changes)
    assert len(found) == 1 and found[0].startswith(expected), found
    assert "Fix:" in found[0]


def test_while_earlyoom_is_off_only_its_switch_and_the_apt_rule_are_checked():
    assert errors(guard_earlyoom=False, guard_earlyoom_memory_percent=0, guard_earlyoom_avoid="(") == []
    assert errors(guard_earlyoom="no", guard_earlyoom_kill_percent=900) == []
    assert errors(guard_earlyoom=False, guard_never_autoremove=["("])[0].startswith(
        "guard_never_autoremove entry '(': does not parse")
    assert errors(guard_never_autoremove=[]) == []

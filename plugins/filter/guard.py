"""The check of the guard role's settings (earlyoom's floor and choices), for the inventory check and the role."""

from __future__ import annotations

import re

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import inputs


def _whole(value):
    """A whole number >= 0 as the operator gave it (7, "7"), None otherwise."""
    return inputs.whole_number(value, signed=False, integral_float=False)


def _unparsed(pattern):
    """Why a regular expression does not parse, or None when it does."""
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"does not parse as a regular expression ({exc})"
    return None


def _never_autoremove_errors(patterns):
    """guard_never_autoremove: a list of regular expressions apt reads from a quoted list in its configuration."""
    fix = 'Fix: e.g. guard_never_autoremove: ["^nvidia-.*", "^libnvidia-.*"], or [] for no rule.'
    if not isinstance(patterns, list):
        return [f"guard_never_autoremove = {inputs.shown(patterns)}: must be a list of regular expressions (package "
                f"names apt autoremove never takes). {fix}"]
    errors = []
    for pattern in patterns:
        problem = None
        if not isinstance(pattern, str) or not pattern.strip():
            problem = "is not a regular expression"
        elif any(c in pattern for c in '";\n{}'):
            problem = 'holds a character apt\'s configuration cannot carry in a quoted value (", ;, {, } or a newline)'
        else:
            problem = _unparsed(pattern)
        if problem:
            errors.append(f"guard_never_autoremove entry {inputs.shown(pattern)}: {problem}. {fix}")
    return errors


def guard_plan(ctx):
    """Check the guard's settings of one host: {errors}, each naming the variable, the value, why it cannot be
    used and the fix. Of earlyoom's, nothing but the switch is checked while it is off."""
    errors = _never_autoremove_errors(ctx.get("guard_never_autoremove"))
    enabled = inputs.switch(ctx.get("guard_earlyoom"))
    if enabled is None:
        errors.append(inputs.not_a_switch("guard_earlyoom", ctx.get("guard_earlyoom")))
    if not enabled:
        return {"errors": errors}
    floor = _whole(ctx.get("guard_earlyoom_memory_percent"))
    if floor is None or not 1 <= floor <= 100:
        errors.append(f"guard_earlyoom_memory_percent = {inputs.shown(ctx.get('guard_earlyoom_memory_percent'))}: must be "
                      "a whole percent from 1 to 100 (below it earlyoom sends SIGTERM). Fix: e.g. "
                      "guard_earlyoom_memory_percent: 4, below the tenth of the memory a serving rank leaves.")
    kill = _whole(ctx.get("guard_earlyoom_kill_percent"))
    if kill is None or not 0 <= kill <= 100:
        errors.append(f"guard_earlyoom_kill_percent = {inputs.shown(ctx.get('guard_earlyoom_kill_percent'))}: must be a "
                      "whole percent from 0 to 100 (below it earlyoom sends SIGKILL). Fix: e.g. "
                      "guard_earlyoom_kill_percent: 2.")
    elif floor is not None and 1 <= floor <= 100 and kill > floor:
        errors.append(f"guard_earlyoom_kill_percent = {kill}: above guard_earlyoom_memory_percent ({floor}); earlyoom "
                      "refuses a SIGKILL floor above its SIGTERM floor and would not start. Fix: set "
                      f"guard_earlyoom_kill_percent <= {floor}.")
    avoid = ctx.get("guard_earlyoom_avoid")
    problem = None
    if not isinstance(avoid, str) or not avoid.strip() or "\n" in avoid:
        problem = "must be one regular expression on one line"
    else:
        problem = _unparsed(avoid)
    if problem:
        errors.append(f"guard_earlyoom_avoid = {inputs.shown(avoid)}: {problem} (process names earlyoom passes over). "
                      "Fix: e.g. guard_earlyoom_avoid: \"^(systemd|sshd|dockerd|containerd)$\".")
    interval = _whole(ctx.get("guard_earlyoom_report_interval"))
    if interval is None or interval < 0:
        errors.append(f"guard_earlyoom_report_interval = {inputs.shown(ctx.get('guard_earlyoom_report_interval'))}: must "
                      "be a whole number of seconds, 0 for no report. Fix: e.g. guard_earlyoom_report_interval: 3600.")
    return {"errors": errors}


class FilterModule:
    def filters(self):
        return {"guard_plan": guard_plan}

"""The check of the verify role's corruption gate settings, for the inventory check (before any change: a bad
threshold found only by the verify that follows a deployment would come after the change it was to judge)."""

from __future__ import annotations

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import inputs


def _share(value):
    """A share from 0 to 1 as the operator gave it (0.01, "0.01", 0), None otherwise."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if 0 <= number <= 1 else None


def verify_plan(ctx):
    """Check the gate's settings of one host: {errors}, each naming the variable, the value, why and the fix."""
    errors = []
    for name, least, example in (("verify_gate_rounds", 0, 2), ("verify_quality_rounds", 1, 10),
                                 ("verify_gate_max_tokens", 1, 256)):
        number = inputs.whole_number(ctx.get(name), signed=False, integral_float=False)
        if number is None or number < least:
            what = ("how often each gate question is asked, 0 for no gate" if least == 0 else
                    "a token budget" if name.endswith("tokens") else "how often each question is asked")
            errors.append(f"{name} = {inputs.shown(ctx.get(name))}: must be a whole number from {least} ({what}). "
                          f"Fix: e.g. {name}: {example}.")
    for name in ("verify_max_fffd_rate", "verify_max_bad_tool_call_rate"):
        if _share(ctx.get(name)) is None:
            errors.append(f"{name} = {inputs.shown(ctx.get(name))}: must be a share from 0 to 1 (of the answers, or of "
                          f"the tool calls, that may be broken). Fix: e.g. {name}: 0.01 for one in a hundred, or 0.")
    return {"errors": errors}


class FilterModule:
    def filters(self):
        return {"verify_plan": verify_plan}

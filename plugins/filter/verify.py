"""The verify role's plan - its corruption gate's and soak's settings, for the inventory check (before any change: a
bad threshold found only by the verify that follows a deployment would come after the change it was to judge) -
and the soak's judgement."""

from __future__ import annotations

import base64
import re

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import inputs

KIB_PER_GIB = 1024 * 1024


def _share(value):
    """A share from 0 to 1, None otherwise."""
    number = inputs.decimal(value)
    return number if number is not None and 0 <= number <= 1 else None


def verify_plan(ctx):
    """Check the gate's, the report's and the soak's settings of one host: {errors}, each naming the variable, the
    value, why and the fix."""
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
    prefix = ctx.get("verify_report_prefix")
    if not isinstance(prefix, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix):
        errors.append(f"verify_report_prefix = {inputs.shown(prefix)}: must be letters, digits, '.', '_' or '-' (the "
                      "report file's name before its time). Fix: e.g. verify_report_prefix: verify.")
    return {"errors": errors + _soak_errors(ctx)}


def _soak_errors(ctx):
    errors = []
    seconds = inputs.decimal(ctx.get("verify_soak_seconds"))
    if seconds is None or seconds < 0:
        errors.append(f"verify_soak_seconds = {inputs.shown(ctx.get('verify_soak_seconds'))}: must be a number of "
                      "seconds, 0 for no soak. Fix: e.g. verify_soak_seconds: 600 (-e on playbooks/quality.yml).")
    for name, example in (("verify_soak_burst_seconds", 30), ("verify_soak_max_latency_drift", 1.5)):
        number = inputs.decimal(ctx.get(name))
        if number is None or number <= 0:
            errors.append(f"{name} = {inputs.shown(ctx.get(name))}: must be a number above 0. Fix: e.g. {name}: {example}.")
    for name, example in (("verify_soak_idle_seconds", 30), ("verify_soak_max_memory_growth_gib", 2)):
        number = inputs.decimal(ctx.get(name))
        if number is None or number < 0:
            errors.append(f"{name} = {inputs.shown(ctx.get(name))}: must be a number, 0 or more. Fix: e.g. {name}: {example}.")
    for name, example in (("verify_soak_concurrency", 2), ("verify_soak_prompt_tokens", 256),
                          ("verify_soak_max_tokens", 128)):
        number = inputs.whole_number(ctx.get(name), signed=False, integral_float=False)
        if number is None or number < 1:
            errors.append(f"{name} = {inputs.shown(ctx.get(name))}: must be a whole number from 1. "
                          f"Fix: e.g. {name}: {example}.")
    if _share(ctx.get("verify_soak_max_error_rate")) is None:
        errors.append(f"verify_soak_max_error_rate = {inputs.shown(ctx.get('verify_soak_max_error_rate'))}: must be a "
                      "share from 0 to 1 of the soak's requests. Fix: e.g. verify_soak_max_error_rate: 0.01, or 0.")
    return errors


def _available_kib(slurped):
    text = base64.b64decode((slurped or {}).get("content") or "").decode("utf-8", "replace")
    found = re.search(r"^MemAvailable:\s+([0-9]+)", text, re.MULTILINE)
    return int(found.group(1)) if found else None


def verify_memory_growth(hosts, hostvars):
    """{host: GiB of available memory lost between its two reads (__verify_memory_before/_after), or None}."""
    growth = {}
    for host in hosts:
        seen = hostvars[host]
        before, after = _available_kib(seen.get("__verify_memory_before")), _available_kib(seen.get("__verify_memory_after"))
        growth[host] = None if before is None or after is None else round((before - after) / KIB_PER_GIB, 3)
    return growth


def verify_soak_failures(soak, growth, thresholds):
    """What the soak crossed, one phrase each naming the figure, its threshold and the variable."""
    failed = []
    rate = soak.get("error_rate")
    if rate is None:
        failed.append("no request was sent (verify_soak_seconds, verify_soak_burst_seconds)")
    elif rate > float(thresholds["max_error_rate"]):
        failed.append(f"{soak['errors']} of {soak['requests']} requests failed, rate {rate:g} above "
                      f"verify_soak_max_error_rate {float(thresholds['max_error_rate']):g}")
    drift = soak.get("latency_drift")
    if drift is not None and drift > float(thresholds["max_latency_drift"]):
        failed.append(f"the latency p50 went from {soak['first_latency_p50_ms']} to {soak['last_latency_p50_ms']} ms, "
                      f"drift {drift:g} above verify_soak_max_latency_drift {float(thresholds['max_latency_drift']):g}")
    for host, lost in sorted(growth.items()):
        if lost is not None and lost > float(thresholds["max_memory_growth_gib"]):
            failed.append(f"{host} lost {lost:g} GiB of available memory, above verify_soak_max_memory_growth_gib "
                          f"{float(thresholds['max_memory_growth_gib']):g}")
    return failed


class FilterModule:
    def filters(self):
        return {"verify_plan": verify_plan, "verify_memory_growth": verify_memory_growth,
                "verify_soak_failures": verify_soak_failures}

"""The benchmark role's input checks and plan: which levels, prompt sizes and request counts.

Pure functions of the role's settings (and of the launch arguments the head runs with, read by the
engine's flag model), so that
every problem is reported before any request is sent, each naming the variable, the value, why
and the fix.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import inputs
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.benchmark_reports import compare_problem
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.flag_models import (
    CAPACITY_ROLES,
    capacity_flag,
    launch_flags,
)

PROMPTS = ("short", "medium", "long")
URL = re.compile(r"^https?://[^/@\s]+(:[0-9]+)?/?$")
MAX_STREAMS = 4096


def _num(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def concurrency_problem(value):
    """Why a concurrency setting is unusable (None when it is 'auto' or a strictly increasing list)."""
    if value == "auto":
        return None
    if not isinstance(value, (list, tuple)):
        return "must be auto or a list of concurrency levels such as [1, 2, 4]"
    if not value:
        return "is empty: there would be nothing to measure"
    numbers = [_count(v) for v in value]
    if any(n is None or n < 1 or n > MAX_STREAMS for n in numbers):
        return f"holds a value that is not a whole number from 1 to {MAX_STREAMS}"
    if any(b <= a for a, b in zip(numbers, numbers[1:], strict=False)):
        return "is not strictly increasing: each level must run more streams than the one before"
    return None


def benchmark_problems(s):
    """Every problem of the settings `s` (the role's variables without their prefix), before any request."""
    problems = []

    def bad(var, why, fix):
        problems.append(f"benchmark_{var} = {inputs.shown(s.get(var))}: {why}. Fix: {fix}.")

    why = concurrency_problem(s.get("concurrency"))
    if why:
        bad("concurrency", why, "give a strictly increasing list of positive whole numbers, e.g. [1, 2, 4, 5], or auto "
            "(1, 2, 4, ... up to the server's concurrency cap and one beyond)")
    prompts = s.get("prompts")
    if not isinstance(prompts, (list, tuple)) or not prompts or any(p not in PROMPTS for p in prompts) \
            or len(set(prompts)) != len(prompts):
        bad("prompts", "must be a non-empty list of distinct prompt sizes", f"choose from {', '.join(PROMPTS)}")
    for var, low in (("short_tokens", 1), ("medium_tokens", 1), ("max_tokens", 1), ("rounds", 1), ("min_requests", 1),
                     ("max_requests", 1), ("max_seconds", 1), ("stall_timeout", 1), ("request_timeout", 1),
                     ("recall_max_tokens", 1)):
        n = _count(s.get(var))
        if n is None or n < low:
            bad(var, "must be a positive whole number", "give a whole number of at least 1")
    for var in ("context_length", "max_running_requests"):
        n = _count(s.get(var))
        if n is None or n < 0:
            bad(var, "must be 0 (read it from the head's server-args.json) or the server's value",
                "leave it 0 for a group this collection deployed")
    for var, low, high in (("long_fraction", 0.0, 1.0), ("recall_fraction", 0.0, 1.0)):
        f = _num(s.get(var))
        if f is None or not low < f <= high:
            bad(var, f"must be a fraction of the context length above {low:g} and at most {high:g}", "e.g. 0.5")
    depths = s.get("recall_depths")
    if not isinstance(depths, (list, tuple)) or not depths or len(depths) > 5 \
            or any(_num(d) is None or not 0.0 <= _num(d) <= 1.0 for d in depths):
        bad("recall_depths", "must list one to five depths between 0 and 1", "e.g. [0.1, 0.5, 0.9]")
    endpoint = s.get("endpoint") or ""
    if endpoint and not (isinstance(endpoint, str) and URL.match(endpoint)):
        problems.append(f"benchmark_endpoint = {inputs.shown(re.sub(r'//[^/@]*@', '//<credentials>@', str(endpoint)))}: "
                        "must be a base URL such as https://spark-0:30000 without credentials or path. Fix: put the key "
                        "in server_api_key (or benchmark_api_key), or leave it empty for the head's endpoint.")
    compare = s.get("compare") or ""
    if compare:
        why = compare_problem(compare)
        if why:
            problems.append(f"benchmark_compare (benchmark_compare) = {inputs.shown(compare)} {why}. Fix: name a "
                            "reports/benchmark-*.json file that an earlier playbooks/benchmark.yml run wrote, or leave it empty.")
    return problems


def _server_args(slurped):
    """{flag: value} of the head's server-args.json as slurped (empty when it could not be read)."""
    if not isinstance(slurped, dict) or "content" not in slurped:
        return {}
    try:
        args = json.loads(base64.b64decode(slurped["content"]).decode())
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return {}
    return launch_flags(args)


def auto_levels(limit):
    """1, 2, 4, ... below the concurrency cap, then the cap, then one beyond (queueing)."""
    levels = []
    n = 1
    while n < limit:
        levels.append(n)
        n *= 2
    return levels + [limit, limit + 1]


def benchmark_cells(s, slurped, model):
    """The plan: server settings, levels and, per prompt size and level, the requests to send.

    The context and the concurrency cap are the engine's flags in what the head runs (`model`, the site's
    flag model: SGLang's context-length and max-running-requests, vLLM's max-model-len and max-num-seqs).
    `slurped` is one head's server-args.json as slurped, or a list of them for an endpoint in front of several
    heads (the model gateway's): their caps add up, and the smallest context is the one every request fits."""
    problems = []
    ctx_name, cap_name = (capacity_flag(model, role)["name"] for role in CAPACITY_ROLES)
    slurps = slurped if isinstance(slurped, list) else [slurped]
    parsed = [_server_args(one) for one in slurps]
    contexts = [_count(args.get(ctx_name)) for args in parsed]
    caps = [_count(args.get(cap_name)) for args in parsed]
    context = _count(s.get("context_length")) or (min(contexts) if all(contexts) else None)
    limit = _count(s.get("max_running_requests")) or (sum(caps) if all(caps) else None)
    if not context or not limit:
        unread = next(((one or {}) for one, args in zip(slurps, parsed, strict=True)
                       if not args.get(ctx_name) or not args.get(cap_name)), {})
        where = unread.get("source") or "the head's server-args.json"
        reason = unread.get("msg") or f"it names no --{ctx_name} or --{cap_name}"
        problems.append(f"the server's {ctx_name} and {cap_name} are unknown: {where} could not be read "
                        f"({str(reason).strip()}). Fix: deploy with playbooks/server.yml, or set "
                        "benchmark_context_length and benchmark_max_running_requests to the server's values.")
        return {"problems": problems, "cells": []}
    levels = auto_levels(limit) if s["concurrency"] == "auto" else [int(v) for v in s["concurrency"]]
    max_tokens = int(s["max_tokens"])
    sizes = {"short": int(s["short_tokens"]), "medium": int(s["medium_tokens"]),
             "long": int(context * float(s["long_fraction"])) - max_tokens}
    for prompt in s["prompts"]:
        if sizes[prompt] < 1 or sizes[prompt] + max_tokens >= context:
            var = "long_fraction" if prompt == "long" else f"{prompt}_tokens"
            problems.append(f"benchmark_{var}: a {prompt} prompt of {sizes[prompt]} tokens plus "
                            f"benchmark_max_tokens {max_tokens} does not fit the server's {ctx_name} {context}. "
                            "Fix: a smaller prompt or fewer output tokens.")
    recall = None
    if s.get("recall"):
        recall_max = int(s["recall_max_tokens"])
        # A margin for the tokenizer estimate: the check must not be refused for its length.
        tokens = min(int(context * float(s["recall_fraction"])), int(context * 0.98) - recall_max)
        if tokens < 200:
            problems.append(f"benchmark_recall_max_tokens = {recall_max}: leaves no room for the recall prompt in "
                            f"{ctx_name} {context}. Fix: fewer tokens, or benchmark_recall: false.")
        recall = {"prompt_tokens": tokens, "max_tokens": recall_max,
                  "depths": [float(d) for d in s["recall_depths"]]}
    cells = []
    budget = int(s["max_requests"])
    for prompt in s["prompts"]:
        for level in levels:
            want = max(int(s["min_requests"]), int(s["rounds"]) * level)
            take = min(want, budget)
            budget -= take
            cell = {"prompt": prompt, "prompt_tokens": sizes[prompt], "concurrency": level, "requests": take,
                    "label": f"concurrency {level}, {prompt} prompts ({sizes[prompt]} tokens)"}
            if take < 1:
                cell["skipped"] = "the total request cap (benchmark_max_requests) was spent"
            cells.append(cell)
    for n, cell in enumerate(cells, 1):
        cell["n"] = n
        cell["file"] = f"level-{n:03d}.json"
    return {"problems": problems, "cells": cells, "levels": levels, "context_length": context,
            "max_running_requests": limit, "flags": {"context": ctx_name, "concurrency": cap_name}, "recall": recall,
            "compare": os.path.abspath(os.path.expanduser(s["compare"])) if s.get("compare") else "",
            "requests": sum(c["requests"] for c in cells)}


def benchmark_line(result, cell, total, elapsed):
    """One progress line for a measured level."""
    head = f"level {cell['n']}/{total}: {cell['label']}"
    if cell.get("skipped") or result.get("skipped"):
        return f"{head}: skipped, {cell.get('skipped') or result.get('skipped')}"
    s = result.get("summary") or {}
    errors = ", ".join(f"{k} {v}" for k, v in sorted((s.get("errors") or {}).items())) or "no errors"

    def f(value, digits=0):
        return "-" if value is None else f"{value:.{digits}f}"

    return (f"{head}: {s.get('requests')} requests, {s.get('ok')} ok, {errors}; TTFT p50/p99 "
            f"{f(s['ttft_ms']['p50'])}/{f(s['ttft_ms']['p99'])} ms; ITL p50 {f(s['itl_ms']['p50'], 1)} ms; "
            f"{f(s['decode_tok_s_per_stream']['p50'], 1)} tok/s per stream, {f(s.get('output_tok_s'), 1)} tok/s in all, "
            f"{f(s.get('requests_per_s'), 2)} req/s; {elapsed:.0f} s elapsed")


def _count(value):
    return inputs.whole_number(value, signed=False, integral_float=False)


class FilterModule:
    def filters(self):
        return {
            "benchmark_problems": benchmark_problems,
            "benchmark_cells": benchmark_cells,
            "benchmark_line": benchmark_line,
        }

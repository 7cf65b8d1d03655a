"""The tune role's search for the capacity frontier, its input checks and its results.

For each context length the largest max-running-requests with which the group starts and answers
the verify questions. Two facts prune the search: a fit at N implies a fit at N-1 (and at every
shorter context), a failure at N implies a failure at N+1 (and at every longer context). Within a
context the search doubles from what is known to fit until something fails, then bisects; a
shorter context's frontier predicts the next one's (the hybrid state cache grows with context x
requests), so a good guess is tried first and its neighbour above confirms it.
"""

from __future__ import annotations

import hashlib
import json
import re

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import inputs

TUNED = ("context-length", "max-running-requests")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

# What a start that does not fit looks like (deployment-facts.md and SGLang's memory errors).
CAPACITY = (
    ("Hybrid (mamba/linear-attention) state cache is too small",
     "the hybrid (mamba/linear-attention) state cache does not hold it"),
    ("CUDA out of memory", "CUDA out of memory"),
    ("torch.OutOfMemoryError", "CUDA out of memory"),
    ("Not enough memory", "not enough memory for the KV cache"),
    ("OOMKilled", "the container was killed for memory (OOM)"),
    ("status=137", "the rank was killed (exit 137: out of memory)"),
)


def _flag(model, name):
    return next((f for f in (model or {}).get("flags", []) if f.get("name") == name), {})


def tune_problems(s, model):
    """Every problem of the tune's settings, before any restart. `model` is spark_flag_model."""
    problems = []
    engine = (model or {}).get("engine", "sglang")
    if engine != "sglang":
        # Its trials restart the group with SGLang's capacity flags and read SGLang's start-up lines.
        return [f"spark_engine = {engine!r}: the tuner varies SGLang's context-length and max-running-requests only in "
                f"this version. Fix: set max-model-len and max-num-seqs in server_flag_overrides (or a profile in "
                f"server_profiles, whose SGLang names apply to {(model or {}).get('label', engine)}'s flags) and run "
                "playbooks/server.yml."]
    ctx_flag, req_flag = _flag(model, "context-length"), _flag(model, "max-running-requests")
    window = int(ctx_flag.get("max", 1048576))
    low = int(ctx_flag.get("min", 1024))
    contexts = s.get("contexts")
    if not isinstance(contexts, (list, tuple)) or not contexts:
        problems.append(f"tune_contexts = {inputs.shown(contexts)}: must be a non-empty list of context lengths. Fix: "
                        "e.g. [65536, 131072, 262144].")
    else:
        numbers = [_count(c) for c in contexts]
        if any(n is None for n in numbers):
            problems.append(f"tune_contexts = {inputs.shown(contexts)}: holds a value that is not a whole number. Fix: "
                            "give token counts such as 65536.")
        else:
            above = [n for n in numbers if n > window]
            if above:
                problems.append(f"tune_contexts = {inputs.shown(contexts)}: {', '.join(map(str, above))} is above the model's "
                                f"window of {window} tokens (the flag model's context-length maximum): SGLang would refuse "
                                f"the start. Fix: drop it, or cap the list at {window}.")
            below = [n for n in numbers if n < low]
            if below:
                problems.append(f"tune_contexts = {inputs.shown(contexts)}: {', '.join(map(str, below))} is below "
                                f"context-length's minimum of {low}. Fix: drop it.")
            if any(b <= a for a, b in zip(numbers, numbers[1:], strict=False)):
                problems.append(f"tune_contexts = {inputs.shown(contexts)}: not strictly increasing. Fix: list each "
                                "context length once, shortest first.")
    cap = _count(s.get("max_requests"))
    high = int(req_flag.get("max", 64))
    if cap is None or not 1 <= cap <= high:
        problems.append(f"tune_max_requests = {inputs.shown(s.get('max_requests'))}: the most max-running-requests to try "
                        f"must be a whole number from 1 to {high} (the flag model's range). Fix: e.g. {high}.")
    apply = s.get("apply") or ""
    if apply and (not isinstance(apply, str) or not NAME.match(apply)):
        problems.append(f"tune_apply (tune_apply) = {inputs.shown(apply)}: not a profile name. Fix: a name the tune "
                        "reports, such as ctx131072-req2, or default.")
    return problems


def tune_base(profile, profiles, overrides):
    """The inventory's flags without the two the tune varies: the selected profile beneath the overrides."""
    flags = dict(((profiles or {}).get(profile) or {}) if profile not in (None, "", "default") else {})
    flags.update(overrides or {})
    return {k: v for k, v in flags.items() if k not in TUNED}


def tune_effective(profile, profiles, overrides, model):
    """(context-length, max-running-requests) the inventory deploys: overrides, else the profile, else the seed."""
    flags = dict(((profiles or {}).get(profile) or {}) if profile not in (None, "", "default") else {})
    flags.update(overrides or {})
    return [_count(flags.get(name, _flag(model, name).get("default"))) for name in TUNED]


def tune_base_id(base, image, revision):
    """What the frontier depends on besides the two flags: a record made under other settings is not reused."""
    text = json.dumps({"flags": base, "image": image, "revision": revision}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _bounds(trials, context, cap):
    """(largest N known to fit, smallest N known to fail) at `context`, from every trial by implication."""
    lo, hi = 0, cap + 1
    for t in trials:
        c, n = int(t["context"]), int(t["requests"])
        if t.get("fits") and c >= context:
            lo = max(lo, n)
        if t.get("fits") is False and c <= context:
            hi = min(hi, n)
    return lo, min(hi, cap + 1)


def tune_frontier(trials, contexts, cap):
    """{context: largest N known to fit, or None while unknown}; 0 means it does not start at all."""
    out = {}
    for c in contexts:
        lo, hi = _bounds(trials, int(c), int(cap))
        out[int(c)] = lo if hi - lo <= 1 else None
    return out


def tune_next(trials, contexts, cap):
    """The next candidate {context, requests}, or done; with the number of trials left (an estimate)."""
    cap = int(cap)
    contexts = [int(c) for c in contexts]
    frontier = tune_frontier(trials, contexts, cap)
    left = 0
    pick = None
    for i, c in enumerate(contexts):
        if frontier[c] is not None:
            continue
        lo, hi = _bounds(trials, c, cap)
        # A shorter context's frontier predicts this one's: the state cache grows with context x requests.
        guess = None
        for p in reversed(contexts[:i]):
            if frontier.get(p):
                guess = max(0, frontier[p] * p // c)
                break
        if guess is not None and lo < guess < hi:
            n = guess
        elif guess is not None and lo == guess and guess + 1 < hi:
            n = guess + 1
        elif hi > cap:
            n = min(cap, max(1, 2 * lo))
        else:
            n = (lo + hi) // 2
        span = (min(hi, cap + 1) - lo)
        estimate = max(1, (span - 1).bit_length())
        if pick is None:
            pick = {"context": c, "requests": n, "lo": lo, "hi": hi}
            left += estimate
        else:
            left += 2
    return {"done": pick is None, "frontier": frontier, "left": left, **(pick or {})}


def tune_failure(journals, failed_task, failed_msg):
    """{fits: False, capacity: bool, reason} for a candidate that did not start or did not answer.

    `journals` is the looped journalctl result of every rank since the trial began. Only a start that
    failed the way too large a configuration fails (the hybrid state cache, memory) or a group that
    started but failed verify counts against the candidate; anything else stops the tune.
    """
    texts = []
    for r in (journals or {}).get("results", []):
        texts.append(str(r.get("stdout", "")))
    text = "\n".join(texts)
    for needle, reason in CAPACITY:
        if needle in text:
            line = next((ln.strip() for ln in text.splitlines() if needle in ln), needle)
            return {"fits": False, "capacity": True, "reason": f"{reason}: {line[-300:]}"}
    if "Verification of" in str(failed_msg):
        return {"fits": False, "capacity": True, "reason": f"started, but failed the verify questions: {str(failed_msg)[:300]}"}
    last = [ln.strip() for ln in text.splitlines() if ln.strip()][-3:]
    return {"fits": False, "capacity": False,
            "reason": f"{failed_task}: {str(failed_msg)[:300]}" + (f" (last journal lines: {' | '.join(last)})" if last else "")}


def tune_results(trials, contexts, cap):
    """Per context: the frontier, the trial that proved it (its start time and figures), the profile name."""
    frontier = tune_frontier(trials, contexts, cap)
    rows = []
    for c in [int(x) for x in contexts]:
        n = frontier[c]
        proof = next((t for t in reversed(trials) if t.get("fits") and int(t["context"]) == c and int(t["requests"]) == n),
                     None)
        rows.append({
            "context": c,
            "max_requests": n,
            "startable": bool(n),
            "profile": f"ctx{c}-req{n}" if n else None,
            "start_seconds": proof.get("seconds") if proof else None,
            "figures": (proof or {}).get("figures"),
            "proved_by": "a trial" if proof else ("implied by other trials" if n is not None else "not searched"),
        })
    return rows


def tune_table(rows, benchmark):
    head = "| context | max concurrency | start to ready (s) | profile |"
    rule = "| ---: | ---: | ---: | --- |"
    if benchmark:
        head += " TTFT p50 ms | ITL p50 ms | decode tok/s |"
        rule += " ---: | ---: | ---: |"
    lines = [head, rule]
    for r in rows:
        n = "not startable" if r["max_requests"] == 0 else ("?" if r["max_requests"] is None else str(r["max_requests"]))
        secs = "-" if r["start_seconds"] is None else f"{r['start_seconds']:.0f}"
        line = f"| {r['context']} | {n} | {secs} | {r['profile'] or '-'} |"
        if benchmark:
            f = r.get("figures") or {}
            line += f" {f.get('ttft_ms_p50', '-')} | {f.get('itl_ms_p50', '-')} | {f.get('decode_tok_s', '-')} |"
        lines.append(line)
    return lines


def tune_profiles(rows, existing):
    """The inventory's profiles with one per startable frontier point added (same names replaced)."""
    out = dict(existing or {})
    for r in rows:
        if r["max_requests"]:
            out[r["profile"]] = {"context-length": r["context"], "max-running-requests": r["max_requests"]}
    return out


def tune_figures(result):
    """The single-stream figures of a benchmark result (the benchmark role's benchmark_result)."""
    levels = [lv for lv in (result or {}).get("levels") or [] if lv.get("summary")]
    if not levels:
        return None
    s = levels[0]["summary"]
    return {"ttft_ms_p50": s["ttft_ms"]["p50"], "itl_ms_p50": s["itl_ms"]["p50"],
            "decode_tok_s": s["decode_tok_s_per_stream"]["p50"], "report": (result or {}).get("json")}


def _count(value):
    return inputs.whole_number(value, signed=False, integral_float=False)


class FilterModule:
    def filters(self):
        return {
            "tune_problems": tune_problems,
            "tune_base": tune_base,
            "tune_effective": tune_effective,
            "tune_base_id": tune_base_id,
            "tune_next": tune_next,
            "tune_frontier": tune_frontier,
            "tune_failure": tune_failure,
            "tune_results": tune_results,
            "tune_table": tune_table,
            "tune_profiles": tune_profiles,
            "tune_figures": tune_figures,
        }

"""The tune role's search for the capacity frontier, its input checks and its results.

For each context length the largest concurrency with which the group starts and answers the verify
questions. Two facts prune the search: a fit at N implies a fit at N-1 (and at every shorter context),
a failure at N implies a failure at N+1 (and at every longer context). Within a context the search
doubles from what is known to fit until something fails, then bisects; a shorter context's frontier
predicts the next one's (the per-request state grows with context x requests), so a good guess is tried
first and its neighbour above confirms it.

The two flags it varies are the engine's (the flag model's `capacity: context` and `capacity:
concurrency` flags: SGLang's context-length and max-running-requests, vLLM's max-model-len and
max-num-seqs), and so is what a start too large looks like (the model's `start_failures`). The profiles
it writes name them by the name every engine's model accepts, so one file serves either engine.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import inputs
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.flag_models import (
    CAPACITY_ROLES as ROLES,
)
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.flag_models import (
    capacity_flag as _capacity,
)
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.flag_models import (
    flag_names as _names,
)
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.flag_models import (
    launch_flags,
    speculative_flags,
)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

# A start too large for the memory looks the same under every engine here: torch's and the container's.
# Each engine's own messages are its flag model's start_failures.
OUT_OF_MEMORY = (
    {"match": "CUDA out of memory", "reason": "CUDA out of memory"},
    {"match": "torch.OutOfMemoryError", "reason": "CUDA out of memory"},
    {"match": "OOMKilled", "reason": "the container was killed for memory (OOM)"},
    {"match": "status=137", "reason": "the rank was killed (exit 137: out of memory)"},
)


def tune_flags(model):
    """{context, concurrency}: the engine's own names of the two flags the tune varies."""
    return {role: _capacity(model, role)["name"] for role in ROLES}


def tune_profile_keys(models):
    """{context, concurrency}: the name each engine's model takes for that flag (its name or an alias), so a
    profile the tune writes for one engine deploys on the other."""
    keys = {}
    for role in ROLES:
        specs = [_capacity(m, role) for m in (models or {}).values()]
        common = set(_names(specs[0])).intersection(*(_names(s) for s in specs[1:]))
        if not common:
            raise ValueError(f"no name of the {role} flag is known to every engine's flag model: "
                             f"{[_names(s) for s in specs]}; give one an alias")
        # The first engine's own spelling where it is common (the seed's names), else the first alias in common.
        keys[role] = next(n for n in _names(specs[0]) if n in common)
    return keys


def tune_problems(s, model):
    """Every problem of the tune's settings, before any restart. `model` is spark_flag_model."""
    problems = []
    ctx_flag, req_flag = _capacity(model, "context"), _capacity(model, "concurrency")
    ctx_name, req_name, label = ctx_flag["name"], req_flag["name"], model.get("label", model.get("engine"))
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
                                f"window of {window} tokens (the flag model's {ctx_name} maximum): {label} would refuse "
                                f"the start. Fix: drop it, or cap the list at {window}.")
            below = [n for n in numbers if n < low]
            if below:
                problems.append(f"tune_contexts = {inputs.shown(contexts)}: {', '.join(map(str, below))} is below "
                                f"{ctx_name}'s minimum of {low}. Fix: drop it.")
            if any(b <= a for a, b in zip(numbers, numbers[1:], strict=False)):
                problems.append(f"tune_contexts = {inputs.shown(contexts)}: not strictly increasing. Fix: list each "
                                "context length once, shortest first.")
    cap = _count(s.get("max_requests"))
    high = int(req_flag.get("max", 64))
    if cap is None or not 1 <= cap <= high:
        problems.append(f"tune_max_requests = {inputs.shown(s.get('max_requests'))}: the most {req_name} to try "
                        f"must be a whole number from 1 to {high} (the flag model's range). Fix: e.g. {high}.")
    apply = s.get("apply") or ""
    if apply and (not isinstance(apply, str) or not NAME.match(apply)):
        problems.append(f"tune_apply (tune_apply) = {inputs.shown(apply)}: not a profile name. Fix: a name the tune "
                        "reports, such as ctx131072-req2, or default.")
    return problems


def _selected(profile, profiles, overrides):
    """The inventory's flags: the selected profile beneath the overrides."""
    flags = dict(((profiles or {}).get(profile) or {}) if profile not in (None, "", "default") else {})
    flags.update(overrides or {})
    return flags


def tune_base(profile, profiles, overrides, model):
    """The inventory's flags without the two the tune varies, under any of their names."""
    varied = {n for role in ROLES for n in _names(_capacity(model, role))}
    return {k: v for k, v in _selected(profile, profiles, overrides).items() if k not in varied}


def tune_effective(profile, profiles, overrides, model):
    """[context, concurrency] the inventory deploys: overrides, else the profile, else the seed."""
    flags = _selected(profile, profiles, overrides)
    point = []
    for role in ROLES:
        spec = _capacity(model, role)
        given = [flags[n] for n in _names(spec) if n in flags]
        point.append(_count(given[0] if given else spec.get("default")))
    return point


def tune_candidate(base, context, requests, model):
    """The server_flag_overrides of one candidate: the inventory's other flags and the two, by the engine's names."""
    names = tune_flags(model)
    return {**(base or {}), names["context"]: int(context), names["concurrency"]: int(requests)}


def _slurped_flags(content):
    """{flag: value} of a rank's server-args.json as slurp read it (base64); {} when it is not there or unreadable."""
    try:
        args = json.loads(base64.b64decode(content or "").decode() or "[]")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        args = []
    return launch_flags(args)


def tune_args_point(content, model):
    """[context, concurrency] of a rank's server-args.json (slurped, base64), None for a flag it lacks."""
    flags = _slurped_flags(content)
    return [_count(flags.get(_capacity(model, role)["name"])) for role in ROLES]


def tune_base_id(base, image, revision, build=None):
    """What the frontier depends on besides the two flags: a record made under other settings is not reused.

    ``build``: a derived image's pinned context files, whose change is another image on the same base. Left out
    of the text when empty, so that a record made without a build keeps its ID."""
    settings = {"flags": base, "image": image, "revision": revision}
    if build:
        settings["build"] = build
    text = json.dumps(settings, sort_keys=True, default=str)
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


def tune_failure(journals, failed_task, failed_msg, model):
    """{fits: False, capacity: bool, reason} for a candidate that did not start or did not answer.

    `journals` is the looped journalctl result of every rank since the trial began. Only a start that
    failed the way too large a configuration fails (the engine's own messages, memory) or a group that
    started but failed verify counts against the candidate; anything else stops the tune, a failure the
    engine's model knows as no candidate's with its fix.
    """
    texts = []
    for r in (journals or {}).get("results", []):
        texts.append(str(r.get("stdout", "")))
    text = "\n".join(texts)
    failures = (model or {}).get("start_failures") or {}

    def line_of(needle):
        return next((ln.strip() for ln in text.splitlines() if needle in ln), needle)[-300:]

    for known in failures.get("not_the_candidate") or []:
        if known["match"] in text:
            return {"fits": False, "capacity": False,
                    "reason": f"{' '.join(known['reason'].split())}: {line_of(known['match'])}. Fix: "
                              f"{' '.join(known['fix'].split())}"}
    for known in [*(failures.get("too_large") or []), *OUT_OF_MEMORY]:
        if known["match"] in text:
            return {"fits": False, "capacity": True, "reason": f"{known['reason']}: {line_of(known['match'])}"}
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


def tune_profiles(rows, existing, models):
    """The inventory's profiles with one per startable frontier point added (same names replaced), each
    naming the two flags as every engine's model accepts them."""
    keys = tune_profile_keys(models)
    out = dict(existing or {})
    for r in rows:
        if r["max_requests"]:
            out[r["profile"]] = {keys["context"]: r["context"], keys["concurrency"]: r["max_requests"]}
    return out


def tune_figures(result):
    """The single-stream figures of a benchmark result (the benchmark role's benchmark_result)."""
    levels = [lv for lv in (result or {}).get("levels") or [] if lv.get("summary")]
    if not levels:
        return None
    s = levels[0]["summary"]
    return {"ttft_ms_p50": s["ttft_ms"]["p50"], "itl_ms_p50": s["itl_ms"]["p50"],
            "decode_tok_s": s["decode_tok_s_per_stream"]["p50"], "report": (result or {}).get("json")}


# --- speculative profiles: measured against the base, promoted by the figures --------------------------------


def tune_speculative_problems(names, profiles, model, min_speedup=None, apply=None):
    """Every problem of tune_speculative (the profiles to measure against what the group runs) before any restart.
    `profiles` is the inventory's server_profiles, `model` spark_flag_model; the threshold and tune_apply are judged
    where given (the tune role's own check; the inventory check judges the names)."""
    if names in (None, "", []):
        return []
    label = model.get("label", model.get("engine"))
    spec = model.get("speculative") or {}
    if not spec:
        return [f"tune_speculative = {inputs.shown(names)}: speculative decoding on {label} is not modelled by this "
                "version (no guard rails, no acceptance to read). Fix: leave tune_speculative empty."]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and NAME.match(n) for n in names):
        return [f"tune_speculative = {inputs.shown(names)}: must be a list of profile names from server_profiles. Fix: "
                "e.g. -e '{\"tune_speculative\": [\"mtp3\"]}'."]
    problems = []
    profiles = profiles if isinstance(profiles, dict) else {}
    if len(set(names)) != len(names):
        problems.append(f"tune_speculative = {inputs.shown(names)}: names a profile twice. Fix: list each once.")
    algo = spec["algorithm_flag"]
    for name in dict.fromkeys(names):
        flags = profiles.get(name)
        if flags is None:
            problems.append(f"tune_speculative: {name!r} is not in server_profiles ({', '.join(sorted(profiles)) or 'none'}"
                            f"). Fix: add it to server_profiles with --{algo} and its settings.")
        elif not isinstance(flags, dict) or algo not in flags:
            problems.append(f"tune_speculative: server_profiles[{name!r}] sets no {algo}: there is no drafter to measure "
                            f"against the base. Fix: add {algo} ({' or '.join(spec['algorithms'])}), or drop the name.")
    if min_speedup is not None and (inputs.decimal(min_speedup) is None or inputs.decimal(min_speedup) < 1.0):
        problems.append(f"tune_speculative_min_speedup = {inputs.shown(min_speedup)}: the single-stream decode speed a "
                        "profile must reach as a multiple of the base's must be a number of at least 1.0 (below it a "
                        "slower profile would be promoted). Fix: e.g. 1.05.")
    if apply and apply not in names:
        problems.append(f"tune_apply = {inputs.shown(apply)} with tune_speculative: only a profile this run measures "
                        f"can be promoted and applied. Fix: add it to tune_speculative, or leave tune_apply empty.")
    return problems


def tune_speculative_running(contents, base_flags, model):
    """How the ranks' speculative flags (each rank's server-args.json, slurped) differ from the base the inventory
    deploys: the base is measured as it runs, so a group left on another drafter would be measured as the base.
    One line per rank and flag that differs; empty when they agree."""
    flags = speculative_flags(model)
    names = [n for n in (flags["algorithm"], flags["draft"], *flags["settings"]) if n]
    wanted = {n: str(base_flags[n]) for n in names if (base_flags or {}).get(n) not in (None, False)}
    out = []
    for host, content in (contents or {}).items():
        runs = {n: str(v) for n, v in _slurped_flags(content).items() if n in names}
        for name in names:
            if runs.get(name) != wanted.get(name):
                out.append(f"{host} runs --{name} {runs.get(name, '(unset)')}, the inventory deploys "
                           f"{wanted.get(name, '(unset)')}")
    return out


def tune_speculative_contexts(names, ctx):
    """The server plan's input for each named profile (the inventory check refuses each one's problems)."""
    return [dict(ctx, server_profile=name) for name in names or []]


def tune_speculative_verdict(row, base, min_speedup, model):
    """A measured profile's row with its verdict: promoted only when it started, its accept length beats the base's
    (one token per decoding step without a drafter; a base that drafts itself has its own) and its single-stream
    decode speed is at least `min_speedup` times the base's, on the same prompts. `row` and `base` carry `figures`
    (tune_figures) and `metrics` (the engine's gauges by name; a gauge of 0 is no drafter)."""
    names = (model.get("speculative") or {}).get("metrics") or {}

    def read(entry, key):
        value = ((entry or {}).get("metrics") or {}).get(names.get(key))
        return value if isinstance(value, (int, float)) else None

    out = dict(row)
    base_speed = ((base or {}).get("figures") or {}).get("decode_tok_s")
    speed = (row.get("figures") or {}).get("decode_tok_s")
    out["accept_length"], out["accept_rate"] = read(row, "accept_length"), read(row, "accept_rate")
    out["speedup"] = round(speed / base_speed, 3) if speed and base_speed else None
    floor = float(min_speedup)
    base_accept = max(read(base, "accept_length") or 0.0, 1.0)
    base_says = "one token per decoding step" if base_accept == 1.0 else f"accept length {base_accept:g}"
    if not row.get("started"):
        out["promoted"], out["why"] = False, f"not promoted: {row.get('reason') or 'did not start'}"
    elif not out["accept_length"] or out["accept_length"] <= base_accept:
        out["promoted"], out["why"] = False, (
            f"not promoted: accept length {inputs.shown(out['accept_length'])} is no better than the base's {base_says}"
            + (" (the drafted tokens are rejected)" if base_accept == 1.0 else ""))
    elif out["speedup"] is None or out["speedup"] < floor:
        out["promoted"], out["why"] = False, (
            f"not promoted: {inputs.shown(speed)} tok/s single-stream is {inputs.shown(out['speedup'])}x the base's "
            f"{inputs.shown(base_speed)}, below tune_speculative_min_speedup {floor} (drafting and verifying cost more "
            "than the accepted tokens save)")
    else:
        out["promoted"], out["why"] = True, (
            f"promoted: accept length {out['accept_length']:.2f}, {speed} tok/s single-stream = {out['speedup']}x the "
            f"base's {base_speed}")
    return out


def tune_speculative_table(rows, base, model):
    """The markdown table of a speculative tune: the base, then each profile with its figures and verdict."""
    def cell(value):
        return "-" if value in (None, 0, 0.0) else str(value)

    names = (model.get("speculative") or {}).get("metrics") or {}
    base_fig, base_metrics = (base or {}).get("figures") or {}, (base or {}).get("metrics") or {}
    lines = [f"| profile | {model.get('label')} decode tok/s (1 stream) | speedup | accept length | accept rate | "
             "ITL p50 ms | verdict |", "|---|---|---|---|---|---|---|",
             f"| base (what the group ran) | {cell(base_fig.get('decode_tok_s'))} | 1.0 | "
             f"{cell(base_metrics.get(names.get('accept_length')))} | {cell(base_metrics.get(names.get('accept_rate')))} | "
             f"{cell(base_fig.get('itl_ms_p50'))} | - |"]
    for row in rows:
        fig = row.get("figures") or {}
        lines.append(f"| {row['name']} | {cell(fig.get('decode_tok_s'))} | {cell(row.get('speedup'))} | "
                     f"{cell(row.get('accept_length'))} | {cell(row.get('accept_rate'))} | {cell(fig.get('itl_ms_p50'))} "
                     f"| {row['why']} |")
    return lines


def _count(value):
    return inputs.whole_number(value, signed=False, integral_float=False)


class FilterModule:
    def filters(self):
        return {
            "tune_problems": tune_problems,
            "tune_base": tune_base,
            "tune_effective": tune_effective,
            "tune_flags": tune_flags,
            "tune_candidate": tune_candidate,
            "tune_args_point": tune_args_point,
            "tune_base_id": tune_base_id,
            "tune_next": tune_next,
            "tune_frontier": tune_frontier,
            "tune_failure": tune_failure,
            "tune_results": tune_results,
            "tune_table": tune_table,
            "tune_profiles": tune_profiles,
            "tune_figures": tune_figures,
            "tune_speculative_problems": tune_speculative_problems,
            "tune_speculative_contexts": tune_speculative_contexts,
            "tune_speculative_running": tune_speculative_running,
            "tune_speculative_verdict": tune_speculative_verdict,
            "tune_speculative_table": tune_speculative_table,
        }

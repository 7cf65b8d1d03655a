#!/usr/bin/python
"""Measure the group's OpenAI-compatible endpoint (SGLang or vLLM) with streaming chat completions: calibration,
one level, or the recall check."""
# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_run
short_description: Stream chat completions at the group's endpoint and time every token
description:
  - For the benchmark role's internal use; options and return values may change with the role.
  - C(mode=calibrate) reads the served model from /v1/models and asks two one-token completions to learn how many
    tokens a word of the filler text makes (from the server's usage), so that prompts get the sizes asked for.
  - C(mode=level) runs one level, O(concurrency) streams in a closed loop (each sends its next request when its last
    one ended) until O(requests) are sent or the wall-clock O(deadline) passes; every content or reasoning delta is
    time-stamped on arrival; writes the raw records to O(out) and returns the level's figures.
  - C(mode=soak) (the verify role's quality run) loads the endpoint for O(soak_seconds) in bursts of
    O(burst_seconds) (O(concurrency) streams, each sending its next request as its last one ends; a burst's last
    requests are let finish) separated by O(idle_seconds) of nothing, and returns per burst the requests, errors
    and latency p50, with the error rate and the latency drift (the last burst's p50 over the first's).
  - C(mode=metrics) reads the engine's /metrics (with the key) and returns the first sample of each family
    O(metrics) names, or null where there is none.
  - C(mode=recall) sends one prompt near the context length with facts planted at O(depths) and reports which the
    answer names, and the time to the first token (the prefill).
  - Runs in the foreground of its task. A Ctrl-C reaches it with the rest of the process group; if Ansible's worker
    goes away otherwise, the module notices within half a second and exits, closing every stream.
  - Never fails because the endpoint misbehaves (errors are counted); fails only on unusable options.
version_added: "1.0.0"
author: LLM serving maintainers (@dgx-spark)
options:
  endpoint:
    description: Base URL, e.g. http://spark-0:30000 (https with TLS).
    type: str
    required: true
  api_key:
    description: Bearer key; never returned.
    type: str
    default: ""
  ca_file:
    description: CA bundle that signed the endpoint's certificate (https); empty uses the system's.
    type: path
    default: ""
  validate_certs:
    description: Whether to verify the endpoint's certificate (https).
    type: bool
    default: true
  model:
    description: Model id for the requests; empty takes the first id /v1/models lists (calibrate mode).
    type: str
    default: ""
  mode:
    description: What to measure.
    type: str
    choices: [calibrate, level, recall, soak, metrics]
    required: true
  metrics:
    description: The /metrics families whose first sample C(mode=metrics) returns (gauges, by the engine's names).
    type: list
    elements: str
    default: []
  soak_seconds:
    description: How long the soak loads the endpoint (soak mode), idle gaps included.
    type: float
    default: 60
  burst_seconds:
    description: The length of each burst (soak mode).
    type: float
    default: 30
  idle_seconds:
    description: The pause between bursts (soak mode).
    type: float
    default: 30
  concurrency:
    description: Streams in flight (level mode).
    type: int
    default: 1
  requests:
    description: Requests to send in this level.
    type: int
    default: 1
  prompt_tokens:
    description: Prompt size in tokens (level and recall modes).
    type: int
    default: 128
  max_tokens:
    description: Completion tokens per request.
    type: int
    default: 128
  ignore_eos:
    description:
      - Ask the engine to generate exactly max_tokens (SGLang's and vLLM's ignore_eos sampling option), for
        fixed-length outputs.
    type: bool
    default: true
  depths:
    description: Where the recall facts go, as fractions of the prompt.
    type: list
    elements: float
    default: [0.1, 0.5, 0.9]
  calibration:
    description: The calibrate mode's result (tokens_per_word, overhead).
    type: dict
    default: {}
  stall_timeout:
    description: Seconds without a byte after which a request counts as a timeout.
    type: int
    default: 120
  request_timeout:
    description: Seconds a request may take at most.
    type: int
    default: 900
  deadline:
    description: Wall-clock end (seconds since the epoch) of the whole benchmark; 0 for none.
    type: float
    default: 0
  out:
    description: File that receives the raw records as JSON (level and recall modes); empty writes none.
    type: path
    default: ""
  seed:
    description: Makes the prompts of this call differ from every other call's.
    type: int
    default: 0
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: none
    details: Sends load to the endpoint; the role skips it in check mode.
  diff_mode:
    support: none
    details: Changes nothing but its output file.
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: One level
  dgx_spark.llm_serving.benchmark_run:
    endpoint: http://spark-0:30000
    model: /models/glm53
    mode: level
    concurrency: 4
    requests: 12
    prompt_tokens: 128
    max_tokens: 256
    calibration: {tokens_per_word: 1.0, overhead: 8}
    out: /srv/reports/benchmark-x/level-01.json
"""

RETURN = r"""
summary:
  description: The level's figures (ms for latencies, tok/s, req/s, error counts by kind).
  type: dict
  returned: mode=level
calibration:
  description: tokens_per_word, overhead, source (usage or assumed), model.
  type: dict
  returned: mode=calibrate
recall:
  description: Planted facts with recalled true/false, prompt tokens, time to first token (prefill) and the error if any.
  type: dict
  returned: mode=recall
metrics:
  description: Each family O(metrics) names, by name, with its first sample's value (null where /metrics has none).
  type: dict
  returned: mode=metrics
"""

import asyncio
import json
import os
import time
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.benchmark_client import (
    Endpoint,
    filler,
    level_prompt,
    percentile,
    recall_prompt,
    recalled,
    run_level,
    stream_once,
    summarize,
    watch_parents,
)

# Without a usage report: a conservative guess (more tokens per word keeps prompts inside the window).
ASSUMED = {"tokens_per_word": 1.35, "overhead": 16}


def body(ep, content, max_tokens, ignore_eos):
    payload = {"model": ep.model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
               "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        payload["ignore_eos"] = True
    return payload


async def main_async(module, ep):
    p = module.params
    watcher = asyncio.ensure_future(watch_parents()())
    try:
        if p["mode"] == "calibrate":
            return await calibrate(module, ep)
        if p["mode"] == "level":
            return await level(ep, p)
        if p["mode"] == "soak":
            return await soak(module, ep, p)
        if p["mode"] == "metrics":
            return read_metrics(module, ep)
        return await recall(ep, p)
    finally:
        watcher.cancel()


def get(module, ep, path):
    """The body of a GET of `path` at the endpoint's host, with the key; fails the module when it does not answer."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         urllib.request.HTTPSHandler(context=ep.ssl) if ep.ssl else
                                         urllib.request.HTTPHandler())
    scheme = "https" if ep.tls else "http"
    req = urllib.request.Request(f"{scheme}://{ep.authority}{path}")  # noqa: S310 - http(s) only (Endpoint)
    if ep.key:
        req.add_header("Authorization", f"Bearer {ep.key}")
    try:
        with opener.open(req, timeout=module.params["stall_timeout"]) as resp:
            return resp.read()
    except Exception as err:  # noqa: BLE001 - any failure is reported with its text
        module.fail_json(msg=f"{scheme}://{ep.authority}: {path} did not answer ({err}); is the group serving? "
                             "(playbooks/status.yml, playbooks/verify.yml)")


def read_metrics(module, ep):
    """The value of each named family's first sample at /metrics (None where the engine serves none): the
    engine's gauges as they stand after a run (SGLang's speculative acceptance, say)."""
    text = get(module, ep, "/metrics").decode("utf-8", "replace")
    values = {}
    for name in module.params["metrics"]:
        values[name] = None
        for line in text.splitlines():
            head, _sep, value = line.rpartition(" ")
            if head == name or head.startswith(name + "{"):
                try:
                    values[name] = float(value)
                except ValueError:
                    continue
                break
    return {"metrics": values}


def list_models(module, ep):
    data = json.loads(get(module, ep, f"{ep.path.rsplit('/chat/completions', 1)[0]}/models"))
    scheme = "https" if ep.tls else "http"
    models = [m.get("id") for m in data.get("data") or [] if isinstance(m, dict)]
    if not models:
        module.fail_json(msg=f"{scheme}://{ep.authority}: /v1/models lists no model")
    return models[0], data


async def calibrate(module, ep):
    if not ep.model:
        ep.model, dummy = list_models(module, ep)
    seen = []
    errors = []
    for words in (50, 450):
        # Up to three tries per size: a request that fails is counted, not fatal.
        for attempt in range(3):
            rec = await stream_once(ep, body(ep, filler(words, -(words * 10 + attempt)), 1, False),
                                    module.params["stall_timeout"], module.params["request_timeout"])
            if rec.get("error"):
                errors.append(rec["error"])
                continue
            tokens = (rec.get("usage") or {}).get("prompt_tokens")
            if isinstance(tokens, int):
                seen.append((words, tokens))
            break
    if len(seen) < 2:
        return {"calibration": dict(ASSUMED, source="assumed", model=ep.model, errors=errors,
                                    note=f"no prompt token count from the server ({', '.join(errors) or 'no usage'}): "
                                         f"{ASSUMED['tokens_per_word']} tokens per word assumed")}
    (w1, t1), (w2, t2) = seen
    per_word = max(0.2, (t2 - t1) / (w2 - w1))
    overhead = max(0, round(t1 - per_word * w1))
    return {"calibration": {"tokens_per_word": round(per_word, 4), "overhead": overhead, "source": "usage",
                            "model": ep.model, "errors": errors}}


def write(path, doc):
    if not path:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, path)


def rounded_record(rec):
    out = dict(rec)
    for key in ("start", "ttft", "end"):
        if isinstance(out.get(key), float):
            out[key] = round(out[key], 5)
    out["chunks"] = [round(t, 5) for t in rec.get("chunks") or []]
    return out


async def level(ep, p):
    deadline = p["deadline"] or (time.time() + 10 ** 9)
    if time.time() >= deadline:
        doc = {"skipped": "the wall-time cap (benchmark_max_seconds) was reached before this level"}
        write(p["out"], doc)
        return {"summary": None, "skipped": doc["skipped"]}
    bodies = [body(ep, level_prompt(p["prompt_tokens"], p["calibration"] or ASSUMED, p["seed"] * 100000 + i),
                   p["max_tokens"], p["ignore_eos"]) for i in range(p["requests"])]
    records, wall = await run_level(ep, bodies, p["concurrency"], deadline=deadline,
                                    stall_timeout=p["stall_timeout"], request_timeout=p["request_timeout"])
    summary = summarize(records, wall)
    write(p["out"], {"summary": summary, "records": [rounded_record(r) for r in records]})
    return {"summary": summary}


def _burst(records, seconds):
    """One burst's figures: the level's (summarize: requests, errors by kind, TTFT, tok/s) and the end-to-end
    latency p50 whose drift the soak judges."""
    latency = percentile([r.get("end") for r in records if r.get("error") is None], 50)
    return {**summarize(records, seconds), "latency_p50_ms": None if latency is None else round(latency * 1000, 2)}


async def soak(module, ep, p):
    """Bursts of closed-loop streams with idle gaps between them, until soak_seconds have passed."""
    if not ep.model:
        ep.model, dummy = list_models(module, ep)
    bursts = []
    count = 0
    end_at = time.monotonic() + p["soak_seconds"]
    while True:
        burst_end = min(time.monotonic() + p["burst_seconds"], end_at)
        records = []
        started = time.perf_counter()

        async def stream(until, records):
            nonlocal count
            while time.monotonic() < until:
                i = count
                count += 1
                payload = body(ep, level_prompt(p["prompt_tokens"], p["calibration"] or ASSUMED, p["seed"] * 100000 + i),
                               p["max_tokens"], p["ignore_eos"])
                records.append(await stream_once(ep, payload, p["stall_timeout"], p["request_timeout"]))

        await asyncio.gather(*(stream(burst_end, records) for dummy in range(p["concurrency"])))
        bursts.append(_burst(records, time.perf_counter() - started))
        if time.monotonic() + p["idle_seconds"] >= end_at:
            break
        await asyncio.sleep(p["idle_seconds"])
    requests = sum(b["requests"] for b in bursts)
    errors = sum(b["error_count"] for b in bursts)
    measured = [b["latency_p50_ms"] for b in bursts if b["latency_p50_ms"]]
    drift = round(measured[-1] / measured[0], 3) if len(measured) > 1 else None
    result = {"bursts": bursts, "requests": requests, "errors": errors,
              "error_rate": round(errors / requests, 4) if requests else None, "latency_drift": drift,
              "first_latency_p50_ms": measured[0] if measured else None,
              "last_latency_p50_ms": measured[-1] if measured else None}
    write(p["out"], {"soak": result})
    return {"soak": result}


async def recall(ep, p):
    content, facts = recall_prompt(p["prompt_tokens"], p["calibration"] or ASSUMED, p["depths"], p["seed"])
    rec = await stream_once(ep, body(ep, content, p["max_tokens"], False), p["stall_timeout"], p["request_timeout"],
                            collect=True)
    text = rec.pop("text", "")
    result = {
        "facts": recalled(facts, text),
        "answer": text[-2000:],
        "prompt_tokens": (rec.get("usage") or {}).get("prompt_tokens"),
        "prompt_tokens_target": p["prompt_tokens"],
        "prefill_ms": None if rec.get("ttft") is None else round(rec["ttft"] * 1000, 1),
        "error": rec.get("error"),
        "detail": rec.get("detail"),
    }
    result["recalled"] = sum(1 for f in result["facts"] if f["recalled"])
    if result["prompt_tokens"] and rec.get("ttft"):
        result["prefill_tok_s"] = round(result["prompt_tokens"] / rec["ttft"], 1)
    write(p["out"], {"recall": result, "record": rounded_record(rec)})
    return {"recall": result}


def main():
    module = AnsibleModule(
        argument_spec={
            "endpoint": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "ca_file": {"type": "path", "default": ""},
            "validate_certs": {"type": "bool", "default": True},
            "model": {"type": "str", "default": ""},
            "mode": {"type": "str", "required": True, "choices": ["calibrate", "level", "recall", "soak", "metrics"]},
            "metrics": {"type": "list", "elements": "str", "default": []},
            "soak_seconds": {"type": "float", "default": 60},
            "burst_seconds": {"type": "float", "default": 30},
            "idle_seconds": {"type": "float", "default": 30},
            "concurrency": {"type": "int", "default": 1},
            "requests": {"type": "int", "default": 1},
            "prompt_tokens": {"type": "int", "default": 128, "no_log": False},
            "max_tokens": {"type": "int", "default": 128, "no_log": False},
            "ignore_eos": {"type": "bool", "default": True},
            "depths": {"type": "list", "elements": "float", "default": [0.1, 0.5, 0.9]},
            "calibration": {"type": "dict", "default": {}},
            "stall_timeout": {"type": "int", "default": 120},
            "request_timeout": {"type": "int", "default": 900},
            "deadline": {"type": "float", "default": 0},
            "out": {"type": "path", "default": ""},
            "seed": {"type": "int", "default": 0},
        },
        supports_check_mode=False,
    )
    p = module.params
    if p["concurrency"] < 1 or p["requests"] < 1 or p["max_tokens"] < 1 or p["prompt_tokens"] < 1:
        module.fail_json(msg="concurrency, requests, max_tokens and prompt_tokens must be positive")
    if p["mode"] == "soak" and (p["soak_seconds"] <= 0 or p["burst_seconds"] <= 0 or p["idle_seconds"] < 0):
        module.fail_json(msg="soak_seconds and burst_seconds must be positive, idle_seconds 0 or more")
    try:
        ep = Endpoint(p["endpoint"], p["api_key"], p["ca_file"], p["validate_certs"], p["model"])
    except ValueError as err:
        module.fail_json(msg=str(err))
    result = asyncio.run(main_async(module, ep))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()

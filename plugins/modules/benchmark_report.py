#!/usr/bin/python
"""Gather a benchmark's levels into one report: JSON with the raw timings, a markdown table, a PNG chart."""
# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_report
short_description: Write the JSON, markdown and PNG report of a benchmark run
description:
  - For the benchmark role's internal use; options and return values may change with the role.
  - Reads the raw files M(dgx_spark.llm_serving.benchmark_run) wrote for each level and for the recall check, and writes
    C(<out>.json) (every figure and every request's raw timings), C(<out>.md) (the tables) and C(<out>.png)
    (output tokens/s and TTFT p99 against concurrency, one line per prompt size) with matplotlib.
  - With O(compare), an earlier report's figures stand beside this run's (same prompt size and concurrency).
author: LLM serving maintainers (@dgx-spark)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: none
    details: The role does not measure in check mode.
  diff_mode:
    support: none
    details: Writes a new report each run.
  platform:
    platforms: posix
options:
  cells:
    description: The planned levels, each with label, prompt, concurrency, prompt_tokens, requests and file.
    type: list
    elements: dict
    required: true
  directory:
    description: Where the cells' files are.
    type: path
    required: true
  recall_file:
    description: The recall check's raw file; empty when it did not run.
    type: path
    default: ""
  calibration:
    description: The calibration used for the prompt sizes.
    type: dict
    default: {}
  compare:
    description: An earlier report (JSON) to set beside this one; empty for none.
    type: path
    default: ""
  meta:
    description:
      - What was measured (endpoint without credentials, model, server settings, benchmark settings).
      - C(engine) names the engine in the titles, C(context_flag) and C(concurrency_flag) its names of the two
        server settings (SGLang's, when they are not given).
    type: dict
    default: {}
  out:
    description: Path of the report without its extension.
    type: path
    required: true
  chart:
    description: Whether to draw the PNG.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Write the report of the levels measured
  dgx_spark.llm_serving.benchmark_report:
    cells: "{{ __benchmark_cells }}"
    directory: /tmp/benchmark-raw
    out: reports/benchmark-20261201T000000Z
  delegate_to: localhost
"""

RETURN = r"""
table:
  description: The markdown report, line by line.
  type: list
  returned: always
json:
  description: Path of the JSON report.
  type: str
  returned: always
markdown:
  description: Path of the markdown report.
  type: str
  returned: always
png:
  description: Path of the chart, empty when it could not be drawn (chart_error says why).
  type: str
  returned: always
levels:
  description: Per level the prompt size, concurrency and summary.
  type: list
  returned: always
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.benchmark_reports import KIND, compare_problem, load


def fmt(value, digits=1):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def errors_text(summary):
    errors = summary.get("errors") or {}
    if not errors:
        return "0"
    return ", ".join(f"{k} {v}" for k, v in sorted(errors.items()))


def change(now, before):
    if now is None or not before:
        return "-"
    return f"{now / before:.2f}x"


def level_rows(levels, before):
    head = ("| prompt | conc. | requests | ok | errors | TTFT ms p50 / p90 / p99 | ITL ms p50 / p99 | decode tok/s per stream "
            "| output tok/s | req/s |")
    rule = "| --- | ---: | ---: | ---: | --- | --- | --- | ---: | ---: | ---: |"
    if before is not None:
        head += " before: TTFT p99 ms | before: output tok/s | output tok/s change |"
        rule += " ---: | ---: | ---: |"
    rows = [head, rule]
    for lv in levels:
        s = lv.get("summary")
        prompt = f"{lv['prompt']} ({fmt((s or {}).get('prompt_tokens_p50') or lv['prompt_tokens'], 0)})"
        if not s:
            rows.append(f"| {prompt} | {lv['concurrency']} | - | - | - | skipped: {lv.get('skipped', '?')} | | | | |"
                        + (" | | |" if before is not None else ""))
            continue
        t, i = s["ttft_ms"], s["itl_ms"]
        row = (f"| {prompt} | {lv['concurrency']} | {s['requests']} | {s['ok']} | {errors_text(s)} | "
               f"{fmt(t['p50'], 0)} / {fmt(t['p90'], 0)} / {fmt(t['p99'], 0)} | {fmt(i['p50'])} / {fmt(i['p99'])} | "
               f"{fmt(s['decode_tok_s_per_stream']['p50'])} | {fmt(s['output_tok_s'])} | {fmt(s['requests_per_s'], 2)} |")
        if before is not None:
            b = before.get((lv["prompt"], lv["concurrency"])) or {}
            row += (f" {fmt((b.get('ttft_ms') or {}).get('p99'), 0)} | {fmt(b.get('output_tok_s'))} | "
                    f"{change(s['output_tok_s'], b.get('output_tok_s'))} |")
        rows.append(row)
    return rows


def recall_rows(recall):
    if not recall:
        return []
    rows = ["", f"Long-context recall: {recall.get('recalled', 0)} of {len(recall.get('facts') or [])} planted facts found; "
            f"prompt {fmt(recall.get('prompt_tokens'), 0)} tokens (asked {recall.get('prompt_tokens_target')}), "
            f"time to first token (prefill) {fmt(recall.get('prefill_ms'), 0)} ms"
            + (f", {fmt(recall.get('prefill_tok_s'), 0)} prompt tok/s" if recall.get("prefill_tok_s") else "")
            + (f"; error: {recall['error']} {recall.get('detail') or ''}".rstrip() if recall.get("error") else "") + ".",
            "", "| depth | fact | recalled |", "| ---: | --- | --- |"]
    for f in recall.get("facts") or []:
        rows.append(f"| {int(f['depth'] * 100)}% | the {f['item']} locker's passcode {f['code']} | "
                    f"{'yes' if f['recalled'] else 'no'} |")
    return rows


def chart(path, levels, before, meta):
    """Output tokens/s and TTFT p99 against concurrency, one line per prompt size (dashed: the earlier run)."""
    import matplotlib  # noqa: PLC0415 - heavy, and only this step needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    prompts = []
    for lv in levels:
        if lv["prompt"] not in prompts:
            prompts.append(lv["prompt"])
    for n, prompt in enumerate(prompts):
        color = f"C{n}"
        mine = [lv for lv in levels if lv["prompt"] == prompt and lv.get("summary")]
        xs = [lv["concurrency"] for lv in mine]
        left.plot(xs, [lv["summary"]["output_tok_s"] for lv in mine], "o-", color=color, label=prompt)
        right.plot(xs, [lv["summary"]["ttft_ms"]["p99"] for lv in mine], "o-", color=color, label=prompt)
        if before is not None:
            old = sorted((c, s) for (p, c), s in before.items() if p == prompt)
            if old:
                left.plot([c for c, dummy in old], [s.get("output_tok_s") for dummy, s in old], "x--", color=color,
                          label=f"{prompt} (before)")
                right.plot([c for c, dummy in old], [(s.get("ttft_ms") or {}).get("p99") for dummy, s in old], "x--",
                           color=color, label=f"{prompt} (before)")
    limit = meta.get("max_running_requests")
    cap_flag = meta.get("concurrency_flag") or "max-running-requests"
    ticks = sorted({lv["concurrency"] for lv in levels} | ({c for dummy, c in before} if before else set()))
    for ax, title, unit in ((left, "Output throughput", "tokens/s"), (right, "Time to first token, p99", "ms")):
        if isinstance(limit, int):
            ax.axvline(limit, color="grey", linestyle=":", linewidth=1)
        ax.set_title(title)
        ax.set_xticks(ticks)
        ax.set_xlabel("concurrent streams" + (f" (dotted: {cap_flag} {limit})" if isinstance(limit, int) else ""))
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{meta.get('engine') or 'SGLang'} benchmark {meta.get('time', '')} - {meta.get('model', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    module = AnsibleModule(
        argument_spec={
            "cells": {"type": "list", "elements": "dict", "required": True},
            "directory": {"type": "path", "required": True},
            "recall_file": {"type": "path", "default": ""},
            "calibration": {"type": "dict", "default": {}},
            "compare": {"type": "path", "default": ""},
            "meta": {"type": "dict", "default": {}},
            "out": {"type": "path", "required": True},
            "chart": {"type": "bool", "default": True},
        },
        supports_check_mode=False,
    )
    p = module.params
    before = None
    compare = None
    if p["compare"]:
        problem = compare_problem(p["compare"])
        if problem:
            module.fail_json(msg=f"benchmark_compare = {p['compare']!r} {problem}. Fix: name a reports/benchmark-*.json "
                                 "file an earlier run wrote, or leave it empty.")
        compare = load(p["compare"])
        before = {(lv.get("prompt"), lv.get("concurrency")): lv.get("summary") or {} for lv in compare["levels"]}
    levels = []
    for cell in p["cells"]:
        entry = {"prompt": cell["prompt"], "concurrency": cell["concurrency"], "prompt_tokens": cell["prompt_tokens"],
                 "requests_planned": cell["requests"], "summary": None, "records": []}
        try:
            raw = load(os.path.join(p["directory"], cell["file"]))
        except (OSError, ValueError):
            raw = {"skipped": cell.get("skipped") or "not measured"}
        if raw.get("skipped") or not raw.get("summary"):
            entry["skipped"] = raw.get("skipped") or "not measured"
        else:
            entry["summary"] = raw["summary"]
            entry["records"] = raw.get("records") or []
        levels.append(entry)
    recall = None
    recall_record = None
    if p["recall_file"] and os.path.exists(p["recall_file"]):
        raw = load(p["recall_file"])
        recall, recall_record = raw.get("recall"), raw.get("record")
    meta = dict(p["meta"])
    meta.setdefault("time", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    doc = {"kind": KIND, "version": 1, "time": meta["time"], "meta": meta, "calibration": p["calibration"],
           "levels": levels, "recall": recall, "recall_record": recall_record,
           "compare": None if compare is None else {"file": p["compare"], "time": compare.get("time"),
                                                    "levels": [{k: lv.get(k) for k in ("prompt", "concurrency", "summary")}
                                                               for lv in compare["levels"]]}}
    out = p["out"]
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    lines = [f"# {meta.get('engine') or 'SGLang'} benchmark {meta['time']}", "",
             f"Endpoint {meta.get('endpoint', '?')}, model {meta.get('model', '?')}, "
             f"{meta.get('context_flag') or 'context-length'} {meta.get('context_length', '?')}, "
             f"{meta.get('concurrency_flag') or 'max-running-requests'} {meta.get('max_running_requests', '?')}; "
             f"{meta.get('max_tokens', '?')} output tokens per request"
             + (" (ignore_eos)" if meta.get("ignore_eos") else "") + "; prompt sizes in tokens "
             f"({'from the server' if (p['calibration'] or {}).get('source') == 'usage' else 'estimated'}).",
             ""]
    if compare is not None:
        lines += [f"Compared with {p['compare']} ({compare.get('time', '?')}).", ""]
    lines += level_rows(levels, before) + recall_rows(recall)
    png = out + ".png"
    chart_error = ""
    if p["chart"]:
        try:
            chart(png, levels, before, meta)
        except Exception as err:  # noqa: BLE001 - the tables still stand without the picture
            chart_error = f"{type(err).__name__}: {err}"
            png = ""
    else:
        png = ""
    with open(out + ".json", "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    module.exit_json(changed=True, table=lines, json=out + ".json", markdown=out + ".md", png=png,
                     chart_error=chart_error,
                     levels=[{k: lv.get(k) for k in ("prompt", "concurrency", "summary", "skipped")} for lv in levels],
                     recall=recall)


if __name__ == "__main__":
    main()

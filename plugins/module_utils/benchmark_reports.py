"""The benchmark's report file (reports/benchmark-<stamp>.json): what makes one, for the filter that checks
`benchmark_compare` before a run and for the module that sets an earlier report beside a new one."""

from __future__ import annotations

import json
import os

KIND = "spark-llm-benchmark"
# What versions before 1.3.0 wrote: their reports stay comparable.
KINDS_READ = (KIND, "sglang-benchmark")


def load(path: str):
    with open(os.path.abspath(os.path.expanduser(str(path)))) as f:
        return json.load(f)


def compare_problem(path) -> str | None:
    """Why `path` is not a benchmark report playbooks/benchmark.yml wrote (None when it is one)."""
    try:
        doc = load(path)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    except ValueError as err:
        return f"is not JSON ({err})"
    if not isinstance(doc, dict) or doc.get("kind") not in KINDS_READ:
        found = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        return f"is not a benchmark report (kind {found!r}; playbooks/benchmark.yml writes kind {KIND!r})"
    if not isinstance(doc.get("levels"), list) or not doc["levels"]:
        return "is a benchmark report without levels"
    return None

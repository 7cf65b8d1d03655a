"""Pure helpers of the benchmarks: medians, ratios, verdicts, the markdown table, machine facts.

Nothing here touches a node, so tests/unit/test_bench_report.py can check it without root.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path


def median(values: list[float]) -> float | None:
    """Median of the samples that exist; None when a figure has none (it failed or was skipped)."""
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def paired_ratio(measured: list[float], baseline: list[float]) -> float | None:
    """Median of per-round ratios.

    Each round measures the figure and its baseline back to back, so load that other work puts on
    the machine hits both sides of one ratio alike; the median of the ratios is steadier than a
    ratio of two medians taken over rounds with different background load.
    """
    ratios = [m / b for m, b in zip(measured, baseline, strict=True) if m is not None and b]
    return statistics.median(ratios) if ratios else None


def verdict(value: float | None, op: str, target: float) -> str:
    """'pass' or 'fail' for value `op` target, with op one of <=, <, >=, >."""
    if value is None:
        return "fail"
    ok = {"<=": value <= target, "<": value < target, ">=": value >= target, ">": value > target}[op]
    return "pass" if ok else "fail"


@dataclass
class Figure:
    """One row of the table.

    `value` is what the target is judged on: the ratio for relative targets, the measured value
    itself for absolute ones (fast verify < 1 s).
    """

    key: str
    name: str
    unit: str
    measured: list[float]
    baseline_name: str
    baseline: list[float]
    target_op: str
    target: float
    judged_on: str = "ratio"  # or "measured"
    target_text: str = ""
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    # Further requirements of the target besides the number (e.g. "0 changed tasks on nodes").
    conditions: dict[str, bool] = field(default_factory=dict)
    # The engine the pair served with ("sglang", "vllm"); "" for a figure no engine bears on (a transfer, a hash).
    engine: str = ""

    @property
    def measured_median(self) -> float | None:
        return median(self.measured)

    @property
    def baseline_median(self) -> float | None:
        return median(self.baseline)

    @property
    def ratio(self) -> float | None:
        return paired_ratio(self.measured, self.baseline)

    @property
    def result(self) -> str:
        value = self.ratio if self.judged_on == "ratio" else self.measured_median
        if not all(self.conditions.values()):
            return "fail"
        return verdict(value, self.target_op, self.target)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(measured_median=self.measured_median, baseline_median=self.baseline_median,
                 ratio=self.ratio, result=self.result)
        return d


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "s":
        return f"{value:.3f} s" if value < 1 else f"{value:.1f} s"
    if unit == "MiB/s":
        return f"{value:.0f} MiB/s" if value >= 100 else f"{value:.1f} MiB/s"
    return f"{value:.3g} {unit}".strip()


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def engine_label(f: Figure) -> str:
    """The row's engine; `any` where the figure does not depend on it (measured once, with the first engine)."""
    return f.engine or "any"


def target_text(f: Figure) -> str:
    if f.target_text:
        return f.target_text
    if f.judged_on == "ratio":
        return f"{f.target_op} {f.target:g}x"
    return f"{f.target_op} {fmt_value(f.target, f.unit)}"


def machine_line(machine: dict) -> str:
    load = machine.get("load_before") or []
    after = machine.get("load_after") or []
    parts = [
        f"{machine.get('cores', '?')} cores ({machine.get('cpu', '?')})",
        f"{machine.get('memory_gib', '?')} GiB memory",
        f"kernel {machine.get('kernel', '?')}",
    ]
    if load:
        parts.append("load average (1/5/15 min) before " + "/".join(f"{x:.2f}" for x in load)
                     + (", after " + "/".join(f"{x:.2f}" for x in after) if after else ""))
    return "; ".join(parts)


def markdown_table(figures: list[Figure], machine: dict, runs: int, smoke: bool) -> str:
    """The table the README carries: one row per figure, then the machine it ran on."""
    rows = [
        "| figure | engine | measured | baseline | ratio | target | result |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in figures:
        rows.append(
            f"| {f.name} | {engine_label(f)} | {fmt_value(f.measured_median, f.unit)} "
            f"| {f.baseline_name}: {fmt_value(f.baseline_median, f.unit)} "
            f"| {fmt_ratio(f.ratio)} | {target_text(f)} | {f.result} |"
        )
    head = f"Median of {runs} run{'s' if runs != 1 else ''}" + (" (smoke: tiny sizes, not a measurement)" if smoke else "")
    lines = [head + ". Machine: " + machine_line(machine) + ".", "", *rows]
    notes = [(f.name + (f" ({f.engine})" if f.engine else ""), n) for f in figures for n in f.notes]
    if notes:
        lines.append("")
        lines += [f"- {name}: {note}" for name, note in notes]
    return "\n".join(lines) + "\n"


def read_loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine_facts() -> dict:
    mem_kib = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kib = int(line.split()[1])
                    break
    except OSError:
        pass
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "arch": platform.machine(),
    }


def mib_per_s(nbytes: int, seconds: float | None) -> float | None:
    if not seconds or seconds <= 0:
        return None
    return nbytes / seconds / (1 << 20)


def write_results(out: Path, doc: dict, table: str) -> None:
    """The run's JSON at `out`, its table beside it (.md), and the table on the terminal."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(table)
    print()
    print(table)

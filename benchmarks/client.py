"""Issue 17's client figure: the benchmark's client keeps up with many fast streams (`scripts/bench client`).

The stand-in SGLang server runs on this machine (no node, no root) with a knob-set inter-token
latency, no per-request slowdown and a slot for every stream; the benchmark role's client
(plugins/module_utils/benchmark_client.py, the code the playbook's module
runs) streams `--streams` requests at once. Measured: the inter-token latency the client reports
(p50 of the gaps between deltas) and each stream's decode rate; baseline: the knob. A ratio near
1 means the client timed every token as the server sent it; a client that falls behind shows
longer gaps and a lower rate. Client and stand-in share this machine's cores, so a loaded machine
shows in both sides: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.lib.role_module import module_utils
from tests.lib.seed import seed_args

from .report import Figure, machine_facts, markdown_table, read_loadavg, write_results

REPO = Path(__file__).resolve().parents[1]
SERVER = REPO / "tests" / "standins" / "lib" / "sglang_server.py"
RESULTS = REPO / "benchmarks" / "results"
CLIENT = module_utils("benchmark_client")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/bench client", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=64, help="concurrent streams (default 64)")
    p.add_argument("--itl-ms", type=float, default=5.0, help="the stand-in's inter-token latency in ms (default 5)")
    p.add_argument("--tokens", type=int, default=256, help="output tokens per request (default 256)")
    p.add_argument("--rounds", type=int, default=2, help="requests per stream per run (default 2)")
    p.add_argument("--runs", type=int, default=3, help="runs; the table shows medians (default 3)")
    p.add_argument("--smoke", action="store_true", help="one short run: proves it works, the numbers mean little")
    p.add_argument("--out", type=Path, default=RESULTS / "client.json", help="JSON result; the table goes beside it (.md)")
    args = p.parse_args(argv)
    if args.smoke:
        args.runs, args.rounds, args.tokens = 1, 1, 64
    return args


def start_standin(tmp: Path, itl: float, streams: int) -> tuple[subprocess.Popen, int]:
    model = tmp / "models" / "glm53"
    model.mkdir(parents=True)
    (model / "processor_config.json").write_text("{}")
    (tmp / "etc/spark-sim").mkdir(parents=True)
    (tmp / "etc/spark-sim/node.json").write_text(json.dumps({"sglang": {
        "load_seconds": 0.1, "token_seconds": itl, "ttft_seconds": 0.05, "concurrency_slowdown": 0.0,
        "state_budget": streams * 65536}}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--model-path", str(model), "--tp-size", "1", "--host", "127.0.0.1", "--port",
         str(port), *seed_args(without=("--max-running-requests",)), "--max-running-requests", str(streams)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
        env={"SPARK_SIM_ROOT": str(tmp), "PATH": "/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES": "all"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("bench client: the stand-in exited")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):  # noqa: S310 - loopback
                return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("bench client: the stand-in did not answer")


def one_run(port: int, args, n: int) -> dict:
    ep = CLIENT.Endpoint(f"http://127.0.0.1:{port}", model="glm53")
    cal = {"tokens_per_word": 1.0, "overhead": 8}
    bodies = [{"model": "glm53", "messages": [{"role": "user", "content": CLIENT.level_prompt(128, cal, n * 10000 + i)}],
               "max_tokens": args.tokens, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
              for i in range(args.streams * args.rounds)]
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    records, wall = asyncio.run(CLIENT.run_level(ep, bodies, args.streams, deadline=time.time() + 600,
                                                 stall_timeout=60, request_timeout=600))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    s = CLIENT.summarize(records, wall)
    s["client_cpu_s"] = round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 2)
    return s


def main(argv=None) -> int:
    args = parse_args(argv)
    itl = args.itl_ms / 1000
    machine = machine_facts()
    machine["load_before"] = read_loadavg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="spark-bench-client-") as tmp:
        proc, port = start_standin(Path(tmp), itl, args.streams)
        try:
            for n in range(args.runs):
                s = one_run(port, args, n)
                runs.append(s)
                print(f"bench client: run {n + 1}/{args.runs}: {s['ok']}/{s['requests']} ok, ITL p50 {s['itl_ms']['p50']} ms "
                      f"(p99 {s['itl_ms']['p99']}), {s['decode_tok_s_per_stream']['p50']} tok/s per stream, "
                      f"{s['output_tok_s']} tok/s in all, client CPU {s['client_cpu_s']} s in {s['wall_s']} s", flush=True)
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=10)
    machine["load_after"] = read_loadavg()
    errors = sum(s["error_count"] for s in runs)
    notes = [f"{args.streams} streams x {args.rounds} requests x {args.tokens} tokens per run, stand-in on 127.0.0.1 "
             f"(token_seconds {itl}, no slowdown, max-running-requests {args.streams}); errors {errors}",
             "client CPU per run: " + ", ".join(f"{s['client_cpu_s']} s of {s['wall_s']} s" for s in runs)]
    conditions = {"no errors": errors == 0}
    figs = [
        Figure(key="client-itl", name=f"benchmark client: inter-token latency p50 at {args.streams} streams",
               unit="ms", measured=[s["itl_ms"]["p50"] for s in runs], baseline_name=f"the stand-in's {args.itl_ms:g} ms",
               baseline=[args.itl_ms] * len(runs), target_op="<=", target=1.1, notes=notes, conditions=conditions),
        Figure(key="client-rate", name=f"benchmark client: decode tokens/s per stream at {args.streams} streams",
               unit="tok/s", measured=[s["decode_tok_s_per_stream"]["p50"] for s in runs],
               baseline_name=f"1 / {args.itl_ms:g} ms", baseline=[1000 / args.itl_ms] * len(runs), target_op=">=",
               target=0.9, notes=notes, conditions=conditions),
    ]
    table = markdown_table(figs, machine, args.runs, args.smoke)
    doc = {"kind": "spark-bench-client", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "smoke": args.smoke,
           "settings": vars(args) | {"out": str(args.out)}, "machine": machine, "runs": runs,
           "figures": [f.to_dict() for f in figs], "table_markdown": table}
    write_results(args.out, doc, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

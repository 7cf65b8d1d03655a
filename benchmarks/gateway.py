"""Issue 28's speed figures: several TP groups behind the gateway (`scripts/bench gateway`).

Boots four simulated Sparks as two TP groups of two (harness instance `benchg`), converges site.yml on the
product's defaults (the real smg gateway on the first head, the supervisor and the monitoring on), then measures,
each round side by side:

- aggregate output tokens/s through the gateway (both groups) against straight to one head (one group alone), at a
  concurrency of twice one group's running-request cap (the seed's 2), which saturates one group;
- time to first token, p50 of sequential single requests, through the gateway against straight to a head;
- a rolling upgrade of both groups (upgrade.yml) while a client loops requests through the gateway, against two
  single-group upgrades back to back (upgrade.yml --limit each group): wall seconds, and the client's failed
  requests (none may fail).

The stand-in engine's timings (knobs) make the serving figures: a token every --itl-ms per running request, the
first after 50 ms, no slowdown with concurrency, so a group serves at most 2 streams at once. Timing is not a
test: nothing here asserts, a missed target is a "fail" row in the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.harness import cluster as sim
from tests.lib.looping_client import LoopingClient
from tests.lib.playbook import run_playbook
from tests.lib.role_module import module_utils

from .context import PRODUCT_DEFAULTS
from .report import Figure, machine_facts, markdown_table, read_loadavg, write_results

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CLIENT = module_utils("benchmark_client")
GROUPS = {"replica_a": ("spark-0", "spark-1"), "replica_b": ("spark-2", "spark-3")}
MODEL = "/models/glm53"
CAP = 2  # the seed's --max-running-requests: what one group serves at once
HEAD_PORT = 30000
GATEWAY_PORT = 30080  # gateway_port's default


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/bench gateway", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="rounds; the table shows medians (default 3)")
    p.add_argument("--itl-ms", type=float, default=20.0, help="the stand-in's inter-token latency in ms (default 20)")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request of the throughput figure")
    p.add_argument("--requests", type=int, default=16, help="requests per side and round of the throughput figure")
    p.add_argument("--ttft-requests", type=int, default=20, help="sequential requests per side and round (TTFT)")
    p.add_argument("--smoke", action="store_true", help="one short round: proves it runs, the numbers mean little")
    p.add_argument("-i", "--instance", default="benchg", help="harness instance name (default benchg)")
    p.add_argument("--out", type=Path, default=RESULTS / "gateway.json", help="JSON result; the table goes beside it")
    p.add_argument("--keep", action="store_true", help="leave the nodes up afterwards")
    args = p.parse_args(argv)
    if args.smoke:
        args.runs, args.requests, args.ttft_requests = 1, 8, 5
    if min(args.runs, args.tokens, args.requests, args.ttft_requests) < 1 or args.itl_ms <= 0:
        p.error("--runs, --tokens, --requests, --ttft-requests and --itl-ms must be positive")
    return args


class Site:
    def __init__(self, cluster, workdir: Path, say):
        self.cluster, self.workdir, self.say = cluster, workdir, say
        self.nodes = {n.name: n for n in cluster.nodes}
        # Behind the gateway the heads admit only its host and the monitoring host: the figure straight to one head
        # is taken from this controller, which the site names for that (the product's knob, closed by default).
        self.vars = {**PRODUCT_DEFAULTS, "verify_report_dir": str(workdir / "reports"),
                     "gateway_heads_allowed_clients": [f"{cluster.bridge_ip}/32"]}

    @property
    def key(self) -> str:
        return (self.cluster.inventory / ".credentials" / "spark_llm_api_key").read_text().strip()

    def head_url(self, group: str = "replica_a") -> str:
        return f"http://{self.nodes[GROUPS[group][0]].mgmt_ip}:{HEAD_PORT}"

    @property
    def gateway_url(self) -> str:
        return f"http://{self.nodes['spark-0'].mgmt_ip}:{GATEWAY_PORT}"

    def play(self, playbook: str, limit: str | None = None, **extravars) -> tuple[float, object]:
        t0 = time.monotonic()
        result = run_playbook(playbook, self.cluster.inventory, extravars={**self.vars, **extravars}, limit=limit,
                              timeout=3600)
        seconds = time.monotonic() - t0
        if result.rc != 0:
            raise RuntimeError(f"bench gateway: {playbook}{' --limit ' + limit if limit else ''} failed: "
                               f"{result.failure_messages()[-3000:] or result.stdout[-3000:]}")
        return seconds, result

    def ask(self) -> bool:
        body = json.dumps({"model": MODEL, "max_tokens": 4,
                           "messages": [{"role": "user", "content": f"17 x 23 = ? ({time.monotonic_ns()})"}]}).encode()
        req = urllib.request.Request(  # noqa: S310 - the simulated gateway
            f"{self.gateway_url}/v1/chat/completions", data=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - the simulated gateway
                return resp.status == 200 and bool(json.loads(resp.read())["choices"])
        except (OSError, urllib.error.URLError, ValueError, KeyError):
            return False

    def level(self, url: str, requests: int, concurrency: int, tokens: int, seed: int) -> dict:
        """`requests` streamed requests, `concurrency` at a time, through the benchmark role's client."""
        ep = CLIENT.Endpoint(url, api_key=self.key, model=MODEL)
        cal = {"tokens_per_word": 1.0, "overhead": 8}
        bodies = [{"model": MODEL, "max_tokens": tokens, "ignore_eos": True, "stream": True,
                   "stream_options": {"include_usage": True},
                   "messages": [{"role": "user", "content": CLIENT.level_prompt(64, cal, seed * 100000 + i)}]}
                  for i in range(requests)]
        records, wall = asyncio.run(CLIENT.run_level(ep, bodies, concurrency, deadline=time.time() + 900,
                                                     stall_timeout=120, request_timeout=900))
        return CLIENT.summarize(records, wall)


def upgrade_round(site: Site, image: str, n: int) -> dict:
    """One rolling upgrade of both groups, then two single-group upgrades, each to an image no rank ran before,
    each under a client looping requests through the gateway."""
    out = {}
    with LoopingClient(site.ask) as client:
        out["rolling_s"], _ = site.play("playbooks/upgrade.yml", server_image=f"{image}-rolling{n}")
    out["rolling_failed"], out["rolling_ok"] = client.failed, client.ok
    out["single_s"], out["single_failed"], out["single_ok"] = 0.0, 0, 0
    for group in GROUPS:
        with LoopingClient(site.ask) as client:
            seconds, _ = site.play("playbooks/upgrade.yml", limit=group, server_image=f"{image}-single{n}")
        out["single_s"] += seconds
        out["single_failed"] += client.failed
        out["single_ok"] += client.ok
    site.say(f"upgrades: rolling {out['rolling_s']:.1f} s ({out['rolling_failed']} of "
             f"{out['rolling_failed'] + out['rolling_ok']} requests failed), two single-group "
             f"{out['single_s']:.1f} s ({out['single_failed']} failed)")
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench gateway: the simulated nodes need root (network namespaces, systemd-nspawn)", file=sys.stderr)
        return 2

    def handler(signum, _frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
    started = time.monotonic()
    machine = machine_facts()
    machine["load_before"] = read_loadavg()
    log: list[str] = []

    def say(line: str) -> None:
        log.append(line)
        print(f"bench gateway: {line}", flush=True)

    itl = args.itl_ms / 1000
    knobs = {"sglang": {"load_seconds": 0.2, "token_seconds": itl, "ttft_seconds": 0.05, "concurrency_slowdown": 0.0}}
    workdir = Path(tempfile.mkdtemp(prefix=f"spark-bench-{args.instance}-"))
    cluster = None
    throughput, ttft, upgrades = [], [], []
    try:
        cluster = sim.up(args.instance, 4, {f"spark-{i}": knobs for i in range(4)}, hub=True, site_rails=1,
                         tp_groups=2)
        site = Site(cluster, workdir, say)
        seconds, _ = site.play("site.yml")
        say(f"converged two groups and the gateway in {seconds:.0f} s")
        image = sim.ssh(site.nodes["spark-0"], "docker inspect --format '{{.Config.Image}}' spark-llm").strip()
        for n in range(args.runs):
            one = site.level(site.head_url(), args.requests, 2 * CAP, args.tokens, 2 * n)
            both = site.level(site.gateway_url, args.requests, 2 * CAP, args.tokens, 2 * n + 1)
            throughput.append({"head": one, "gateway": both})
            say(f"round {n + 1}: {one['output_tok_s']} tok/s straight to one head, {both['output_tok_s']} through the "
                f"gateway ({one['error_count']} + {both['error_count']} errors)")
            direct = site.level(site.head_url(), args.ttft_requests, 1, 4, 1000 + 2 * n)
            gated = site.level(site.gateway_url, args.ttft_requests, 1, 4, 1001 + 2 * n)
            ttft.append({"head": direct, "gateway": gated})
            say(f"round {n + 1}: TTFT p50 {direct['ttft_ms']['p50']} ms straight, {gated['ttft_ms']['p50']} ms through "
                "the gateway")
            upgrades.append(upgrade_round(site, image, n))
    finally:
        if cluster is not None and not args.keep:
            sim.down(args.instance)
        shutil.rmtree(workdir, ignore_errors=True)
    machine["load_after"] = read_loadavg()

    errors = sum(r[side]["error_count"] for r in throughput + ttft for side in ("head", "gateway"))
    concurrency = 2 * CAP
    figs = [
        Figure(key="gateway-throughput",
               name=f"output tokens/s through the gateway, two groups, {concurrency} streams", unit="tok/s",
               measured=[r["gateway"]["output_tok_s"] for r in throughput],
               baseline_name="straight to one head (one group alone)",
               baseline=[r["head"]["output_tok_s"] for r in throughput], target_op=">=", target=1.8,
               conditions={"no errors": errors == 0},
               notes=[f"{args.requests} requests x {args.tokens} tokens per side and round, {concurrency} at a time "
                      f"(twice one group's --max-running-requests {CAP}); stand-in: a token every {args.itl_ms:g} ms "
                      "per running request, no slowdown with concurrency"]),
        Figure(key="gateway-ttft", name="time to first token p50 through the gateway", unit="ms",
               measured=[r["gateway"]["ttft_ms"]["p50"] for r in ttft], baseline_name="straight to the head",
               baseline=[r["head"]["ttft_ms"]["p50"] for r in ttft], target_op="<=", target=1.05,
               conditions={"no errors": errors == 0},
               notes=[f"{args.ttft_requests} sequential requests per side and round; the stand-in's first token "
                      "comes 50 ms after a request arrives"]),
        Figure(key="gateway-rolling-upgrade", name="rolling upgrade of two groups behind the gateway", unit="s",
               measured=[u["rolling_s"] for u in upgrades], baseline_name="two single-group upgrades back to back",
               baseline=[u["single_s"] for u in upgrades], target_op="<=", target=1.0,
               conditions={"0 failed requests through the gateway": all(u["rolling_failed"] == 0 for u in upgrades)},
               notes=["requests through the gateway during the rolling upgrades: "
                      + ", ".join(f"{u['rolling_failed']} of {u['rolling_failed'] + u['rolling_ok']} failed"
                                  for u in upgrades)
                      + "; during the single-group ones: "
                      + ", ".join(f"{u['single_failed']} of {u['single_failed'] + u['single_ok']} failed"
                                  for u in upgrades),
                      "each upgrade to an image no rank ran before; the product's defaults (supervisor, monitoring, "
                      "gateway health checks)"]),
    ]
    table = markdown_table(figs, machine, args.runs, args.smoke)
    doc = {"kind": "spark-bench-gateway", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "smoke": args.smoke, "settings": vars(args) | {"out": str(args.out)}, "machine": machine,
           "seconds": round(time.monotonic() - started, 1), "throughput": throughput, "ttft": ttft,
           "upgrades": upgrades, "figures": [f.to_dict() for f in figs], "log": log, "table_markdown": table}
    write_results(args.out, doc, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmarks of issues 7, 12 and 27 on simulated Spark nodes; `scripts/bench --help`.

Boots a two-node harness instance of its own, serves a synthetic checkpoint of the real shape
(120 shards) from the hub emulator on the harness bridge, converges site.yml once per engine, then
measures each figure against its baseline in the same rounds. Writes benchmarks/results/latest.json and
latest.md and prints the table. The instance is torn down at the end, also on failure or SIGTERM.
Timing is not a test: nothing here asserts, a missed target is a "fail" row in the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook
from tests.lib.supervised import MODEL_DIR, wait_for

from . import figures
from .context import ENGINES, Context
from .nodes import REPO, close_masters
from .report import Figure, machine_facts, markdown_table, read_loadavg

STANDINS = REPO / "tests" / "standins"
sys.path.insert(0, str(STANDINS))
import hub_emulator  # noqa: E402 - a test stand-in, imported from its folder like the harness does

RESULTS = REPO / "benchmarks" / "results"
MiB = 1 << 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="rounds per figure; the table shows medians (default 3)")
    p.add_argument("--site-runs", type=int, help="rounds of the site.yml figure (default: --runs); each takes minutes")
    p.add_argument("--shards", type=int, default=120, help="weight shards of the synthetic checkpoint (default 120)")
    p.add_argument("--shard-mib", type=float, default=8,
                   help="MiB per shard (default 8: about 1 GiB, so a transfer takes seconds to tens of seconds here)")
    p.add_argument("--smoke", action="store_true",
                   help="one round, 64 KiB shards: proves every figure runs end to end; the numbers mean nothing")
    p.add_argument("--only", action="append", choices=sorted(figures.FIGURES),
                   help="measure only this figure group (repeatable)")
    p.add_argument("--engine", choices=[*ENGINES, "both"], default="both",
                   help="the engine the server figures (" + ", ".join(figures.PER_ENGINE) + ") measure; both: "
                   "SGLang's pair first, then the same pair switched to vLLM (default both); the other figures do "
                   "not depend on it and run once, with the first")
    p.add_argument("-i", "--instance", default="bench", help="harness instance name (default bench)")
    p.add_argument("--out", type=Path, default=RESULTS / "latest.json", help="JSON result; the table goes beside it (.md)")
    p.add_argument("--keep", action="store_true", help="leave the nodes up afterwards (tear down with "
                   "`python -m tests.harness down -i INSTANCE`)")
    args = p.parse_args(argv)
    if args.smoke:
        args.runs, args.site_runs, args.shard_mib = 1, 1, 1 / 16
    args.site_runs = args.site_runs or args.runs
    if args.runs < 1 or args.site_runs < 1 or args.shards < 1 or args.shard_mib <= 0:
        p.error("--runs, --site-runs, --shards and --shard-mib must be positive")
    return args


def _terminate_on_signals() -> None:
    # SIGTERM/SIGHUP would end the process without `finally`: make them unwind so the nodes go away.
    def handler(signum, _frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def start_hub(root: Path, bind: str, log: Path) -> subprocess.Popen:
    """The emulator in a process of its own, so its serving threads do not share this process's GIL."""
    proc = subprocess.Popen(
        [sys.executable, str(STANDINS / "hub_emulator.py"), "--root", str(root), "--bind", bind,
         "--port", str(sim.HUB_PORT)],
        stdin=subprocess.DEVNULL, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    import socket  # noqa: PLC0415 - only needed here

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with socket.create_connection((bind, sim.HUB_PORT), timeout=1):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"bench: the hub emulator did not start; see {log}")


def stop_hub(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def role_defaults() -> dict:
    return yaml.safe_load((REPO / "roles" / "checkpoint" / "defaults" / "main.yml").read_text())


def test_site_model_dir() -> str:
    """The test site's model directory: its inventory's spark_model_dir, else the product's default (MODEL_DIR, which
    the tests' deployments find the checkpoint in): the test inventory leaves it to the default since 1.8.0."""
    data = yaml.safe_load((REPO / "tests" / "inventory" / "group_vars" / "spark" / "main.yml").read_text()) or {}
    return data.get("spark_model_dir", MODEL_DIR)


def tool_versions() -> dict:
    def first_line(cmd: list[str]) -> str:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "?"

    return {
        "ansible-core": first_line([str(Path(sys.executable).parent / "ansible"), "--version"]),
        "rsync": first_line(["rsync", "--version"]),
        "ssh": first_line(["ssh", "-V"]),
        "python": sys.version.split()[0],
    }


def git_commit() -> str:
    """The commit measured, read at the start: the checkout may move while a run takes minutes."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
    return (head.stdout.strip() or "?") + ("+uncommitted changes" if dirty.stdout.strip() else "")


def measurement_plan(only: list[str] | None, engine: str) -> list[tuple[str, str]]:
    """(engine, figure group) in the order they are measured: the groups no engine bears on once, with the first
    engine, then each engine's server figures (figures.ORDER within each, whatever order --only gave them in;
    "site" is another name of "nochange"). An engine none of the chosen groups needs is never deployed."""
    engines = list(ENGINES) if engine == "both" else [engine]
    groups = [key for key in figures.ORDER if key in (only or set(figures.ORDER) - {"site"})]
    return ([(engines[0], key) for key in groups if key not in figures.PER_ENGINE]
            + [(name, key) for name in engines for key in groups if key in figures.PER_ENGINE])


def converge(ctx: Context, engine: str, control_dir: Path) -> None:
    """site.yml with `engine`'s settings over the product's defaults: what every figure of that engine starts from."""
    ctx.engine = engine
    ctx.say(f"converging site.yml on {ctx.cluster.instance} with {engine} (fetch, sync, server, verify) before measuring")
    t0 = time.monotonic()
    r = run_playbook("site.yml", ctx.inventory, extravars=ctx.extravars, timeout=3600,
                     envvars={"ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir)})
    if r.rc != 0:
        raise RuntimeError(f"bench: converging site.yml with {engine} failed: "
                           f"{r.failure_messages()[-3000:] or r.stdout[-3000:]}")
    ctx.say(f"converged with {engine} in {time.monotonic() - t0:.0f} s")


def switch(ctx: Context, engine: str, control_dir: Path) -> None:
    """The pair from the engine it serves with to `engine`. The recovery figure's ranks keep their GPU memory a few
    seconds after they end (gpu_release_seconds, read at a rank's start), and the role starts the other engine's
    ranks right after the stop (its supervisor waits for the release, a deployment does not): so the group is
    stopped first and the GPUs seen free on every node before site.yml deploys the other engine."""
    for n in ctx.cluster.nodes:
        sim.set_knobs(ctx.cluster.instance, n.name, {name: {"gpu_release_seconds": 0} for name in ENGINES})
    r = run_playbook("playbooks/stop.yml", ctx.inventory, extravars=ctx.extravars, timeout=600,
                     envvars={"ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir)})
    if r.rc != 0:
        raise RuntimeError(f"bench: stopping the {ctx.engine} group failed: {r.failure_messages()[-3000:]}")
    for n in ctx.cluster.nodes:
        wait_for(lambda n=n: not ctx.sh(n, "nvidia-smi --query-compute-apps=pid --format=csv,noheader").strip(),
                 f"{n.name}'s GPU memory to be released", 120, every=0.5)
    converge(ctx, engine, control_dir)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench: the simulated nodes need root (network namespaces, systemd-nspawn); run as root", file=sys.stderr)
        return 2
    _terminate_on_signals()
    started = time.monotonic()
    commit = git_commit()
    machine = machine_facts()
    machine["load_before"] = read_loadavg()
    shard_bytes = max(int(args.shard_mib * MiB), 1)
    plan = measurement_plan(args.only, args.engine)
    engines = list(dict.fromkeys(engine for engine, _ in plan))
    defaults = role_defaults()

    hub_root = sim.CACHE_ROOT / "bench-hub" / f"{args.shards}x{shard_bytes}"
    print(f"bench: synthetic checkpoint {args.shards} x {shard_bytes} bytes in {hub_root} (built once, then reused)",
          flush=True)
    info = hub_emulator.build_checkpoint(hub_root, shards=args.shards, shard_bytes=shard_bytes)
    commit_dir = hub_root / info["repo_id"] / info["new"]
    files = sorted(info["files"])
    total = sum((commit_dir / f).stat().st_size for f in files)

    workdir = Path(tempfile.mkdtemp(prefix=f"spark-bench-{args.instance}-"))
    control_dir = workdir / "cp"
    control_dir.mkdir()
    hub = None
    cluster = None
    results: list[Figure] = []
    errors: dict[str, str] = {}
    log: list[str] = []
    node_tools: dict[str, str] = {}
    try:
        # No harness hub: the harness serves a tiny checkpoint; ours has benchmark-sized shards.
        cluster = sim.up(args.instance, 2, hub=False)
        hub = start_hub(hub_root, cluster.bridge_ip, workdir / "hub.log")
        ctx = Context(
            cluster=cluster, workdir=workdir, control_dir=control_dir,
            hub_url=f"http://{cluster.bridge_ip}:{sim.HUB_PORT}", repo_id=info["repo_id"], revision=info["new"],
            model_dir=test_site_model_dir(), venv_dir=defaults["checkpoint_venv_dir"],
            fetch_workers=int(defaults["checkpoint_fetch_workers"]), sync_streams=int(defaults["checkpoint_sync_streams"]),
            sync_ssh_command=defaults["checkpoint_sync_ssh_command"],
            sync_transport=defaults["checkpoint_sync_transport"],
            sync_rsyncd_port=int(defaults["checkpoint_sync_rsyncd_port"]), shards=args.shards, files=files,
            total_bytes=total, log=log,
        )
        converge(ctx, plan[0][0], control_dir)
        # The tools that do the work run in the nodes (Debian trixie), not on this machine.
        node_tools = {
            "rsync": ctx.sh(ctx.head, "rsync --version | head -n 1", check=False).strip(),
            "ssh": ctx.sh(ctx.head, "ssh -V 2>&1", check=False).strip(),
            "sha256sum": ctx.sh(ctx.head, "sha256sum --version | head -n 1", check=False).strip(),
            "python": ctx.sh(ctx.head, "python3 -V", check=False).strip(),
        }
        for engine, key in plan:
            if engine != ctx.engine:
                try:
                    switch(ctx, engine, control_dir)
                except (RuntimeError, AssertionError) as e:
                    # The first engine's figures are measured: they are still written.
                    ctx.say(f"could not switch the pair to {engine}: {e}")
                    errors[f"switch to {engine}"] = str(e)
                    break
            runs = args.site_runs if key in ("nochange", "site", "floor") else args.runs
            figs, err = figures.run_figure(ctx, key, runs)
            results += figs
            if err:
                errors[f"{key} ({engine})" if key in figures.PER_ENGINE else key] = err
    finally:
        stop_hub(hub)
        close_masters(control_dir)
        if cluster is not None and not args.keep:
            sim.down(args.instance)
        shutil.rmtree(workdir, ignore_errors=True)
    machine["load_after"] = read_loadavg()

    table = markdown_table(results, machine, args.runs, args.smoke)
    doc = {
        "kind": "spark-bench",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit,
        "smoke": args.smoke,
        "runs": args.runs,
        "site_runs": args.site_runs,
        "engines": engines,
        "checkpoint": {"shards": args.shards, "shard_bytes": shard_bytes, "files": len(files), "bytes": total},
        "machine": machine,
        "tools": {"controller": tool_versions(), "nodes": node_tools},
        "seconds": round(time.monotonic() - started, 1),
        "figures": [f.to_dict() for f in results],
        "errors": errors,
        "log": log,
        "table_markdown": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(table)
    print()
    print(table)
    print(f"bench: {len(results)} figures in {doc['seconds']:.0f} s; {args.out} and {args.out.with_suffix('.md')}")
    for key, err in errors.items():
        print(f"bench: {key} could not be measured: {err.splitlines()[0]}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

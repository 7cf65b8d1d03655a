"""Benchmarks of issue 7 on simulated Spark nodes; `scripts/bench --help`.

Boots a two-node harness instance of its own, serves a synthetic checkpoint of the real shape
(120 shards) from the hub emulator on the harness bridge, converges site.yml once, then measures
each figure against its baseline in the same rounds. Writes benchmarks/results/latest.json and
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

from . import figures
from .context import Context
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
    data = yaml.safe_load((REPO / "tests" / "inventory" / "group_vars" / "spark" / "main.yml").read_text())
    return data["spark_model_dir"]


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
    groups = args.only or ["sync", "verify", "fetch", "nochange", "floor", "recovery"]
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
        ctx.say(f"converging site.yml on {args.instance} (fetch, sync, server, verify) before measuring")
        t0 = time.monotonic()
        r = run_playbook("site.yml", ctx.inventory, extravars=ctx.extravars, timeout=3600,
                         envvars={"ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir)})
        if r.rc != 0:
            raise RuntimeError(f"bench: converging site.yml failed: {r.failure_messages()[-3000:] or r.stdout[-3000:]}")
        ctx.say(f"converged in {time.monotonic() - t0:.0f} s")
        # The tools that do the work run in the nodes (Debian trixie), not on this machine.
        node_tools = {
            "rsync": ctx.sh(ctx.head, "rsync --version | head -n 1", check=False).strip(),
            "ssh": ctx.sh(ctx.head, "ssh -V 2>&1", check=False).strip(),
            "sha256sum": ctx.sh(ctx.head, "sha256sum --version | head -n 1", check=False).strip(),
            "python": ctx.sh(ctx.head, "python3 -V", check=False).strip(),
        }
        for key in groups:
            runs = args.site_runs if key in ("nochange", "site", "floor") else args.runs
            figs, err = figures.run_figure(ctx, key, runs)
            results += figs
            if err:
                errors[key] = err
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

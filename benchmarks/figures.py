"""The figures of issues 7, 12 and 27, each measured against its baseline in the same round."""

from __future__ import annotations

import os
import shlex
import shutil
import time
import traceback
from collections import Counter

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook

from .context import (
    BENCH_DIR,
    ENGINES,
    PRODUCT_DEFAULTS,
    RUNNER_ENV,
    SYSTEM_PYTHON,
    Context,
    defaults_config,
    effective_settings,
    no_inherited_ansible_env,
    node_task_counts,
    rounds,
    settings_text,
    task_seconds,
)
from .nodes import REPO, BenchError, StagedModule, close_masters
from .recovery import recovery
from .report import Figure, median, mib_per_s, read_loadavg
from .restart import restart
from .task_floor import task_floor

NOCHANGE_TARGET_SECONDS = 15.0


def site_noop(ctx: Context, runs: int) -> list[Figure]:
    """A no-change site.yml with the product's defaults (Context.extravars), the project's ansible.cfg beside
    Ansible's stock configuration: wall time and the tasks that reached a node, side by side in each round."""
    configs = {"project": REPO / "ansible.cfg", "defaults": defaults_config(ctx)}
    changed: dict[str, list[dict]] = {k: [] for k in configs}
    tasks: dict[str, list[dict]] = {k: [] for k in configs}
    slowest: Counter = Counter()
    counter = iter(range(10_000))

    def one(which: str):
        def step() -> float:
            # A fresh control-socket directory per run: no run inherits another's open SSH connections.
            cp = ctx.control_dir / f"site-{ctx.engine}-{which}-{next(counter)}"
            cp.mkdir()
            env = {"ANSIBLE_CONFIG": str(configs[which]), "ANSIBLE_SSH_CONTROL_PATH_DIR": str(cp)}
            if which == "defaults":
                env["ANSIBLE_CALLBACK_PLUGINS"] = ""  # stock: not even the project's plugin cache
            t0 = time.monotonic()
            try:
                with no_inherited_ansible_env():
                    r = run_playbook("site.yml", ctx.inventory, extravars=ctx.extravars, timeout=1800, envvars=env)
            finally:
                seconds = time.monotonic() - t0
                close_masters(cp)
            if r.rc != 0:
                raise BenchError(f"site.yml with {which} config failed (rc {r.rc}): {r.failure_messages()[-1500:]}")
            on_nodes = [f"{d['host']}: {d['task']}" for d in r.changed
                        if d.get("res", {}).get("_ansible_delegated_vars", {}).get("ansible_delegated_host") != "localhost"]
            on_controller = [f"{d['host']}: {d['task']}" for d in r.changed if f"{d['host']}: {d['task']}" not in on_nodes]
            changed[which].append({"nodes": on_nodes, "controller": on_controller})
            tasks[which].append(node_task_counts(r))
            if which == "project":
                slowest.update(task_seconds(r.events))
            return seconds
        return step

    # The exact settings each side ran with (speed-relevant ones), named in the figure.
    settings = {which: effective_settings(cfg, ctx.control_dir / "site-settings") for which, cfg in configs.items()}
    inherited = sorted(k for k in os.environ if k.startswith("ANSIBLE_"))
    s = rounds(ctx, "site.yml no-change", runs, [("project", one("project")), ("defaults", one("defaults"))])
    node_changes = max((len(c["nodes"]) for c in changed["project"]), default=None)
    ctrl_changes = max((len(c["controller"]) for c in changed["project"]), default=None)
    dflt_node_changes = max((len(c["nodes"]) for c in changed["defaults"]), default=None)

    def counted(which: str) -> str:
        last = tasks[which][-1] if tasks[which] else {}
        return (f"{last.get('on_nodes')} task results on the nodes, {last.get('skipped')} skipped there, "
                f"{last.get('controller')} on the controller")

    engine_note = ENGINES[ctx.engine]["note"]
    # The defaults as this engine's site gets them (an engine's settings may differ from them).
    defaults = {k: ctx.extravars[k] for k in PRODUCT_DEFAULTS}
    fig = Figure(
        key="nochange", name="site.yml no-change re-run, 2 nodes, the product's defaults (wall)", unit="s", engine=ctx.engine,
        measured=s["project"], baseline_name="Ansible's stock configuration", baseline=s["defaults"],
        target_op="<=", target=NOCHANGE_TARGET_SECONDS, judged_on="measured",
        target_text=f"<= {NOCHANGE_TARGET_SECONDS:.0f} s on a quiet machine and 0 changed on nodes",
        notes=[f"the product's defaults: {', '.join(f'{k}={v}' for k, v in defaults.items())} over the test "
               f"inventory's shortcuts",
               *([engine_note] if engine_note else []),
               f"tasks per run with the project's ansible.cfg: {counted('project')}; with the stock configuration: "
               f"{counted('defaults')}",
               f"changed tasks per run with the project's ansible.cfg: {node_changes} on nodes, {ctrl_changes} on the "
               f"controller; with the stock configuration: {dflt_node_changes} on nodes",
               "slowest tasks (project config, seconds summed over its runs): "
               + ", ".join(f"{name} {sec:.1f}" for name, sec in slowest.most_common(5)),
               f"stock settings (as ansible-config reports them in the run): {settings_text(settings['defaults'])}",
               f"project settings (ansible.cfg): {settings_text(settings['project'])}",
               "both sides run through ansible-runner, which sets "
               + ", ".join(f"{k}={v}" for k, v in RUNNER_ENV.items())
               + "; the inventory adds only host-key options (ansible_ssh_common_args); the caller's ANSIBLE_* "
               "variables are not passed on" + (f" (ignored here: {', '.join(sorted(inherited))})" if inherited else "")],
        extra={"changed": changed, "tasks": tasks, "task_seconds_project": dict(slowest.most_common(40)),
               "defaults_config": configs["defaults"].read_text(), "settings": settings,
               "runner_env": RUNNER_ENV, "inherited_ansible_env_ignored": sorted(inherited),
               "product_defaults": defaults},
    )
    fig.conditions["0 changed tasks on nodes"] = node_changes == 0
    return [fig]


# ---- 2. head -> worker sync over the fabric -----------------------------------------------------------

def ssh_pipes(ctx: Context) -> dict[str, float]:
    """Diagnosis, not a figure: what one ssh stream over the fabric carries, per cipher, in one round.

    The checkpoint's bytes go through ssh into /dev/null, so the number is the ceiling ssh itself
    puts on an rsync stream here; the default cipher next to AES-GCM shows whether the cipher is it.
    """
    head, worker = ctx.head, ctx.worker
    offered = set(ctx.sh(head, "ssh -Q cipher", check=False).split())
    # The client's first preference is what a stock sshd on the worker agrees to.
    first = ctx.sh(head, f"ssh -G root@{worker.fabric_ip} | awk '/^ciphers /{{print $2}}'", check=False)
    default = f"default cipher {first.strip().split(',')[0]}" if first.strip() else "the default cipher"
    out: dict[str, float] = {}
    for label, option in ((default, ""), ("aes128-gcm@openssh.com", "-c aes128-gcm@openssh.com")):
        if option and option.split()[-1] not in offered:
            continue
        try:
            seconds, _ = ctx.timed(head, f"cd {ctx.model_dir} && find . -type f -print0 | xargs -0 cat "
                                         f"| {ctx.sync_ssh_command} {option} root@{worker.fabric_ip} 'cat >/dev/null'")
        except BenchError as e:
            ctx.say(f"ssh pipe with {label} FAILED: {e}")
            continue
        out[label] = round(mib_per_s(ctx.total_bytes, seconds), 1)
        ctx.say(f"ssh pipe head -> worker with {label}: {out[label]} MiB/s")
    return out


RAW_TCP_PORT = 28799  # the raw TCP baseline's listener on the worker's fabric address
# The raw TCP baseline's two ends: a plain socket, 1 MiB reads and writes, nothing else in the way.
TCP_RECEIVE = ("import socket, sys; s = socket.create_server((sys.argv[1], int(sys.argv[2]))); c, _ = s.accept(); "
               "b = bytearray(1 << 20); m = memoryview(b); o = sys.stdout.buffer\n"
               "while (n := c.recv_into(b)):\n    o.write(m[:n])")
TCP_SEND = ("import socket, sys; c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); i = sys.stdin.buffer\n"
            "while (b := i.read1(1 << 20)):\n    c.sendall(b)")


def sync(ctx: Context, runs: int) -> list[Figure]:
    """The role's sync (checkpoint_sync as the role calls it, default transport) against one rsync -a over
    ssh, a raw TCP copy of the same files over the same fabric link, and a local copy; the role's ssh
    transport (the fallback) is measured beside them for the notes."""
    head, worker = ctx.head, ctx.worker
    dest, partial = f"{BENCH_DIR}/sync", f"{BENCH_DIR}/.sync.partial/rsync"
    copy_dir, rsync_dir, tcp_dir = f"{BENCH_DIR}/copy", f"{BENCH_DIR}/rsync", f"{BENCH_DIR}/tcp"
    file_list = f"{BENCH_DIR}/files.list"
    for n in (head, worker):
        ctx.sh(n, f"rm -rf {BENCH_DIR} && mkdir -p {BENCH_DIR}")
    ctx.sh(head, f"cat > {file_list} <<'EOF'\n" + "\n".join(ctx.files) + "\nEOF")

    # The arguments the role passes (tasks/sync.yml), to a scratch directory on the worker.
    def staged(transport: str, label: str) -> StagedModule:
        return StagedModule(head, ctx.control_dir, "checkpoint_sync", SYSTEM_PYTHON).stage(ctx.inventory, {
            "src_dir": ctx.model_dir, "dest_host": worker.fabric_ip, "dest_user": "root", "dest_dir": dest,
            "partial_dir": partial, "files": ctx.files, "streams": ctx.sync_streams, "transport": transport,
            "listen_address": head.fabric_ip, "port": ctx.sync_rsyncd_port, "ssh_command": ctx.sync_ssh_command,
            "extra_args": [], "progress_path": f"{BENCH_DIR}/sync-progress.json", "progress_id": "bench"}, label)

    modules = {"role": staged(ctx.sync_transport, "sync"), "role_ssh": staged("ssh", "sync-ssh")}
    module_seconds: dict[str, list] = {k: [] for k in modules}

    def fresh(node: sim.Node, *dirs: str) -> None:
        # Untimed: an empty destination and no dirty pages of the previous step on either node.
        if dirs:
            ctx.sh(node, f"rm -rf {' '.join(dirs)} && mkdir -p {' '.join(dirs)}")
        for n in (head, worker):
            ctx.sh(n, "sync -f /opt")

    def role_sync(which: str):
        def step() -> float:
            fresh(worker, dest, partial)
            seconds, result = modules[which].run()
            want = ctx.sync_transport if which == "role" else "ssh"
            if result.get("transport") != want:
                raise BenchError(f"checkpoint_sync went over {result.get('transport')}, not {want}: "
                                 f"{result.get('fallback_reason')}")
            if result.get("transferred_files") != len(ctx.files):
                raise BenchError(f"checkpoint_sync transferred {result.get('transferred_files')} of {len(ctx.files)} files")
            module_seconds[which].append(result.get("seconds"))
            ctx.expect_tree(worker, dest, f"checkpoint_sync over {want}")
            ctx.sh(worker, f"rm -rf {dest}")
            return mib_per_s(ctx.total_bytes, seconds)
        return step

    cp_command = f"cp -a {ctx.model_dir} {copy_dir}"

    def local_copy() -> float:
        ctx.sh(head, f"rm -rf {copy_dir}")
        fresh(head)
        seconds, _ = ctx.timed(head, cp_command)
        ctx.expect_tree(head, copy_dir, "cp -a")
        ctx.sh(head, f"rm -rf {copy_dir}")
        return mib_per_s(ctx.total_bytes, seconds)

    rsync_command = (f"rsync -a -e {shlex.quote(ctx.sync_ssh_command)} {ctx.model_dir}/ "
                     f"root@{worker.fabric_ip}:{rsync_dir}/")

    def plain_rsync() -> float:
        ctx.sh(worker, f"rm -rf {rsync_dir}")
        fresh(worker)
        seconds, _ = ctx.timed(head, rsync_command)
        ctx.expect_tree(worker, rsync_dir, "rsync -a")
        ctx.sh(worker, f"rm -rf {rsync_dir}")
        return mib_per_s(ctx.total_bytes, seconds)

    receive_command = (f"python3 -c {shlex.quote(TCP_RECEIVE)} {worker.fabric_ip} {RAW_TCP_PORT} "
                       f"| tar -xf - -C {tcp_dir}")
    send_command = (f"tar -C {ctx.model_dir} -cf - -T {file_list} "
                    f"| python3 -c {shlex.quote(TCP_SEND)} {worker.fabric_ip} {RAW_TCP_PORT}")

    def raw_tcp() -> float:
        """tar of the same files into a plain TCP socket on the head, out of it into tar -x on the worker.

        The receiver ends on the worker after the sender on the head: the copy's time runs from the
        sender's start (head) to the receiver's end (worker), both read from the machine's one clock.
        """
        done = f"{BENCH_DIR}/tcp.done"
        ctx.sh(worker, f"systemctl stop bench-tcp-receive 2>/dev/null; systemctl reset-failed bench-tcp-receive "
                       f"2>/dev/null; rm -f {done}", check=False)
        fresh(worker, tcp_dir)
        ctx.sh(worker, "systemd-run --quiet --unit=bench-tcp-receive --collect sh -c "
                       + shlex.quote(f"{receive_command} && date +%s%N > {done}"))
        deadline = time.monotonic() + 60
        while f"{worker.fabric_ip}:{RAW_TCP_PORT}" not in ctx.sh(worker, f"ss -Htln 'sport = :{RAW_TCP_PORT}'"):
            if time.monotonic() > deadline:
                raise BenchError(f"the raw TCP receiver did not listen on {worker.fabric_ip}:{RAW_TCP_PORT}")
        _, out = ctx.timed(head, f"date +%s%N && {send_command}")
        started = int(out.split()[0])
        deadline = time.monotonic() + 1800
        while True:
            # The unit's state first: a receiver that ended after writing its end time is found by the read after.
            state = ctx.sh(worker, "systemctl is-active bench-tcp-receive || true").strip()
            if ended := ctx.sh(worker, f"cat {done} 2>/dev/null || true").strip():
                break
            if state not in ("active", "activating") or time.monotonic() > deadline:
                log = ctx.sh(worker, "journalctl -o cat -n 5 -u bench-tcp-receive || true", check=False)
                raise BenchError(f"the raw TCP receiver ended without finishing ({state}): {log.strip()[-800:]}")
        seconds = (int(ended) - started) / 1e9
        ctx.expect_tree(worker, tcp_dir, "raw TCP copy")
        ctx.sh(worker, f"rm -rf {tcp_dir} {done}")
        return mib_per_s(ctx.total_bytes, seconds)

    s = rounds(ctx, "sync", runs, [("role", role_sync("role")), ("rsync", plain_rsync), ("tcp", raw_tcp),
                                    ("cp", local_copy), ("role_ssh", role_sync("role_ssh"))])
    cores = int(ctx.sh(head, "nproc").strip())
    pipes = ssh_pipes(ctx)
    fallback = median(s["role_ssh"])
    common = {"bytes": ctx.total_bytes, "files": len(ctx.files), "streams": ctx.sync_streams,
              "transport": ctx.sync_transport, "rsyncd_port": ctx.sync_rsyncd_port,
              "module_reported_seconds": module_seconds, "node_cores": cores, "ssh_pipe_mib_s": pipes,
              "role_over_ssh_mib_s": s["role_ssh"],
              "baseline_commands": {"rsync": f"on the head: {rsync_command}",
                                    "tcp": f"on the worker: {receive_command}; then on the head: {send_command}",
                                    "cp": f"on the head: {cp_command}"}}
    name = f"checkpoint sync head -> worker over the fabric ({ctx.sync_transport}, {ctx.sync_streams} streams)"
    fallback_note = (f"the role's ssh transport (the fallback, same streams) measured {fallback:.0f} MiB/s"
                     if fallback else "the role's ssh transport (the fallback) could not be measured")
    bound = (f"both nodes share this machine's {cores} cores: the sender's and the receiver's rsync (and for "
             "ssh, encryption and decryption) run on the same CPUs, so streams cannot add CPU that is not "
             "there; on two real Sparks each end has its own 20 cores")
    if pipes:
        bound += ("; one ssh stream alone, no rsync and no disk, moves "
                  + ", ".join(f"{v:.0f} MiB/s with {k}" for k, v in pipes.items()))
    return [
        Figure(key="sync_vs_rsync", name=name, unit="MiB/s", measured=s["role"],
               baseline_name="one `rsync -a` over ssh", baseline=s["rsync"], target_op=">=", target=2.0,
               extra=common,
               notes=[f"baseline, on the head: `{rsync_command}`", fallback_note, *([bound] if cores < 8 else [])]),
        Figure(key="sync_vs_tcp", name=name, unit="MiB/s", measured=s["role"],
               baseline_name="raw TCP copy (tar into a plain socket, tar -x out)", baseline=s["tcp"],
               target_op=">=", target=0.5, extra=common,
               notes=[f"baseline, on the worker: `{receive_command}`, then on the head: `{send_command}`; timed from "
                      "the sender's start to the receiver's end"]),
        Figure(key="sync_vs_copy", name=name, unit="MiB/s", measured=s["role"],
               baseline_name="`cp -a` on one node", baseline=s["cp"], target_op=">=", target=0.8, extra=common,
               notes=[f"baseline, on the head: `{cp_command}`; a local copy reads the page cache and writes one "
                      "filesystem, the sync also sends every byte through the network stack on the same cores"]),
    ]


# ---- 3. verification --------------------------------------------------------------------------------

def verify(ctx: Context, runs: int) -> list[Figure]:
    head = ctx.head
    record = f"{ctx.model_dir}.record.json"
    base = {"model_dir": ctx.model_dir, "record_path": record, "revision": ctx.revision,
            "shard_count": ctx.shards, "fail_on_problems": True}
    fast = StagedModule(head, ctx.control_dir, "checkpoint_verify", SYSTEM_PYTHON).stage(
        ctx.inventory, {**base, "mode": "fast"}, "verify-fast")
    deep = StagedModule(head, ctx.control_dir, "checkpoint_verify", SYSTEM_PYTHON).stage(
        ctx.inventory, {**base, "mode": "deep"}, "verify-deep")
    cores = int(ctx.sh(head, "nproc").strip())
    fast_seconds: list[float] = []
    sha_seconds: list[float] = []

    def run_fast() -> float:
        seconds, result = fast.run()
        if not result.get("ok"):
            raise BenchError(f"fast verify found problems: {result.get('problems')}")
        fast_seconds.append(seconds)
        return seconds

    def run_deep() -> float:
        seconds, result = deep.run()
        if not result.get("ok") or result.get("hashed_bytes") != ctx.total_bytes:
            raise BenchError(f"deep verify: ok={result.get('ok')} hashed {result.get('hashed_bytes')} of {ctx.total_bytes}")
        return mib_per_s(ctx.total_bytes, seconds)

    sha_command = (f"cd {ctx.model_dir} && find . -path ./.cache -prune -o -type f -print0 "
                   "| xargs -0 sha256sum >/dev/null")

    def run_sha256sum() -> float:
        # One sha256sum process over the same files (xargs may start a second one, in sequence).
        seconds, _ = ctx.timed(head, sha_command)
        sha_seconds.append(seconds)
        return mib_per_s(ctx.total_bytes, seconds)

    s = rounds(ctx, "verify", runs, [("fast", run_fast), ("deep", run_deep), ("sha256sum", run_sha256sum)])
    deep_seconds = [ctx.total_bytes / (v * (1 << 20)) if v else None for v in s["deep"]]
    return [
        Figure(key="verify_fast",
               name=f"fast verify, {ctx.shards} shards + {len(ctx.files) - ctx.shards} files (wall, in the node)",
               unit="s", measured=s["fast"], baseline_name="deep verify", baseline=deep_seconds,
               target_op="<", target=1.0, judged_on="measured", target_text="< 1 s",
               extra={"node_cores": cores}),
        Figure(key="verify_deep", name=f"deep verify (checkpoint_verify mode=deep, {cores} cores)", unit="MiB/s",
               measured=s["deep"], baseline_name="one `sha256sum` stream", baseline=s["sha256sum"],
               # Issue 14: on 2 cores at least 1.6x one sha256sum (0.8 per core), and 0.8 x cores beyond.
               target_op=">=", target=round(0.8 * cores, 2), target_text=f">= 0.8 x {cores} cores = {0.8 * cores:.2f}x",
               extra={"node_cores": cores, "bytes": ctx.total_bytes, "sha256sum_seconds": sha_seconds,
                      "baseline_command": f"on the head: {sha_command}"},
               notes=[f"baseline, on the head: `{sha_command}`",
                      f"{cores} cores shared with the other node and this machine's other work"]),
    ]


# ---- 4. fetch from the hub emulator -------------------------------------------------------------------

def fetch(ctx: Context, runs: int) -> list[Figure]:
    head = ctx.head
    python = f"{ctx.venv_dir}/bin/python"
    dest, record = f"{BENCH_DIR}/fetch", f"{BENCH_DIR}/fetch.record.json"
    staging, hf_dir, hf_home = f"{BENCH_DIR}/.fetch.partial", f"{BENCH_DIR}/hf", f"{BENCH_DIR}/hf-home"
    ctx.sh(head, f"rm -rf {BENCH_DIR} && mkdir -p {BENCH_DIR}")
    version = ctx.sh(head, f"{python} -c 'import huggingface_hub as h; print(h.__version__)'").strip()
    # As the role calls it (tasks/fetch.yml and record.yml), into a fresh directory with no record,
    # so it reads the revision's file list from the hub as `hf download` does.
    module = StagedModule(head, ctx.control_dir, "checkpoint_fetch", python).stage(ctx.inventory, {
        "repo_id": ctx.repo_id, "revision": ctx.revision, "model_dir": dest, "record_path": record,
        "staging_dir": staging, "endpoint": ctx.hub_url, "max_workers": ctx.fetch_workers,
        "progress_id": "bench"}, "fetch")

    def role_fetch() -> float:
        ctx.sh(head, f"rm -rf {dest} {record} {staging}")
        seconds, result = module.run()
        if len(result.get("fetched", [])) != len(ctx.files):
            raise BenchError(f"checkpoint_fetch fetched {len(result.get('fetched', []))} of {len(ctx.files)} files")
        ctx.expect_tree(head, dest, "checkpoint_fetch")
        ctx.sh(head, f"rm -rf {dest} {record} {staging}")
        return mib_per_s(ctx.total_bytes, seconds)

    # Progress bars off, as in the module: the comparison is of transfers, not of terminal output.
    hf_command = (f"HF_ENDPOINT={ctx.hub_url} HF_HOME={hf_home} HF_HUB_DISABLE_TELEMETRY=1 "
                  f"HF_HUB_DISABLE_PROGRESS_BARS=1 {ctx.venv_dir}/bin/hf download {ctx.repo_id} "
                  f"--revision {ctx.revision} --local-dir {hf_dir}")

    def hf_download() -> float:
        ctx.sh(head, f"rm -rf {hf_dir} {hf_home}")
        seconds, _ = ctx.timed(head, hf_command)
        ctx.expect_tree(head, hf_dir, "hf download")
        ctx.sh(head, f"rm -rf {hf_dir} {hf_home}")
        return mib_per_s(ctx.total_bytes, seconds)

    s = rounds(ctx, "fetch", runs, [("role", role_fetch), ("hf", hf_download)])
    return [Figure(
        key="fetch", name=f"fetch from the local hub emulator ({ctx.fetch_workers} workers)", unit="MiB/s",
        measured=s["role"], baseline_name=f"hf download (huggingface_hub {version})", baseline=s["hf"],
        target_op=">=", target=0.95,
        extra={"huggingface_hub": version, "bytes": ctx.total_bytes, "baseline_command": f"on the head: {hf_command}"},
        notes=[f"baseline, on the head: `{hf_command}`",
               "both clients on the head, served by one emulator process on this machine's bridge"],
    )]


FIGURES = {"sync": sync, "verify": verify, "fetch": fetch, "nochange": site_noop, "site": site_noop, "floor": task_floor,
           "restart": restart, "recovery": recovery}
# The groups measured once per engine (`--engine both`: first SGLang's, then vLLM's pair); the others do not
# depend on the engine and run once, before them. Recovery stays last within an engine: it turns the supervisor on.
PER_ENGINE = ("nochange", "site", "restart", "recovery")
ORDER = ("sync", "verify", "fetch", "floor", "nochange", "site", "restart", "recovery")


def run_figure(ctx: Context, key: str, runs: int) -> tuple[list[Figure], str | None]:
    """One figure group; an unexpected error is reported and the other groups still run."""
    load = read_loadavg()
    ctx.say(f"== {key}: {runs} round(s), load average {load}")
    try:
        figs = FIGURES[key](ctx, runs)
    except Exception as e:  # noqa: BLE001 - one broken figure must not cost the others
        ctx.say(f"{key} could not be measured: {e}")
        return [], f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
    finally:
        for n in ctx.cluster.nodes:
            ctx.sh(n, f"rm -rf {BENCH_DIR} /root/.bench-ansible", check=False)
    for f in figs:
        f.extra["load_at_start"] = load
    return figs, None


def cleanup_workdir(ctx: Context) -> None:
    close_masters(ctx.control_dir)
    shutil.rmtree(ctx.workdir, ignore_errors=True)

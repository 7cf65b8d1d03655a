"""What the checkpoint tests share: the hub emulator serving a checkpoint of the real shape, a checkpoint
fetched by the role's own module, a checkpoint site on this machine for the checkpoint playbook, and a
playbook run a test can interrupt.

The site: two inventory hosts with a local connection stand for the head and a worker, each with its
own model directory beside the other. Their fabric addresses are two loopback addresses: the sync's
rsync daemon listens on the head's (127.0.0.1), the worker's pull connects from its own (127.0.0.2),
started through a remote shell that runs it here, as ssh runs it on the worker. The hub is the local
emulator (tests/standins/hub_emulator.py), passed in.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from tests.lib.playbook import REPO, Result, children_cpu_seconds, log_run, run_playbook
from tests.lib.role_module import run_module
from tests.standins.hub_emulator import HubEmulator, _safetensors, build_checkpoint

PLAYBOOK = "playbooks/checkpoint.yml"
SCALES = "model-input-scales.safetensors"
SHARD = "model-00042-of-00120.safetensors"
CODE = "modeling_glm5_next.py"
CODE_TEXT = "import torch\n\nclass Glm5NextForConditionalGeneration:\n    pass\n"
# The hub client writes what arrives in 10 MiB chunks: a shard bigger than that leaves bytes on disk
# when its download is cut or held part-way.
BIG_SHARD_BYTES = 24 << 20
# checkpoint.yml as site.yml imports it: the inventory check and every node's room were judged before
# this run (site.yml: by its own first play and preflight; here: by the same site's first run of
# checkpoint.yml), so both plays match no host and the run is the checkpoint role alone. A site's later
# runs pass it: each of those plays costs the controller about 5 CPU-s a run and no test reads them again.
SITE_STEP = {"spark_inventory_checked": True, "spark_room_checked": True}


def free_port() -> int:
    """A TCP port nothing listens on now, on the loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grow_shard(source: Path) -> int:
    """Make SHARD of a built commit bigger than the client's write chunk (its own file: the commits share
    unchanged files as hard links). Returns its size."""
    shard = source / SHARD
    shard.unlink()
    shard.write_bytes(_safetensors({"model.layers.41.mlp.experts.weight_packed": os.urandom(BIG_SHARD_BYTES)}))
    return shard.stat().st_size


def hub_stats(cluster) -> dict:
    """The bytes the harness's hub emulator has served, per file (its /_emulator/stats)."""
    with urllib.request.urlopen(f"{cluster.hub_url}/_emulator/stats", timeout=10) as resp:  # noqa: S310 - the harness hub
        return json.loads(resp.read())["bytes_served"]


@contextlib.contextmanager
def serve_hub(root: Path, *, seed: int | None = None, host: str = "127.0.0.1", code: bool = False,
              big_shard: bool = False):
    """The hub emulator on ``host`` serving a checkpoint of the real shape built under ``root``.

    The emulator carries ``info`` (build_checkpoint's: repo_id, the old and new commits, file names)
    and ``source`` (the new commit's files). ``code``: the new commit also holds CODE (a code file
    the server would run); ``big_shard``: its SHARD is bigger than the client's write chunk.
    """
    info = build_checkpoint(root) if seed is None else build_checkpoint(root, seed=seed)
    source = Path(root) / info["repo_id"] / info["new"]
    if big_shard:
        grow_shard(source)
    if code:
        (source / CODE).write_text(CODE_TEXT)
    with HubEmulator(root, host=host) as emulator:
        emulator.info = info
        emulator.source = source
        yield emulator


def fetch_checkpoint(hub, base: Path, tmp: Path | None = None, **kw) -> dict:
    """checkpoint_fetch of the hub's new commit into ``base``/glm53 (its record beside it), run as Ansible
    runs the module; returns the module's result."""
    return run_module("checkpoint_fetch", {
        "repo_id": hub.info["repo_id"], "revision": hub.info["new"], "model_dir": str(base / "glm53"),
        "endpoint": hub.url, **kw}, tmp or base)


def changed_tasks(result) -> list[str]:
    """'host: task' of every task a playbook run reported changed."""
    return [f"{d['host']}: {d['task']}" for d in result.changed]


def make_site(base: Path, hub, host_vars: dict[str, dict] | None = None) -> dict:
    """Inventory, model directories and the extra vars of a two-host site served by ``hub``.

    ``host_vars``: more inventory variables per host (spark-0, the head; spark-1, the worker), for a run
    that gives each host a value of its own (a variable set there must not be passed as an extra var too).
    """
    more = host_vars or {}
    base.mkdir(parents=True, exist_ok=True)
    rsh = base / "fake-rsh"
    rsh.write_text('#!/bin/sh\nwhile [ "$1" = "-l" ]; do shift 2; done\nshift\nexec sh -c "$*"\n')
    rsh.chmod(rsh.stat().st_mode | stat.S_IXUSR)
    common = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    # Distinct fabric addresses, as the inventory check demands: the sync's daemon listens on the head's,
    # the worker's pull comes from its own.
    inventory = {"spark": {"children": {
        "spark_head": {"hosts": {"spark-0": {**common, "spark_fabric_ip": "127.0.0.1",
                                             "spark_model_dir": str(base / "head" / "glm53"),
                                             **more.get("spark-0", {})}}},
        "spark_workers": {"hosts": {"spark-1": {**common, "spark_fabric_ip": "127.0.0.2",
                                                "spark_model_dir": str(base / "worker" / "glm53"),
                                                **more.get("spark-1", {})}}},
    }}}
    (base / "hosts.yml").write_text(yaml.safe_dump(inventory))
    return {
        "base": base,
        "inventory": base / "hosts.yml",
        "head": base / "head" / "glm53",
        "worker": base / "worker" / "glm53",
        "partial": base / "head" / ".glm53.partial",
        "vars": {
            "checkpoint_revision": hub.info["new"],
            "checkpoint_hf_endpoint": hub.url,
            # The toolchain venv already holds the pinned client, so the install task has nothing to do.
            "checkpoint_venv_dir": str(Path(sys.executable).parent.parent),
            "checkpoint_sync_ssh_command": str(rsh),
            # A port of the site's own: local sites of other tests may sync at the same time.
            "checkpoint_sync_rsyncd_port": free_port(),
            # A round of the role's progress loop ends when the transfer does (or dies), so this bounds only how
            # often a transfer that runs on prints, one a test holds, say: each round is a module run and an
            # include on the controller, and a fetch of this small checkpoint now ends in its first round.
            "checkpoint_progress_interval": 5,
            "checkpoint_disk_reserve_bytes": 0,
            # The room checkpoint.yml measures first (preflight's disk rule) for this small checkpoint, as the
            # simulated nodes' test site sets it (tests/inventory/group_vars/spark/preflight.yml).
            "preflight_checkpoint_bytes": 1 << 30,
            "preflight_disk_headroom_bytes": 100 << 20,
        },
    }


def play(site: dict, check: bool = False, **extra):
    """The checkpoint playbook through ansible-runner, to its end."""
    return run_playbook(PLAYBOOK, site["inventory"], extravars={**site["vars"], **extra}, check=check, timeout=900)


class Operator:
    """ansible-playbook started as an operator starts it in a terminal, so that it can be interrupted.

    Its own session and process group, as a terminal's foreground job: ``interrupt`` sends SIGINT to
    the whole group, which is what Ctrl-C does. Output goes to a file the test can read meanwhile. Once
    reaped, the run is logged with its controller CPU like run_playbook's (the pytest summary's playbook
    runs); start one only after the one before it has ended, or their CPU mixes.
    """

    def __init__(self, site: dict, name: str, **extra):
        self.started, self.cpu_before, self.logged = time.monotonic(), children_cpu_seconds(), False
        self.out = site["base"] / f"{name}.out"
        extravars = site["base"] / f"{name}.vars.json"
        extravars.write_text(json.dumps({**site["vars"], **extra}))
        bindir = str(Path(sys.executable).parent)
        env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
               "ANSIBLE_FORCE_COLOR": "0", "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(Path(bindir) / "ansible-playbook"), "-i", str(site["inventory"]), "-e", f"@{extravars}",
                 str(REPO / PLAYBOOK)],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_output(self, text: str, timeout: float) -> bool:
        """Whether ``text`` appeared in the output (polled) before the run ended or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return True
            if self.proc.poll() is not None:
                return text in self.output()
            time.sleep(0.2)
        return False

    def interrupt(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)

    def wait(self, timeout: float = 900) -> int:
        rc = self.proc.wait(timeout)
        self._log(rc)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self._log(self.proc.returncode)

    def _log(self, rc: int) -> None:
        if not self.logged:
            self.logged = True
            log_run(PLAYBOOK, False, Result(rc=rc, status="interrupted" if rc else "successful", stdout=self.output()),
                     time.monotonic() - self.started, children_cpu_seconds() - self.cpu_before)

"""Commands on the simulated nodes, timed inside the node, and the role's modules run there as Ansible runs them.

Timing happens inside the node (the nodes share this machine's clock), so SSH connection set-up and
this process's own load stay out of every figure. A module of the role is run from the very
AnsiballZ payload Ansible ships (kept with ANSIBLE_KEEP_REMOTE_FILES, exploded once, then executed
per round), so a figure measures the module's code path, imports included, without the controller's
per-task overhead that a playbook would add to a transfer of a few seconds.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.harness import cluster as sim

REPO = Path(__file__).resolve().parents[1]
_BIN = Path(sys.executable).parent


class BenchError(RuntimeError):
    """A benchmark step did not do what it should; its figure gets no sample."""


def ssh_argv(node: sim.Node, control_dir: Path) -> list[str]:
    """The harness's SSH command with a multiplexed connection of our own.

    Dozens of set-up and check commands per round would otherwise each pay a key exchange.
    """
    base = sim.ssh_base(node)
    return [*base[:-1], "-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir}/n-%C",
            "-o", "ControlPersist=900", base[-1]]


def sh(node: sim.Node, control_dir: Path, command: str, *, timeout: float = 600, check: bool = True) -> str:
    proc = subprocess.run([*ssh_argv(node, control_dir), command], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise BenchError(f"{node.name}: {command!r} failed ({proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
    return proc.stdout


def timed(node: sim.Node, control_dir: Path, command: str, *, timeout: float = 1800,
          flush: str = "/opt") -> tuple[float, str]:
    """Run `command` in the node and return (seconds it took there, its stdout).

    Dirty pages of the previous step are written back first (syncfs of `flush`, not timed), so one
    step's writeback does not land in the next step's time.
    """
    marker = "@@BENCH@@"
    script = (
        f"sync -f {shlex.quote(flush)} 2>/dev/null || sync\n"
        "out=$(mktemp) err=$(mktemp)\n"
        "s=$(date +%s%N)\n"
        f"( {command} ) >\"$out\" 2>\"$err\"\n"
        "rc=$?\n"
        "e=$(date +%s%N)\n"
        f"echo \"{marker} $rc $((e - s))\"\n"
        "cat \"$out\"; if [ $rc -ne 0 ]; then tail -c 3000 \"$err\"; fi\n"
        "rm -f \"$out\" \"$err\"\n"
    )
    text = sh(node, control_dir, script, timeout=timeout)
    head, _, rest = text.partition("\n")
    parts = head.split()
    if len(parts) != 3 or parts[0] != marker:
        raise BenchError(f"{node.name}: no timing from {command!r}: {text[-1500:]}")
    rc, ns = int(parts[1]), int(parts[2])
    if rc != 0:
        raise BenchError(f"{node.name}: {command!r} exited {rc}: {rest.strip()[-2000:]}")
    return ns / 1e9, rest


def tree_bytes(node: sim.Node, control_dir: Path, directory: str) -> tuple[int, int]:
    """(files, bytes) of the regular files under directory, outside client metadata (.cache/)."""
    out = sh(node, control_dir, f"find {shlex.quote(directory)} -path '*/.cache' -prune -o -type f -printf '%s\\n'")
    sizes = [int(x) for x in out.split()]
    return len(sizes), sum(sizes)


def close_masters(control_dir: Path) -> None:
    """Stop the SSH control masters whose sockets are in control_dir (ours only)."""
    if not control_dir.is_dir():
        return
    for sock in control_dir.iterdir():
        if sock.is_socket():
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "bench"], capture_output=True,
                           timeout=30, check=False)


@dataclass
class StagedModule:
    """One of the collection's modules (the checkpoint role's), ready to run on `node` with fixed arguments."""

    node: sim.Node
    control_dir: Path
    module: str
    python: str
    wrapper: str = ""

    def stage(self, inventory: Path, args: dict, label: str) -> StagedModule:
        """Let Ansible build and ship the module once (check mode: nothing happens), keep its payload."""
        remote_tmp = f"/root/.bench-ansible/{label}"
        sh(self.node, self.control_dir, f"rm -rf {remote_tmp}")
        env = dict(
            os.environ,
            ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
            ANSIBLE_KEEP_REMOTE_FILES="1",
            ANSIBLE_REMOTE_TMP=remote_tmp,
            ANSIBLE_SSH_CONTROL_PATH_DIR=str(self.control_dir),
            ANSIBLE_NOCOLOR="1",
        )
        proc = subprocess.run(
            [str(_BIN / "ansible"), self.node.name, "-i", str(inventory), "-m", f"dgx_spark.llm_serving.{self.module}",
             "-a", json.dumps(args), "--check", "-e", f"ansible_python_interpreter={self.python}"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        )
        if proc.returncode != 0:
            raise BenchError(f"staging {self.module} on {self.node.name} failed: {proc.stdout[-2000:]}{proc.stderr[-1000:]}")
        found = sh(self.node, self.control_dir,
                   f"ls -1 {remote_tmp}/ansible-tmp-*/AnsiballZ_{self.module}.py").split()
        if len(found) != 1:
            raise BenchError(f"expected one kept AnsiballZ_{self.module}.py on {self.node.name}, found {found}")
        self.wrapper = found[0]
        workdir = os.path.dirname(self.wrapper)
        sh(self.node, self.control_dir, f"cd {workdir} && {self.python} {self.wrapper} explode >/dev/null")
        params = json.loads(sh(self.node, self.control_dir, f"cat {workdir}/debug_dir/args"))
        # Staged in check mode so that nothing moved; the timed runs are real.
        params["ANSIBLE_MODULE_ARGS"]["_ansible_check_mode"] = False
        params["ANSIBLE_MODULE_ARGS"]["_ansible_keep_remote_files"] = False
        sh(self.node, self.control_dir, f"cat > {workdir}/debug_dir/args <<'EOF'\n{json.dumps(params)}\nEOF")
        return self

    def run(self, *, timeout: float = 1800) -> tuple[float, dict]:
        """(seconds in the node, module result); a failed module is an error, not a sample."""
        workdir = os.path.dirname(self.wrapper)
        seconds, out = timed(self.node, self.control_dir, f"cd {workdir} && {self.python} {self.wrapper} execute",
                             timeout=timeout)
        try:
            result = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError) as e:
            raise BenchError(f"{self.module} printed no result: {out[-1500:]}") from e
        if result.get("failed"):
            raise BenchError(f"{self.module} failed: {result.get('msg')}")
        return seconds, result

"""What every figure shares: the run's context, the rounds that measure a figure beside its baseline, and
the Ansible settings each side runs with. Figures import it; it imports no figure."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness import cluster as sim
from tests.lib.vllm_image import sm121_fix_build

from .nodes import REPO, BenchError, sh, timed, tree_bytes

# What the test inventory turns off to save the tests time, back as a site gets it: figures are taken on the
# product's defaults (tests/inventory/group_vars/spark/monitoring.yml and server.yml say why they differ).
PRODUCT_DEFAULTS = {"spark_monitoring": True, "supervisor_enabled": True}
# Per engine: what a site of it sets over the product's defaults, whether it runs on the derived image (the recipe's
# sparse-MLA fix built on the head), and why it differs, for the figures' notes.
ENGINES = {
    "sglang": {"settings": {}, "derived_image": False, "note": ""},
    "vllm": {"settings": {"spark_engine": "vllm"}, "derived_image": True,
             "note": "vLLM on the derived image with the recipe's sparse-MLA fix (built on the head, loaded on the "
                     "worker)"},
}
BENCH_DIR = "/opt/bench"  # scratch on the nodes, outside the deployed checkpoint
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass
class Context:
    cluster: sim.Cluster
    workdir: Path  # controller-side scratch, removed at the end
    control_dir: Path
    hub_url: str
    repo_id: str
    revision: str
    model_dir: str  # the converged checkpoint on every node (spark_model_dir of the test site)
    venv_dir: str  # checkpoint_venv_dir: the hub client the role installed on the head
    fetch_workers: int
    sync_streams: int
    sync_ssh_command: str
    sync_transport: str = "rsyncd"  # checkpoint_sync_transport
    sync_rsyncd_port: int = 28730  # checkpoint_sync_rsyncd_port (the first worker's)
    shards: int = 120
    files: list[str] = field(default_factory=list)
    total_bytes: int = 0
    log: list[str] = field(default_factory=list)
    engine: str = "sglang"  # the engine the pair serves with now (ENGINES)

    @property
    def inventory(self) -> Path:
        return self.cluster.inventory

    @property
    def head(self) -> sim.Node:
        return self.cluster.nodes[0]

    @property
    def worker(self) -> sim.Node:
        return self.cluster.nodes[1]

    @property
    def extravars(self) -> dict:
        # The verify role writes its report on the controller: into our scratch, not the checkout.
        return {**PRODUCT_DEFAULTS, **self.engine_settings, "checkpoint_revision": self.revision,
                "checkpoint_hf_endpoint": self.hub_url, "verify_report_dir": str(self.workdir / "reports")}

    @property
    def engine_settings(self) -> dict:
        """The settings that make the site serve with `engine`, the derived image's build context among them."""
        spec = ENGINES[self.engine]
        if not spec["derived_image"]:
            return dict(spec["settings"])
        context = self.workdir / f"{self.engine}-image-build"
        context.mkdir(exist_ok=True)
        return {**spec["settings"], **sm121_fix_build(context)}

    def say(self, msg: str) -> None:
        line = f"bench: {msg}"
        print(line, flush=True)
        self.log.append(line)

    def sh(self, node: sim.Node, command: str, **kw) -> str:
        return sh(node, self.control_dir, command, **kw)

    def timed(self, node: sim.Node, command: str, **kw) -> tuple[float, str]:
        return timed(node, self.control_dir, command, **kw)

    def expect_tree(self, node: sim.Node, directory: str, what: str) -> None:
        """A copy that is short of the checkpoint must not count as a fast copy."""
        nfiles, nbytes = tree_bytes(node, self.control_dir, directory)
        if nfiles != len(self.files) or nbytes != self.total_bytes:
            raise BenchError(f"{what} left {nfiles} files / {nbytes} bytes in {node.name}:{directory}, "
                             f"expected {len(self.files)} / {self.total_bytes}")


def rounds(ctx: Context, name: str, runs: int, steps: list, order_rotates: bool = True) -> dict[str, list]:
    """Run the steps once per round, rotating their order so drift in background load is shared.

    A step that fails leaves None for that round (reported), the others still count.
    """
    samples: dict[str, list] = {key: [] for key, _ in steps}
    for r in range(runs):
        shift = r % len(steps) if order_rotates else 0
        for key, step in steps[shift:] + steps[:shift]:
            try:
                value = step()
                ctx.say(f"{name} round {r + 1}/{runs}: {key} = {value:.3f}")
            except (BenchError, OSError, TimeoutError) as e:
                value = None
                ctx.say(f"{name} round {r + 1}/{runs}: {key} FAILED: {e}")
            samples[key].append(value)
    return samples


# ---- 1. no-change re-run of site.yml ---------------------------------------------------------------

def defaults_config(ctx: Context) -> Path:
    """Ansible's defaults, plus only what a run needs to find the project (its roles and collections, this one
    among them) and to trust host keys.

    No pipelining, the default ssh_args (-C -o ControlMaster=auto -o ControlPersist=60s, so connections
    are reused within the run), forks 5, implicit gathering (every play here says gather_facts: false),
    interpreter discovery (auto), the default connection timeout.
    """
    path = ctx.workdir / "ansible-defaults.cfg"
    path.write_text(
        "# Written by benchmarks/figures.py: Ansible defaults for everything that bears on speed.\n"
        "[defaults]\n"
        f"roles_path = {REPO / 'roles'}\n"
        f"collections_path = {REPO / '.collections'}\n"
        f"inventory = {ctx.inventory}\n"
        "host_key_checking = True\n"
        "retry_files_enabled = False\n"
    )
    return path


# What ansible-runner puts in every run's environment (ansible_runner/config/_base.py), on both sides
# alike; everything else comes from the config file. ANSIBLE_* variables of the shell that started
# the benchmark are not passed on (see no_inherited_ansible_env).
RUNNER_ENV = {"ANSIBLE_STDOUT_CALLBACK": "awx_display", "ANSIBLE_RETRY_FILES_ENABLED": "False",
              "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_CACHE_PLUGIN": "jsonfile"}
# The settings that bear on a run's speed, as ansible-config names them.
SPEED_SETTINGS = ("DEFAULT_FORKS", "DEFAULT_STRATEGY", "DEFAULT_GATHERING", "INTERPRETER_PYTHON", "CACHE_PLUGIN",
                  "DEFAULT_TIMEOUT")
SSH_SETTINGS = ("pipelining", "ssh_args", "ssh_common_args", "ssh_extra_args")


@contextlib.contextmanager
def no_inherited_ansible_env():
    """Run without the caller's ANSIBLE_* variables: ansible-runner copies os.environ into every run,
    so an exported ANSIBLE_SSH_ARGS= (which turns connection reuse off) or ANSIBLE_PIPELINING would
    silently change the baseline (or the project's side) away from what its config file says."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("ANSIBLE_")}
    for k in saved:
        del os.environ[k]
    try:
        yield
    finally:
        os.environ.update(saved)


def effective_settings(config: Path, control_dir: Path) -> dict:
    """The speed settings a run with `config` gets, as ansible-config reports them in the run's environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(RUNNER_ENV, ANSIBLE_CONFIG=str(config), ANSIBLE_SSH_CONTROL_PATH_DIR=str(control_dir))
    ansible_config = str(Path(sys.executable).parent / "ansible-config")
    out = subprocess.run([ansible_config, "dump", "-t", "all", "--format", "json"], env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    dump = json.loads(out)
    found = {e["name"]: e["value"] for e in dump if isinstance(e, dict) and e.get("name") in SPEED_SETTINGS}
    for entry in dump:
        for ssh in (entry.get("CONNECTION_PLUGINS") or []) if isinstance(entry, dict) else []:
            for option in ssh.get("ssh") or []:
                if option.get("name") in SSH_SETTINGS:
                    found[f"ssh {option['name']}"] = option.get("value")
    return found


def settings_text(settings: dict) -> str:
    return "; ".join(f"{k.removeprefix('DEFAULT_').lower()}={v!r}" for k, v in sorted(settings.items()))


def task_seconds(events: list[dict]) -> Counter:
    """Wall seconds per task: from its start event to the next task's (or the recap's)."""
    marks = [(e["created"], f"{e['event_data'].get('role') or '-'}: {e['event_data'].get('task')}")
             for e in events if e.get("event") in ("playbook_on_task_start", "playbook_on_stats")]
    out: Counter = Counter()
    for (a, name), (b, _) in zip(marks, marks[1:], strict=False):
        out[name] += (datetime.datetime.fromisoformat(b) - datetime.datetime.fromisoformat(a)).total_seconds()
    return out


def node_task_counts(r) -> dict[str, int]:
    """What a run did on the nodes: task results that reached a node (ok, changed, failed or unreachable on a
    node, not delegated to the controller), those skipped there, and those that ran on the controller."""
    counts = {"on_nodes": 0, "skipped": 0, "controller": 0}
    for e in r.task_events():
        kind, data = e["event"], e["event_data"]
        if kind == "runner_on_start":
            continue
        delegated = data.get("res", {}).get("_ansible_delegated_vars", {}).get("ansible_delegated_host")
        if data.get("host") == "localhost" or delegated == "localhost":
            counts["controller"] += 1
        elif kind == "runner_on_skipped":
            counts["skipped"] += 1
        else:
            counts["on_nodes"] += 1
    return counts

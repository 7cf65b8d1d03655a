"""What the doctor's integration tests share: running playbooks/doctor.yml, reading its bundle and
output, and waiting on the rank units of simulated nodes (every wait ends on the event)."""

from __future__ import annotations

import json
import shlex
import tarfile
import time
from pathlib import Path

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook
from tests.lib.supervised import UNIT

SHOW = "Show the node's state, last lines and findings"
BUNDLE = "Write the bundle of every node's redacted files and the summary"


def node(cluster, name):
    return next(n for n in cluster.nodes if n.name == name)


def sh(n, command, check=True):
    return sim.ssh(n, command, timeout=120, check=check)


def run_doctor(cluster, out_dir: Path, check=False, **extravars):
    """The doctor as an operator runs it: with the inventory alone (plus `extravars`), none of the -e that
    deployed the group. Returns (result, {bundle path: text}, bundle)."""
    result = run_playbook("playbooks/doctor.yml", cluster.inventory, check=check,
                          extravars={"doctor_bundle_dir": str(out_dir), **extravars})
    assert result.rc == 0, result.stdout[-4000:]
    bundles = sorted(out_dir.glob("doctor-*.tar.gz"))
    assert len(bundles) == (0 if check else 1), list(out_dir.iterdir())
    return result, (bundle_files(bundles[0]) if bundles else {}), (bundles[0] if bundles else None)


def bundle_files(bundle: Path) -> dict[str, str]:
    with tarfile.open(bundle) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode("utf-8", errors="replace")
                for m in tar.getmembers() if m.isfile()}


def findings(files, host):
    """The current findings of `host` in the bundle, by id."""
    return {f["id"]: f for f in json.loads(files[f"{host}/findings.json"])}


def history(files, host):
    return json.loads(files[f"{host}/history.json"])


def drift(files, host):
    return {d["what"]: (d["inventory"], d["node"]) for d in json.loads(files[f"{host}/drift.json"])}


def shown(result):
    """What the doctor printed for every node (state, last lines, findings)."""
    return "\n".join("\n".join(r.get("msg") or []) for r in result.results(SHOW).values())


def unit_state(n):
    out = sh(n, f"systemctl show {UNIT} -p ActiveState,SubState,Result,ExecMainStatus")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_on_node(n, condition: str, timeout: float, what) -> None:
    """Until `condition` (a shell test) holds on the node: one ssh, the loop runs there (no ssh per look).
    `what()` says what never happened."""
    seconds = max(1, int(timeout + 0.999))
    out = sim.ssh(n, f"end=$((SECONDS + {seconds})); until {condition}; do [ $SECONDS -lt $end ] || "
                     "{ echo timeout; exit 0; }; sleep 0.2; done; echo ok", check=False, timeout=seconds + 60)
    assert out.split()[-1:] == ["ok"], what()


def wait_down(cluster, *names, timeout=90):
    """Until each rank's main process has exited (failed, waiting to restart, or inactive)."""
    deadline = time.monotonic() + timeout
    for name in names:
        n = node(cluster, name)
        wait_on_node(n, f"systemctl show {UNIT} -p ActiveState,SubState | grep -qxE "
                         "'ActiveState=(failed|inactive)|SubState=auto-restart'",
                      deadline - time.monotonic(), lambda n=n, name=name: f"{name}: {UNIT} still {unit_state(n)}")


def wait_journal(cluster, name, text, timeout=60):
    """Until the rank's journal holds `text`."""
    wait_on_node(node(cluster, name), f"journalctl -u {UNIT} -o cat --no-pager | grep -qF -- {shlex.quote(text)}",
                  timeout, lambda: f"{name}: {text!r} never in the journal")


def stop(cluster, *names):
    """What an operator (or server.yml's failed readiness) does: stop, so no restart is pending."""
    for name in names:
        sh(node(cluster, name), f"systemctl stop {UNIT}")

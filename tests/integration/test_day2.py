"""Day-2 verbs on a TP=2 group deployed by playbooks/server.yml on simulated nodes.

The stand-ins (docker CLI, SGLang server) run the real unit; the playbooks
reach the nodes over SSH like on DGX OS. First, on the pair as it booted, a
restart is refused; then the tests run in file order on one deployment:
status, verify, doctor, a restart under --limit, stop. The restart under
--limit runs once (module fixture `restarted_under_limit`) and feeds two
tests: restart.yml ends with verify.yml's role (verify), whose JSON report
the verify test reads, so the group is not asked the verify questions twice.
"""

from __future__ import annotations

import json
import tarfile

import pytest

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook

# What checkpoint.yml leaves behind (files, record, deep stamp at a claimed pin), in its smallest form.
from tests.lib.supervised import REVISION, UNIT, checkpoint_files, node_file

pytestmark = pytest.mark.slow

# The server role's readiness runs in rounds up to this many seconds; the
# stand-in group is up in about two minutes.
READINESS = 300
def sh(node, command):
    return sim.ssh(node, command, timeout=120)


def unit_times(node):
    """(stopped at, started at, state) of the unit in microseconds since the epoch (one clock: same kernel)."""
    out = sh(node, f"systemctl show {UNIT} -p InactiveEnterTimestampMonotonic,ActiveEnterTimestampMonotonic,ActiveState")
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return int(props["InactiveEnterTimestampMonotonic"]), int(props["ActiveEnterTimestampMonotonic"]), props["ActiveState"]


def test_a_restart_of_a_group_never_deployed_is_refused_with_the_fix_before_any_stop(sim_cluster):
    # First in the file: the pair as it booted, before the module's deployment; the worker's unit masked as well,
    # which no start gets past either.
    worker = sim_cluster.nodes[1]
    refused = {}
    for masked in (False, True):
        if masked:
            sh(worker, f"systemctl mask {UNIT}")
        try:
            refused[masked] = run_playbook("playbooks/restart.yml", sim_cluster.inventory)
        finally:
            sh(worker, f"systemctl unmask {UNIT}")
    not_installed = (f"Nothing to restart: {UNIT} is not installed on {{}} (never deployed there, or uninstalled). "
                     "Deploy the group first: ansible-playbook site.yml -i <inventory> (or playbooks/server.yml where "
                     "the checkpoint and the fabric are already in place).")
    assert refused[False].failure_messages() == not_installed.format("spark-0, spark-1")
    assert refused[True].failure_messages() == not_installed.format("spark-0") + (
        f" {UNIT} is masked on spark-1, so no rank can start there (someone took it out of service by hand). Fix: "
        f"systemctl unmask {UNIT} on each, then run this again.")
    for result in refused.values():
        assert result.rc != 0
        assert {d["task"] for d in result.failed} == {"Refuse to restart a group that is not deployed"}, \
            result.stdout[-3000:]
        assert result.changed == []
        assert [e for e in result.task_events() if e["event_data"].get("task") == "Stop every rank, the head first"] == []


@pytest.fixture(scope="module")
def deployed(sim_cluster):
    for n in sim_cluster.nodes:
        # What checkpoint.yml and fabric.yml leave behind, in the smallest form the server role and stand-in accept.
        sh(n, checkpoint_files() + " && (ip -o addr show dev enp1s0f1np1 | grep -q ' "
              f"{n.fabric_ip}/' || ip addr add {n.fabric_ip}/24 dev enp1s0f1np1)")
    result = run_playbook("playbooks/server.yml", sim_cluster.inventory,
                          extravars={"server_readiness_timeout": READINESS, "checkpoint_revision": REVISION})
    assert result.rc == 0, result.stdout[-4000:]
    yield sim_cluster
    # Leave the nodes as other test modules expect them: no server unit installed.
    for n in sim_cluster.nodes:
        sim.ssh(n, f"systemctl disable --now {UNIT}; rm -f /etc/systemd/system/{UNIT}; rm -rf /etc/spark-llm; "
                   f"systemctl daemon-reload; systemctl reset-failed {UNIT}; true", check=False)


def test_status_has_one_line_per_node(deployed):
    result = run_playbook("playbooks/status.yml", deployed.inventory)
    assert result.rc == 0, result.stdout[-3000:]
    lines = {h: r["msg"] for h, r in result.results("Show one line per node").items()}
    assert set(lines) == {"spark-0", "spark-1"}
    head, worker = lines["spark-0"], lines["spark-1"]
    assert head.startswith("spark-0 head: unit active/running;")
    assert "image lmsysorg/sglang:glm-5.3-flash-arm64 (" in head
    assert "endpoint healthy, serves /models/glm53" in head
    assert f"checkpoint {REVISION} (verified yes)" in head and f"checkpoint {REVISION} (verified yes)" in worker
    assert worker.startswith("spark-1 worker: unit active/running;") and "endpoint n/a (worker)" in worker
    assert not result.changed


@pytest.fixture(scope="module")
def restarted_under_limit(deployed, tmp_path_factory):
    """restart.yml --limit the worker, run once: (start times before it, its result, its verify report)."""
    head, worker = deployed.nodes
    before = unit_times(head)[1], unit_times(worker)[1]
    # What each node wrote to /proc/sys/vm/drop_caches so far (its stand-in file, tests/standins/README.md) goes:
    # the restart's starts must write it again.
    for n in deployed.nodes:
        node_file(n, sim.DROP_CACHES).write_text("")
    report = tmp_path_factory.mktemp("verify") / "verify.json"
    result = run_playbook("playbooks/restart.yml", deployed.inventory, limit=worker.name,
                          extravars={"server_readiness_timeout": READINESS,
                                     "verify_report_path": str(report)})
    return before, result, report


def test_verify_passes_on_the_deployed_group(deployed, restarted_under_limit):
    # The verify step of the restart run (verify, as in verify.yml) wrote the report.
    _, result, report = restarted_under_limit
    assert result.rc == 0, result.stdout[-3000:]
    data = json.loads(report.read_text())
    # Secure by default: the generated key is sent, and no key or a wrong one gets 401 (the auth row).
    assert data["ok"] and [c["name"] for c in data["checks"]] == ["models", "reasoning", "tool_call", "sanity", "gate", "auth"]
    assert data["endpoint"] == f"http://{deployed.nodes[0].mgmt_ip}:30000"


def test_a_short_soak_on_the_pair_reports_its_bursts_and_each_rank_s_memory(deployed, tmp_path):
    """quality.yml's soak against the group's head, over the network, with the ranks' memory read on the nodes."""
    result = run_playbook("playbooks/quality.yml", deployed.inventory, extravars={
        "verify_report_dir": str(tmp_path), "verify_quality_rounds": 1, "verify_soak_seconds": 3,
        "verify_soak_burst_seconds": 1, "verify_soak_idle_seconds": 0.5, "verify_soak_max_tokens": 8,
        # The simulated nodes share this machine's memory, which other work moves: only the engine's figures are
        # judged here.
        "verify_soak_max_memory_growth_gib": 1000})
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    (written,) = tmp_path.glob("soak-*.json")
    report = json.loads(written.read_text())
    figures = report["soak"]
    assert len(figures["bursts"]) >= 2 and figures["requests"] > 2 * len(figures["bursts"]), figures
    assert (figures["errors"], report["failed"]) == (0, [])
    assert set(report["memory_growth_gib"]) == {n.name for n in deployed.nodes}, report["memory_growth_gib"]
    assert result.changed == []


def test_doctor_reads_the_flags_from_the_running_unit(deployed, tmp_path):
    result = run_playbook("playbooks/doctor.yml", deployed.inventory, extravars={"doctor_bundle_dir": str(tmp_path)})
    assert result.rc == 0, result.stdout[-3000:]
    (bundle,) = tmp_path.glob("doctor-*.tar.gz")
    with tarfile.open(bundle) as tar:
        flags = json.loads(tar.extractfile(f"{bundle.name[:-7]}/spark-0/flags.json").read())
        found = json.loads(tar.extractfile(f"{bundle.name[:-7]}/spark-0/findings.json").read())
        args = json.loads(tar.extractfile(f"{bundle.name[:-7]}/spark-1/server-args.json").read())
    assert flags["source"] == "unit"
    assert flags["flags"]["max-running-requests"] == "2" and flags["flags"]["context-length"] == "65536"
    assert args[args.index("--node-rank") + 1] == "1"
    # A healthy group: no log fingerprint (fabric probes may still speak: the sim's link has MTU 1500).
    log_ids = {"hybrid_state_cache", "tilelang_shared_memory", "processor_config_missing", "distributed_timeout",
               "init_hang", "out_of_memory", "download_at_boot", "unit_missing", "env_host_ip", "env_ifname", "env_offline"}
    assert log_ids & {f["id"] for f in found} == set(), found


def test_restart_under_limit_restarts_every_rank_head_stopped_first_workers_started_first(deployed, restarted_under_limit):
    """--limit names one rank; the TP group still restarts whole (the others by delegation)."""
    head, worker = deployed.nodes
    before, result, _ = restarted_under_limit
    assert result.rc == 0, result.stdout[-4000:]
    h_stop, h_start, h_state = unit_times(head)
    w_stop, w_start, w_state = unit_times(worker)
    assert (h_state, w_state) == ("active", "active")
    assert h_start > before[0] and w_start > before[1], "both ranks restarted"
    assert h_stop < w_stop, "head stopped first"
    assert w_start < h_start, "workers started first"
    table = "\n".join(result.results("Show the verification table")[worker.name]["msg"])
    assert table.count("PASS") == 6, table


def test_each_rank_start_drops_the_page_cache_first(deployed, restarted_under_limit):
    """The unit writes out dirty pages and drops the page cache before docker run: on both ranks, at the restart."""
    _, result, _ = restarted_under_limit
    assert result.rc == 0, result.stdout[-4000:]
    for n in deployed.nodes:
        drop = node_file(n, sim.DROP_CACHES)
        assert drop.read_text().strip() == "3", n.name
        started = int(sh(n, f"systemctl show {UNIT} -p ActiveEnterTimestamp --value --timestamp=unix").strip().lstrip("@"))
        assert int(drop.stat().st_mtime) <= started, (n.name, drop.stat().st_mtime, started)


def test_restart_brings_back_a_rank_whose_crash_loop_hit_the_start_limit(deployed):
    """A worker whose starts failed (driver not loaded) until systemd refused it; the cause then goes away."""
    head, worker = deployed.nodes
    sim.set_knobs(deployed.instance, worker.name, {"gpu": {"present": False}})
    try:
        # Each start fails at once; after the unit's StartLimitBurst (3 per hour) systemd refuses the next ones.
        sh(worker, f"for i in 1 2 3 4 5; do systemctl restart {UNIT} || true; sleep 1; done; true")
        # A plain start is refused now: the state `playbooks/restart.yml` must clear.
        refused = sh(worker, f"systemctl start {UNIT} 2>&1; echo rc=$?; journalctl -u {UNIT} -n 3 --no-pager")
        assert "rc=0" not in refused and "Start request repeated too quickly" in refused, refused
    finally:
        sim.set_knobs(deployed.instance, worker.name, {"gpu": {"present": True}})
    result = run_playbook("playbooks/restart.yml", deployed.inventory,
                          extravars={"server_readiness_timeout": READINESS})
    assert result.rc == 0, result.stdout[-4000:]
    assert [unit_times(n)[2] for n in deployed.nodes] == ["active", "active"]
    table = "\n".join(result.results("Show the verification table")[head.name]["msg"])
    assert table.count("PASS") == 6, table


def test_stop_in_check_mode_changes_nothing(deployed):
    result = run_playbook("playbooks/stop.yml", deployed.inventory, check=True)
    assert result.rc == 0, result.stdout[-3000:]
    assert [unit_times(n)[2] for n in deployed.nodes] == ["active", "active"]


def test_stop_with_limit_still_stops_every_rank_head_first(deployed):
    result = run_playbook("playbooks/stop.yml", deployed.inventory, limit="spark-1")
    assert result.rc == 0, result.stdout[-3000:]
    (h_stop, _, h_state), (w_stop, _, w_state) = (unit_times(n) for n in deployed.nodes)
    assert (h_state, w_state) == ("inactive", "inactive")
    assert h_stop < w_stop
    again = run_playbook("playbooks/stop.yml", deployed.inventory)
    assert again.rc == 0 and not again.changed, "stopping a stopped group is idempotent"

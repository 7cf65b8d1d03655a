"""The group supervisor keeps the TP group serving with no playbook run between fault and recovery.

One pair, deployed as a real site is (fabric trust, then server.yml with the supervisor on), takes
one fault after another: a rank killed, a hang, a frozen rank, power cycles of either node and of
both, a deliberate stop, a crash loop given up on, a crash loop that is then fixed. The supervisor
checks every second here (the stand-in answers a generation in milliseconds) and gives up after
max_restarts (3 here) restarts in a row that do not reach stable service (stable_after: two
healthy checks), so the seven spaced incidents, each healed and stable before the next, are more
than max_restarts and all heal: each waits for the streak back to 0. Each test waits on the event
(the endpoint answering a real generation, or the supervisor's state file, read through the
head's root filesystem as the controller mounts it: no SSH round trip per look) and records how
long recovery took (`record_property`); none asserts a duration. The stand-in ranks keep their GPU
for a few seconds after they end (`gpu_release_seconds`), so a restart that did not wait for the
GPU to be free would fail to load.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook
from tests.lib.supervised import (
    ALERT,
    POLL,
    REVISION,
    SHORT_STOP_GRACE,
    STATE_DIR,
    SUPERVISOR,
    checkpoint_files,
    inject_hang,
    ranks_active,
    read_node_file,
    restarts,
    signal_rank,
    state,
    wait_checks,
    wait_for,
    wait_serving,
    wait_stable,
)

pytestmark = pytest.mark.slow

# Checks every second, a restart stable after two healthy checks: the shortest watch the stand-in's
# sub-second generations allow (the probe's deadline stays 3 s, so a slow answer on a loaded machine
# is not taken for a hang).
SUPERVISOR = {**SUPERVISOR, **SHORT_STOP_GRACE, "checkpoint_revision": REVISION, "supervisor_max_restarts": 3,
              "supervisor_interval": 1, "supervisor_stable_after": 2}
MAX_RESTARTS = SUPERVISOR["supervisor_max_restarts"]
UNIT = "spark-llm.service"
STATE = STATE_DIR
# The spaced incidents healed so far, in order (each one group restart, then stable service).
HEALED: list[str] = []


def sh(node, command, timeout=120):
    return sim.ssh(node, command, timeout=timeout)


def serving_again(cluster, since: float, record_property, name: str, by_supervisor: bool = True) -> float:
    """Wait until the group serves a generation again and the supervisor calls it healthy; record the
    time; then until the supervisor's failing streak is back to 0, so that the next test's fault is a
    new incident, not the next attempt of a streak. After the supervisor's own restart that is its
    "stable" event (stable_after of healthy checks); after restart.yml, the resume that cleared it."""
    wait_serving(cluster)
    seconds = round(time.monotonic() - since, 1)
    record_property(f"{name}_recovery_seconds", seconds)
    print(f"{name}: serving again after {seconds} s")
    st = wait_stable(cluster)
    assert st["backoff"] == 0 and st["next_attempt"] == "", st
    if by_supervisor:
        assert st["history"][-1]["event"] == "stable" and st["history"][-1]["streak"] == 1, st["history"][-4:]
        HEALED.append(name)
    return seconds


def written_json(text: str):
    """The JSON object in `text`, or None while it is absent or still being written."""
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return None


@pytest.fixture(scope="module")
def site(sim_cluster):
    for n in sim_cluster.nodes:
        sh(n, checkpoint_files())
        # A stopped or killed rank keeps its GPU memory a few seconds, as a real one's CUDA context can.
        sim.set_knobs(sim_cluster.instance, n.name, {"sglang": {"gpu_release_seconds": 3}})
    # The fabric as a site gets it (the SSH trust the supervisor uses); the bandwidth proof stays off,
    # the product's default (test_fabric measures it).
    fabric = run_playbook("playbooks/fabric.yml", sim_cluster.inventory, extravars={"fabric_iperf_min_gbps": 0})
    assert fabric.rc == 0, fabric.stdout[-3000:]
    server = run_playbook("playbooks/server.yml", sim_cluster.inventory, extravars=SUPERVISOR)
    assert server.rc == 0, server.stdout[-4000:]
    wait_for(lambda: state(sim_cluster).get("state") == "healthy", "the supervisor's first healthy check", 120, every=POLL)
    return sim_cluster


def test_a_supervised_rank_neither_restarts_alone_nor_starts_at_boot_by_itself(site):
    for n in site.nodes:
        unit = sh(n, f"systemctl show {UNIT} -p Restart,UnitFileState")
        assert "Restart=no" in unit and "UnitFileState=disabled" in unit, unit
    supervisor = sh(site.nodes[0], "systemctl show spark-llm-supervisor.service -p ActiveState,UnitFileState")
    assert "ActiveState=active" in supervisor and "UnitFileState=enabled" in supervisor
    assert sh(site.nodes[0], "stat -c %a /etc/spark-llm/supervisor.json").strip() == "600"


def test_status_shows_the_supervisor(site):
    result = run_playbook("playbooks/status.yml", site.inventory, extravars=SUPERVISOR)
    assert result.rc == 0, result.stdout[-3000:]
    head = result.results("Show one line per node")["spark-0"]["msg"]
    assert "; supervisor healthy since " in head and "0 group restart(s) in the window" in head
    assert f"failing streak 0/{MAX_RESTARTS}, back-off none, no attempt pending" in head


def test_sigkill_of_the_worker_rank(site, record_property):
    before = restarts(site)
    t0 = time.monotonic()
    signal_rank(site.nodes[1], "KILL")
    serving_again(site, t0, record_property, "worker_sigkill")
    assert restarts(site) == before + 1, "one group restart for one incident"
    assert ranks_active(site) == ["active", "active"]


def test_sigkill_of_the_head_rank(site, record_property):
    before = restarts(site)
    t0 = time.monotonic()
    signal_rank(site.nodes[0], "KILL")
    serving_again(site, t0, record_property, "head_sigkill")
    assert restarts(site) == before + 1


def test_a_hang_is_noticed_although_health_stays_green(site, record_property):
    before = restarts(site)
    t0 = time.monotonic()

    def health_stays_green():
        # /health still answers while generation hangs: only the generation probe can tell.
        assert sh(site.nodes[0], "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/health").strip() == "200"

    inject_hang(site, while_hanging=health_stays_green)
    serving_again(site, t0, record_property, "hang")
    assert restarts(site) == before + 1
    assert "generation" in " ".join(e.get("reason", "") for e in state(site)["history"][-6:])


def test_a_frozen_worker_rank_is_noticed(site, record_property):
    before = restarts(site)
    t0 = time.monotonic()
    signal_rank(site.nodes[1], "STOP")
    serving_again(site, t0, record_property, "frozen_worker")
    assert restarts(site) == before + 1


@pytest.mark.parametrize("nodes", [["spark-1"], ["spark-0"], ["spark-0", "spark-1"]], ids=["worker", "head", "both"])
def test_power_cycle(site, record_property, nodes):
    before = restarts(site)
    t0 = time.monotonic()
    sim.power_cycle(site.instance, nodes, off_seconds=3)
    serving_again(site, t0, record_property, f"power_cycle_{'_'.join(nodes)}")
    assert ranks_active(site) == ["active", "active"]
    # One restart more than before: the head's reboot kept the supervisor's state (a fresh one would say 1).
    assert restarts(site) == before + 1


def test_the_supervisor_state_is_on_disk(site):
    """What makes the streak survive a reboot of the head: state_dir is not on a filesystem a boot empties."""
    kind = sh(site.nodes[0], f"findmnt -n -o FSTYPE --target {STATE}").strip()
    assert kind and kind not in ("tmpfs", "ramfs"), kind
    assert "spark-llm-supervisor: warning: state_dir" not in sh(
        site.nodes[0], "journalctl -u spark-llm-supervisor.service --no-pager -n 400")


def test_spaced_incidents_beyond_max_restarts_all_healed(site):
    """Seven incidents so far, each healed and stable before the next: more than max_restarts, no give-up."""
    assert len(HEALED) == 7 and len(HEALED) > MAX_RESTARTS, HEALED
    st = state(site)
    assert st["state"] == "healthy" and st["streak"] == 0 and restarts(site) >= len(HEALED)
    assert sh(site.nodes[0], f"test -e {STATE}/gave-up.json && echo present || echo absent").strip() == "absent"


def test_a_deliberate_stop_stays_stopped_until_restart(site, record_property):
    result = run_playbook("playbooks/stop.yml", site.inventory, extravars=SUPERVISOR)
    assert result.rc == 0, result.stdout[-3000:]
    wait_for(lambda: state(site).get("state") == "paused", "the supervisor to say paused", 60, every=POLL)
    assert wait_checks(site, 3)["state"] == "paused"  # three checks that must not act
    # (A worker whose head stopped first dies with it and shows "failed": no rank runs either way.)
    assert all(s != "active" for s in ranks_active(site)), ranks_active(site)
    assert state(site)["state"] == "paused"
    t0 = time.monotonic()
    result = run_playbook("playbooks/restart.yml", site.inventory, extravars=SUPERVISOR)
    assert result.rc == 0, result.stdout[-3000:]
    serving_again(site, t0, record_property, "restart_after_stop", by_supervisor=False)


def test_a_crash_loop_gives_up_after_the_streak_loudly(site):
    """The worker's rank is OOM-killed at every start (it holds more than the container's memory cap):
    attempt 1 at once, then after 2 s and 4 s of back-off, every rank stopped meanwhile; the third
    failed attempt completes the streak of max_restarts and it gives up, loudly."""
    assert state(site)["streak"] == 0
    sh(site.nodes[0], f"rm -f {ALERT}")
    sim.set_knobs(site.instance, "spark-1", {"sglang": {"resident_gib": 130}})
    try:
        signal_rank(site.nodes[1], "KILL")
        gave_up = wait_for(lambda: (st := state(site)).get("state") == "gave-up" and st, "the give-up", every=POLL)
    finally:
        sim.set_knobs(site.instance, "spark-1", {"sglang": {"resident_gib": None}})
    assert gave_up["streak"] == MAX_RESTARTS
    loop = gave_up["history"][-12:]
    loop = loop[max(i for i, e in enumerate(loop) if e["event"] == "restart" and e["attempt"] == 1):]
    assert [e["event"] for e in loop if e["event"] in ("restart", "restart-failed", "backing-off", "gave-up")] == [
        "restart", "restart-failed", "backing-off", "restart", "restart-failed", "backing-off", "restart",
        "restart-failed", "gave-up"], loop
    attempts = [e for e in loop if e["event"] == "restart"]
    backing = [e for e in loop if e["event"] == "backing-off"]
    assert [e["attempt"] for e in attempts] == [1, 2, 3]
    assert [e["backoff"] for e in backing] == [2, 4]
    # No attempt before its back-off ran out.
    assert all(attempts[i + 1]["time"] >= backing[i]["next_attempt"] for i in range(2))
    assert "a crash loop" in gave_up["last_reason"] and "3 group restart(s) in a row" in gave_up["last_reason"]
    assert all(s != "active" for s in ranks_active(site)), "a given-up group holds no GPU"
    alert = wait_for(lambda: written_json(read_node_file(site.nodes[0], ALERT)), "the alert", every=POLL)
    assert alert["reason"] and alert["streak"] == MAX_RESTARTS and set(alert["journal"]) == {"spark-0", "spark-1"}
    journal = sh(site.nodes[0], "journalctl -u spark-llm-supervisor.service --no-pager -n 400")
    assert journal.count("spark-llm-supervisor: GAVE UP") == 1
    # Given up means given up: nothing starts by itself.
    assert wait_checks(site, 3)["state"] == "gave-up"
    assert all(s != "active" for s in ranks_active(site))


def test_status_and_doctor_show_the_give_up(site, tmp_path):
    status = run_playbook("playbooks/status.yml", site.inventory, extravars=SUPERVISOR)
    assert status.rc == 0
    head = status.results("Show one line per node")["spark-0"]["msg"]
    assert "; supervisor gave-up since " in head and f"failing streak {MAX_RESTARTS}/{MAX_RESTARTS}" in head
    assert "no attempt pending" in head
    doctor = run_playbook("playbooks/doctor.yml", site.inventory,
                          extravars={**SUPERVISOR, "doctor_bundle_dir": str(tmp_path)})
    assert doctor.rc == 0, doctor.stdout[-3000:]
    shown = "\n".join(doctor.results("Show the group supervisor's state and history")["spark-0"]["msg"])
    assert "GAVE UP" in shown and "history (earlier incidents, no remedy):" in shown


def test_a_crash_loop_that_is_fixed_is_brought_back_by_restart(site, record_property):
    """Still given up from the test before; the worker's driver is gone, so every start fails; then it is back."""
    sim.set_knobs(site.instance, "spark-1", {"gpu": {"present": False}})
    try:
        result = run_playbook("playbooks/restart.yml", site.inventory, extravars=SUPERVISOR)
        assert result.rc != 0, "the worker cannot start without its driver"
        assert all(s != "active" for s in ranks_active(site)), "a failed restart leaves no rank running"
    finally:
        sim.set_knobs(site.instance, "spark-1", {"gpu": {"present": True}})
    t0 = time.monotonic()
    result = run_playbook("playbooks/restart.yml", site.inventory, extravars=SUPERVISOR)
    assert result.rc == 0, result.stdout[-3000:]
    serving_again(site, t0, record_property, "crash_loop_fixed", by_supervisor=False)
    assert sh(site.nodes[0], f"test -e {STATE}/gave-up.json && echo present || echo gone").strip() == "gone"
    assert state(site)["streak"] == 0  # restart.yml's resume cleared the give-up and the streak

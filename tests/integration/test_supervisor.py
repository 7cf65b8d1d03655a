"""The group supervisor keeps the TP group serving with no playbook run between fault and recovery.

One pair, deployed as a real site is (fabric trust, then server.yml with the supervisor on), takes
one fault after another: a rank killed, a hang, a frozen rank, power cycles of either node and of
both, a deliberate stop, the restart budget spent, a crash loop that is then fixed. Each test
waits on the event (the endpoint answering a real generation, or the supervisor's state) and
records how long recovery took (`record_property`); none asserts a duration. The stand-in ranks
keep their GPU for a few seconds after they end (`gpu_release_seconds`), so a restart that did not
wait for the GPU to be free would fail to load.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook
from tests.lib.supervised import (
    ALERT,
    REVISION,
    STATE_DIR,
    SUPERVISOR,
    checkpoint_files,
    generate,
    inject_hang,
    ranks_active,
    restarts,
    signal_rank,
    state,
    wait_for,
    wait_serving,
)

pytestmark = pytest.mark.slow

SUPERVISOR = {**SUPERVISOR, "checkpoint_revision": REVISION}
UNIT = "sglang.service"
STATE = STATE_DIR


def sh(node, command, timeout=120):
    return sim.ssh(node, command, timeout=timeout)


def serving_again(cluster, since: float, record_property, name: str) -> float:
    """Wait until the group serves a generation again and the supervisor calls it healthy; record the time."""
    wait_serving(cluster)
    seconds = round(time.monotonic() - since, 1)
    record_property(f"{name}_recovery_seconds", seconds)
    print(f"{name}: serving again after {seconds} s")
    return seconds


@pytest.fixture(scope="module")
def site(sim_cluster):
    for n in sim_cluster.nodes:
        sh(n, checkpoint_files())
        # A stopped or killed rank keeps its GPU memory a few seconds, as a real one's CUDA context can.
        sim.set_knobs(sim_cluster.instance, n.name, {"sglang": {"gpu_release_seconds": 3}})
    fabric = run_playbook("playbooks/fabric.yml", sim_cluster.inventory)
    assert fabric.rc == 0, fabric.stdout[-3000:]
    server = run_playbook("playbooks/server.yml", sim_cluster.inventory, extravars=SUPERVISOR)
    assert server.rc == 0, server.stdout[-4000:]
    wait_for(lambda: state(sim_cluster).get("state") == "healthy", "the supervisor's first healthy check", 120)
    return sim_cluster


def test_a_supervised_rank_neither_restarts_alone_nor_starts_at_boot_by_itself(site):
    for n in site.nodes:
        unit = sh(n, f"systemctl show {UNIT} -p Restart,UnitFileState")
        assert "Restart=no" in unit and "UnitFileState=disabled" in unit, unit
    supervisor = sh(site.nodes[0], "systemctl show sglang-supervisor.service -p ActiveState,UnitFileState")
    assert "ActiveState=active" in supervisor and "UnitFileState=enabled" in supervisor
    assert sh(site.nodes[0], "stat -c %a /etc/sglang/supervisor.json").strip() == "600"


def test_status_shows_the_supervisor(site):
    result = run_playbook("playbooks/status.yml", site.inventory, extravars=SUPERVISOR)
    assert result.rc == 0, result.stdout[-3000:]
    head = result.results("Show one line per node")["spark-0"]["msg"]
    assert "; supervisor healthy since " in head and "0 group restart(s) in the window" in head


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
    t0 = time.monotonic()
    sim.power_cycle(site.instance, nodes, off_seconds=3)
    serving_again(site, t0, record_property, f"power_cycle_{'_'.join(nodes)}")
    assert ranks_active(site) == ["active", "active"]


def test_a_deliberate_stop_stays_stopped_until_restart(site, record_property):
    result = run_playbook("playbooks/stop.yml", site.inventory, extravars=SUPERVISOR)
    assert result.rc == 0, result.stdout[-3000:]
    wait_for(lambda: state(site).get("state") == "paused", "the supervisor to say paused", 60)
    time.sleep(3 * SUPERVISOR["sglang_supervisor_interval"])  # three checks that must not act
    # (A worker whose head stopped first dies with it and shows "failed": no rank runs either way.)
    assert all(s != "active" for s in ranks_active(site)), ranks_active(site)
    assert state(site)["state"] == "paused"
    t0 = time.monotonic()
    result = run_playbook("playbooks/restart.yml", site.inventory, extravars=SUPERVISOR)
    assert result.rc == 0, result.stdout[-3000:]
    serving_again(site, t0, record_property, "restart_after_stop")


def test_bounded_gives_up_after_the_limit_with_the_alert_and_ranks_stopped(site):
    limited = {**SUPERVISOR, "sglang_supervisor_max_restarts": 3}
    # New settings, and a fresh budget: the operator's stop and restart clear the window.
    for playbook in ("playbooks/server.yml", "playbooks/stop.yml", "playbooks/restart.yml"):
        result = run_playbook(playbook, site.inventory, extravars=limited)
        assert result.rc == 0, result.stdout[-3000:]
    wait_for(lambda: state(site).get("state") == "healthy", "a healthy check", 120)
    assert restarts(site) == 0
    sh(site.nodes[0], f"rm -f {ALERT}")
    for kill in range(1, 6):
        signal_rank(site.nodes[1], "KILL")
        if kill <= 3:
            wait_for(lambda k=kill: restarts(site) == k and generate(site), f"restart {kill} to serve")
        else:
            break
    gave_up = wait_for(lambda: state(site).get("state") == "gave-up" and state(site), "the give-up")
    assert len(gave_up["restarts"]) == 3
    assert all(s != "active" for s in ranks_active(site)), "a given-up group holds no GPU"
    alert = json.loads(wait_for(lambda: sh(site.nodes[0], f"cat {ALERT} 2>/dev/null || true").strip(), "the alert"))
    assert alert["reason"] and set(alert["journal"]) == {"spark-0", "spark-1"}
    journal = sh(site.nodes[0], "journalctl -u sglang-supervisor.service --no-pager -n 200")
    assert journal.count("sglang-supervisor: GAVE UP") == 1
    # Given up means given up: nothing starts by itself.
    time.sleep(3 * SUPERVISOR["sglang_supervisor_interval"])
    assert all(s != "active" for s in ranks_active(site))


def test_status_and_doctor_show_the_give_up(site, tmp_path):
    status = run_playbook("playbooks/status.yml", site.inventory, extravars=SUPERVISOR)
    assert status.rc == 0
    assert "; supervisor gave-up since " in status.results("Show one line per node")["spark-0"]["msg"]
    doctor = run_playbook("playbooks/doctor.yml", site.inventory,
                          extravars={**SUPERVISOR, "sglang_doctor_bundle_dir": str(tmp_path)})
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
    serving_again(site, t0, record_property, "crash_loop_fixed")
    assert sh(site.nodes[0], f"test -e {STATE}/gave-up.json && echo present || echo gone").strip() == "gone"

"""Issue 27's figure: `playbooks/restart.yml` to serving, per engine.

Measured: the wall time from starting `ansible-playbook playbooks/restart.yml -e restart_verify=false` until the
head answers /v1/models with the model, and separately until it answers a generation, as a client sees it: a
watch on the controller asks the head every POLL seconds from the playbook's start and takes the first answer
after one that failed (the ranks stopped). Baseline, in the same rounds and the same way: the ordered restart the
role makes, as bare commands over the bench's open SSH connections (pause the supervisor; stop the head, then the
worker; reset the start limit and start the worker, then the head) and the engine's own start until the head
answers. Their ratio is what the playbook adds (its checks, its plan, its readiness rounds) to what any restart of
the group costs.
"""

from __future__ import annotations

import shlex
import threading
import time

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook
from tests.lib.supervised import UNIT, generate, lists_model, wait_for

from .context import ENGINES
from .nodes import BenchError
from .report import Figure

POLL = 0.1  # the watch's interval: the figures' resolution, small against the seconds a restart takes
SERVING_TIMEOUT = 600
RESTART_TARGET = 2.0
# Where the supervisor role installs its program and configuration (roles/spark/vars/main.yml, defaults).
SUPERVISOR_PROGRAM = "/usr/local/lib/spark-llm-supervisor/spark_llm_supervisor.py"
SUPERVISOR_CONFIG = "/etc/spark-llm/supervisor.json"


class Watch:
    """Asks `probe` from start() on, in a thread of its own; `seconds` is the time from start() to the first
    answer after a failed one. Probes answered before the first failure are the group before its stop."""

    def __init__(self, probe):
        self.probe = probe
        self.seconds: float | None = None
        self.missed = False
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watch:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        deadline = self._t0 + SERVING_TIMEOUT
        while not self._done.is_set() and time.monotonic() < deadline:
            answered = self.probe()
            if not answered:
                self.missed = True
            elif self.missed:
                self.seconds = time.monotonic() - self._t0
                return
            time.sleep(POLL)

    def cancel(self) -> None:
        self._done.set()

    def result(self, what: str) -> float:
        """Waits for the watch to end; the seconds, or a BenchError saying why there are none."""
        self._thread.join(SERVING_TIMEOUT)
        self._done.set()
        if self.seconds is None:
            raise BenchError(f"{what}: " + ("the head never answered again" if self.missed else
                                            "the head never stopped answering (no restart seen)"))
        return self.seconds


def restart(ctx, runs: int) -> list[Figure]:
    cluster, head, worker = ctx.cluster, ctx.head, ctx.worker
    # The stand-in's defaults (a 1 s load, the GPU released when a rank ends), whatever an earlier figure set.
    for n in cluster.nodes:
        sim.set_knobs(cluster.instance, n.name, {ctx.engine: {"gpu_release_seconds": 0}})
    playbook_seconds: list[float] = []

    def serving() -> None:
        # Before each side: the group answers both probes, so a watch's first failure is this side's stop.
        wait_for(lambda: lists_model(cluster) and generate(cluster), "the group to serve before the round",
                 SERVING_TIMEOUT, every=POLL)

    def watched(what: str, act) -> dict[str, float]:
        serving()
        before = ctx.sh(head, f"systemctl show -p InactiveExitTimestampMonotonic --value {UNIT}").strip()
        models, generation = Watch(lambda: lists_model(cluster)).start(), Watch(lambda: generate(cluster)).start()
        try:
            act()
        except BaseException:
            models.cancel()
            generation.cancel()
            raise
        out = {"models": models.result(f"{what}, /v1/models"), "generation": generation.result(f"{what}, a generation")}
        if ctx.sh(head, f"systemctl show -p InactiveExitTimestampMonotonic --value {UNIT}").strip() == before:
            raise BenchError(f"{what}: the head's rank was not started again")
        return out

    def playbook() -> None:
        t0 = time.monotonic()
        r = run_playbook("playbooks/restart.yml", ctx.inventory, extravars={**ctx.extravars, "restart_verify": False},
                         timeout=SERVING_TIMEOUT)
        playbook_seconds.append(time.monotonic() - t0)
        if r.rc != 0:
            raise BenchError(f"restart.yml failed (rc {r.rc}): {r.failure_messages()[-1500:]}")

    by_hand = [
        (head, f"python3 -I {SUPERVISOR_PROGRAM} pause --config {SUPERVISOR_CONFIG} --reason "
               + shlex.quote("ranks stopped by the benchmark's restart by hand")),
        (head, f"systemctl stop {UNIT}"),
        (worker, f"systemctl stop {UNIT}"),
        (worker, f"systemctl reset-failed {UNIT}; systemctl start {UNIT}"),
        (head, f"systemctl reset-failed {UNIT}; systemctl start {UNIT}"),
    ]

    def manual() -> None:
        for node, command in by_hand:
            ctx.sh(node, command)

    def resume() -> None:
        ctx.sh(head, f"python3 -I {SUPERVISOR_PROGRAM} resume --config {SUPERVISOR_CONFIG}")

    # Both probes of a round come from one restart; the rounds helper wants one number per step, so each side
    # runs once per round here and keeps both of its numbers.
    samples: dict[str, dict[str, list]] = {side: {"models": [], "generation": []} for side in ("playbook", "manual")}
    for rnd in range(runs):
        order = [("playbook", playbook), ("manual", manual)]
        for side, act in order[rnd % 2:] + order[:rnd % 2]:
            try:
                got = watched(f"{side} restart", act)
            except (BenchError, AssertionError, OSError, TimeoutError) as e:
                got = {"models": None, "generation": None}
                ctx.say(f"restart ({ctx.engine}) round {rnd + 1}/{runs}: {side} FAILED: {e}")
            else:
                ctx.say(f"restart ({ctx.engine}) round {rnd + 1}/{runs}: {side}: /v1/models after "
                        f"{got['models']:.1f} s, a generation after {got['generation']:.1f} s")
            finally:
                if side == "manual":
                    resume()
            for probe, value in got.items():
                samples[side][probe].append(value)

    manual_text = "; ".join(f"on the {'head' if node is head else 'worker'}: {command}" for node, command in by_hand)
    common = {"playbook_returned_seconds": playbook_seconds, "baseline_command": manual_text, "poll_seconds": POLL}
    notes = [f"baseline, over the bench's open SSH connections: {manual_text}",
             f"the client's watch asks the head every {POLL} s from the start; the stand-in engine loads in 1 s, where "
             "a real Spark loads 85 GiB of weights for minutes, so the playbook's own seconds weigh far more here"]
    if ENGINES[ctx.engine]["note"]:
        notes.append(ENGINES[ctx.engine]["note"])
    figures = []
    for probe, answer in (("models", "lists the model on /v1/models"), ("generation", "answers a generation")):
        figures.append(Figure(
            key=f"restart_{probe}", name=f"restart.yml (restart_verify=false) until the head {answer}", unit="s",
            measured=samples["playbook"][probe], baseline_name="the same ordered restart by hand",
            baseline=samples["manual"][probe], target_op="<=", target=RESTART_TARGET, engine=ctx.engine,
            notes=notes if probe == "models" else [], extra=dict(common)))
    return figures


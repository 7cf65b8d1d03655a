"""The server playbook on the simulated nodes: units, flags, coordinated restarts, refusals, failures.

One converged cluster serves the whole module (fabric, checkpoint, server once); every test that
breaks something puts it back in a `finally`, so the tests may run alone or in any order. The
nodes are observed over SSH only: the unit and env files, the argv of the docker stand-in
process that the unit started (what a real docker would have received), systemd's own
timestamps, the journal. The expected launch arguments are written out here from
deployment-facts.md, not read from the role's flag model: a comparison of the model with
itself could not fail.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
import uuid

import pytest
import yaml

from tests.harness import cluster as sim
from tests.lib.playbook import REPO, SITE_CHECK, run_playbook
from tests.lib.seed import DEFAULT_FLAGS
from tests.lib.supervised import api_key_header
from tests.lib.unit_file import launch_args

SERVER = "playbooks/server.yml"
UNIT = "spark-llm.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
ENV_PATH = "/etc/spark-llm/spark-llm.env"
MODEL_DIR = "/opt/models/glm53"
STAMP = "/opt/models/glm53.verified"
IMAGE = "lmsysorg/sglang:glm-5.3-flash-arm64"
IMAGES_JSON = "/var/lib/spark-sim/docker/images.json"

PROBE = "Probe the units, and the head's /v1/models for up to a round"
READ = "Pull the engine's image and read what this rank runs"
INSTALL_STEP = "Install the unit and its environment where the probe found them different"
RESTART_STEP = "Restart all ranks together when anything changed"
READINESS_STEP = "Wait for the head, stop every rank on failure"
STEPS_INCLUDE = "Install, restart and wait for the ranks where the read found work to do"
STAMP_CHECK = "Refuse to start on a checkpoint that is not verified at the pinned revision"
ARCH_CHECK = "Refuse an image that is missing or not linux/arm64"
SAME_IMAGE = "Refuse ranks that would run different images"
OUTSIDE_CHECK = "Refuse a run under --limit whose ranks could not restart together"
JOURNALS = "Show the last journal lines of every rank's current start"
GIVE_UP = "Fail with a summary"

# deployment-facts.md, "The field-tested launch command" (--model-path is the container path of
# the mounted directory) with the collection's additions (tests/lib/seed.py), then the multi-node
# flags, in the unit's order.
SEED = DEFAULT_FLAGS


def expected_args(rank: int, head_fabric_ip: str, **values: str) -> list[str]:
    pairs = [("--model-path", "/models/glm53")] + SEED[:1] + [("--tp-size", "2")] + SEED[1:] + [
        ("--nnodes", "2"),
        ("--node-rank", str(rank)),
        ("--dist-init-addr", f"{head_fabric_ip}:20000"),
        ("--host", "0.0.0.0"),  # noqa: S104 - the role's default bind address, compared, not bound
        ("--port", "30000"),
    ]
    out = []
    for flag, default in pairs:
        value = values.get(flag, default)
        out += [flag] if value is None else [flag, value]
    return out


def as_pairs(args: list[str]) -> list[tuple[str, str | None]]:
    """['--a', 'x', '--b'] -> [('--a', 'x'), ('--b', None)], to compare flag by flag."""
    pairs: list[tuple[str, str | None]] = []
    for token in args:
        if token.startswith("--"):
            pairs.append((token, None))
        else:
            assert pairs and pairs[-1][1] is None, f"value {token!r} without a flag in {args}"
            pairs[-1] = (pairs[-1][0], token)
    return pairs


# --- observing the nodes --------------------------------------------------------------------


def ssh(node, command: str, check: bool = True) -> str:
    return sim.ssh(node, command, check=check)


def put(node, path: str, text: str) -> None:
    subprocess.run([*sim.ssh_base(node), f"cat > {path}.new && mv {path}.new {path}"],
                   input=text.encode(), check=True, timeout=60)


def unit_state(node) -> dict[str, str]:
    out = ssh(node, f"systemctl show {UNIT} -p ActiveState -p SubState -p ActiveEnterTimestampMonotonic "
                    "-p UnitFileState -p ExecMainPID")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def started_at(node) -> int:
    """CLOCK_MONOTONIC of the unit's last activation; the nodes share the host kernel's clock."""
    return int(unit_state(node)["ActiveEnterTimestampMonotonic"])


def docker_run_argv(node) -> list[str]:
    """argv of the `docker run` the unit's main process is (the docker stand-in, a Python script)."""
    pid = unit_state(node)["ExecMainPID"]
    assert pid != "0", f"{node.name}: {UNIT} has no main process"
    raw = ssh(node, f"tr '\\0' '\\n' < /proc/{pid}/cmdline")
    argv = raw.split("\n")[:-1]
    assert "run" in argv, argv
    return argv[argv.index("run"):]


def server_args(node) -> list[str]:
    return launch_args(docker_run_argv(node))


def sglang_processes(node) -> str:
    # The brackets keep the pattern from matching the shell that runs pgrep.
    return ssh(node, "pgrep -af '[s]glang|[d]ocker run' || true").strip()


def models(cluster) -> list[str]:
    head = cluster.nodes[0]
    # Secure by default: the key the server role generated beside the inventory.
    request = urllib.request.Request(f"http://{head.mgmt_ip}:30000/v1/models", headers=api_key_header(cluster))
    with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
        return [m["id"] for m in json.loads(resp.read())["data"]]


def outcomes(result, task: str) -> list[str]:
    """The events of the task named `task` that say how it ended (not its start), in order."""
    return [e["event"] for e in result.task_events() if e["event_data"].get("task") == task
            and e["event"] != "runner_on_start"]


def changed_tasks(result) -> list[str]:
    return [f"{d['host']}: {d['task']}" for d in result.changed]


def failed_at(result) -> set[str]:
    return {d["task"] for d in result.failed}


def server(inventory, **extravars):
    return run_playbook(SERVER, inventory, extravars=extravars or None)


def assert_serving(cluster) -> None:
    for node in cluster.nodes:
        state = unit_state(node)
        assert (state["ActiveState"], state["SubState"]) == ("active", "running"), (node.name, state)
    assert models(cluster) == ["/models/glm53"]


def restore(cluster, inventory) -> None:
    """Converge again with the test site's settings and insist the group serves."""
    result = server(inventory)
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    assert_serving(cluster)


# --- the converged cluster ------------------------------------------------------------------


# fabric.yml, checkpoint.yml and server.yml as site.yml imports them: one run (one start-up, one inventory
# check) instead of three. A playbook beside site.yml, so that it sees the project's group_vars as site.yml does.
CONVERGE = """---
- name: Inventory check - every bad inventory or setting refused before any node is contacted
  ansible.builtin.import_playbook: playbooks/inventory_check.yml
{steps}"""
CONVERGE_STEP = """
- name: {name}
  ansible.builtin.import_playbook: playbooks/{name}
  vars:
    spark_inventory_checked: true
"""


@pytest.fixture(scope="module")
def converged(sim_cluster, sim_inventory):
    playbook = REPO / f"_test_server_nodes_converge_{uuid.uuid4().hex[:8]}.yml"
    playbook.write_text(CONVERGE.format(steps="".join(
        CONVERGE_STEP.format(name=name) for name in ("fabric.yml", "checkpoint.yml", "server.yml"))) + "\n")
    try:
        result = run_playbook(playbook.name, sim_inventory)
    finally:
        playbook.unlink(missing_ok=True)
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    assert_serving(sim_cluster)
    return sim_cluster


@pytest.fixture
def serving(converged, sim_inventory):
    """The converged cluster, serving at the start of the test (restored if an earlier test broke it)."""
    try:
        assert_serving(converged)
    except (AssertionError, OSError):
        restore(converged, sim_inventory)
    return converged


def test_unit_and_env_file_on_every_node(serving):
    head = serving.nodes[0]
    for node in serving.nodes:
        mode = ssh(node, f"stat -c '%a %U %G' {UNIT_PATH} {ENV_PATH}").split("\n")
        assert mode[:2] == ["644 root root", "600 root root"], (node.name, mode)
        assert unit_state(node)["UnitFileState"] == "enabled"
        env = dict(line.split("=", 1) for line in ssh(node, f"cat {ENV_PATH}").splitlines()
                   if line and not line.startswith("#"))
        assert env["SGLANG_HOST_IP"] == node.fabric_ip
        assert env["HF_HUB_OFFLINE"] == "1"
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
            assert env[name] == sim.FABRIC_IFACE, (node.name, name, env)
        # Both rails' RoCE devices (the stand-in's), the fabric port's first, and the RoCE v2 GID of their addresses.
        assert (env["NCCL_IB_HCA"], env["NCCL_IB_GID_INDEX"]) == ("rocep1s0f1,roceP2p1s0f1", "3"), (node.name, env)
        unit = ssh(node, f"cat {UNIT_PATH}")
        assert f"--dist-init-addr {head.fabric_ip}:20000" in unit
        assert f"--node-rank {node.rank}" in unit
        assert f"--volume {MODEL_DIR}:/models/glm53:ro" in unit
        assert f"--env-file {ENV_PATH}" in unit


def test_every_flag_reaches_each_rank_one_by_one(serving):
    head = serving.nodes[0]
    for node in serving.nodes:
        got = server_args(node)
        want = expected_args(node.rank, head.fabric_ip)
        got_pairs, want_pairs = as_pairs(got), as_pairs(want)
        for flag, value in want_pairs:
            assert (flag, value) in got_pairs, f"{node.name}: {flag} {value} missing from {got}"
        assert got_pairs == want_pairs, node.name
        # The unit's ExecStart holds the same list as the process (one flag per line).
        unit = ssh(node, f"cat {UNIT_PATH}")
        # ExecStart= and its continuation lines (each ending in a backslash), nothing after them.
        assert launch_args(unit) == want, node.name
        # What the container was given to run the rank with (a real GB10 rank needs each).
        run = docker_run_argv(node)
        for option in (["--gpus", "all"], ["--network", "host"], ["--ipc", "host"], ["--cap-add", "IPC_LOCK"],
                       ["--ulimit", "memlock=-1"], ["--memory", "120g"], ["--memory-swap", "120g"]):
            assert any(run[i:i + 2] == option for i in range(len(run) - 1)), (node.name, option, run)
        assert IMAGE in run


def test_ranks_and_head_endpoint(serving):
    head, worker = serving.nodes
    assert server_args(head)[server_args(head).index("--node-rank") + 1] == "0"
    assert server_args(worker)[server_args(worker).index("--node-rank") + 1] == "1"
    assert models(serving) == ["/models/glm53"]
    journal = ssh(head, f"journalctl -u {UNIT} --no-pager -o cat | tail -n 200")
    assert f"Rank 1 joined from {worker.fabric_ip}" in journal


def test_second_run_changes_nothing_and_restarts_nothing(serving, sim_inventory):
    before = {n.name: started_at(n) for n in serving.nodes}
    began = time.monotonic()
    result = server(sim_inventory)
    took = time.monotonic() - began
    assert result.rc == 0, result.failure_messages()
    assert changed_tasks(result) == []
    assert {n.name: started_at(n) for n in serving.nodes} == before
    # One read per rank decides: nothing differs, so no install, restart or readiness round runs -
    # all of them behind one skipped include per rank, never a line per step or a task per file.
    assert set(result.results(READ)) == {n.name for n in serving.nodes}
    assert outcomes(result, PROBE) == [], "a readiness round ran"
    assert outcomes(result, STEPS_INCLUDE) == ["runner_on_skipped"] * len(serving.nodes)
    for step in (INSTALL_STEP, RESTART_STEP, READINESS_STEP):
        assert outcomes(result, step) == [], step
    print(f"no-change server.yml run: {took:.1f} s")


def test_drift_on_a_node_is_found_and_repaired(serving, sim_inventory):
    """An env file edited on the worker and the head's unit disabled: the one read finds both; the env file
    is put back, which restarts every rank (worker first) and waits for readiness; the unit is enabled again."""
    head, worker = serving.nodes
    before = {n.name: started_at(n) for n in serving.nodes}
    ssh(worker, f"echo EXTRA=1 >> {ENV_PATH}")
    ssh(head, f"systemctl disable {UNIT}")
    repaired = False
    try:
        result = server(sim_inventory)
        assert result.rc == 0, result.failure_messages()
        changed = set(changed_tasks(result))
        assert f"{head.name}: Enable or disable start at boot" in changed, changed
        # The env file's task is no_log: ansible-runner drops `changed` from the censored result, the display
        # line keeps it.
        env_changed = {e["event_data"]["host"] for e in result.task_events("runner_on_ok")
                       if e["event_data"].get("task") == "Install the environment file" and "changed:" in e.get("stdout", "")}
        assert env_changed == {worker.name}, env_changed
        after = {n.name: started_at(n) for n in serving.nodes}
        assert after[head.name] > before[head.name] and after[worker.name] > before[worker.name], (before, after)
        assert after[worker.name] < after[head.name]
        assert outcomes(result, PROBE) == ["runner_on_ok"]
        assert "EXTRA=1" not in ssh(worker, f"cat {ENV_PATH}")
        assert unit_state(head)["UnitFileState"] == "enabled"
        assert_serving(serving)
        repaired = True
    finally:
        # The repair above is the converge: a second one would only reproduce its state.
        if not repaired:
            restore(serving, sim_inventory)


def test_stopped_rank_is_started_with_the_group(serving, sim_inventory):
    """A rank found stopped (nothing else differs) restarts every rank together, the worker first."""
    head, worker = serving.nodes
    before = started_at(head)
    ssh(worker, f"systemctl stop {UNIT}")
    started = False
    try:
        result = server(sim_inventory)
        assert result.rc == 0, result.failure_messages()
        assert started_at(head) > before
        assert started_at(worker) < started_at(head)
        assert outcomes(result, INSTALL_STEP) == ["runner_on_skipped"] * 2
        assert_serving(serving)
        started = True
    finally:
        # The run above is the converge: a second one would only reproduce its state.
        if not started:
            restore(serving, sim_inventory)


def test_flag_change_restarts_both_ranks_worker_first(serving, sim_inventory):
    head, worker = serving.nodes
    before = {n.name: started_at(n) for n in serving.nodes}
    try:
        result = server(sim_inventory, server_flag_overrides={"max-running-requests": 1})
        assert result.rc == 0, result.failure_messages()
        after = {n.name: started_at(n) for n in serving.nodes}
        assert after[head.name] > before[head.name] and after[worker.name] > before[worker.name], (before, after)
        assert after[worker.name] < after[head.name], "the head started before the worker"
        for node in serving.nodes:
            assert server_args(node) == expected_args(node.rank, head.fabric_ip, **{"--max-running-requests": "1"})
        assert models(serving) == ["/models/glm53"]
    finally:
        restore(serving, sim_inventory)
    for node in serving.nodes:
        assert server_args(node) == expected_args(node.rank, head.fabric_ip)


def test_limited_run_refused_before_any_change_when_an_outside_rank_would_differ(serving, sim_inventory):
    """--limit with a new flag: the head outside the run would rejoin with the old flags."""
    head, worker = serving.nodes
    before = {n.name: started_at(n) for n in serving.nodes}
    units = {n.name: ssh(n, f"sha256sum {UNIT_PATH}") for n in serving.nodes}
    result = run_playbook(SERVER, sim_inventory, limit=worker.name,
                          extravars={"server_flag_overrides": {"max-running-requests": 1}})
    assert result.rc != 0
    assert failed_at(result) == {OUTSIDE_CHECK}
    assert changed_tasks(result) == []
    messages = result.failure_messages()
    assert f"{head.name} cannot rejoin" in messages
    assert "--max-running-requests is installed as '2', the inventory gives '1'" in messages
    assert "without --limit" in messages
    assert {n.name: started_at(n) for n in serving.nodes} == before
    assert {n.name: ssh(n, f"sha256sum {UNIT_PATH}") for n in serving.nodes} == units
    assert_serving(serving)


def test_reprovisioned_worker_converges_alone_and_every_rank_restarts(serving, sim_inventory):
    """A reinstalled worker (fresh OS, new host keys) and site.yml --limit it: the head is restarted too."""
    head, worker = serving.nodes
    head_before = started_at(head)
    old_key = ssh(worker, "cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub").strip()
    sim.reinstall(serving.instance, worker.name)
    new_key = ssh(worker, "cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub").strip()
    assert new_key != old_key
    assert ssh(worker, f"test -e {MODEL_DIR} || echo absent; systemctl is-active {UNIT} || true").split() == [
        "absent", "inactive"]

    # Check mode first: it predicts the fresh node's files without writing them and fails only at verify,
    # because the group lost a rank with the reinstall and nothing answers.
    preview = run_playbook("site.yml", sim_inventory, limit=worker.name, check=True)
    assert failed_at(preview) == {"Fail when a check failed"}, preview.failure_messages() or preview.stdout[-3000:]
    assert "Install the systemd unit" in {d["task"] for d in preview.changed}
    # The env file's task is no_log (it holds the API key): ansible-runner drops `changed` from a censored
    # result, the display line keeps it.
    assert any(e["event_data"].get("task") == "Install the environment file" and e["event_data"].get("host") == worker.name
               and "changed:" in e.get("stdout", "") for e in preview.task_events("runner_on_ok"))
    assert ssh(worker, f"test -e {UNIT_PATH} || echo absent").strip() == "absent"

    result = run_playbook("site.yml", sim_inventory, limit=worker.name)
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    assert {d["host"] for d in result.changed} == {worker.name}
    # The head's own side of the worker's setup ran by delegation: its new host keys pinned, the sync pushed.
    pinned = ssh(head, f"grep '^{worker.fabric_ip} ssh-ed25519 ' /root/.ssh/known_hosts").split()
    assert pinned == [worker.fabric_ip, "ssh-ed25519", new_key]
    assert ssh(head, f"ssh -o BatchMode=yes -i /root/.ssh/id_spark_fabric {worker.fabric_ip} hostname").strip() == worker.name
    assert ssh(worker, f"test -e {STAMP} && echo stamped").strip() == "stamped"
    assert ssh(worker, f"sha256sum {MODEL_DIR}/config.json").split()[0] == \
        ssh(head, f"sha256sum {MODEL_DIR}/config.json").split()[0]
    # Both ranks restarted as one group, the worker first; the fresh rank serves with the old one.
    assert started_at(head) > head_before
    assert started_at(worker) < started_at(head)
    for node in serving.nodes:
        assert server_args(node) == expected_args(node.rank, head.fabric_ip)
    assert_serving(serving)
    verdicts = next(iter(result.results("Show the verification table").values()))["msg"]
    # The four checks of the answers, the corruption gate and the auth row (secure by default: 401 without the key).
    assert sum(" PASS " in line for line in verdicts) == 6, verdicts

    started = {n.name: started_at(n) for n in serving.nodes}
    again = run_playbook("site.yml", sim_inventory, limit=worker.name)
    assert again.rc == 0, again.failure_messages()
    assert changed_tasks(again) == []
    assert {n.name: started_at(n) for n in serving.nodes} == started


def test_guard_rail_refuses_before_any_change(serving, sim_inventory):
    before = {n.name: started_at(n) for n in serving.nodes}
    units = {n.name: ssh(n, f"sha256sum {UNIT_PATH}") for n in serving.nodes}
    result = server(sim_inventory, server_flag_overrides={"tool-call-parser": "glm"})
    assert result.rc != 0
    assert failed_at(result) == {SITE_CHECK}
    assert changed_tasks(result) == []
    messages = result.failure_messages()
    assert "tool-call-parser" in messages and "glm47" in messages and '"tool_calls": null' in messages
    assert {n.name: started_at(n) for n in serving.nodes} == before
    assert {n.name: ssh(n, f"sha256sum {UNIT_PATH}") for n in serving.nodes} == units


@pytest.fixture
def worker_images(serving):
    """Put the worker's pulled images and knobs back after a test that changes what docker pulls."""
    worker = serving.nodes[1]
    saved = ssh(worker, f"cat {IMAGES_JSON}")
    yield worker
    sim.set_knobs(serving.instance, worker.name, {"docker": {"image_id": None, "architecture": "arm64"}})
    # Back to the very image the running rank was started from: no restart is owed.
    put(worker, IMAGES_JSON, saved)


def test_image_mismatch_between_nodes_refused_before_any_rank_starts(serving, sim_inventory, worker_images):
    before = {n.name: started_at(n) for n in serving.nodes}
    other = "sha256:" + "e" * 64
    sim.set_knobs(serving.instance, worker_images.name, {"docker": {"image_id": other}})
    result = server(sim_inventory)
    assert result.rc != 0
    assert SAME_IMAGE in failed_at(result)
    assert other in result.failure_messages() and "server_image_digest" in result.failure_messages()
    # Pulling is how the mismatch is found; nothing after it ran.
    assert {c.split(": ", 1)[1] for c in changed_tasks(result)} <= {READ}
    assert {n.name: started_at(n) for n in serving.nodes} == before


def test_amd64_image_refused(serving, sim_inventory, worker_images):
    before = {n.name: started_at(n) for n in serving.nodes}
    sim.set_knobs(serving.instance, worker_images.name, {"docker": {"architecture": "amd64"}})
    result = server(sim_inventory)
    assert result.rc != 0
    assert failed_at(result) == {ARCH_CHECK}
    assert "linux/amd64" in result.failure_messages() and "arm64" in result.failure_messages()
    assert {c.split(": ", 1)[1] for c in changed_tasks(result)} <= {READ}
    assert {n.name: started_at(n) for n in serving.nodes} == before


def test_unverified_checkpoint_refused_before_any_change(serving, sim_inventory):
    worker = serving.nodes[1]
    before = {n.name: started_at(n) for n in serving.nodes}
    ssh(worker, f"mv {STAMP} /root/stamp.saved")
    try:
        result = server(sim_inventory)
        assert result.rc != 0
        assert failed_at(result) == {STAMP_CHECK}
        assert {d["host"] for d in result.failed} == {worker.name}
        assert changed_tasks(result) == []
        messages = result.failure_messages()
        assert f"{STAMP} does not exist" in messages and "playbooks/checkpoint.yml" in messages
        assert {n.name: started_at(n) for n in serving.nodes} == before
    finally:
        ssh(worker, f"mv /root/stamp.saved {STAMP}")


def test_failed_start_fails_early_shows_every_journal_and_stops_every_rank(serving, sim_inventory):
    head, worker = serving.nodes
    for node in serving.nodes:
        ssh(node, f"systemctl stop {UNIT}")
    # The worker's GPU gone (its driver not loaded): its container fails at start, before the rendezvous.
    # A checkpoint file moved away would not do: the stamp no longer vouches for a changed file and the
    # server refuses before any rank starts.
    sim.set_knobs(serving.instance, worker.name, {"gpu": {"present": False}})
    try:
        result = server(sim_inventory)
        assert result.rc != 0
        assert failed_at(result) == {GIVE_UP}
        # Not the 300 s timeout of the test site (11 rounds): the dead worker ended the wait.
        assert "a rank's unit is no longer active" in result.failure_messages()
        rounds = [e for e in result.task_events("runner_on_ok") if e["event_data"].get("task") == PROBE]
        assert 1 <= len(rounds) <= 2, len(rounds)
        shown = next(iter(result.results(JOURNALS).values()))["results"]
        journals = {r["item"]: "\n".join(r["msg"]) for r in shown}
        assert set(journals) == {head.name, worker.name}
        assert "nvml error: driver not loaded" in journals[worker.name], journals[worker.name]
        assert "waiting for 1 other rank" in journals[head.name]
        for node in serving.nodes:
            assert unit_state(node)["ActiveState"] in ("inactive", "failed"), node.name
            assert sglang_processes(node) == "", node.name
    finally:
        sim.set_knobs(serving.instance, worker.name, {"gpu": {"present": True}})
        restore(serving, sim_inventory)


def validate_command(unit_file: str) -> str:
    """The role's own `validate:` of the unit template, aimed at unit_file."""
    tasks = yaml.safe_load((REPO / "roles/server/tasks/install.yml").read_text())
    task = next(t for t in tasks if t.get("name") == "Install the systemd unit")
    command = task["ansible.builtin.template"]["validate"]
    assert "{{ spark_unit_name }}" in command, command
    return command.replace("{{ spark_unit_name }}", UNIT).replace("%s", unit_file)


@pytest.mark.parametrize("bad", [
    "Type=bogus",
    "ExecStop=docker stop spark-llm\nFrobnicate=yes",
], ids=["bad-value", "unknown-key"])
def test_unit_validation_really_rejects_a_bad_unit(serving, bad):
    node = serving.nodes[0]
    ssh(node, f"cp {UNIT_PATH} /root/good.service")
    good = ssh(node, f"{validate_command('/root/good.service')}; echo rc=$?", check=False)
    assert good.strip().endswith("rc=0"), good
    # The installed unit with invalid settings added to [Service].
    unit = ssh(node, f"cat {UNIT_PATH}")
    assert "\n[Service]\n" in unit
    put(node, "/root/bad.service", unit.replace("\n[Service]\n", f"\n[Service]\n{bad}\n", 1))
    out = ssh(node, f"{validate_command('/root/bad.service')} 2>&1; echo rc=$?", check=False)
    assert out.strip().endswith("rc=1"), out
    assert UNIT in out


def test_check_mode_on_the_converged_cluster_changes_nothing(serving, sim_inventory):
    before = {n.name: started_at(n) for n in serving.nodes}
    result = run_playbook(SERVER, sim_inventory, check=True)
    assert result.rc == 0, result.failure_messages()
    assert changed_tasks(result) == []
    assert {n.name: started_at(n) for n in serving.nodes} == before

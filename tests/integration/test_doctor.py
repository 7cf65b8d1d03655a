"""playbooks/doctor.yml on a TP=2 group deployed by playbooks/server.yml on simulated nodes.

One deployment, faults one after another, as an operator meets them (the tests run in file order
and build on each other's state): a deployment whose hybrid state cache is too small, diagnosed
without the -e that deployed it and repaired in one step by the remedy it prints; the healthy
group after it (no current finding, the failure as history, no secret in the bundle, diagnostic
numbers readable); a container memory cap the rank does not fit (an OOM kill: only the new cause,
computed from the deployed cap, and its remedy serves); a kill -9 (a signal, not memory, and the
peer that died with it); a worker whose start failed for the GPU until systemd's start limit, and a
head that waited for it in vain (the peer's absence, not the fabric). Every failure comes from a
real start: the unit server.yml installs runs docker run -> the stand-in SGLang server
(tests/standins/README.md), the doctor reads the nodes over SSH like on DGX OS.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.harness import cluster as sim
from tests.lib.doctor import BUNDLE, findings, history, run_doctor, sh, shown, stop, wait_down
from tests.lib.playbook import run_playbook
from tests.lib.supervised import REVISION, UNIT, checkpoint_files

pytestmark = pytest.mark.slow

API_KEY = "sk-DoctorPlant3dKey0123456789abcdefXYZ"  # noqa: S105 - planted on purpose
ADMIN_KEY = "adminplantedkeyallinlowercaseletters"  # noqa: S105 - planted on purpose: no shape, only its place
HF_TOKEN = "hf_PlantedTokenAbCdEfGh0123456789xyz"  # noqa: S105 - planted on purpose
# Known to the doctor by neither value nor variable: only its shape can give it away.
STRAY = "hf_StrayTokenQwErTy9876543210AbCdEf"  # noqa: S105 - planted on purpose
SECRETS = (API_KEY, ADMIN_KEY, HF_TOKEN, STRAY)
ARGS_FILE = "/etc/spark-llm/server-args.json"
ENV_FILE = "/etc/spark-llm/spark-llm.env"
DROP_IN = f"/etc/systemd/system/{UNIT}.d/50-by-hand.conf"
# Short waits where the real ones are minutes: rank 0 gives up on a missing peer after 6 s.
KNOBS = {"spark-0": {"sglang": {"rendezvous_timeout": 6, "load_seconds": 0.2}},
         "spark-1": {"sglang": {"rendezvous_timeout": 30, "load_seconds": 0.2}}}
SERVER = {"checkpoint_revision": REVISION, "server_api_key": API_KEY, "server_readiness_timeout": 300}
# What the first deployment asks for: more concurrency at a longer context than the state cache holds.
FIRST = {"max-running-requests": 8, "context-length": 262144, "log-requests": True}


def deploy(cluster, **extravars):
    return run_playbook("playbooks/server.yml", cluster.inventory, extravars={**SERVER, **extravars})


def generate(cluster, content="17 × 23 = ?"):
    body = json.dumps({"model": "glm53", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}).encode()
    req = urllib.request.Request(f"http://{cluster.nodes[0].mgmt_ip}:30000/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - the simulated head
        return resp.status == 200 and bool(json.loads(resp.read())["choices"])


@pytest.fixture(scope="module")
def first(sim_cluster):
    """The nodes as checkpoint.yml and fabric.yml leave them, then a deployment whose state cache is too small."""
    for n in sim_cluster.nodes:
        sim.set_knobs(sim_cluster.instance, n.name, KNOBS[n.name])
        # The fabric as netplan renders it (address, MTU 9000), so the doctor's fabric probes are quiet.
        sh(n, checkpoint_files() + " && printf '[Match]\\nName=enp1s0f1np1\\n\\n[Link]\\nMTUBytes=9000\\n\\n[Network]\\n"
              f"Address={n.fabric_ip}/24\\n' > /etc/systemd/network/10-netplan-enp1s0f1np1.network && networkctl reload")
    for n in sim_cluster.nodes:
        deadline = time.monotonic() + 30
        while f" {n.fabric_ip}/24 " not in sh(n, "ip -o -4 addr show dev enp1s0f1np1", check=False):
            assert time.monotonic() < deadline, f"{n.name}: the fabric address never came up"
            time.sleep(0.2)
    result = deploy(sim_cluster, server_flag_overrides=FIRST)
    assert result.rc != 0, "the state cache was meant to be too small"
    yield sim_cluster
    for n in sim_cluster.nodes:
        sim.ssh(n, f"systemctl disable --now {UNIT}; rm -rf /etc/systemd/system/{UNIT}* /etc/spark-llm; "
                   f"systemctl daemon-reload; systemctl reset-failed {UNIT}; true", check=False)


def test_hybrid_remedy_from_the_nodes_values_and_the_errors_figures_serves_in_one_step(first, tmp_path):
    """Finding 2 and 4: the deployed overrides (not the inventory's) and the error's own figures, one step."""
    _, files, _ = run_doctor(first, tmp_path)
    for host in ("spark-0", "spark-1"):
        found = findings(files, host)
        assert set(found) == {"hybrid_state_cache"}, (host, sorted(found))
        f = found["hybrid_state_cache"]
        assert "max_mamba_cache_size=5, mamba_ratio=5, resulting max_num_reqs=1" in f["evidence"]
        assert "deployed max-running-requests 8 and context-length 262144" in f["cause"]
        assert "5 // 5 = 1 request(s) fit" in f["remedy"]
        # Every other deployed override is kept: the context the inventory no longer says, the request log.
        assert f["apply"] == {"server_flag_overrides": {"context-length": 262144, "log-requests": True,
                                                               "max-running-requests": 1}}
        drift = {d["what"]: (d["inventory"], d["node"]) for d in json.loads(files[f"{host}/drift.json"])}
        assert drift["flag context-length"] == ("65536", "262144")
        assert drift["flag max-running-requests"] == ("2", "8")
    fixed = deploy(first, **findings(files, "spark-0")["hybrid_state_cache"]["apply"])
    assert fixed.rc == 0, fixed.stdout[-4000:]
    assert generate(first)


def test_a_fixed_then_healthy_group_has_no_current_finding_and_the_bundle_no_secret(first, tmp_path):
    """Finding 1 and 5: old starts are history without remedies; secrets go by their look, numbers stay."""
    head, worker = first.nodes
    # A key in every file the bundle collects: the env file (HF token), server-args.json and the unit (edited by
    # hand), the rank's journal (a logged request with a Bearer header in its text and a stray token).
    for n in first.nodes:
        sh(n, f"echo HF_TOKEN={HF_TOKEN} >> {ENV_FILE} && python3 -c \"import json; p='{ARGS_FILE}'; "
              f"a=json.load(open(p)); json.dump(a + ['--api-key', '{API_KEY}', '--admin-api-key', '{ADMIN_KEY}'], "
              f"open(p, 'w'), indent=4)\" && mkdir -p {Path(DROP_IN).parent} && printf '[Service]\\n"
              f"# run by hand once: --admin-api-key {ADMIN_KEY}\\nEnvironment=SGLANG_ADMIN_API_KEY={ADMIN_KEY}\\n' > {DROP_IN}"
              " && systemctl daemon-reload")
    prompt = (f"keys {STRAY} {HF_TOKEN} Authorization: Bearer {API_KEY} --admin-api-key {ADMIN_KEY}; figures "
              "max_total_tokens=524288 tokenizer_path=/models/glm53 full KV cache tokens=65536")
    assert generate(first, prompt)
    try:
        result, files, bundle = run_doctor(first, tmp_path)
    finally:
        for n in first.nodes:
            sh(n, f"rm -rf {Path(DROP_IN).parent} && systemctl daemon-reload")
    for host in ("spark-0", "spark-1"):
        assert findings(files, host) == {}, (host, findings(files, host))
        past = history(files, host)
        assert any(f["id"] == "hybrid_state_cache" for h in past for f in h["findings"]), (host, past)
    text = shown(result)
    assert "spark-0: no current finding" in text and "spark-0 history (earlier starts, already over; no remedy):" in text
    assert "remedy: Lower max-running-requests first" not in text
    # The planted values are gone from every file and from the output...
    raw = subprocess.run(["tar", "-xzOf", str(bundle)], capture_output=True, check=True).stdout
    for secret in SECRETS:
        assert secret.encode() not in raw, secret
        assert secret not in result.stdout and secret not in json.dumps(result.events), secret
    for name in ("unit.env", "server-args.json", "unit.service", "journal.log"):
        assert "<redacted>" in files[f"spark-0/{name}"], name
    assert f"SGLANG_HOST_IP={head.fabric_ip}" in files["spark-0/unit.env"]
    assert '"--max-running-requests",\n    "1"' in files[f"{worker.name}/server-args.json"]
    # ...while the diagnostic figures stay readable.
    journal = files["spark-0/journal.log"]
    for figure in ("max_total_tokens=524288", "tokenizer_path=/models/glm53", "full KV cache tokens=65536",
                   "max_mamba_cache_size=5, mamba_ratio=5, max_num_reqs=1, full KV cache tokens=262144",
                   "tokenizer_path=None", "max_total_tokens=None"):
        assert figure in journal, figure


def test_an_oom_kill_after_a_fixed_start_shows_only_the_new_cause_and_its_remedy_serves(first, tmp_path):
    """Finding 1, 2 and 3: --memory 96g deployed, diagnosed without the -e; the remedy's arithmetic serves."""
    kept = {"context-length": 262144, "log-requests": True, "max-running-requests": 1}
    failed = deploy(first, server_flag_overrides=kept, server_container_memory="96g")
    assert failed.rc != 0
    _, files, bundle = run_doctor(first, tmp_path)
    # The healthy start with the logged secrets is history now: its journal is in the bundle, redacted too.
    assert "<redacted>" in files["spark-0/journal-history.log"]
    raw = subprocess.run(["tar", "-xzOf", str(bundle)], capture_output=True, check=True).stdout
    assert not [secret for secret in SECRETS if secret.encode() in raw]
    for host in ("spark-0", "spark-1"):
        found = findings(files, host)
        assert set(found) == {"oom_killed"}, (host, sorted(found))
        f = found["oom_killed"]
        assert "docker: container OOM-killed" in f["evidence"]
        assert "--memory 96g on this node" in f["cause"]
        for part in ("0.84 x 119.7 GiB", "+ 4 GiB runtime overhead = 104.5 GiB", "raise server_container_memory "
                     "96g -> 106g", "lower mem-fraction-static 0.84 -> 0.76", "not max-running-requests"):
            assert part in f["remedy"], (part, f["remedy"])
        assert f["apply"] == {"server_container_memory": "106g"}
        assert f["alternative"] == {"server_flag_overrides": {**kept, "mem-fraction-static": 0.76}}
        drift = {d["what"]: (d["inventory"], d["node"]) for d in json.loads(files[f"{host}/drift.json"])}
        assert drift["container memory (server_container_memory)"] == ("120g", "96g")
        # The earlier failure is history, not a current finding.
        assert any(f["id"] == "hybrid_state_cache" for h in history(files, host) for f in h["findings"])
    fixed = deploy(first, server_flag_overrides=kept, **findings(files, "spark-1")["oom_killed"]["apply"])
    assert fixed.rc == 0, fixed.stdout[-4000:]
    assert generate(first)


def test_a_kill_9_is_a_signal_not_memory_and_its_peer_died_with_it(first, tmp_path):
    """Finding 8: exit 137 without docker's OOM kill is a signal; the head names the worker's end as its cause."""
    head, worker = first.nodes
    sh(worker, "kill -9 $(docker inspect --format '{{.State.Pid}}' spark-llm)")
    wait_down(first, worker.name, head.name)
    stop(first, head.name, worker.name)
    _, files, _ = run_doctor(first, tmp_path)
    on_worker, on_head = findings(files, worker.name), findings(files, head.name)
    assert set(on_worker) == {"signal_killed"}, sorted(on_worker)
    assert "not OOM-killed" in on_worker["signal_killed"]["evidence"]
    assert on_worker["signal_killed"]["apply"] == {}
    assert set(on_head) == {"peer_exited"}, sorted(on_head)
    assert f"{worker.name} (rank 1) ended at" in on_head["peer_exited"]["cause"]
    assert "Rank killed by a signal, not for memory" in on_head["peer_exited"]["cause"]


def test_a_worker_that_could_not_start_is_the_peers_absence_with_its_start_limit(first, tmp_path):
    """Finding 8: a rendezvous timeout with the peer absent is not a fabric fault; the start limit is named;
    the failed start's own journal is the evidence after the GPU came back. Check mode writes no bundle.
    Finding 9: a failed readiness summarises one read of every rank and fails only the rank at fault."""
    head, worker = first.nodes
    sim.set_knobs(first.instance, worker.name, {"gpu": {"present": False}})
    # The head waits for its peer longer than the readiness wait takes to see the worker's start fail at once:
    # when the one pass reads every rank, the head is still up (a timing-free check of whom the run blames).
    sim.set_knobs(first.instance, head.name, {"sglang": {"rendezvous_timeout": 240}})
    try:
        # Finding 9: restart.yml's readiness fails; its summary comes from one read of every rank, and only the
        # ranks that pass read as down are marked failed: the head, still waiting for its peer, is not (a rank
        # that had given up by the time of the read would be down too, and a caller that rescues the start,
        # tune.yml, needs every down rank in its rescue).
        restart = run_playbook("playbooks/restart.yml", first.inventory, extravars=SERVER)
        assert restart.rc != 0
        summary = restart.failure_messages()
        assert f"one pass read it before they were stopped: {head.name} active/running (result success, exit 0); " \
            f"{worker.name} activating/auto-restart (result exit-code, exit 125, ended " in summary, summary
        assert f"first to end: {worker.name}" in summary
        assert [(d["host"], d["task"]) for d in restart.failed] == [(worker.name, "Fail with a summary")]
        stats = next(e["event_data"] for e in restart.events if e.get("event") == "playbook_on_stats")
        assert head.name not in stats.get("failures", {}) and worker.name in stats.get("failures", {}), stats
        sim.set_knobs(first.instance, head.name, KNOBS[head.name])
        # Each start fails at once; after StartLimitBurst (3 an hour) systemd refuses the next ones.
        sh(worker, f"systemctl reset-failed {UNIT}; for i in 1 2 3 4; do systemctl restart {UNIT}; sleep 1; done; true")
        sh(head, f"systemctl reset-failed {UNIT}; systemctl start {UNIT}")
        wait_down(first, head.name)
        stop(first, head.name)
    finally:
        sim.set_knobs(first.instance, worker.name, {"gpu": {"present": True}})
        sim.set_knobs(first.instance, head.name, KNOBS[head.name])
    result, _, _ = run_doctor(first, tmp_path, check=True)
    assert result.results(BUNDLE) and not list(tmp_path.iterdir())
    text = shown(result)
    assert "spark-1: systemd refuses to start the rank again (start limit)" in text
    assert "spark-1: The start could not get the GPU" in text
    assert "nvml error: driver not loaded" in text and "nvidia-smi answers now" in text
    assert "spark-0: A peer rank was not running when this rank waited for it" in text
    assert "DistStoreError: Timed out after" in text and "The start could not get the GPU" in text.split(
        "spark-0: A peer rank was not running")[1]
    assert "spark-0: NCCL/Gloo rendezvous or collective timed out" not in text
    assert "Re-running playbooks/fabric.yml does not help here" in text

"""vLLM on the simulated pair (spark_engine: vllm), its stand-in behind the docker stand-in's vLLM image.

One pair carries the tests in file order, as one site's history: a vLLM site without the recipe's kernel fix
refused before any change; site.yml from scratch with vLLM on a derived image that carries the fix (built on the
head, given to the worker over the fabric), verified; a second run that changes nothing; a killed and a frozen
worker rank healed by the supervisor; status; a change to vLLM's upstream image, which cannot start on GB10, going
back by itself to the configuration that served; an upgrade of the base, the fix built again before any rank
stops; a switch to SGLang and back to vLLM, each verified; a short benchmark on vLLM's --max-num-seqs and a tune of
one candidate that vLLM's KV cache refuses, ending on what ran before; the real smg gateway in front of the vLLM
head; uninstall (the gateway's too). The monitoring stays off here (its
installation would cost every site.yml run of this module): tests/integration/test_monitoring.py turns its pair into
a vLLM group and watches it.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
import yaml

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook
from tests.lib.prometheus_tools import parse_exposition
from tests.lib.supervised import (
    POLL,
    SHORT_STOP_GRACE,
    SUPERVISOR,
    UNIT,
    generate,
    ranks_active,
    restarts,
    signal_rank,
    state,
    wait_for,
    wait_serving,
    wait_stable,
)
from tests.lib.vllm_image import sm121_fix_build

pytestmark = pytest.mark.slow

UPSTREAM = "vllm/vllm-openai:glm51-cu130"
ROLLED_BACK = "The change failed and was rolled back: every rank runs its last good configuration again"


def sh(node, command, timeout=120):
    return sim.ssh(node, command, timeout=timeout)


def running_image(node) -> str:
    return sh(node, "docker inspect --type container --format '{{.Image}}' spark-llm").strip()


def launch_args(node) -> list[str]:
    return json.loads(sh(node, "cat /etc/spark-llm/server-args.json"))


class Site:
    def __init__(self, cluster, settings):
        self.cluster, self.settings = cluster, settings

    def play(self, playbook, **extravars):
        return run_playbook(playbook, self.cluster.inventory, extravars={**self.settings, **extravars})

    def verified(self, result=None):
        """verify.yml's table of the run (or of a verify run of its own): every row passed."""
        result = result or self.play("playbooks/verify.yml")
        assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
        table = "\n".join(next(iter(result.results("Show the verification table").values()))["msg"])
        assert table.count("PASS") == 6 and "FAIL" not in table, table
        return table


@pytest.fixture(scope="module")
def site(sim_cluster, tmp_path_factory):
    for n in sim_cluster.nodes:
        sim.set_knobs(sim_cluster.instance, n.name, {"vllm": {"load_seconds": 0.2}, "sglang": {"load_seconds": 0.2}})
    build = sm121_fix_build(tmp_path_factory.mktemp("vllm-sm121-fix"))
    return Site(sim_cluster, {**SUPERVISOR, **SHORT_STOP_GRACE, "spark_engine": "vllm", "spark_monitoring": False, **build})


def test_a_vllm_site_without_the_kernel_fix_is_refused_before_any_change(site):
    result = site.play("playbooks/server.yml", server_image_build_context="", server_image_build_sha256={},
                       spark_monitoring=True)
    assert result.rc != 0
    message = result.failure_messages()
    assert "spark_engine = 'vllm' with server_image and server_image_build_context empty" in message
    assert "cudaErrorNoKernelImageForDevice" in message and "Fix: set server_image_build_context" in message
    # The monitoring asked for too is no reason to refuse: it knows vLLM's metric names.
    assert "spark_monitoring" not in message
    assert result.changed == []
    for n in site.cluster.nodes:
        assert sh(n, f"systemctl is-active {UNIT}; true").strip() in ("inactive", "unknown")


def test_site_deploys_vllm_from_scratch_on_the_derived_image_and_verifies(site):
    result = site.play("site.yml")
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    site.verified(result)
    head, worker = site.cluster.nodes
    tag = next(iter(result.results("Pull the base image on the head and name the derived image").values()))["tag"]
    assert tag.startswith("spark-llm/vllm-derived:"), tag
    ids = {running_image(n) for n in site.cluster.nodes}
    assert len(ids) == 1 and ids == {sh(worker, f"docker image inspect --format '{{{{.Id}}}}' {tag}").strip()}
    # vllm serve on both nodes: the head serves, the worker joins it headless over the fabric.
    head_args, worker_args = launch_args(head), launch_args(worker)
    assert head_args[0] == worker_args[0] == "/models/glm53"
    assert "--headless" in worker_args and "--headless" not in head_args
    assert worker_args[worker_args.index("--master-addr") + 1] == head.fabric_ip
    assert head_args[head_args.index("--reasoning-parser") + 1] == "deepseek_r1"
    # The vLLM start's own lines in the head's journal, and the key in no container's recorded configuration.
    journal = sh(head, f"journalctl -u {UNIT} --no-pager -o cat")
    assert "Starting vLLM API server" in journal and "Application startup complete." in journal
    key = (site.cluster.inventory / ".credentials" / "spark_llm_api_key").read_text().strip()
    for n in site.cluster.nodes:
        assert key not in sh(n, "docker inspect spark-llm")
    wait_for(lambda: state(site.cluster).get("state") == "healthy", "the supervisor's first healthy check", 120,
             every=POLL)


def test_a_second_run_changes_nothing(site):
    result = site.play("site.yml")
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    assert result.changed == []


def test_a_killed_worker_rank_is_healed_by_the_supervisor(site):
    before = restarts(site.cluster)
    signal_rank(site.cluster.nodes[1], "KILL")
    wait_serving(site.cluster)
    st = wait_stable(site.cluster)
    assert restarts(site.cluster) == before + 1, st["history"][-4:]
    assert ranks_active(site.cluster) == ["active", "active"]


def test_a_frozen_worker_rank_is_healed_by_the_supervisor(site):
    before = restarts(site.cluster)
    signal_rank(site.cluster.nodes[1], "STOP")
    wait_serving(site.cluster)
    wait_stable(site.cluster)
    assert restarts(site.cluster) == before + 1
    assert ranks_active(site.cluster) == ["active", "active"]


def test_status_shows_the_vllm_group(site):
    result = site.play("playbooks/status.yml")
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    lines = {h: r["msg"] for h, r in result.results("Show one line per node").items()}
    head, worker = lines["spark-0"], lines["spark-1"]
    assert head.startswith("spark-0 head: unit active/running;") and "image spark-llm/vllm-derived:" in head, head
    assert "endpoint healthy, serves /models/glm53" in head
    assert worker.startswith("spark-1 worker: unit active/running;") and "endpoint n/a (worker)" in worker
    assert not result.changed


def test_vllm_s_upstream_image_cannot_start_on_gb10_and_the_group_goes_back(site):
    before = {n.name: running_image(n) for n in site.cluster.nodes}
    result = site.play("playbooks/server.yml", server_image=UPSTREAM, server_image_build_context="",
                       server_image_build_sha256={})
    assert result.rc != 0
    message = result.failure_messages()
    assert ROLLED_BACK in message, message or result.stdout[-3000:]
    assert "vLLM did not come up" in message and "no kernel image is available for execution on the device" in message
    # The doctor diagnosed the failed start before it went back (the same on the worker).
    assert "The doctor on the failed start: spark-0: The image has no kernel for GB10 (sm_121)" in message, message
    assert "Deploy a derived image that carries the fix: set server_image_build_context" in message
    assert {n.name: running_image(n) for n in site.cluster.nodes} == before
    assert generate(site.cluster)


def test_an_upgrade_of_the_base_builds_the_fix_again_before_any_rank_stops(site):
    t0 = time.time()
    result = site.play("playbooks/upgrade.yml", server_image=f"{UPSTREAM}-v2")
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    tag = next(iter(result.results("Pull the base image on the head and name the derived image").values()))["tag"]
    head, worker = site.cluster.nodes
    seen = {n.name: [json.loads(line) for line in sh(n, f"docker events --since {t0} --until {time.time() + 1:.3f} "
                                                        "--format '{{json .}}'").splitlines()] for n in site.cluster.nodes}
    stopped = min(e["timeNano"] for name in seen for e in seen[name]
                  if e["Type"] == "container" and e["Action"] in ("kill", "stop", "die"))
    built = [e["timeNano"] for e in seen[head.name] if e["Action"] == "tag" and e["Actor"]["Attributes"]["name"] == tag]
    loaded = [e["timeNano"] for e in seen[worker.name] if e["Action"] == "load"]
    assert built and loaded and max(built + loaded) < stopped
    built_id = sh(head, f"docker image inspect --format '{{{{.Id}}}}' {tag}").strip()
    assert {running_image(n) for n in site.cluster.nodes} == {built_id}
    assert generate(site.cluster)


def test_a_switch_to_sglang_and_back_to_vllm(site):
    sglang = {"spark_engine": "sglang", "server_image_build_context": "", "server_image_build_sha256": {}}
    to_sglang = site.play("playbooks/server.yml", **sglang)
    assert to_sglang.rc == 0, to_sglang.failure_messages() or to_sglang.stdout[-3000:]
    head = site.cluster.nodes[0]
    assert "--model-path" in launch_args(head) and "run_module('sglang.launch_server'" in sh(head, f"systemctl cat {UNIT}")
    site.verified(site.play("playbooks/verify.yml", **sglang))
    back = site.play("playbooks/server.yml")
    assert back.rc == 0, back.failure_messages() or back.stdout[-3000:]
    assert launch_args(head)[0] == "/models/glm53" and "'vllm','serve'" in sh(head, f"systemctl cat {UNIT}")
    site.verified()


# ---- The benchmark and the tuner on vLLM's flags: one short benchmark, a tune of one candidate --------------


def test_the_benchmark_follows_vllm_s_max_num_seqs_and_max_model_len(site, tmp_path):
    result = site.play("playbooks/benchmark.yml", benchmark_prompts=["short"], benchmark_recall=False,
                       benchmark_chart=False, benchmark_max_tokens=8, benchmark_rounds=1, benchmark_min_requests=1,
                       benchmark_report_dir=str(tmp_path), benchmark_report_name="run")
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    report = json.loads((tmp_path / "run.json").read_text())
    # auto: 1 up to --max-num-seqs 2, then one beyond; the context is --max-model-len's.
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2, 3], report["levels"]
    assert int(report["meta"]["context_length"]) == 65536 and int(report["meta"]["max_running_requests"]) == 2
    assert all(lv["summary"]["ok"] == lv["summary"]["requests"] > 0 for lv in report["levels"]), report["levels"]
    markdown = (tmp_path / "run.md").read_text()
    assert markdown.startswith("# vLLM benchmark") and "max-model-len 65536, max-num-seqs 2;" in markdown, markdown


# A sequence's linear-attention state of 2 GiB (the stand-in's knob; 0.75 by default): at the seed's 0.84 of the GPU
# the KV cache then holds 65536 tokens beside 2 sequences' state, not beside 3.
HEAVY_STATE = {"vllm": {"state_gib_per_seq": 2.0}}


def test_the_tuner_varies_vllm_s_flags_and_ends_on_what_the_group_ran(site, tmp_path):
    head = site.cluster.nodes[0]
    for n in site.cluster.nodes:
        sim.set_knobs(site.cluster.instance, n.name, HEAVY_STATE)
    since = sh(head, "date +%s").strip()
    try:
        result = site.play("playbooks/tune.yml", tune_contexts=[65536], tune_max_requests=3, tune_dir=str(tmp_path))
    finally:
        for n in site.cluster.nodes:
            sim.set_knobs(site.cluster.instance, n.name, {"vllm": {"state_gib_per_seq": 0.75}})
    assert result.rc == 0, result.failure_messages() or result.stdout[-5000:]
    (path,) = tmp_path.glob("tune-*Z.json")
    report = json.loads(path.read_text())
    # The running point counted without a restart, one candidate above it: the KV cache's own refusal.
    assert {(t["context"], t["requests"]): t["fits"] for t in report["trials"]} == {(65536, 2): True, (65536, 3): False}
    failed = report["trials"][-1]
    assert failed["reason"].startswith("the KV cache does not hold max-model-len tokens: "), failed
    assert "ValueError: The model's max seq len (65536) is larger than the maximum number of tokens" in failed["reason"]
    assert [(r["context"], r["max_requests"]) for r in report["frontier"]] == [(65536, 2)]
    shown = [m for m in (e["event_data"]["res"]["msg"] for e in result.task_events("runner_on_ok")
                         if e["event_data"].get("task") == "Show the candidate")]
    assert len(shown) == 1 and shown[0].startswith("Candidate max-model-len 65536 x max-num-seqs 3 "), shown
    # The candidate reached vLLM as its own flag, and the group ends on what it ran before, serving.
    started = sh(head, f"journalctl -u {UNIT} --since @{since} --no-pager -o cat | grep 'non-default args'")
    assert "'max_num_seqs': 3" in started and "'max_num_seqs': 2" in started, started
    for n in site.cluster.nodes:
        args = launch_args(n)
        assert (args[args.index("--max-model-len") + 1], args[args.index("--max-num-seqs") + 1]) == ("65536", "2")
    assert json.loads(next(tmp_path.glob("tune-*/verify-after.json")).read_text())["ok"] is True
    assert generate(site.cluster)
    # The table and the profiles file: the flags under the names either engine's inventory takes.
    assert next(tmp_path.glob("tune-*Z.md")).read_text().startswith("# vLLM capacity frontier")
    (profiles,) = tmp_path.glob("tune-*-profiles.yml")
    assert yaml.safe_load(profiles.read_text()) == {
        "server_profiles": {"ctx65536-req2": {"context-length": 65536, "max-running-requests": 2}}}


def head_successes(head) -> float:
    """The requests the vLLM head finished, whatever their finish reason (its own /metrics, asked on the node)."""
    parsed = parse_exposition(sh(head, "curl -s http://127.0.0.1:30000/metrics"))
    return sum(value for name, _labels, value in parsed["samples"] if name == "vllm:request_success_total")


def test_the_gateway_fronts_a_vllm_group(site):
    """The real smg in front of the vLLM head (on the first head, gateway_enabled): a chat completion through its
    port reaches the head with the site's key, and without the key the gateway answers itself."""
    result = site.play("playbooks/gateway.yml", gateway_enabled=True)
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    head = site.cluster.nodes[0]
    assert sh(head, "systemctl is-active spark-llm-gateway.service").strip() == "active"
    key = (site.cluster.inventory / ".credentials" / "spark_llm_api_key").read_text().strip()
    body = json.dumps({"model": "/models/glm53", "max_tokens": 16,
                       "messages": [{"role": "user", "content": "17 x 23 = ?"}]}).encode()

    def ask(headers: dict) -> tuple[int, dict]:
        req = urllib.request.Request(f"http://{head.mgmt_ip}:30080/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - the simulated gateway
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as refusal:
            return refusal.code, json.loads(refusal.read() or b"{}")

    before = head_successes(head)
    status, answer = ask({"Authorization": f"Bearer {key}"})
    assert status == 200 and answer["choices"][0]["message"]["content"] == "391", (status, answer)
    assert head_successes(head) == before + 1
    status, answer = ask({})
    assert status == 401, (status, answer)
    assert head_successes(head) == before + 1


def test_uninstall_takes_vllm_off_the_nodes_and_keeps_the_images(site):
    result = site.play("playbooks/uninstall.yml")
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    for n in site.cluster.nodes:
        left = sh(n, f"ls -d /etc/systemd/system/{UNIT} /etc/systemd/system/spark-llm-gateway.service /etc/spark-llm "
                     "2>/dev/null; docker ps -q; true").split()
        assert left == [], (n.name, left)
        assert "spark-llm/vllm-derived:" in sh(n, "docker images --format '{{.Repository}}:{{.Tag}}'")

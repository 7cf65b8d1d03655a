"""Where the monitoring's figures come from: the SGLang stand-in's /metrics, the node collector, the node exporter.

The stand-in serves SGLang's real metric names, types and labels and moves them as it serves (tokens counted when
a request finishes, the time to first token and the gaps between tokens observed, running and queued requests as
the scheduler sees them), only with --enable-metrics, and without the API key unless the build predates SGLang's
/metrics exemption. The node collector turns nvidia-smi's answers (a GB10's [N/A] memory included), the rank's GPU
process, the filesystems and the supervisor's state into a textfile. Every metric a dashboard panel uses exists in
one of those outputs, the real node exporter's (Debian's package) or the alert rules.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.lib.playbook import REPO
from tests.lib.prometheus_tools import node_exporter, parse_exposition, promtool, sample
from tests.lib.roles import filter_plugin, flag_model
from tests.lib.seed import DEFAULT_FLAGS, flatten

SERVER = REPO / "tests" / "standins" / "lib" / "sglang_server.py"
NVIDIA_SMI = REPO / "tests" / "standins" / "bin" / "nvidia-smi"
COLLECTOR = REPO / "roles" / "monitoring" / "files" / "spark_node_collector.py"
DASHBOARD = REPO / "roles" / "monitoring" / "files" / "dashboard.json"
LOOPBACK = "127.0.0.1"
KEY = "sk-monitoring-test-key-0123456789abcdef"
MODEL_LABEL = {"model_name": "/models/glm53"}
SCHEDULER = {"engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def http(port, path, body=None, headers=None, timeout=30):
    req = urllib.request.Request(f"http://{LOOPBACK}:{port}{path}", headers={"Content-Type": "application/json",
                                                                             **(headers or {})},
                                 data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
            return resp.status, resp.headers.get("content-type", ""), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("content-type", ""), err.read().decode()


def start_standin(tmp_path, *flags, knobs=None):
    """One rank (--nnodes 1) on loopback serving the seed's flags plus `flags`, its model at /models/glm53."""
    root = tmp_path / "root"
    (root / "etc/spark-sim").mkdir(parents=True, exist_ok=True)
    (root / "etc/spark-sim/node.json").write_text(json.dumps({"sglang": {"load_seconds": 0.05, **(knobs or {})}}))
    model = tmp_path / "glm53"
    model.mkdir(exist_ok=True)
    (model / "processor_config.json").write_text("{}")
    (model / "config.json").write_text("{}")
    port = free_port()
    args = ["--model-path", str(model), "--served-model-name", "/models/glm53", "--tp-size", "1", "--nnodes", "1",
            "--node-rank", "0", "--host", LOOPBACK, "--port", str(port),
            *flatten([f for f in DEFAULT_FLAGS if f[0] not in ("--enable-metrics",)]), *flags]
    env = {**os.environ, "NVIDIA_VISIBLE_DEVICES": "all", "SPARK_SIM_ROOT": str(root), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, str(SERVER), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the stand-in exited {proc.returncode}: {proc.stdout.read()}")
        try:
            if http(port, "/health")[0] == 200:
                return proc, port, root
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("the stand-in did not serve")


@pytest.fixture
def standin(tmp_path):
    procs = []

    def start(*flags, knobs=None):
        proc, port, root = start_standin(tmp_path, *flags, knobs=knobs)
        procs.append(proc)
        return port, root

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def metrics(port, headers=None) -> dict:
    status, ctype, body = http(port, "/metrics", headers=headers)
    assert status == 200, body
    assert ctype.startswith("text/plain; version=0.0.4")
    return parse_exposition(body)


def chat(port, words=3, stream=False, headers=None):
    body = {"model": "/models/glm53", "messages": [{"role": "user", "content": " ".join(["hello"] * words)}],
            "max_tokens": 20, "ignore_eos": True, "stream": stream,
            "stream_options": {"include_usage": True} if stream else None}
    status, _, text = http(port, "/v1/chat/completions", body=body, headers=headers, timeout=60)
    assert status == 200, text
    if not stream:
        return json.loads(text)["usage"]
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    return next(c["usage"] for c in chunks if c.get("usage"))


def test_sglang_metrics_have_the_real_names_types_and_labels_and_move_as_it_serves(standin):
    # Each request's first token comes from its prefill, so four 20-token requests, two at a time, take 38
    # decoding steps or more, by how their prefills line up: the scheduler's default log interval (40) is
    # not always reached, a 10-step one always is.
    port, _ = standin("--enable-metrics", "--decode-log-interval", "10",
                      knobs={"token_seconds": 0.02, "ttft_seconds": 0.05})
    before = metrics(port)
    kinds = before["families"]
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total"):
        assert kinds[name] == "counter"
    for name in ("sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
                 "sglang:e2e_request_latency_seconds"):
        assert kinds[name] == "histogram"
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
                 "sglang:num_used_tokens"):
        assert kinds[name] == "gauge"
        assert sample(before, name, **MODEL_LABEL, **SCHEDULER) == 0.0
    assert sample(before, "sglang:generation_tokens_total", **MODEL_LABEL) == 0.0
    assert sample(before, "sglang:time_to_first_token_seconds_bucket", le="+Inf", **MODEL_LABEL) == 0.0

    # max-running-requests is 2: of four requests at once two wait in the queue, and the gauges show it.
    seen = {"running": 0.0, "queued": 0.0}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(chat, port, 3 + i, i % 2 == 1) for i in range(4)]
        while not all(f.done() for f in futures):
            now = metrics(port)
            seen["running"] = max(seen["running"], sample(now, "sglang:num_running_reqs", **SCHEDULER))
            seen["queued"] = max(seen["queued"], sample(now, "sglang:num_queue_reqs", **SCHEDULER))
            if sample(now, "sglang:num_running_reqs", **SCHEDULER):
                assert sample(now, "sglang:token_usage", **SCHEDULER) > 0
            time.sleep(0.02)
        usages = [f.result() for f in futures]
    assert seen == {"running": 2.0, "queued": 2.0}

    after = metrics(port)
    generated = sum(u["completion_tokens"] for u in usages)
    assert sample(after, "sglang:generation_tokens_total", **MODEL_LABEL) == generated == 80
    assert sample(after, "sglang:prompt_tokens_total", **MODEL_LABEL) == sum(u["prompt_tokens"] for u in usages)
    assert sample(after, "sglang:num_requests_total", **MODEL_LABEL) == 4
    assert sample(after, "sglang:time_to_first_token_seconds_count", **MODEL_LABEL) == 4
    assert sample(after, "sglang:e2e_request_latency_seconds_count", **MODEL_LABEL) == 4
    # One gap per token after the first; the queued requests waited, so their first token came later.
    assert sample(after, "sglang:inter_token_latency_seconds_count", **MODEL_LABEL) == generated - 4
    assert sample(after, "sglang:time_to_first_token_seconds_bucket", le="0.1", **MODEL_LABEL) < 4
    assert sample(after, "sglang:time_to_first_token_seconds_sum", **MODEL_LABEL) > 4 * 0.05
    # Histogram buckets are cumulative and end in +Inf = count.
    buckets = [(float(labels["le"]), value) for name, labels, value in after["samples"]
               if name == "sglang:e2e_request_latency_seconds_bucket"]
    assert [v for _, v in sorted(buckets)] == sorted(v for _, v in buckets) and buckets[-1] == (float("inf"), 4)
    # 76 decoded tokens in 38 steps or more: the scheduler measured its throughput; nothing runs any more.
    assert sample(after, "sglang:gen_throughput", **SCHEDULER) > 0
    assert sample(after, "sglang:num_running_reqs", **SCHEDULER) == 0
    assert sample(after, "sglang:num_used_tokens", **SCHEDULER) == 0
    # Prometheus's own parser reads it.
    linted = subprocess.run([str(promtool()), "check", "metrics"], input=http(port, "/metrics")[2],
                            capture_output=True, text=True, check=False)
    assert "error while linting" not in linted.stdout + linted.stderr, linted.stdout + linted.stderr


def test_metrics_need_enable_metrics(standin):
    port, _ = standin()
    assert http(port, "/metrics")[0] == 404


def test_metrics_answer_without_the_api_key_unless_the_build_predates_the_exemption(standin):
    port, root = standin("--enable-metrics", "--api-key", KEY)
    assert http(port, "/v1/models")[0] == 401
    # SGLang's auth middleware lets /health* and /metrics* through (srt/utils/auth.py).
    assert http(port, "/metrics")[0] == 200
    knobs = json.loads((root / "etc/spark-sim/node.json").read_text())
    knobs["sglang"]["metrics_behind_key"] = True
    (root / "etc/spark-sim/node.json").write_text(json.dumps(knobs))
    status, _, body = http(port, "/metrics")
    assert (status, json.loads(body)) == (401, {"error": "Unauthorized"})
    assert http(port, "/metrics", headers={"Authorization": f"Bearer {KEY}"})[0] == 200
    assert http(port, "/metrics", headers={"Authorization": "Bearer wrong"})[0] == 401


# --- the node collector ----------------------------------------------------------------------------------


def collect(tmp_path, *extra, gpu=None, env=None) -> dict:
    root = tmp_path / "root"
    (root / "etc/spark-sim").mkdir(parents=True, exist_ok=True)
    (root / "etc/spark-sim/node.json").write_text(json.dumps({"gpu": gpu or {}}))
    textfiles = tmp_path / "textfile"
    proc = subprocess.run([sys.executable, str(COLLECTOR), "--textfile-dir", str(textfiles), "--model-dir",
                           str(tmp_path / "models" / "glm53"), "--nvidia-smi", str(NVIDIA_SMI), *extra],
                          env={**os.environ, "SPARK_SIM_ROOT": str(root), **(env or {})},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    out = textfiles / "spark_node.prom"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert [p.name for p in textfiles.iterdir()] == ["spark_node.prom"], "no temporary file left behind"
    return parse_exposition(out.read_text())


def test_the_collector_reports_a_gb10_its_unified_memory_as_not_supported(tmp_path):
    found = collect(tmp_path, gpu={"temperature": 77, "utilization": 93})
    gpu = {"gpu": "0"}
    assert sample(found, "spark_gpu_query_success") == 1
    assert sample(found, "spark_gpu_info", name="NVIDIA GB10", driver_version="580.95.05") == 1
    assert sample(found, "spark_gpu_temperature_celsius", **gpu) == 77
    assert sample(found, "spark_gpu_utilization_percent", **gpu) == 93
    assert sample(found, "spark_gpu_power_draw_watts", **gpu) == 11.52
    assert sample(found, "spark_gpu_sm_clock_hertz", **gpu) == 2405e6
    # [N/A]: no sample, and the field is said to be unsupported rather than 0.
    for field in ("memory.used", "memory.total", "clocks.mem"):
        assert sample(found, "spark_gpu_field_supported", field=field, **gpu) == 0
    assert sample(found, "spark_gpu_field_supported", field="temperature.gpu", **gpu) == 1
    assert sample(found, "spark_gpu_memory_used_bytes", **gpu) is None
    assert sample(found, "spark_rank_process_present") == 0
    assert sample(found, "spark_gpu_compute_processes", **gpu) == 0
    # The model directory does not exist yet: measured where it will be.
    for purpose in ("model", "root"):
        size = sample(found, "spark_filesystem_size_bytes", purpose=purpose)
        assert size > 0 and 0 <= sample(found, "spark_filesystem_avail_bytes", purpose=purpose) <= size
    assert abs(sample(found, "spark_collector_last_run_timestamp_seconds") - time.time()) < 60
    assert sample(found, "spark_supervisor_state", state="healthy") is None


@contextlib.contextmanager
def gpu_holder(tmp_path, title: str):
    """A process with the node root's GPU device open whose command line carries `title`, as a rank's does."""
    device = tmp_path / "root" / "var/lib/spark-sim/gpu/nvidia0"
    device.parent.mkdir(parents=True)
    device.touch()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); time.sleep(60)",
                               str(device), title])
    try:
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_the_collector_finds_the_rank_holding_the_gpu_and_the_supervisors_state(tmp_path):
    with gpu_holder(tmp_path, "sglang.launch_server"):
        state = tmp_path / "supervisor"
        state.mkdir()
        # The supervisor's flapping alert raised a minute ago holds for its window (an hour here).
        until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3540))
        (state / "state.json").write_text(json.dumps({"state": "probing-failed", "failures": 2,
                                                      "restarts": ["2026-01-01T00:00:00Z"], "flapping_until": until}))
        deadline = time.monotonic() + 10
        while True:
            found = collect(tmp_path, "--supervisor-state-dir", str(state))
            if sample(found, "spark_rank_process_present") == 1 or time.monotonic() > deadline:
                break
        assert sample(found, "spark_rank_process_present") == 1
        assert sample(found, "spark_gpu_compute_processes", gpu="0") == 1
        assert sample(found, "spark_supervisor_state", state="probing-failed") == 1
        assert sample(found, "spark_supervisor_state", state="healthy") == 0
        assert sample(found, "spark_supervisor_probe_failures") == 2
        assert sample(found, "spark_supervisor_restarts") == 1
        assert sample(found, "spark_supervisor_gave_up") == 0
        assert sample(found, "spark_supervisor_flapping") == 1
        (state / "state.json").write_text(json.dumps({"state": "healthy", "flapping_until": "2026-01-01T00:00:00Z"}))
        assert sample(collect(tmp_path, "--supervisor-state-dir", str(state)), "spark_supervisor_flapping") == 0


def rdma_port(root, device, netdev, *, state, gids):
    """An RDMA device's port as sysfs shows it (the RoCE stand-in's layout): gids maps index -> (gid, type)."""
    (root / device / "device" / "net" / netdev).mkdir(parents=True)
    port = root / device / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True)
    (port / "state").write_text(f"{state}\n")
    for index, (gid, kind) in gids.items():
        (port / "gids" / str(index)).write_text(gid + "\n")
        (port / "gid_attrs/types" / str(index)).write_text(kind + "\n")
        (port / "gid_attrs/ndevs" / str(index)).write_text(netdev + "\n")


def test_the_collector_counts_the_rdma_ports_nccl_can_use_behind_the_fabric_interface(tmp_path):
    mapped = "0000:0000:0000:0000:0000:ffff:0ae8:010a"
    rdma = tmp_path / "infiniband"
    rdma_port(rdma, "rocep1s0f1", "enp1s0f1np1", state="4: ACTIVE",
              gids={2: (mapped, "IB/RoCE v1"), 3: (mapped, "RoCE v2")})
    rdma_port(rdma, "roceP2p1s0f1", "enP2p1s0f1np1", state="1: DOWN", gids={})
    args = ("--fabric-interface", "enp1s0f1np1", "--rdma-class", str(rdma))
    found = collect(tmp_path, *args)
    assert sample(found, "spark_rdma_port_active", device="rocep1s0f1", port="1", netdev="enp1s0f1np1") == 1
    assert sample(found, "spark_rdma_port_active", device="roceP2p1s0f1", port="1", netdev="enP2p1s0f1np1") == 0
    assert sample(found, "spark_rdma_fabric_ports_usable", netdev="enp1s0f1np1") == 1
    # Two rails: one sample each; the second rail's port is DOWN.
    both = collect(tmp_path, *args, "--fabric-interface", "enP2p1s0f1np1")
    assert sample(both, "spark_rdma_fabric_ports_usable", netdev="enp1s0f1np1") == 1
    assert sample(both, "spark_rdma_fabric_ports_usable", netdev="enP2p1s0f1np1") == 0
    # Only a RoCE v1 GID for the address: NCCL (RoCE v2) cannot use the port.
    (rdma / "rocep1s0f1/ports/1/gid_attrs/types/3").write_text("IB/RoCE v1\n")
    assert sample(collect(tmp_path, *args), "spark_rdma_fabric_ports_usable", netdev="enp1s0f1np1") == 0
    # No RDMA driver at all: no port, and none usable.
    found = collect(tmp_path, "--fabric-interface", "enp1s0f1np1", "--rdma-class", str(tmp_path / "absent"))
    assert sample(found, "spark_rdma_port_active", device="rocep1s0f1", port="1", netdev="enp1s0f1np1") is None
    assert sample(found, "spark_rdma_fabric_ports_usable", netdev="enp1s0f1np1") == 0


def test_the_collector_reports_a_gpu_that_does_not_answer(tmp_path):
    found = collect(tmp_path, gpu={"present": False})
    assert sample(found, "spark_gpu_query_success") == 0
    assert "couldn't communicate with the NVIDIA driver" in next(
        labels["error"] for name, labels, _ in found["samples"] if name == "spark_gpu_query_error")
    assert sample(found, "spark_gpu_temperature_celsius", gpu="0") is None


def test_a_field_the_driver_does_not_know_is_dropped_and_the_rest_asked_again(tmp_path):
    spec = importlib.util.spec_from_file_location("spark_node_collector", COLLECTOR)
    collector = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(collector)
    collector.GPU_FIELDS = [*collector.GPU_FIELDS, ("clocks.bogus", ("spark_gpu_bogus", "x", 1.0))]
    root = tmp_path / "root"
    (root / "etc/spark-sim").mkdir(parents=True)
    os.environ["SPARK_SIM_ROOT"] = str(root)
    try:
        rows, unknown, error = collector.query_gpus(str(NVIDIA_SMI))
    finally:
        del os.environ["SPARK_SIM_ROOT"]
    assert (unknown, error) == (["clocks.bogus"], "")
    assert rows[0]["temperature.gpu"] == "41" and rows[0]["memory.used"] == "[N/A]"


# --- every metric a dashboard panel uses exists -----------------------------------------------------------

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan"}
PROMETHEUS_OWN = {"up", "ALERTS"}


def promql_metrics(expr: str) -> set[str]:
    """The metric names an expression selects (not functions, keywords, labels or durations)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    text = re.sub(r"\boffset\s+\S+", "", text)
    for match in re.finditer(r"(?<![0-9A-Za-z_.:])[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        rest = text[match.end():].lstrip()
        word = match.group(0)
        if rest.startswith("(") or word.lower() in PROMQL_WORDS or re.fullmatch(r"\d.*", word):
            continue
        names.add(word)
    return names


def exporter_names(tmp_path, textfile_dir) -> set[str]:
    """Metric names Debian's node exporter serves here, with the collector's textfile beside it."""
    port = free_port()
    proc = subprocess.Popen([str(node_exporter()), f"--web.listen-address={LOOPBACK}:{port}",
                             f"--collector.textfile.directory={textfile_dir}", "--collector.systemd"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _, body = http(port, "/metrics")
                if status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    return {name for name, _, _ in parse_exposition(body)["samples"]}


def test_every_metric_a_dashboard_panel_uses_exists(tmp_path, standin):
    port, _ = standin("--enable-metrics")
    chat(port)
    names = {name for name, _, _ in metrics(port)["samples"]}
    state = tmp_path / "supervisor"
    state.mkdir()
    (state / "state.json").write_text(json.dumps({"state": "healthy", "failures": 0, "restarts": []}))
    # The head's collector, with the fabric proof's record beside the supervisor's state.
    record = tmp_path / "proof.json"
    record.write_text(json.dumps({"rdma_write": {"time": "2026-12-04T12:00:00Z", "pairs": [
        {"rail": "enp1s0f1np1", "head_hca": "rocep1s0f1", "worker": "spark-1", "gbits_per_second": 97.5}]},
        "all_reduce": {"time": "2026-12-04T12:00:05Z", "network": "IB", "busbw_gbytes_per_second": 23.19}}))
    names |= {name for name, _, _ in collect(tmp_path, "--supervisor-state-dir", str(state),
                                             "--fabric-record", str(record))["samples"]}
    names |= exporter_names(tmp_path, tmp_path / "textfile")
    monitoring, engine = filter_plugin("monitoring"), flag_model("sglang")
    rules = monitoring.monitoring_rules({"ttft_p99_seconds": 30, "queue_threshold": 4, "filesystem_free_percent": 10,
                                         "gpu_temperature_celsius": 85, "speculative_min_accept_length": 1.3,
                                         "engine": engine})
    rule_names = set().union(*(promql_metrics(r["expr"]) for r in rules["groups"][0]["rules"]))
    # The dashboard as the role ships it to an SGLang group (tests/unit/test_monitoring_engines.py: vLLM's).
    dashboard = monitoring.monitoring_dashboard(json.loads(DASHBOARD.read_text()), {"engine": engine})
    used = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for name in promql_metrics(target["expr"]):
                used.setdefault(name, panel["title"])
    assert len(used) > 20
    # node_systemd_unit_state needs systemd's bus, which a test machine may not offer: the rules use it (and
    # promtool tests them); the deployed pair's Prometheus shows it for real (tests/integration/test_monitoring.py).
    missing = {name: title for name, title in used.items()
               if name not in names | PROMETHEUS_OWN and not (name in rule_names and name.startswith("node_systemd"))}
    assert missing == {}, f"panels use metrics nothing exports: {missing}"
    # The dashboard's queries are the rules' metric names, where both speak of the same figure.
    def family(name):
        return re.sub(r"_(bucket|count|sum)$", "", name)

    spoken = {family(n) for n in rule_names if n.startswith(("sglang:", "spark_gpu_temperature", "spark_filesystem"))}
    assert spoken <= {family(n) for n in used}


def test_the_promql_reader_finds_names_and_nothing_else():
    expr = ('histogram_quantile(0.99, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket{job="server",'
            'le!="x"}[5m]))) > 10 and on() max(up{job="server"}) == 1 or ALERTS{alertstate="firing"} offset 5m')
    assert promql_metrics(expr) == {"sglang:time_to_first_token_seconds_bucket", "up", "ALERTS"}


# A pair's record as heads before the pairs' own ends wrote it (the head measured each worker), one rail's
# measurement failed.
TWO_RAIL_RECORD = {
    "kind": "spark-llm-fabric-proof", "members": ["spark-0", "spark-1"], "rails": ["enp1s0f1np1", "enP2p1s0f1np1"],
    "rdma_write": {"time": "2026-12-04T12:00:00Z", "pairs": [
        {"rail": "enp1s0f1np1", "head_hca": "rocep1s0f1", "worker": "spark-1", "worker_hca": "rocep1s0f1",
         "gbits_per_second": 97.5},
        {"rail": "enP2p1s0f1np1", "head_hca": "roceP2p1s0f1", "worker": "spark-1", "worker_hca": "roceP2p1s0f1",
         "gbits_per_second": None}]},
    "all_reduce": {"time": "2026-12-04T12:00:05Z", "bytes": "1G", "network": "IB", "busbw_gbytes_per_second": 23.19}}


def test_the_collector_exports_the_fabric_proofs_last_figures_from_the_heads_record(tmp_path):
    record = tmp_path / "proof.json"
    record.write_text(json.dumps(TWO_RAIL_RECORD))
    found = collect(tmp_path, "--fabric-record", str(record))
    assert sample(found, "spark_fabric_rdma_write_gbits_per_second", rail="enp1s0f1np1", device="rocep1s0f1",
                  peer="spark-1") == 97.5
    # That record predates the pairs' own ends (the head measured each worker): the head is the measuring node.
    assert sample(found, "spark_fabric_rdma_write_gbits_per_second", rail="enp1s0f1np1", node="spark-0") == 97.5
    # Every pair of a group of four is its own sample, by its measuring node and its peer.
    record.write_text(json.dumps({"members": ["spark-0", "spark-1", "spark-2", "spark-3"], "rdma_write": {
        "time": "2026-12-04T12:00:00Z", "pairs": [
            {"rail": "enp1s0f1np1", "from": a, "from_hca": "rocep1s0f1", "to": b, "to_hca": "rocep1s0f1",
             "gbits_per_second": 90.0 + i} for i, (a, b) in enumerate([("spark-0", "spark-3"), ("spark-1", "spark-3")])]}}))
    pairs = collect(tmp_path, "--fabric-record", str(record))
    assert sample(pairs, "spark_fabric_rdma_write_gbits_per_second", node="spark-1", peer="spark-3") == 91.0
    assert sample(pairs, "spark_fabric_rdma_write_gbits_per_second", node="spark-0", peer="spark-3") == 90.0
    record.write_text(json.dumps(TWO_RAIL_RECORD))
    # A rail whose measurement failed has no figure (not a zero that reads as a measured one).
    assert sample(found, "spark_fabric_rdma_write_gbits_per_second", rail="enP2p1s0f1np1", device="roceP2p1s0f1",
                  peer="spark-1") is None
    assert sample(found, "spark_fabric_all_reduce_busbw_gbytes_per_second", network="IB") == 23.19
    assert sample(found, "spark_fabric_measured_timestamp_seconds", measurement="all_reduce") == 1796385605
    # Nothing measured yet: no figure at all.
    assert sample(collect(tmp_path, "--fabric-record", str(tmp_path / "absent.json")),
                  "spark_fabric_all_reduce_busbw_gbytes_per_second", network="IB") is None

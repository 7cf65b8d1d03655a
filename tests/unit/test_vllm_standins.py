"""The vLLM stand-in (tests/standins/lib/vllm_server.py) and the docker stand-in running it, on 127.0.0.1 only.

SPARK_SIM_ROOT points the stand-ins' /etc, /sys, /var/lib and /usr/lib at a temporary directory, one per
simulated node; the ranks of a pair meet over real sockets on this machine's loopback.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit import test_sglang_standins as sglang_tests
from tests.unit.test_sglang_standins import (
    ASK,
    TOOLS,
    Stream,
    compute_apps,
    docker,
    free_port,
    http,
    killed_worker_takes_down,
    listening_ports,
    node_root,
    open_request,
    quiet_for,
    read_until,
    stop,
    wait_ready,
)

# The checkpoint directory fixture, as the SGLang stand-in's tests make it.
model_dir = sglang_tests.model_dir

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "tests" / "standins" / "bin" / "docker"
SERVER = REPO / "tests" / "standins" / "lib" / "vllm_server.py"
IMAGE = "vllm/vllm-openai:glm-5.3-flash-arm64"
LOOPBACK = "127.0.0.1"
# What the rendered env file would give a rank, for "nodes" that are this machine (the fabric is the loopback).
FABRIC_ENV = {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo", "VLLM_HOST_IP": LOOPBACK, "HF_HUB_OFFLINE": "1"}
# The flags a unit would give: the reference's capacity (0.84 of the GPU, 64k context, 2 sequences), the seed's
# parsers for vLLM.
SEED = {"gpu_memory_utilization": "0.84", "max_model_len": "65536", "max_num_seqs": "2", "enforce_eager": True,
        "trust_remote_code": True, "reasoning_parser": "deepseek_r1", "tool_call_parser": "glm47",
        "enable_auto_tool_choice": True}
KV_ERROR = "ValueError: The model's max seq len ({}) is larger than the maximum number of tokens that can be stored in " \
           "KV cache ({})."
KERNEL = "torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device"


def serve_args(model, port, *, nnodes=1, rank=0, master_port=None, **flags):
    """`serve MODEL` with the seed's flags for one rank on this machine; keyword flags change them (None drops)."""
    chosen = {**SEED, "tensor_parallel_size": str(nnodes), "host": LOOPBACK, "port": str(port), **flags}
    if nnodes > 1:
        chosen.update(nnodes=str(nnodes), node_rank=str(rank), master_addr=LOOPBACK, master_port=str(master_port))
        if rank > 0:
            chosen.setdefault("headless", True)
    out = ["serve", str(model)]
    for name, value in chosen.items():
        if value is None or value is False:
            continue
        out += ["--" + name.replace("_", "-")] + ([] if value is True else [str(value)])
    return out


def knob_root(tmp_path, vllm=None, gpu=None):
    """A node's SPARK_SIM_ROOT with these knobs: fast loading, an image with the sparse-MLA fix unless told."""
    root = tmp_path / f"root{len(list(tmp_path.glob('root*')))}"
    (root / "etc/spark-sim").mkdir(parents=True)
    knobs = {"vllm": {"load_seconds": 0.05, "sparse_mla_sm121": True, **(vllm or {})}}
    if gpu:
        knobs["gpu"] = gpu
    (root / "etc/spark-sim/node.json").write_text(json.dumps(knobs))
    return root


def start(tmp_path, args, env=None, root=None):
    env = {**os.environ, "NVIDIA_VISIBLE_DEVICES": "all", **FABRIC_ENV, **(env or {}),
           "SPARK_SIM_ROOT": str(root or knob_root(tmp_path))}
    return subprocess.Popen([sys.executable, str(SERVER), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def run(tmp_path, args, env=None, root=None, timeout=30):
    proc = start(tmp_path, args, env, root)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


@pytest.fixture
def procs():
    """The processes a test starts, stopped when it ends (thawed first, should it have frozen one)."""
    started = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        stop(proc)


@pytest.fixture
def serve(model_dir, tmp_path, procs):
    """A single-node vLLM serving on this machine: returns its port and process."""

    def _serve(env=None, root=None, **flags):
        port = free_port()
        procs.append(start(tmp_path, serve_args(model_dir, port, **flags), env, root))
        wait_ready(port, procs[-1])
        return port, procs[-1]

    return _serve


def chat(port, body, key=None):
    return http(port, "/v1/chat/completions", body, {"Authorization": f"Bearer {key}"} if key else None)


# --- arguments and start-up checks ------------------------------------------------------------------


def test_an_unknown_flag_exits_2_like_vllm_serves_argparse(tmp_path, model_dir):
    rc, out = run(tmp_path, [*serve_args(model_dir, free_port()), "--max-model-length", "5"])
    assert rc == 2
    assert "usage: vllm serve [model_tag] [options]" in out
    assert "vllm serve: error: unrecognized arguments: --max-model-length 5" in out


@pytest.mark.parametrize(("flags", "error"), [
    ({"tool_call_parser": None}, "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser"),
    ({"reasoning_parser": "glm5"}, "KeyError: 'invalid reasoning parser: glm5 (chose from {"),
    ({"tool_call_parser": "glm"}, "KeyError: 'invalid tool call parser: glm (chose from {"),
], ids=["auto tool choice without parser", "unknown reasoning parser", "unknown tool parser"])
def test_parser_settings_are_refused_before_anything_starts(tmp_path, model_dir, flags, error):
    rc, out = run(tmp_path, serve_args(model_dir, free_port(), **flags))
    assert rc == 1 and error in out
    assert "Starting to load model" not in out


def test_the_ray_backend_fails_like_an_image_without_ray(tmp_path, model_dir):
    rc, out = run(tmp_path, serve_args(model_dir, free_port(), distributed_executor_backend="ray"))
    assert rc == 1
    assert "ModuleNotFoundError: No module named 'ray'" in out
    assert out.index("No module named 'ray'") < out.index("ValueError: Failed to import Ray")
    assert "Starting to load model" not in out


def test_a_hub_repo_id_fails_offline_and_a_checkpoint_without_processor_config_fails(tmp_path, model_dir):
    rc, out = run(tmp_path, serve_args("LibertAIDAI/GLM-5.3-Flash-NVFP4", free_port()))
    assert rc == 1 and "outgoing traffic has been disabled" in out
    (model_dir / "processor_config.json").unlink()
    rc, out = run(tmp_path, serve_args(model_dir, free_port()))
    assert rc == 1 and f"No such file or directory: '{model_dir}/processor_config.json'" in out


def test_no_gpu_in_the_container_fails(tmp_path, model_dir):
    rc, out = run(tmp_path, serve_args(model_dir, free_port()), {"NVIDIA_VISIBLE_DEVICES": ""})
    assert rc == 1 and "RuntimeError: Failed to infer device type" in out


@pytest.mark.parametrize(("share", "fails"), [("0.90", True), ("0.89", True), ("0.88", False), ("0.84", False)])
def test_gpu_memory_utilization_must_fit_what_the_os_leaves_free_on_gb10(tmp_path, model_dir, share, fails):
    port = free_port()
    proc = start(tmp_path, serve_args(model_dir, port, gpu_memory_utilization=share))
    try:
        if fails:
            assert proc.wait(timeout=30) == 1
            out = proc.stdout.read()
            assert (f"ValueError: Free memory on device (105.70/119.70 GiB) on startup is less than desired GPU memory "
                    f"utilization ({float(share)}, ") in out
            assert "Decrease GPU memory utilization or reduce GPU memory used by other processes." in out
            assert "RuntimeError: Engine core initialization failed. See root cause above." in out
        else:
            wait_ready(port, proc)
    finally:
        stop(proc)


@pytest.mark.parametrize(("seqs", "length", "tokens"), [
    (8, 65536, 49954), (2, 262144, 86818), (1, 131072, 92962)])
def test_a_context_times_concurrency_that_does_not_fit_the_kv_cache_fails(tmp_path, model_dir, seqs, length, tokens):
    rc, out = run(tmp_path, serve_args(model_dir, free_port(), max_num_seqs=seqs, max_model_len=length))
    assert rc == 1
    assert KV_ERROR.format(length, tokens) in out
    assert "EngineCore failed to start." in out and "GPU KV cache size" not in out


def test_lowering_concurrency_first_then_context_makes_it_fit(tmp_path, model_dir, serve):
    # 8 x 64k does not fit (above); 4 x 64k does: concurrency first. 1 x 128k does not, 1 x 80k does.
    for seqs, length in ((4, 65536), (1, 81920)):
        port, proc = serve(max_num_seqs=seqs, max_model_len=length)
        stop(proc)
    rc, out = run(tmp_path, serve_args(model_dir, free_port(), max_num_seqs=None, max_model_len="64k"))
    assert rc == 1 and "ValueError: No available memory for the cache blocks." in out  # vLLM's default: 256


def test_success_logs_the_lines_the_playbooks_read(serve):
    port, proc = serve(api_key="sk-never-logged")
    assert http(port, "/version")[1]["version"]
    out = stop(proc)
    lines = ["Starting to load model", "GPU KV cache size: 86,818 tokens",
             "Maximum concurrency for 65,536 tokens per request: 1.32x", "Starting vLLM API server 0 on "
             f"http://{LOOPBACK}:{port}", "Application startup complete."]
    at = [out.index(text) for text in lines]
    assert at == sorted(at), out
    assert "sk-never-logged" not in out


@pytest.mark.parametrize(("gpu", "knobs", "fails"), [
    ({}, {"sparse_mla_sm121": False}, True),
    ({}, {"sparse_mla_sm121": True}, False),
    ({"compute_cap": "10.0"}, {"sparse_mla_sm121": False}, False),
], ids=["sm_121 without the fix", "sm_121 with the fix", "sm_100 without it"])
def test_the_sparse_mla_kernels_need_the_sm121_fix_on_gb10(tmp_path, model_dir, gpu, knobs, fails):
    port = free_port()
    proc = start(tmp_path, serve_args(model_dir, port), root=knob_root(tmp_path, knobs, gpu))
    try:
        if not fails:
            wait_ready(port, proc)
            return
        assert proc.wait(timeout=30) == 1
        out = proc.stdout.read()
        assert KERNEL in out and "cudaErrorNoKernelImageForDevice" in out
        assert out.index("Model loading took") < out.index(KERNEL)
        assert "GPU KV cache size" not in out
    finally:
        stop(proc)


# --- the API: key, models, parsers, tools, streaming, metrics --------------------------------------


@pytest.mark.parametrize("source", ["--api-key", "VLLM_API_KEY"])
def test_the_key_guards_v1_only(serve, source):
    key = "sk-vllm-test"
    port, _ = serve(api_key=key) if source == "--api-key" else serve(env={"VLLM_API_KEY": key})
    assert http(port, "/v1/models") == (401, {"error": "Unauthorized"})
    assert chat(port, ASK)[0] == 401
    # vLLM compares the whole header: the scheme as written, the exact key.
    assert http(port, "/v1/models", headers={"Authorization": f"bearer {key}"})[0] == 401
    assert http(port, "/v1/models", headers={"Authorization": "Bearer sk-vllm-tes"})[0] == 401
    assert http(port, "/health")[0] == 200 and http(port, "/version")[0] == 200
    assert "vllm:num_requests_running" in http_text(port, "/metrics")
    assert chat(port, ASK, key)[0] == 200


def test_models_lists_the_served_name_or_the_model_path(serve, model_dir):
    port, _ = serve()
    (model,) = http(port, "/v1/models")[1]["data"]
    assert (model["id"], model["root"], model["owned_by"], model["max_model_len"]) == \
        (str(model_dir), str(model_dir), "vllm", 65536)
    port, _ = serve(served_model_name="glm53")
    assert [m["id"] for m in http(port, "/v1/models")[1]["data"]] == ["glm53"]
    assert http(port, "/v1/nothing")[0] == 404


@pytest.mark.parametrize(("parser", "content", "reasoning"), [
    ("deepseek_r1", "391", "17 × 23 = 17 × 20 + 17 × 3 = 340 + 51 = 391"),
    ("glm45", "", None),
    (None, "17 × 23 = 17 × 20 + 17 × 3 = 340 + 51 = 391, so the answer is 391.</think>391", None),
], ids=["deepseek_r1 splits", "glm45 drops the reply", "no parser leaks"])
def test_reasoning_parsers_behave_as_the_seed_says(serve, parser, content, reasoning):
    port, _ = serve(reasoning_parser=parser)
    status, reply = chat(port, ASK)
    assert status == 200
    message = reply["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == (content, reasoning)
    assert reply["choices"][0]["finish_reason"] == "stop" and reply["usage"]["completion_tokens"] == 53


def test_tools_want_auto_tool_choice_and_glm47_returns_tool_calls(serve):
    port, _ = serve(enable_auto_tool_choice=None, tool_call_parser=None)
    status, reply = chat(port, {**ASK, "tools": TOOLS})
    assert status == 400
    assert reply["error"]["message"] == '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser ' \
                                        "to be set"
    assert chat(port, {**ASK, "tools": TOOLS, "tool_choice": "none"})[1]["choices"][0]["message"]["content"] == "391"
    port, _ = serve()
    reply = chat(port, {**ASK, "tools": TOOLS})[1]
    (call,) = reply["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Beijing"}
    assert reply["choices"][0]["finish_reason"] == "tool_calls"
    port, _ = serve(tool_call_parser="glm45")
    message = chat(port, {**ASK, "tools": TOOLS})[1]["choices"][0]["message"]
    assert message["tool_calls"] == [] and message["content"].startswith("<tool_call>get_weather")


def events_of(port, body):
    stream = Stream(port, body)
    try:
        assert stream.headers().startswith("HTTP/1.0 200 ")
        events = []
        while (event := stream.event()) != "[DONE]":
            events.append(event)
        return events
    finally:
        stream.close()


def test_streaming_sends_the_reasoning_then_the_content_and_the_usage(serve):
    port, _ = serve()
    events = events_of(port, {**ASK, "stream_options": {"include_usage": True}})
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert deltas[0]["role"] == "assistant"
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "17 × 23 = 17 × 20 + 17 × 3 = 340 + 51 = 391"
    assert "".join(d.get("content", "") for d in deltas) == "391"
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 53
    assert events[0]["id"].startswith("chatcmpl-")
    port, _ = serve(reasoning_parser="glm45")
    deltas = [e["choices"][0]["delta"] for e in events_of(port, ASK)]
    assert "".join(d.get("content") or "" for d in deltas) == "" and not any("reasoning_content" in d for d in deltas)


def test_ignore_eos_max_tokens_and_the_context_limit(serve):
    port, _ = serve(max_model_len="1000", max_num_seqs="2")
    reply = chat(port, {**ASK, "ignore_eos": True, "max_tokens": 17})[1]
    assert reply["usage"]["completion_tokens"] == 17 and reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["total_tokens"] == reply["usage"]["prompt_tokens"] + 17
    status, reply = chat(port, {**ASK, "max_tokens": 995})
    assert status == 400
    assert reply["error"]["message"] == "'max_tokens' or 'max_completion_tokens' is too large: 995. This model's " \
                                        "maximum context length is 1000 tokens and your request has 13 input tokens " \
                                        "(995 > 1000 - 13)."


def samples(port):
    out = {}
    for text in http_text(port, "/metrics").splitlines():
        if text and not text.startswith("#"):
            name, value = text.rsplit(" ", 1)
            out[name] = float(value)
    return out


def http_text(port, path):
    with socket.create_connection((LOOPBACK, port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.0 200 "), head
    return body


def test_metrics_have_vllms_v1_names_and_move_as_it_serves(serve, model_dir):
    port, _ = serve()
    labels = f'{{model_name="{model_dir}",engine="0"}}'
    before = samples(port)
    assert before[f"vllm:num_requests_running{labels}"] == 0 and before[f"vllm:kv_cache_usage_perc{labels}"] == 0
    chat(port, ASK)
    chat(port, {**ASK, "ignore_eos": True, "max_tokens": 4})
    after = samples(port)
    assert after[f"vllm:prompt_tokens_total{labels}"] == 26
    assert after[f"vllm:generation_tokens_total{labels}"] == 53 + 4
    assert after[f"vllm:prefix_cache_queries_total{labels}"] == 26
    assert after[f"vllm:prefix_cache_hits_total{labels}"] == 0
    reasons = {r: after[f'vllm:request_success_total{{model_name="{model_dir}",engine="0",finished_reason="{r}"}}']
               for r in ("stop", "length")}
    assert reasons == {"stop": 1, "length": 1}
    for histogram in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                      "request_queue_time_seconds"):
        assert after[f"vllm:{histogram}_count{labels}"] >= 2, histogram
    assert after[f"vllm:num_requests_waiting{labels}"] == 0
    port, _ = serve(disable_log_stats=True)
    assert "vllm:" not in http_text(port, "/metrics")


# --- two nodes: the rendezvous, headless workers, the start's hangs ---------------------------------


def pair(tmp_path, model_dir, *, head_knobs=None, worker_knobs=None, worker_env=None, worker_root=None,
         start_head=True, **worker_flags):
    """Node 0 and a headless node 1 of a TP=2 group on this machine: (head, worker, head port, worker port)."""
    port, wport, master = free_port(), free_port(), free_port()
    worker = start(tmp_path, serve_args(model_dir, wport, nnodes=2, rank=1, master_port=master, **worker_flags),
                   worker_env, worker_root or knob_root(tmp_path, worker_knobs))
    head = start(tmp_path, serve_args(model_dir, port, nnodes=2, rank=0, master_port=master),
                 root=knob_root(tmp_path, head_knobs)) if start_head else None
    return head, worker, port, wport


@pytest.fixture
def group(tmp_path, model_dir, procs):
    def _group(**kw):
        head, worker, port, wport = pair(tmp_path, model_dir, **kw)
        procs.extend(p for p in (head, worker) if p)
        return head, worker, port, wport

    return _group


def test_node0_serves_only_once_the_headless_node_joined_and_dies_with_it(tmp_path, model_dir):
    port, wport, master = free_port(), free_port(), free_port()
    head = start(tmp_path, serve_args(model_dir, port, nnodes=2, rank=0, master_port=master))
    worker = None
    try:
        read_until(head, "Rank 0 waiting for 1 other rank(s)")
        with pytest.raises(OSError):
            http(port, "/health")
        worker = start(tmp_path, serve_args(model_dir, wport, nnodes=2, rank=1, master_port=master))
        wait_ready(port, head)
        assert chat(port, ASK)[1]["choices"][0]["message"]["content"] == "391"
        # The headless node serves nothing and never opened its --port.
        assert wport not in listening_ports(worker.pid)
        with pytest.raises(OSError):
            http(wport, "/health")
        assert "NCCL error: remote process exited or there was a network error" in killed_worker_takes_down(head, worker)
    finally:
        stop(head)
        if worker:
            stop(worker)


def test_a_non_zero_node_rank_without_headless_is_refused(tmp_path, model_dir):
    rc, out = run(tmp_path, serve_args(model_dir, free_port(), nnodes=2, rank=1, master_port=free_port(),
                                       headless=False))
    assert rc == 1 and "must run with --headless" in out


def test_a_worker_whose_master_address_has_nothing_listening_never_joins(tmp_path, model_dir):
    # Its own loopback, on another node: nothing listens there. Here: a port nothing listens on.
    port, master = free_port(), free_port()
    head = start(tmp_path, serve_args(model_dir, port, nnodes=2, rank=0, master_port=master),
                 root=knob_root(tmp_path, {"rendezvous_timeout": 1}))
    worker = start(tmp_path, serve_args(model_dir, free_port(), nnodes=2, rank=1, master_port=free_port()),
                   root=knob_root(tmp_path, {"rendezvous_timeout": 1}))
    try:
        assert head.wait(timeout=20) == 1 and worker.wait(timeout=20) == 1
        out = head.stdout.read()
        assert "torch.distributed.DistStoreError: Timed out after 2 seconds waiting for clients. 1/2 clients " \
               "joined." in out
        assert "Engine core initialization failed" in out
        assert "DistNetworkError: The client socket has timed out after 1000ms" in worker.stdout.read()
    finally:
        stop(head)
        stop(worker)


def roce_devices(root, names):
    """The RoCE stand-in's tree for usable devices: port 1 ACTIVE, a RoCE v2 GID of an IPv4 address at index 3."""
    for i, hca in enumerate(names):
        port = root / "sys/class/infiniband" / hca / "ports/1"
        (port / "gids").mkdir(parents=True)
        (port / "gid_attrs/types").mkdir(parents=True)
        (port / "state").write_text("4: ACTIVE\n")
        (port / "gids/3").write_text(f"0000:0000:0000:0000:0000:ffff:0ae8:{i + 1:02x}0a\n")
        (port / "gid_attrs/types/3").write_text("RoCE v2\n")


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("hca", [None, "rocep1s0f1"], ids=["NCCL_IB_HCA unset", "NCCL_IB_HCA pinned"])
def test_nccl_init_spins_without_the_hca_pinned_on_a_node_with_two_rails(tmp_path, model_dir, group, hca):
    root = knob_root(tmp_path)
    roce_devices(root, ["rocep1s0f1", "roceP2p1s0f1"])
    head, worker, port, _ = group(worker_root=root, worker_env={"NCCL_IB_HCA": hca} if hca else None)
    if hca:
        wait_ready(port, head)
        return
    read_until(worker, "vLLM is using nccl")
    # 100% CPU: its CPU time grows as fast as the clock, nothing fails, nothing serves.
    deadline, spent = time.monotonic() + 20, cpu_seconds(worker.pid)
    while cpu_seconds(worker.pid) - spent < 0.5:
        assert time.monotonic() < deadline, "the rank does not spin"
        time.sleep(0.1)
    assert head.poll() is None and worker.poll() is None
    with pytest.raises(OSError):
        http(port, "/health")


@pytest.mark.parametrize(("logind", "dropin", "removed"), [
    ("[Login]\nRemoveIPC=yes\n", None, True),
    ("[Login]\n#RemoveIPC=yes\n", "[Login]\nRemoveIPC=yes\n", True),
    ("[Login]\nRemoveIPC=yes\n", "[Login]\nRemoveIPC=no\n", False),
    ("[Login]\n#RemoveIPC=yes\n", None, False),
], ids=["logind.conf", "a drop-in", "a drop-in undoes it", "the commented default"])
def test_a_worker_whose_node_removes_ipc_loses_its_broadcast_block(tmp_path, group, logind, dropin, removed):
    root = knob_root(tmp_path)
    (root / "etc/systemd/logind.conf.d").mkdir(parents=True)
    (root / "etc/systemd/logind.conf").write_text(logind)
    if dropin:
        (root / "etc/systemd/logind.conf.d/90-spark.conf").write_text(dropin)
    head, worker, port, _ = group(worker_root=root, worker_env={"VLLM_RINGBUFFER_WARNING_INTERVAL": "1"})
    if not removed:
        wait_ready(port, head)
        return
    seen = read_until(worker, "No available shared memory broadcast block found in 1 seconds")
    seen += read_until(worker, "No available shared memory broadcast block found in 1 seconds")
    assert "This typically happens when some processes are hanging" in seen
    assert head.poll() is None
    with pytest.raises(OSError):
        http(port, "/health")


def test_a_frozen_worker_stalls_generation_until_the_watchdog_takes_node0_down(group):
    head, worker, port, _ = group(head_knobs={"watchdog_seconds": 2})
    wait_ready(port, head)
    assert chat(port, ASK)[0] == 200
    worker.send_signal(signal.SIGSTOP)
    request = open_request(port, ASK)
    try:
        assert quiet_for(request, 0.5)
        assert http(port, "/health")[0] == 200
        assert head.wait(timeout=30) == 134
    finally:
        request.close()
    assert "Watchdog caught collective operation timeout" in head.stdout.read()


# --- the docker stand-in runs vLLM's image as a unit would -------------------------------------------


LAUNCHER = ("import os,runpy,sys;key=open(sys.argv[1]).read().strip();os.environ['VLLM_API_KEY']=key;"
            "sys.argv=['vllm','serve']+sys.argv[2:];"
            "runpy.run_module('vllm.entrypoints.cli.main',run_name='__main__',alter_sys=True)")


def docker_run(root, model_dir, image, *tail, options=()):
    cmd = [sys.executable, str(DOCKER), "run", "--rm", "--name", "vllm", "--gpus", "all", "--network", "host",
           "--ipc", "host", "--memory", "120g", *options, "--volume", f"{model_dir}:/models/glm53:ro", image, *tail]
    return subprocess.Popen(cmd, env={**os.environ, **FABRIC_ENV, "SPARK_SIM_ROOT": str(root)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), cmd


@pytest.mark.parametrize("form", ["ENTRYPOINT", "--entrypoint vllm", "keyed launcher"])
def test_docker_runs_the_vllm_image_as_the_units_would(tmp_path, model_dir, form):
    root = node_root(tmp_path, "n", {"vllm": {"load_seconds": 0.05},
                                     "docker": {"registry": {IMAGE: {"vllm": {"sparse_mla_sm121": True}}}}})
    assert docker(root, "pull", IMAGE).returncode == 0
    assert json.loads(docker(root, "image", "inspect", "--format", "{{json .Config.Entrypoint}}", IMAGE).stdout) == \
        ["vllm", "serve"]
    port = free_port()
    args = serve_args("/models/glm53", port)[1:]
    key_file = tmp_path / "api-key"
    key_file.write_text("sk-from-file\n")
    if form == "ENTRYPOINT":
        proc, cmd = docker_run(root, model_dir, IMAGE, *args)
    elif form == "--entrypoint vllm":
        proc, cmd = docker_run(root, model_dir, IMAGE, "serve", *args, options=("--entrypoint", "vllm"))
    else:
        proc, cmd = docker_run(root, model_dir, IMAGE, "-c", LAUNCHER, "/run/spark-llm/api-key", *args,
                               options=("--entrypoint", "python3", "--volume",
                                        f"{key_file}:/run/spark-llm/api-key:ro"))
    try:
        wait_ready(port, proc)
        key = "sk-from-file" if form == "keyed launcher" else None
        models = http(port, "/v1/models", headers={"Authorization": f"Bearer {key}"} if key else None)[1]
        assert models["data"][0]["id"] == "/models/glm53"
        if key:
            assert http(port, "/v1/models")[0] == 401
            assert "sk-from-file" not in " ".join(cmd)
            assert "sk-from-file" not in docker(root, "inspect", "vllm").stdout
        pid = int(docker(root, "inspect", "--format", "{{.State.Pid}}", "vllm").stdout)
        assert compute_apps(root) == [(pid, sys.executable)]
        assert docker(root, "stop", "--time", "5", "vllm").returncode == 0
        assert proc.wait(timeout=10) == 143
        assert "Application startup complete." in proc.stdout.read()
    finally:
        stop(proc)


def test_an_image_without_the_sparse_mla_fix_fails_on_gb10_and_a_derived_build_serves(tmp_path, model_dir):
    fixed = "spark/vllm-glm53:sm121"
    root = node_root(tmp_path, "n", {"vllm": {"load_seconds": 0.05},
                                     "docker": {"registry": {fixed: {"vllm": {"sparse_mla_sm121": True}}}}})
    for image in (IMAGE, fixed):
        assert docker(root, "pull", image).returncode == 0
    proc, _ = docker_run(root, model_dir, IMAGE, *serve_args("/models/glm53", free_port())[1:])
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1 and KERNEL in out
    port = free_port()
    # The derived image is vLLM's by its build, whatever its name: its ENTRYPOINT serves.
    proc, _ = docker_run(root, model_dir, fixed, *serve_args("/models/glm53", port)[1:])
    try:
        wait_ready(port, proc)
    finally:
        stop(proc)

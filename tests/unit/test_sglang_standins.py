"""The stand-ins (docker, the SGLang server, nvidia-smi, the hub), run locally on 127.0.0.1 only.

SPARK_SIM_ROOT points the stand-ins' /etc, /var/lib, /usr/lib and /dev at a
temporary directory, one per simulated node.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.harness import cluster as sim
from tests.lib.roles import keyed_launcher
from tests.lib.seed import SEED_FLAGS, flatten
from tests.standins.hub_emulator import REPO_ID, HubEmulator, build_checkpoint

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "tests" / "standins" / "bin" / "docker"
SERVER = REPO / "tests" / "standins" / "lib" / "sglang_server.py"
NVIDIA_SMI = REPO / "tests" / "standins" / "bin" / "nvidia-smi"
HUB_EMULATOR = REPO / "tests" / "standins" / "hub_emulator.py"
IMAGE = "lmsysorg/sglang:glm-5.3-flash-arm64"
LOOPBACK = "127.0.0.1"
HYBRID = "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "glm53"
    d.mkdir()
    (d / "processor_config.json").write_text("{}")
    (d / "config.json").write_text('{"model_type": "glm5_next"}')
    return d


def server_args(model, port, *, nnodes=1, rank=0, dist_port=None, **flags):
    """The seed's flags (tests/lib/seed.py), TileLang DSA kernels included, for one rank on this machine.

    Keyword flags change it: `context_length=32768` sets a value, `disable_cuda_graph=True` adds a
    switch, `reasoning_parser=None` drops a flag.
    """
    pairs = [("--model-path", str(model)), SEED_FLAGS[0], ("--tp-size", str(nnodes)), *SEED_FLAGS[1:],
             ("--nnodes", str(nnodes)), ("--node-rank", str(rank)), ("--host", LOOPBACK), ("--port", str(port))]
    if dist_port:
        pairs.append(("--dist-init-addr", f"{LOOPBACK}:{dist_port}"))
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        change = None if value is None else (flag, None if value is True else str(value))
        at = next((i for i, (known, _) in enumerate(pairs) if known == flag), None)
        if at is None:
            pairs += [change] if change else []
        elif change:
            pairs[at] = change
        else:
            del pairs[at]
    return flatten(pairs)


# What the rendered env file gives a rank, for "nodes" that are this machine (the fabric is the loopback).
FABRIC_ENV = {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo", "SGLANG_HOST_IP": LOOPBACK,
              "HF_HUB_OFFLINE": "1"}


def knob_root(tmp_path, sglang=None, gpu=None):
    """A SPARK_SIM_ROOT whose node.json holds these knobs (fast loading unless told otherwise)."""
    root = tmp_path / f"root{len(list(tmp_path.glob('root*')))}"
    (root / "etc/spark-sim").mkdir(parents=True)
    knobs = {"sglang": {"load_seconds": 0.1, **(sglang or {})}}
    if gpu:
        knobs["gpu"] = gpu
    (root / "etc/spark-sim/node.json").write_text(json.dumps(knobs))
    return root


@pytest.fixture(autouse=True)
def fast_loading(tmp_path_factory):
    """Unless a test says otherwise, ranks load their weights in 0.1 s."""
    global DEFAULT_ROOT  # noqa: PLW0603 - read by start_server, which tests call directly
    DEFAULT_ROOT = knob_root(tmp_path_factory.mktemp("knobs"))


DEFAULT_ROOT = None


def start_server(args, env_extra=None, root=None):
    env = {**os.environ, "NVIDIA_VISIBLE_DEVICES": "all", **FABRIC_ENV, **(env_extra or {}),
           "SPARK_SIM_ROOT": str(root or DEFAULT_ROOT)}
    return subprocess.Popen([sys.executable, str(SERVER), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def run_server(args, env_extra=None, timeout=30, root=None):
    proc = start_server(args, env_extra, root)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def http(port, path, body=None, headers=None):
    req = urllib.request.Request(f"http://{LOOPBACK}:{port}{path}", headers={"Content-Type": "application/json",
                                                                             **(headers or {})},
                                 data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback only
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def wait_ready(port, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {proc.stdout.read()}")
        try:
            if http(port, "/health")[0] == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("server did not become ready")


def read_until(proc, text, timeout=30):
    """Consume the process's output up to and including `text` (the event a test waits for)."""
    fd, seen = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0 and select.select([fd], [], [], left)[0], f"no {text!r} within {timeout} s: {seen.decode()}"
        chunk = os.read(fd, 65536)
        assert chunk, f"exited before {text!r}: {seen.decode()}"
        seen += chunk
    return seen.decode()


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.stdout.read() if proc.stdout else ""


@pytest.fixture
def serve(model_dir):
    procs = []

    def _serve(root=None, **flags):
        port = free_port()
        proc = start_server(server_args(model_dir, port, **flags), root=root)
        procs.append(proc)
        wait_ready(port, proc)
        return port, proc

    yield _serve
    for proc in procs:
        stop(proc)


ASK = {"model": "glm53", "messages": [{"role": "user", "content": "17 × 23 = ?"}], "max_tokens": 512}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


# --- the SGLang stand-in ----------------------------------------------------


def test_unknown_flag_is_refused_like_argparse(model_dir):
    rc, out = run_server([*server_args(model_dir, free_port()), "--contxt-length", "5"])
    assert rc == 2
    assert "launch_server.py: error: unrecognized arguments: --contxt-length 5" in out


HUB = "LibertAIDAI/GLM-5.3-Flash-NVFP4"


def test_hub_repo_id_without_network_fails_with_huggingface_hubs_messages():
    rc, out = run_server(server_args(HUB, free_port()), {"HF_HUB_OFFLINE": ""})
    assert rc == 1
    assert ("requests.exceptions.ConnectionError: (MaxRetryError(\"HTTPSConnectionPool(host='huggingface.co', "
            "port=443): Max retries exceeded with url: /LibertAIDAI/GLM-5.3-Flash-NVFP4/resolve/main/config.json") in out
    assert "Failed to resolve 'huggingface.co'" in out
    assert ("huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the file on the "
            "Hub") in out
    assert "OSError: We couldn't connect to 'https://huggingface.co' to load this file" in out
    # It never got as far as the model code, nor as distributed init.
    assert "processor_config.json" not in out and "Init torch distributed begin" not in out


def test_hub_repo_id_in_offline_mode_fails_without_a_connection():
    rc, out = run_server(server_args(HUB, free_port()), {"HF_HUB_OFFLINE": "1"})
    assert rc == 1
    assert ("huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested files in the disk cache and "
            "outgoing traffic has been disabled.") in out
    assert "HTTPSConnectionPool" not in out


def test_hub_endpoint_names_the_host_it_tried():
    rc, out = run_server(server_args(HUB, free_port()), {"HF_HUB_OFFLINE": "", "HF_ENDPOINT": "https://hub.example.org"})
    assert rc == 1 and "HTTPSConnectionPool(host='hub.example.org', port=443)" in out


def test_hub_repo_id_with_the_hub_reachable_fails_at_processor_config(tmp_path):
    # The field case of deployment-facts.md: config.json came down, the model code opens a local path.
    rc, out = run_server(server_args(HUB, free_port()), {"HF_HUB_OFFLINE": ""},
                         root=knob_root(tmp_path, {"hub_reachable": True}))
    assert rc == 1
    assert ("FileNotFoundError: [Errno 2] No such file or directory: "
            "'LibertAIDAI/GLM-5.3-Flash-NVFP4/processor_config.json'") in out


def test_a_path_that_is_neither_a_directory_nor_a_repo_id(tmp_path):
    rc, out = run_server(server_args(tmp_path / "nowhere", free_port()))
    assert rc == 1
    assert f"OSError: Incorrect path_or_model_id: '{tmp_path / 'nowhere'}'" in out
    assert "HTTPSConnectionPool" not in out


def test_checkpoint_without_processor_config_fails(model_dir):
    (model_dir / "processor_config.json").unlink()
    rc, out = run_server(server_args(model_dir, free_port()))
    assert rc == 1
    assert f"No such file or directory: '{model_dir}/processor_config.json'" in out


# The pool's own figures (262144 request-tokens of state, 5 slots per request): the slots at this context, the
# requests they back.
@pytest.mark.parametrize(("reqs", "context", "fails"), [
    (2, 65536, False), (4, 65536, False), (8, 65536, "max_mamba_cache_size=20, mamba_ratio=5, resulting max_num_reqs=4."),
    (2, 262144, "max_mamba_cache_size=5, mamba_ratio=5, resulting max_num_reqs=1."),
    (1, 1048576, "max_mamba_cache_size=1, mamba_ratio=5, resulting max_num_reqs=0."),
])
def test_hybrid_state_cache_threshold(model_dir, reqs, context, fails):
    args = server_args(model_dir, free_port(), max_running_requests=reqs, context_length=context)
    if not fails:
        proc = start_server(args)
        wait_ready(int(args[args.index("--port") + 1]), proc)
        assert HYBRID not in stop(proc)
        return
    rc, out = run_server(args)
    assert rc == 1
    assert HYBRID + fails in out


def test_dropping_concurrency_and_context_hits_the_hybrid_error(model_dir):
    rc, out = run_server(server_args(model_dir, free_port(), max_running_requests=None, context_length=None))
    assert rc == 1 and HYBRID in out


SMEM = "Failed to set the allowed dynamic shared memory size to 169984 with error: invalid argument"


def test_gb10_tile_of_the_per_model_image_starts_and_the_default_tile_fails_at_capture(tmp_path, model_dir):
    args = server_args(model_dir, free_port())
    rc, out = run_server(args, root=knob_root(tmp_path, {"tilelang_tile": "default"}))
    assert rc == 1
    assert f"Exception: Capture cuda graph failed: {SMEM}" in out
    assert out.index("Capture cuda graph begin") < out.index(SMEM)
    assert "fired up" not in out
    proc = start_server(args, root=knob_root(tmp_path))
    wait_ready(int(args[args.index("--port") + 1]), proc)
    assert SMEM not in stop(proc)


def test_default_tile_fits_a_gpu_with_more_shared_memory_or_without_tilelang(tmp_path, model_dir):
    for knobs, flags in (({"compute_cap": "9.0"}, {}),
                         ({}, {"dsa_prefill_backend": "flashmla_sparse", "dsa_decode_backend": "flashmla_sparse"})):
        args = server_args(model_dir, free_port(), **flags)
        proc = start_server(args, root=knob_root(tmp_path, {"tilelang_tile": "default"}, gpu=knobs))
        wait_ready(int(args[args.index("--port") + 1]), proc)
        assert SMEM not in stop(proc)


def test_default_tile_without_cuda_graphs_fails_at_the_first_prefill(tmp_path, model_dir):
    rc, out = run_server(server_args(model_dir, free_port(), disable_cuda_graph=True),
                         root=knob_root(tmp_path, {"tilelang_tile": "default"}))
    assert rc == 1 and f"RuntimeError: {SMEM}" in out and "Capture cuda graph begin" not in out


def test_a_speculative_drafter_needs_the_gb10_tile_for_its_verify_shapes(tmp_path, model_dir):
    args = server_args(model_dir, free_port(), speculative_algorithm="EAGLE", speculative_num_draft_tokens=4)
    rc, out = run_server(args, root=knob_root(tmp_path))
    assert rc == 1
    assert "Capture draft cuda graph begin. speculative_algorithm=EAGLE" in out
    assert f"Exception: Capture draft cuda graph failed: {SMEM}" in out
    proc = start_server(args, root=knob_root(tmp_path, {"tilelang_verify_tile": "gb10"}))
    wait_ready(int(args[args.index("--port") + 1]), proc)
    assert SMEM not in stop(proc)


def gauge(port, name):
    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=5) as resp:  # noqa: S310 - loopback
        text = resp.read().decode()
    return float(next(line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(name + "{")))


@pytest.mark.parametrize(("flags", "expected"), [
    # SGLang's auto choice for GLM-style MoE models: 3 steps, topk 1, 4 draft tokens; 1 + .6 + .36 + .216.
    ({}, (0.6, 2.176, 0.392, False)),
    # With topk 1 SGLang sets num-draft-tokens to num-steps + 1, and says so.
    ({"speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 8},
     (0.5, 1.5, 0.5, True)),
    # Two branches per depth: each depth accepted when either is, 1 - (1 - .5)^2 = .75.
    ({"speculative_num_steps": 2, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 6},
     (0.5, 2.3125, 0.6562, False)),
])
def test_speculative_decoding_reports_its_acceptance_where_sglang_does(tmp_path, model_dir, flags, expected):
    acceptance, length, rate, adjusted = expected
    port = free_port()
    args = server_args(model_dir, port, speculative_algorithm="EAGLE", enable_metrics=True, **flags)
    proc = start_server(args, root=knob_root(tmp_path, {"tilelang_verify_tile": "gb10",
                                                       "speculative_acceptance": acceptance}))
    try:
        wait_ready(port, proc)
        assert http(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                   "max_tokens": 8})[0] == 200
        assert gauge(port, "sglang:spec_accept_length") == pytest.approx(length, abs=1e-3)
        assert gauge(port, "sglang:spec_accept_rate") == pytest.approx(rate, abs=1e-3)
        out = read_until(proc, "accept len: ")
    finally:
        stop(proc)
    assert ("is adjusted to speculative_num_steps + 1" in out) is adjusted


def test_without_speculative_decoding_the_acceptance_gauges_are_zero(serve):
    port, _proc = serve(enable_metrics=True)
    assert gauge(port, "sglang:spec_accept_length") == 0.0


def test_no_gpu_in_the_container_fails(model_dir):
    rc, out = run_server(server_args(model_dir, free_port()), {"NVIDIA_VISIBLE_DEVICES": ""})
    assert rc == 1 and "RuntimeError: No CUDA GPUs are available" in out


def test_health_models_and_log_fingerprints_of_success(serve, model_dir):
    port, proc = serve()
    assert http(port, "/health") == (200, None)
    status, models = http(port, "/v1/models")
    assert status == 200
    assert [m["id"] for m in models["data"]] == [str(model_dir)]
    http(port, "/v1/chat/completions", ASK)
    out = stop(proc)
    assert "cuda graph: True" in out
    assert "MambaRadixCache with MAMBA component" in out
    assert "The server is fired up and ready to roll!" in out


def test_glm45_reasoning_parser_splits_thinking_from_the_answer(serve):
    port, _ = serve()
    status, reply = http(port, "/v1/chat/completions", ASK)
    message = reply["choices"][0]["message"]
    assert status == 200
    assert message["content"] == "391"
    assert message["reasoning_content"] == "17 × 23 = 17 × 20 + 17 × 3 = 340 + 51 = 391"
    assert reply["usage"]["reasoning_tokens"] > 0


def test_without_reasoning_parser_thinking_leaks_into_content(serve):
    port, _ = serve(reasoning_parser=None)
    message = http(port, "/v1/chat/completions", ASK)[1]["choices"][0]["message"]
    assert message["content"].endswith("391.</think>391")
    assert message["reasoning_content"] is None


def test_glm_tool_parser_fails_silently_with_the_fingerprint(serve):
    port, _ = serve(tool_call_parser="glm")
    reply = http(port, "/v1/chat/completions", {**ASK, "tools": TOOLS})[1]
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == ""
    assert choice["message"]["tool_calls"] is None


def test_glm47_tool_parser_returns_a_tool_call(serve):
    port, _ = serve()
    choice = http(port, "/v1/chat/completions", {**ASK, "tools": TOOLS})[1]["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Beijing"}


def test_a_non_bf16_kv_cache_under_tilelang_garbles_output_with_replacement_characters(serve):
    port, _ = serve(kv_cache_dtype="fp8_e4m3")
    message = http(port, "/v1/chat/completions", ASK)[1]["choices"][0]["message"]
    assert "\ufffd" in message["reasoning_content"] and "×" not in message["reasoning_content"]
    port, _ = serve()
    assert "\ufffd" not in json.dumps(http(port, "/v1/chat/completions", ASK)[1], ensure_ascii=False)


@pytest.mark.parametrize(("corruption", "broken"), [
    ("wrong-answer", lambda reply: reply["choices"][0]["message"]["content"] == "394"),
    ("bad-tool-args", lambda reply: reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
     == '{"city": "Beijing"'),
    ("fffd", lambda reply: "\ufffd" in json.dumps(reply, ensure_ascii=False)),
])
def test_output_corruption_knob(serve, tmp_path, corruption, broken):
    body = {**ASK, "tools": TOOLS} if corruption == "bad-tool-args" else ASK
    port, _ = serve(root=knob_root(tmp_path, {"output_corruption": corruption}))
    assert broken(http(port, "/v1/chat/completions", body)[1])
    port, _ = serve(root=knob_root(tmp_path))
    assert not broken(http(port, "/v1/chat/completions", body)[1])


def test_a_build_that_breaks_korean_now_and_then_breaks_exactly_its_share(serve, tmp_path):
    port, _ = serve(root=knob_root(tmp_path, {"corrupt_rate": 0.5, "corrupt_scripts": ["hangul"],
                                             "bad_tool_call_rate": 0.5}))
    korean = {**ASK, "messages": [{"role": "user", "content": "한국의 사계절을 설명해 주세요."}]}
    chinese = {**ASK, "messages": [{"role": "user", "content": "介绍长城。"}]}

    def broken(body):
        return "\ufffd" in json.dumps(http(port, "/v1/chat/completions", body)[1], ensure_ascii=False)

    # Every second answer that holds Hangul; the Chinese and English ones never (nor do they count).
    assert [broken(korean) for _ in range(4)] == [False, True, False, True]
    assert not broken(chinese) and not broken(ASK)
    calls = [http(port, "/v1/chat/completions", {**ASK, "tools": TOOLS})[1]["choices"][0]["message"]["tool_calls"][0]
             for _ in range(2)]
    assert [c["function"]["arguments"] for c in calls] == ['{"city": "Beijing"}', '{"city": "Beijing"']


def test_log_requests_logs_what_was_asked(serve):
    said = {**ASK, "messages": [{"role": "user", "content": "token hf_x in a prompt"}]}
    logged = {}
    for flag in (True, None):
        port, proc = serve(log_requests=flag) if flag else serve()
        http(port, "/v1/chat/completions", said)
        logged[flag] = stop(proc)
    assert "Receive: obj=GenerateReqInput(" in logged[True] and "token hf_x in a prompt" in logged[True]
    assert "token hf_x in a prompt" not in logged[None]


def test_api_key_is_required_when_set(serve):
    port, _ = serve(api_key="sk-local-test")
    assert http(port, "/v1/models")[0] == 401
    assert http(port, "/v1/models", headers={"Authorization": "Bearer sk-local-test"})[0] == 200
    assert http(port, "/health")[0] == 200


def test_api_key_check_is_sglangs(serve):
    # srt/utils/auth.py: the Bearer scheme in any case, the exact key; /health* and /metrics* are never asked.
    port, _ = serve(api_key="sk-local-test")
    assert http(port, "/v1/models", headers={"Authorization": "bearer sk-local-test"})[0] == 200
    assert http(port, "/v1/models", headers={"Authorization": "Bearer sk-local-tes"})[0] == 401
    assert http(port, "/v1/models", headers={"Authorization": "sk-local-test"})[0] == 401
    assert http(port, "/v1/chat/completions", {"messages": []}) == (401, {"error": "Unauthorized"})
    assert http(port, "/health_generate")[0] != 401 and http(port, "/metrics")[0] != 401


def test_rank0_serves_only_after_every_rank_joined_and_dies_with_a_peer(model_dir):
    port, dist = free_port(), free_port()
    head = start_server(server_args(model_dir, port, nnodes=2, rank=0, dist_port=dist))
    worker = None
    try:
        # The head waits at the rendezvous for the worker: it must not serve yet.
        read_until(head, "Init torch distributed begin.")
        assert head.poll() is None
        with pytest.raises(OSError):
            http(port, "/health")
        worker = start_server(server_args(model_dir, free_port(), nnodes=2, rank=1, dist_port=dist))
        wait_ready(port, head)
        assert http(port, "/v1/chat/completions", ASK)[1]["choices"][0]["message"]["content"] == "391"
        assert "NCCL error" in killed_worker_takes_down(head, worker)
    finally:
        stop(head)
        if worker:
            stop(worker)


def killed_worker_takes_down(head, worker) -> str:
    """SIGKILL the worker of a serving pair: rank 0 goes down with it at once (exit 1); rank 0's remaining output."""
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    assert head.wait(timeout=10) == 1
    return head.stdout.read()


def listening_ports(pid) -> list[int]:
    """The TCP ports process `pid` listens on, on every IPv4 address (0.0.0.0)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and inode in inodes and local.startswith("00000000:"):
            ports.append(int(local.split(":")[1], 16))
    return sorted(ports)


def test_rank0_keeps_its_tcpstore_and_broadcast_queue_listening_on_every_address_while_it_serves(model_dir):
    # torch's TCPStore server on rank 0 lives as long as the process group, bound to every address, and
    # so does rank 0's broadcast queue: what a firewall must close on the management network.
    port, dist = free_port(), free_port()
    head = start_server(server_args(model_dir, port, nnodes=2, rank=0, dist_port=dist))
    worker = start_server(server_args(model_dir, free_port(), nnodes=2, rank=1, dist_port=dist))
    held = []
    try:
        wait_ready(port, head)
        # Another address of this machine than --dist-init-addr's: the store listens on all of them, and so
        # does rank 0's broadcast queue, on a random port (the real MessageQueue binds tcp://*).
        queue = [p for p in listening_ports(head.pid) if p not in (port, dist)]
        assert len(queue) == 1, queue
        held = [socket.create_connection((address, p), timeout=5) for address in (LOOPBACK, "127.0.0.2")
                for p in (dist, queue[0])]
        held[0].sendall(b"not a store request\n")
        assert not select.select(held, [], [], 0.5)[0], "the store closed a connection it was given"
        assert http(port, "/v1/chat/completions", ASK)[1]["choices"][0]["message"]["content"] == "391"
        for sock in held:
            sock.close()
        assert http(port, "/v1/chat/completions", ASK)[1]["choices"][0]["message"]["content"] == "391"
        assert head.poll() is None and worker.poll() is None
    finally:
        for sock in held:
            sock.close()
        stop(head)
        stop(worker)


def test_ranks_with_different_arguments_refuse_to_form_a_group(model_dir):
    port, dist = free_port(), free_port()
    head = start_server(server_args(model_dir, port, nnodes=2, rank=0, dist_port=dist))
    worker = start_server(server_args(model_dir, free_port(), nnodes=2, rank=1, dist_port=dist, context_length=32768))
    try:
        assert head.wait(timeout=20) == 1
        assert "different server arguments" in head.stdout.read()
    finally:
        stop(head)
        stop(worker)


# --- multi-node init over real sockets: TCPStore, Gloo, NCCL, the broadcast queue -----------


def group(model_dir, tmp_path, *, head_env=None, worker_env=None, start=("worker", "head"), head_timeout=2,
          worker_timeout=10, **flags):
    """Start a TP=2 pair on this machine; returns {name: Popen} and the head's HTTP port.

    The head gives up on a missing peer soon (what a failing case waits for); the worker, started
    first, waits long enough for the head to come up on a loaded machine.
    """
    port, dist = free_port(), free_port()
    procs = {}
    for name in start:
        rank = 0 if name == "head" else 1
        timeout = head_timeout if rank == 0 else worker_timeout
        procs[name] = start_server(server_args(model_dir, port if rank == 0 else free_port(), nnodes=2, rank=rank,
                                               dist_port=dist, **flags),
                                   head_env if rank == 0 else worker_env,
                                   knob_root(tmp_path, {"rendezvous_timeout": timeout}))
    return procs, port


def outputs(procs, timeout=30):
    return {name: (proc.wait(timeout=timeout), proc.stdout.read()) for name, proc in procs.items()}


def test_ranks_failing_the_same_check_each_print_their_own_error(tmp_path, model_dir):
    # Between start-up collectives a rank does not notice its peer died, as with NCCL.
    procs, _ = group(model_dir, tmp_path, max_running_requests=8)
    for rc, out in outputs(procs).values():
        assert rc == 1 and HYBRID in out and "NCCL error" not in out


GLOO_TIMEOUT = "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error"


def test_gloo_on_a_missing_interface_fails_that_rank_and_times_out_its_peer(tmp_path, model_dir):
    procs, _ = group(model_dir, tmp_path, worker_env={"GLOO_SOCKET_IFNAME": "spk-none0"})
    out = outputs(procs)
    assert out["worker"][0] == 1
    assert ("RuntimeError: [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/device.cc:84] ifa != nullptr. "
            "Unable to find address for: spk-none0") in out["worker"][1]
    assert out["head"][0] == 1 and GLOO_TIMEOUT in out["head"][1]
    assert out["head"][1].index("Init torch distributed begin.") < out["head"][1].index(GLOO_TIMEOUT)


def test_nccl_on_a_missing_interface_is_invalid_usage_and_says_why_with_nccl_debug(tmp_path, model_dir):
    for debug in ("", "WARN"):
        procs, _ = group(model_dir, tmp_path, worker_env={"NCCL_SOCKET_IFNAME": "spk-none", "NCCL_DEBUG": debug})
        out = outputs(procs)
        assert out["worker"][0] == 1
        assert "RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)" in out["worker"][1]
        assert ("NCCL WARN Bootstrap : no socket interface found" in out["worker"][1]) is bool(debug)
        assert out["head"][0] == 1


def test_a_worker_that_cannot_reach_the_dist_init_addr_times_out_like_torch(tmp_path, model_dir):
    procs, _ = group(model_dir, tmp_path, start=("worker",), worker_timeout=1)
    (rc, out), = outputs(procs).values()
    assert rc == 1
    assert "[c10d] The client socket has failed to connect to [127.0.0.1]:" in out and "Connection refused" in out
    assert "torch.distributed.DistNetworkError: The client socket has timed out after 1000ms while trying to connect " \
           "to (127.0.0.1, " in out


def test_rank0_alone_times_out_waiting_for_clients(tmp_path, model_dir):
    procs, _ = group(model_dir, tmp_path, start=("head",), head_timeout=1)
    (rc, out), = outputs(procs).values()
    assert rc == 1
    assert "torch.distributed.DistStoreError: Timed out after 2 seconds waiting for clients. 1/2 clients joined." in out


@pytest.mark.parametrize("host_ip", ["192.0.2.1", None], ids=["unreachable SGLANG_HOST_IP", "right SGLANG_HOST_IP"])
def test_a_wrong_sglang_host_ip_on_rank0_hangs_the_group_after_init(tmp_path, model_dir, host_ip):
    procs, port = group(model_dir, tmp_path, head_env={"SGLANG_HOST_IP": host_ip} if host_ip else None)
    try:
        if host_ip is None:
            wait_ready(port, procs["head"])
            return
        # Past the head's 2 s rendezvous timeout: nothing failed, nothing serves, nothing is logged.
        time.sleep(3)
        assert procs["head"].poll() is None and procs["worker"].poll() is None
        with pytest.raises(OSError):
            http(port, "/health")
    finally:
        out = {name: stop(proc) for name, proc in procs.items()}
    for text in out.values():
        assert "Init torch distributed begin." in text and "Init torch distributed ends" not in text
        assert "Error" not in text


# --- serving needs every rank: a collective per decoding step, NCCL's watchdog, hangs ----------------


def open_request(port, body):
    """POST a chat completion over a bare socket; the caller reads the reply, or sees that none comes."""
    sock = socket.create_connection((LOOPBACK, port), timeout=10)
    data = json.dumps(body).encode()
    sock.sendall(f"POST /v1/chat/completions HTTP/1.0\r\nHost: {LOOPBACK}:{port}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def quiet_for(sock, seconds):
    """Nothing arrives on the socket for `seconds`: no byte and no close (the request stays open)."""
    return not select.select([sock], [], [], seconds)[0]


class Stream:
    """A streamed chat completion (server-sent events), read event by event."""

    def __init__(self, port, body):
        self.sock = open_request(port, {**body, "stream": True})
        self.buf = b""

    def _until(self, marker, timeout):
        deadline = time.monotonic() + timeout
        while marker not in self.buf:
            left = deadline - time.monotonic()
            assert left > 0 and select.select([self.sock], [], [], left)[0], f"no {marker!r}: {self.buf!r}"
            chunk = self.sock.recv(65536)
            assert chunk, f"closed before {marker!r}: {self.buf!r}"
            self.buf += chunk
        head, _, self.buf = self.buf.partition(marker)
        return head.decode()

    def headers(self, timeout=10):
        return self._until(b"\r\n\r\n", timeout)

    def event(self, timeout=10):
        text = self._until(b"\n\n", timeout)
        assert text.startswith("data: "), text
        payload = text[len("data: "):]
        return payload if payload == "[DONE]" else json.loads(payload)

    def quiet_for(self, seconds):
        return b"\n\n" not in self.buf and quiet_for(self.sock, seconds)

    def drain(self, seconds):
        """The events that come within `seconds`."""
        events = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if b"\n\n" in self.buf:
                events.append(self.event())
            elif select.select([self.sock], [], [], left)[0]:
                chunk = self.sock.recv(65536)
                assert chunk, f"closed: {self.buf!r}"
                self.buf += chunk
        return events

    def close(self):
        self.sock.close()


@pytest.fixture
def tp_pair(model_dir, tmp_path):
    """A serving TP=2 pair on this machine, knobs per rank: returns (head, worker, the head's port)."""
    procs = []

    def _pair(head_knobs=None, worker_knobs=None):
        port, dist = free_port(), free_port()
        worker = start_server(server_args(model_dir, free_port(), nnodes=2, rank=1, dist_port=dist),
                              root=knob_root(tmp_path, worker_knobs))
        head = start_server(server_args(model_dir, port, nnodes=2, rank=0, dist_port=dist),
                            root=knob_root(tmp_path, head_knobs))
        procs.extend([head, worker])
        wait_ready(port, head)
        return head, worker, port

    yield _pair
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        stop(proc)


WATCHDOG = "Watchdog caught collective operation timeout: WorkNCCL(SeqNum="


def test_a_frozen_peer_stalls_generation_while_health_answers_until_the_watchdog_takes_rank0_down(tp_pair):
    head, worker, port = tp_pair(head_knobs={"watchdog_seconds": 3})
    assert http(port, "/v1/chat/completions", ASK)[1]["choices"][0]["message"]["content"] == "391"
    worker.send_signal(signal.SIGSTOP)
    request = open_request(port, ASK)
    try:
        # No token without the frozen rank; the server itself still looks healthy.
        assert quiet_for(request, 1.0)
        assert http(port, "/health")[0] == 200
        assert http(port, "/v1/models")[0] == 200
        assert head.poll() is None
        # Then NCCL's watchdog: the collective outlived its timeout, the process goes down.
        assert head.wait(timeout=30) == 134
    finally:
        request.close()
    out = head.stdout.read()
    assert f"[rank0]:[E ProcessGroupNCCL.cpp:632] [Rank 0] {WATCHDOG}" in out
    assert "Timeout(ms)=3000" in out
    assert "terminate called after throwing an instance of 'c10::DistBackendError'" in out
    assert out.index("Decode batch") < out.index(WATCHDOG)
    # The worker, thawed, finds rank 0 gone and goes down with it.
    worker.send_signal(signal.SIGCONT)
    assert worker.wait(timeout=10) == 1
    assert "NCCL error: remote process exited or there was a network error" in worker.stdout.read()


def test_a_peer_frozen_mid_stream_stalls_the_stream_and_it_resumes_when_the_peer_does(tp_pair):
    # 53 decoding steps of 0.05 s: time to freeze the worker while tokens are coming out.
    head, worker, port = tp_pair(head_knobs={"token_seconds": 0.05})
    stream = Stream(port, ASK)
    try:
        assert stream.headers().startswith("HTTP/1.0 200 ")
        first = [stream.event() for _ in range(3)]
        assert first[0]["choices"][0]["delta"]["role"] == "assistant"
        worker.send_signal(signal.SIGSTOP)
        # The step under way may have had its answer already: what it completes may still come out.
        first += stream.drain(0.5)
        assert stream.quiet_for(1.5)
        assert http(port, "/health")[0] == 200
        worker.send_signal(signal.SIGCONT)
        events = []
        while (event := stream.event()) != "[DONE]":
            events.append(event)
    finally:
        stream.close()
    deltas = [e["choices"][0]["delta"] for e in first + events if e["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "17 × 23 = 17 × 20 + 17 × 3 = 340 + 51 = 391"
    assert "".join(d.get("content", "") for d in deltas) == "391"
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert head.poll() is None and worker.poll() is None


def test_a_peer_that_dies_during_a_stalled_generation_takes_rank0_down_at_once(tp_pair):
    head, worker, port = tp_pair()  # the watchdog: the rendezvous timeout, 600 s
    worker.send_signal(signal.SIGSTOP)
    request = open_request(port, ASK)
    try:
        assert quiet_for(request, 0.5)
        worker.send_signal(signal.SIGKILL)
        assert head.wait(timeout=10) == 1
    finally:
        request.close()
    out = head.stdout.read()
    assert "RuntimeError: NCCL error: remote process exited or there was a network error" in out
    assert WATCHDOG not in out


def test_a_tp_group_streams_and_serves_every_request_through_its_collectives(tp_pair):
    head, worker, port = tp_pair()
    for body in (ASK, {**ASK, "tools": TOOLS}):
        assert http(port, "/v1/chat/completions", body)[0] == 200
    stream = Stream(port, {**ASK, "tools": TOOLS, "stream_options": {"include_usage": True}})
    try:
        assert stream.headers().startswith("HTTP/1.0 200 ")
        events = []
        while (event := stream.event()) != "[DONE]":
            events.append(event)
    finally:
        stream.close()
    call = events[0]["choices"][0]["delta"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather" and call["index"] == 0
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 24


def test_the_hang_knob_keeps_health_green_while_generations_never_finish(serve, tmp_path):
    root = knob_root(tmp_path, {"hang": True})
    port, proc = serve(root=root)
    assert http(port, "/health")[0] == 200
    assert http(port, "/v1/models")[0] == 200
    request = open_request(port, ASK)
    stream = Stream(port, ASK)
    try:
        # No token and no error: the request stays open until the client gives up.
        assert quiet_for(request, 1.5)
        assert stream.headers().startswith("HTTP/1.0 200 ")
        assert stream.quiet_for(0.5)
    finally:
        request.close()
        stream.close()
    # Read at each request: the same rank answers once the knob is off.
    (root / "etc/spark-sim/node.json").write_text(json.dumps({"sglang": {"load_seconds": 0.1, "hang": False}}))
    assert http(port, "/v1/chat/completions", ASK)[1]["choices"][0]["message"]["content"] == "391"
    assert proc.poll() is None


# --- the GPU outlives an ended rank by gpu_release_seconds ------------------------------------------

OOM = "torch.OutOfMemoryError: CUDA out of memory."


def wait_gpu_free(root, timeout=30):
    deadline = time.monotonic() + timeout
    while apps := compute_apps(root):
        assert time.monotonic() < deadline, f"GPU still held: {apps}"
        time.sleep(0.2)


@pytest.mark.parametrize("ending", ["SIGKILL", "docker stop", "crash"])
def test_an_ended_ranks_gpu_stays_held_for_gpu_release_seconds(tmp_path, model_dir, ending):
    release = 4
    knobs = {"sglang": {"load_seconds": 0.1, "gpu_release_seconds": release,
                        **({"tilelang_tile": "default"} if ending == "crash" else {})}}
    root = node_root(tmp_path, "n", knobs)
    assert docker(root, "pull", IMAGE).returncode == 0
    port = free_port()
    rank = subprocess.Popen([sys.executable, str(DOCKER), "run", "--rm", "--name", "sglang", "--gpus", "all",
                             "--volume", f"{model_dir}:/models/glm53:ro", IMAGE, "python3", "-m",
                             "sglang.launch_server", *server_args("/models/glm53", port)],
                            env={**os.environ, **FABRIC_ENV, "SPARK_SIM_ROOT": str(root)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        if ending == "crash":
            # Its cuda graph capture fails (the default TileLang tile): exit 1 with its memory pool allocated.
            assert rank.wait(timeout=30) == 1
        else:
            wait_ready(port, rank)
            pid = int(docker(root, "inspect", "--format", "{{.State.Pid}}", "sglang").stdout)
            # While the rank lives, the driver lists it alone.
            assert compute_apps(root) == [(pid, sys.executable)]
            if ending == "SIGKILL":
                os.kill(pid, signal.SIGKILL)
                assert rank.wait(timeout=10) == 137
            else:
                assert docker(root, "stop", "--time", "5", "sglang").returncode == 0
                assert rank.wait(timeout=10) == 143
        ended = time.monotonic()
        # docker run came back at once, the GPU is still held.
        held = compute_apps(root)
        assert len(held) == 1 and held[0][1] == sys.executable
        # A rank started now does not find the memory it needs.
        (root / "etc/spark-sim/node.json").write_text(json.dumps({"sglang": {"load_seconds": 0.1}}))
        again = server_args(model_dir, free_port())
        rc, out = run_server(again, root=root)
        assert time.monotonic() - ended < release, "too slow to see the GPU held; raise release"
        assert rc == 1 and OOM in out and "GPU 0 has a total capacity of 119.70 GiB" in out
        # Then the memory is released and a rank starts.
        wait_gpu_free(root)
        proc = start_server(again, root=root)
        wait_ready(int(again[again.index("--port") + 1]), proc)
        assert OOM not in stop(proc)
    finally:
        stop(rank)


def test_without_gpu_release_seconds_the_gpu_is_free_when_the_rank_ends(tmp_path, model_dir):
    root = knob_root(tmp_path)
    port = free_port()
    rank = start_server(server_args(model_dir, port), root=root)
    try:
        wait_ready(port, rank)
        rank.send_signal(signal.SIGKILL)
        rank.wait(timeout=10)
        assert compute_apps(root) == []
        proc = start_server(server_args(model_dir, port), root=root)
        wait_ready(port, proc)
        stop(proc)
    finally:
        stop(rank)


# --- the docker stand-in ------------------------------------------------------


def node_root(tmp_path, name, knobs=None):
    root = tmp_path / name
    (root / "etc/spark-sim").mkdir(parents=True)
    (root / "dev").mkdir()
    # The stand-ins' libraries as the harness installs them (the server reads the RoCE stand-in's through roce_port).
    sim.install_standin_libs(root)
    (root / "etc/spark-sim/node.json").write_text(json.dumps({"sglang": {"load_seconds": 0.1}, **(knobs or {})}))
    return root


def docker(root, *args, timeout=30):
    env = {**os.environ, "SPARK_SIM_ROOT": str(root)}
    return subprocess.run([sys.executable, str(DOCKER), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_daemon_unreachable_message_is_the_real_one(tmp_path):
    root = node_root(tmp_path, "n", {"docker": {"running": False}})
    for args in (["pull", IMAGE], ["ps"], ["image", "inspect", IMAGE], ["info", "--format", "{{json .Runtimes}}"]):
        r = docker(root, *args)
        assert r.returncode == 1
        assert ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                "Is the docker daemon running?") in r.stderr


def test_info_lists_the_nvidia_runtime_unless_told_otherwise(tmp_path):
    r = docker(node_root(tmp_path, "a"), "info", "--format", "{{json .Runtimes}}")
    assert r.returncode == 0
    assert json.loads(r.stdout)["nvidia"]["path"] == "nvidia-container-runtime"
    r = docker(node_root(tmp_path, "b", {"docker": {"nvidia_runtime": False}}), "info", "--format",
               "{{json .Runtimes}}")
    assert "nvidia" not in json.loads(r.stdout)


def test_pull_records_a_stable_arm64_image_identical_across_nodes(tmp_path):
    ids = []
    for name in ("n0", "n1"):
        root = node_root(tmp_path, name)
        r = docker(root, "pull", IMAGE)
        assert r.returncode == 0, r.stderr
        assert f"Status: Downloaded newer image for {IMAGE}" in r.stdout
        assert docker(root, "pull", IMAGE).stdout.count("Image is up to date") == 1
        fmt = docker(root, "image", "inspect", "--format", "{{.Id}} {{.Os}}/{{.Architecture}}", IMAGE)
        image_id, platform = fmt.stdout.split()
        assert platform == "linux/arm64"
        assert image_id.startswith("sha256:") and len(image_id) == 71
        ids.append(image_id)
    assert ids[0] == ids[1]


def test_knobs_make_a_node_disagree_or_pull_amd64(tmp_path):
    odd = node_root(tmp_path, "odd", {"docker": {"image_id": "sha256:" + "ab" * 32, "architecture": "amd64"}})
    docker(odd, "pull", IMAGE)
    out = docker(odd, "image", "inspect", "--format", "{{.Id}} {{.Architecture}}", IMAGE).stdout.split()
    assert out == ["sha256:" + "ab" * 32, "amd64"]
    r = docker(odd, "run", "--rm", IMAGE, "python3", "-c", "print(1)")
    assert r.returncode != 0 and "exec format error" in r.stderr


def test_missing_image_and_container_errors(tmp_path):
    root = node_root(tmp_path, "n")
    r = docker(root, "image", "inspect", "nope:1")
    assert r.returncode == 1 and "Error response from daemon: No such image: nope:1" in r.stderr
    assert docker(root, "stop", "sglang").stderr.strip() == "Error response from daemon: No such container: sglang"
    assert docker(root, "rm", "-f", "sglang").returncode == 0


def test_run_reports_the_container_path_of_a_checkpoint_without_processor_config(tmp_path, model_dir):
    root = node_root(tmp_path, "n")
    (model_dir / "processor_config.json").unlink()
    docker(root, "pull", IMAGE)
    r = docker(root, "run", "--rm", "--gpus", "all", "-v", f"{model_dir}:/models/glm53:ro", IMAGE,
               "python3", "-m", "sglang.launch_server", *server_args("/models/glm53", free_port()))
    assert r.returncode == 1
    assert "No such file or directory: '/models/glm53/processor_config.json'" in r.stdout


def test_run_refuses_a_missing_device_or_env_file_like_docker(tmp_path):
    root = node_root(tmp_path, "n")
    docker(root, "pull", IMAGE)
    r = docker(root, "run", "--rm", "--device", "/dev/infiniband", IMAGE, "true")
    assert r.returncode == 125 and 'adding custom device "/dev/infiniband"' in r.stderr
    r = docker(root, "run", "--rm", "--env-file", str(tmp_path / "none.env"), IMAGE, "true")
    assert r.returncode == 125 and "no such file or directory" in r.stderr
    # A bind source the daemon would create: inside the node root it is, outside it (this machine) it is refused.
    r = docker(root, "run", "--rm", "--volume", f"{tmp_path}/outside/api-key:/run/key:ro", IMAGE, "true")
    assert r.returncode == 125 and "is missing and outside the node root" in r.stderr
    assert not (tmp_path / "outside").exists()
    r = docker(root, "run", "--rm", "--volume", f"{root}/inside:/run/inside", IMAGE, "true")
    assert r.returncode == 0 and (root / "inside").is_dir()


def test_run_runs_the_sglang_standin_with_mounts_env_and_stop(tmp_path, model_dir):
    root = node_root(tmp_path, "n")
    (root / "dev/infiniband").mkdir()
    assert docker(root, "pull", IMAGE).returncode == 0
    env_file = tmp_path / "spark-llm.env"
    env_file.write_text("# comment\nHF_HUB_OFFLINE=1\n")
    env_file.chmod(0o600)
    key_file = tmp_path / "spark-llm.key"
    key_file.write_text("sk-file-only")
    key_file.chmod(0o600)
    port = free_port()
    # The unit's launcher: the key file's path in the container is its first argument.
    launcher = keyed_launcher()
    args = server_args("/models/glm53", port)
    cmd = [sys.executable, str(DOCKER), "run", "--rm", "--name", "sglang", "--gpus", "all", "--network", "host",
           "--ipc", "host", "--shm-size", "32g", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
           "--cap-add", "IPC_LOCK", "--device", "/dev/infiniband", "--memory", "120g", "--memory-swap", "120g",
           "--volume", f"{model_dir}:/models/glm53:ro", "--volume", f"{key_file}:/run/spark-llm/api-key:ro",
           "--env-file", str(env_file), IMAGE, "python3", "-c", launcher, "/run/spark-llm/api-key", *args]
    proc = subprocess.Popen(cmd, env={**os.environ, "SPARK_SIM_ROOT": str(root)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(port, proc)
        ps = docker(root, "ps", "--format", "{{.Names}} {{.Image}}")
        assert ps.stdout.split() == ["sglang", IMAGE]
        conflict = docker(root, "run", "--rm", "--name", "sglang", IMAGE, "true")
        assert conflict.returncode == 125 and 'The container name "/sglang" is already in use' in conflict.stderr
        # The key came from the mounted file, not from any command line.
        assert http(port, "/v1/models")[0] == 401
        # Served under the container path, as the real server would.
        models = http(port, "/v1/models", headers={"Authorization": "Bearer sk-file-only"})[1]
        assert models["data"][0]["id"] == "/models/glm53"
        assert "sk-file-only" not in " ".join(cmd)
        assert "MAMBA component" in docker(root, "logs", "sglang").stdout
        # The roles' own query: the running container's image, by an anchored name filter.
        assert docker(root, "ps", "--filter", "name=^sglang$", "--format", "{{.Image}}").stdout.strip() == IMAGE
        assert docker(root, "ps", "--filter", "name=^sglan$", "-q").stdout.strip() == ""
        state = json.loads(docker(root, "inspect", "sglang").stdout)[0]
        image_id = docker(root, "image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
        assert (state["Name"], state["Image"], state["Config"]["Image"]) == ("/sglang", image_id, IMAGE)
        assert state["State"]["Status"] == "running" and state["State"]["Running"] is True
        assert state["State"]["Pid"] > 0
        assert state["HostConfig"]["Memory"] == 120 * 1024 ** 3 and state["HostConfig"]["AutoRemove"] is True
        assert {"Source": str(model_dir), "Destination": "/models/glm53", "RW": False}.items() <= \
            state["Mounts"][0].items()
        # Like the daemon: the environment given to the container is in its record, a mounted file's
        # content is not (only its paths are).
        assert "HF_HUB_OFFLINE=1" in state["Config"]["Env"]
        assert {"Source": str(key_file), "Destination": "/run/spark-llm/api-key", "RW": False}.items() <= \
            state["Mounts"][1].items()
        assert "sk-file-only" not in docker(root, "inspect", "sglang").stdout
        assert docker(root, "stop", "--time", "5", "sglang").stdout.strip() == "sglang"
        assert proc.wait(timeout=10) == 143
        assert docker(root, "ps", "-a", "-q").stdout.strip() == ""
        gone = docker(root, "inspect", "sglang")
        assert gone.returncode == 1 and gone.stderr.strip() == "Error: No such object: sglang"
    finally:
        stop(proc)


def run_rank(root, model_dir, *docker_options, flags=()):
    """docker run of a serving-size rank on this machine: (exit status, output)."""
    port = free_port()
    cmd = [sys.executable, str(DOCKER), "run", "--name", "sglang", "--gpus", "all", *docker_options,
           "--volume", f"{model_dir}:/models/glm53:ro", IMAGE, "python3", "-m", "sglang.launch_server",
           *server_args("/models/glm53", port), *flags]
    proc = subprocess.Popen(cmd, env={**os.environ, **FABRIC_ENV, "SPARK_SIM_ROOT": str(root)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            # SIGTERM: docker forwards it to the container (a SIGKILL would leave the rank running).
            proc.terminate()
            proc.wait(timeout=10)
    return proc.returncode, out, port


@pytest.mark.parametrize(("memory", "knobs", "flags"), [
    ("96g", {}, ()),
    ("120g", {}, ("--mem-fraction-static", "0.97")),
    ("120g", {"resident_gib": 130}, ()),
], ids=["cap below the seed's need", "mem-fraction-static 0.97", "resident_gib knob"])
def test_a_rank_over_the_containers_memory_is_oom_killed_with_exit_137(tmp_path, model_dir, memory, knobs, flags):
    root = node_root(tmp_path, "n", {"sglang": {"load_seconds": 0.1, **knobs}} if knobs else None)
    assert docker(root, "pull", IMAGE).returncode == 0
    rc, out, _ = run_rank(root, model_dir, "--memory", memory, "--memory-swap", memory, flags=flags)
    assert rc == 137
    # Killed while allocating its memory pool: after the weights, before any graph capture; no last words.
    assert "Load weight end" in out and "Capture cuda graph begin" not in out
    assert out.rstrip().splitlines()[-1].endswith("mem usage=90.68 GB.")
    fmt = "{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}} {{.State.Running}} {{.Config.Image}}"
    assert docker(root, "inspect", "--format", fmt, "sglang").stdout.split() == ["exited", "137", "true", "false", IMAGE]
    assert docker(root, "container", "inspect", "--format", "{{.HostConfig.Memory}}", "sglang").stdout.strip() == \
        str(int(memory[:-1]) * 1024 ** 3)
    ps = docker(root, "ps", "-a", "--format", "{{.Names}}|{{.State}}|{{.Status}}").stdout.strip()
    assert ps.startswith("sglang|exited|Exited (137) ") and ps.endswith(" ago")
    assert docker(root, "ps", "-q").stdout.strip() == ""
    assert docker(root, "rm", "sglang").returncode == 0
    assert docker(root, "container", "inspect", "sglang").stderr.strip() == \
        "Error response from daemon: No such container: sglang"


def test_a_rank_within_its_memory_is_not_oom_killed(tmp_path, model_dir):
    root = node_root(tmp_path, "n")
    assert docker(root, "pull", IMAGE).returncode == 0
    # A rank that fails for another reason: its exit status is its own, not the OOM killer's.
    rc, out, _ = run_rank(root, model_dir, "--memory", "120g", flags=("--max-running-requests", "8"))
    assert rc == 1 and "Hybrid (mamba/linear-attention) state cache is too small" in out
    fmt = "{{.State.ExitCode}} {{.State.OOMKilled}}"
    assert docker(root, "inspect", "--format", fmt, "sglang").stdout.split() == ["1", "false"]


def events(root, *filters):
    """`docker events` from a minute ago until now, as the doctor reads them: [(action, attributes)]."""
    r = docker(root, "events", "--since", "1m", "--until", str(time.time()), *filters, "--format", "{{json .}}")
    assert r.returncode == 0, r.stderr
    return [(e["Action"], e["Actor"]["Attributes"]) for e in map(json.loads, r.stdout.splitlines())]


def test_the_daemons_events_tell_an_oom_kill_from_a_kill_9_after_run_rm(tmp_path, model_dir):
    """Both end with exit 137 and, with --rm, no container to inspect: only the daemon's `oom` event tells them apart."""
    root = node_root(tmp_path, "n")
    assert docker(root, "pull", IMAGE).returncode == 0
    rc, _, _ = run_rank(root, model_dir, "--rm", "--memory", "96g", "--memory-swap", "96g")
    assert rc == 137
    assert docker(root, "container", "inspect", "sglang").returncode == 1
    seen = events(root, "--filter", "container=sglang")
    assert [a for a, _ in seen] == ["create", "start", "oom", "die", "destroy"]
    assert seen[3][1]["exitCode"] == "137" and seen[3][1]["name"] == "sglang" and seen[3][1]["image"] == IMAGE
    killer = subprocess.run([sys.executable, str(DOCKER), "run", "--rm", "--name", "other", IMAGE, "python3", "-c",
                             "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                            env={**os.environ, "SPARK_SIM_ROOT": str(root)}, capture_output=True, timeout=30, check=False)
    assert killer.returncode == 137
    assert [a for a, _ in events(root, "--filter", "container=other")] == ["create", "start", "die", "destroy"]
    assert [a for a, _ in events(root, "--filter", "event=oom")] == ["oom"]
    # The CLI's default line when no --format is given.
    r = docker(root, "events", "--since", "1m", "--until", str(time.time()), "--filter", "event=die")
    stamp, kind, action, cid, attributes = r.stdout.splitlines()[0].split(" ", 4)
    assert stamp.endswith("Z") and (kind, action, len(cid)) == ("container", "die", 64), r.stdout
    assert attributes.startswith("(execDuration=") and attributes.endswith(f", exitCode=137, image={IMAGE}, name=sglang)")


@pytest.mark.parametrize(("options", "error"), [
    (["--memory", "lots"], 'invalid argument "lots" for "-m, --memory" flag: invalid size: \'lots\''),
    (["--memory", "4m"], "Minimum memory limit allowed is 6MB"),
    (["--memory", "8g", "--memory-swap", "4g"], "Minimum memoryswap limit should be larger than memory limit"),
])
def test_run_refuses_bad_memory_limits_like_docker(tmp_path, options, error):
    root = node_root(tmp_path, "n")
    docker(root, "pull", IMAGE)
    r = docker(root, "run", "--rm", *options, IMAGE, "true")
    assert r.returncode == 125 and error in r.stderr


# --- nvidia-smi: compute apps are the processes holding the GPU -------------------------------


def smi(root, *args):
    env = {**os.environ, "SPARK_SIM_ROOT": str(root)}
    return subprocess.run([sys.executable, str(NVIDIA_SMI), *args], env=env, capture_output=True, text=True,
                          timeout=30, check=False)


def compute_apps(root) -> list[tuple[int, str]]:
    r = smi(root, "--query-compute-apps=pid,process_name", "--format=csv,noheader")
    assert r.returncode == 0, r.stdout + r.stderr
    return [(int(pid), name) for pid, name in (line.split(", ") for line in r.stdout.splitlines())]


def cmdline(pid) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


@pytest.mark.parametrize("keyed", [False, True], ids=["python3 -m sglang.launch_server", "API-key launcher"])
def test_nvidia_smi_lists_the_rank_of_either_launcher_and_not_the_docker_client(tmp_path, model_dir, keyed):
    root = node_root(tmp_path, "n")
    assert docker(root, "pull", IMAGE).returncode == 0
    env_file = tmp_path / "spark-llm.env"
    env_file.write_text("HF_HUB_OFFLINE=1\n")
    key_file = tmp_path / "spark-llm.key"
    key_file.write_text("sk-smi-test\n")
    # What the unit runs (roles/server/templates/server.service.j2), with and without an API key.
    launcher = (["python3", "-c", keyed_launcher(), "/run/spark-llm/api-key"] if keyed
                else ["python3", "-m", "sglang.launch_server"])
    port = free_port()
    cmd = [sys.executable, str(DOCKER), "run", "--rm", "--name", "sglang", "--gpus", "all", "--env-file",
           str(env_file), "--volume", f"{model_dir}:/models/glm53:ro",
           "--volume", f"{key_file}:/run/spark-llm/api-key:ro", IMAGE, *launcher,
           *server_args("/models/glm53", port)]
    assert compute_apps(root) == []
    proc = subprocess.Popen(cmd, env={**os.environ, "SPARK_SIM_ROOT": str(root)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(port, proc)
        rank = int(docker(root, "inspect", "--format", "{{.State.Pid}}", "sglang").stdout)
        assert rank != proc.pid
        # The rank runs what the unit asked for; the docker client names the launcher in its own argv too.
        assert cmdline(rank)[1:3] == launcher[1:3]
        assert launcher[2] in cmdline(proc.pid)
        # Only the rank holds the GPU, as the driver would list it: not the client that started it.
        assert compute_apps(root) == [(rank, sys.executable)]
        if keyed:
            assert http(port, "/v1/models", headers={"Authorization": "Bearer sk-smi-test"})[0] == 200
        assert docker(root, "stop", "--time", "5", "sglang").returncode == 0
        assert proc.wait(timeout=10) == 143
        assert compute_apps(root) == []
    finally:
        stop(proc)


def test_nvidia_smi_lists_knob_processes_beside_a_rank_until_the_rank_is_killed(tmp_path, model_dir):
    root = knob_root(tmp_path, gpu={"processes": [{"pid": 4242, "name": "ollama"}]})
    port = free_port()
    rank = start_server(server_args(model_dir, port), root=root)
    try:
        wait_ready(port, rank)
        assert compute_apps(root) == [(4242, "ollama"), (rank.pid, sys.executable)]
        rows = smi(root, "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader").stdout.splitlines()
        uuid = smi(root, "--query-gpu=uuid", "--format=csv,noheader").stdout.strip()
        assert rows == [f"4242, {uuid}", f"{rank.pid}, {uuid}"]
        # However a rank ends (here as the OOM killer ends it), its GPU is free with it.
        rank.send_signal(signal.SIGKILL)
        rank.wait(timeout=10)
        assert compute_apps(root) == [(4242, "ollama")]
    finally:
        stop(rank)


def test_nvidia_smi_lists_nothing_of_another_node(tmp_path, model_dir):
    port = free_port()
    rank = start_server(server_args(model_dir, port), root=knob_root(tmp_path))
    try:
        wait_ready(port, rank)
        assert compute_apps(knob_root(tmp_path)) == []
    finally:
        stop(rank)


# --- the network rule: no stand-in resolves a name --------------------------------------------

# Every resolver entry point of the socket module: each one a test address could reach the site's DNS through.
RESOLVERS = ("getfqdn", "gethostbyaddr", "gethostbyname", "gethostbyname_ex", "getaddrinfo", "getnameinfo")
NO_RESOLVER = (
    "import os, socket, sys\n"
    "def refuse(name):\n"
    "    def resolve(*args, **kwargs):\n"
    "        sys.stderr.write(f'name resolution: socket.{name}{args}\\n')\n"
    "        sys.stderr.flush()\n"
    "        os._exit(97)\n"
    "    return resolve\n"
    f"for name in {RESOLVERS!r}:\n"
    "    setattr(socket, name, refuse(name))\n"
)


def without_resolver(program: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    """Run Python `program` with every resolver of the socket module replaced by an exit 97."""
    return subprocess.Popen([sys.executable, "-c", NO_RESOLVER + program, *args], env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def raw_get(port: int, path: str, headers: str = "") -> str:
    """An HTTP/1.0 GET to 127.0.0.1 over a bare socket: a numeric address, so nothing is resolved here either."""
    with socket.socket() as s:
        s.settimeout(10)
        s.connect((LOOPBACK, port))
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: {LOOPBACK}:{port}\r\n{headers}\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.decode(errors="replace")


def get_when_up(port: int, path: str, proc: subprocess.Popen, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {proc.stdout.read()}")
        try:
            return raw_get(port, path)
        except OSError:
            assert time.monotonic() < deadline, f"nothing answered on port {port}"
            time.sleep(0.1)


def test_the_resolver_trap_catches_what_http_server_does_at_bind():
    """The control: a plain http.server bind looks its address up (socket.getfqdn), and the trap sees it."""
    proc = without_resolver("from http.server import HTTPServer, BaseHTTPRequestHandler\n"
                            "HTTPServer(('127.0.0.1', 0), BaseHTTPRequestHandler)\n")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 97, out
    assert "name resolution: socket.getfqdn('127.0.0.1',)" in out


def test_hub_emulator_serves_without_resolving_a_name(tmp_path):
    info = build_checkpoint(tmp_path / "hub", shards=2, shard_bytes=64)
    port = free_port()
    # As the harness starts it, on an address it is given (there the bridge's).
    proc = without_resolver(f"import runpy, sys\nsys.argv = [{str(HUB_EMULATOR)!r}] + sys.argv[1:]\n"
                            f"runpy.run_path({str(HUB_EMULATOR)!r}, run_name='__main__')\n",
                            "--root", str(tmp_path / "hub"), "--bind", LOOPBACK, "--port", str(port))
    try:
        reply = get_when_up(port, f"/api/models/{REPO_ID}", proc)
        assert reply.startswith("HTTP/1.1 200 ") and info["new"] in reply
        reply = raw_get(port, f"/{REPO_ID}/resolve/main/config.json")
        assert reply.startswith("HTTP/1.1 200 ") and "glm5_next" in reply
        assert proc.poll() is None
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert "name resolution" not in out, out


def test_hub_emulator_takes_addresses_not_names(tmp_path):
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 address"):
        HubEmulator(tmp_path, host="localhost")
    r = subprocess.run([sys.executable, str(HUB_EMULATOR), "--root", str(tmp_path), "--bind", "localhost"],
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 2 and "argument --bind" in r.stderr


def test_sglang_standin_serves_without_resolving_a_name(model_dir):
    port = free_port()
    proc = without_resolver(f"import runpy, sys\nsys.argv = [{str(SERVER)!r}] + sys.argv[1:]\n"
                            f"runpy.run_path({str(SERVER)!r}, run_name='__main__')\n",
                            *server_args(model_dir, port),
                            env={"NVIDIA_VISIBLE_DEVICES": "all", "SPARK_SIM_ROOT": str(DEFAULT_ROOT)})
    try:
        reply = get_when_up(port, "/v1/models", proc)
        assert reply.startswith("HTTP/1.0 200 ") and str(model_dir) in reply
        # A generation too, through its decoding steps, streamed and not.
        for body in (ASK, {**ASK, "stream": True}):
            with open_request(port, body) as sock:
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
            assert data.startswith(b"HTTP/1.0 200 ") and b"391" in data
    finally:
        out = stop(proc)
    assert "name resolution" not in out, out

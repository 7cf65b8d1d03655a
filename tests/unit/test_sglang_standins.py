"""The docker and SGLang stand-ins, run locally as subprocesses on 127.0.0.1 only.

SPARK_SIM_ROOT points the stand-ins' /etc, /var/lib, /usr/lib and /dev at a
temporary directory, one per simulated node.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "tests" / "standins" / "bin" / "docker"
SERVER = REPO / "tests" / "standins" / "lib" / "sglang_server.py"
IMAGE = "lmsysorg/sglang:glm-5.3-flash-arm64"
LOOPBACK = "127.0.0.1"
HYBRID = ("RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
          "max_mamba_cache_size=1, mamba_ratio=5, resulting max_num_reqs=0.")


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
    args = ["--model-path", str(model), "--trust-remote-code", "--tp-size", str(nnodes),
            "--reasoning-parser", "glm45", "--tool-call-parser", "glm47",
            "--context-length", "65536", "--max-running-requests", "2",
            "--nnodes", str(nnodes), "--node-rank", str(rank),
            "--host", LOOPBACK, "--port", str(port)]
    if dist_port:
        args += ["--dist-init-addr", f"{LOOPBACK}:{dist_port}"]
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            i = args.index(flag)
            del args[i:i + 2]
        elif value is True:
            args.append(flag)
        elif flag in args:
            args[args.index(flag) + 1] = str(value)
        else:
            args += [flag, str(value)]
    return args


def start_server(args, env_extra=None, root=None):
    env = {**os.environ, "NVIDIA_VISIBLE_DEVICES": "all", **(env_extra or {})}
    if root:
        env["SPARK_SIM_ROOT"] = str(root)
    return subprocess.Popen([sys.executable, str(SERVER), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def run_server(args, env_extra=None, timeout=30):
    proc = start_server(args, env_extra)
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

    def _serve(**flags):
        port = free_port()
        proc = start_server(server_args(model_dir, port, **flags))
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


def test_hub_repo_id_fails_with_the_file_missing_error():
    rc, out = run_server(server_args("LibertAIDAI/GLM-5.3-Flash-NVFP4", free_port()))
    assert rc == 1
    assert ("FileNotFoundError: [Errno 2] No such file or directory: "
            "'LibertAIDAI/GLM-5.3-Flash-NVFP4/processor_config.json'") in out


def test_checkpoint_without_processor_config_fails(model_dir):
    (model_dir / "processor_config.json").unlink()
    rc, out = run_server(server_args(model_dir, free_port()))
    assert rc == 1
    assert f"No such file or directory: '{model_dir}/processor_config.json'" in out


@pytest.mark.parametrize(("reqs", "context", "fails"), [
    (2, 65536, False), (4, 65536, False), (8, 65536, True), (2, 262144, True), (1, 1048576, True),
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
    assert HYBRID in out


def test_dropping_concurrency_and_context_hits_the_hybrid_error(model_dir):
    rc, out = run_server(server_args(model_dir, free_port(), max_running_requests=None, context_length=None))
    assert rc == 1 and HYBRID in out


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


def test_api_key_is_required_when_set(serve):
    port, _ = serve(api_key="sk-local-test")
    assert http(port, "/v1/models")[0] == 401
    assert http(port, "/v1/models", headers={"Authorization": "Bearer sk-local-test"})[0] == 200
    assert http(port, "/health")[0] == 200


def test_rank0_serves_only_after_every_rank_joined_and_dies_with_a_peer(model_dir):
    port, dist = free_port(), free_port()
    head = start_server(server_args(model_dir, port, nnodes=2, rank=0, dist_port=dist))
    worker = None
    try:
        time.sleep(1.5)
        assert head.poll() is None
        with pytest.raises(OSError):
            http(port, "/health")
        worker = start_server(server_args(model_dir, free_port(), nnodes=2, rank=1, dist_port=dist))
        wait_ready(port, head)
        assert http(port, "/v1/chat/completions", ASK)[1]["choices"][0]["message"]["content"] == "391"
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        assert head.wait(timeout=10) == 1
        assert "NCCL error" in head.stdout.read()
    finally:
        stop(head)
        if worker:
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


# --- the docker stand-in ------------------------------------------------------


def node_root(tmp_path, name, knobs=None):
    root = tmp_path / name
    (root / "etc/spark-sim").mkdir(parents=True)
    (root / "usr/lib/spark-sim").mkdir(parents=True)
    (root / "dev").mkdir()
    shutil.copy2(SERVER, root / "usr/lib/spark-sim/sglang_server.py")
    (root / "etc/spark-sim/node.json").write_text(json.dumps(knobs or {}))
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


def test_run_runs_the_sglang_standin_with_mounts_env_and_stop(tmp_path, model_dir):
    root = node_root(tmp_path, "n")
    (root / "dev/infiniband").mkdir()
    assert docker(root, "pull", IMAGE).returncode == 0
    env_file = tmp_path / "sglang.env"
    env_file.write_text("# comment\nSGLANG_API_KEY=sk-env-only\nHF_HUB_OFFLINE=1\n")
    env_file.chmod(0o600)
    port = free_port()
    launcher = ("import os,runpy,sys; sys.argv=['sglang.launch_server']+sys.argv[1:]+['--api-key',"
                "os.environ['SGLANG_API_KEY']]; runpy.run_module('sglang.launch_server',run_name='__main__',"
                "alter_sys=True)")
    args = server_args("/models/glm53", port)
    cmd = [sys.executable, str(DOCKER), "run", "--rm", "--name", "sglang", "--gpus", "all", "--network", "host",
           "--ipc", "host", "--shm-size", "32g", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
           "--cap-add", "IPC_LOCK", "--device", "/dev/infiniband", "--memory", "120g", "--memory-swap", "120g",
           "--volume", f"{model_dir}:/models/glm53:ro", "--env-file", str(env_file), IMAGE,
           "python3", "-c", launcher, *args]
    proc = subprocess.Popen(cmd, env={**os.environ, "SPARK_SIM_ROOT": str(root)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(port, proc)
        ps = docker(root, "ps", "--format", "{{.Names}} {{.Image}}")
        assert ps.stdout.split() == ["sglang", IMAGE]
        conflict = docker(root, "run", "--rm", "--name", "sglang", IMAGE, "true")
        assert conflict.returncode == 125 and 'The container name "/sglang" is already in use' in conflict.stderr
        # The key came from the env file, not from any command line.
        assert http(port, "/v1/models")[0] == 401
        # Served under the container path, as the real server would.
        models = http(port, "/v1/models", headers={"Authorization": "Bearer sk-env-only"})[1]
        assert models["data"][0]["id"] == "/models/glm53"
        assert "sk-env-only" not in " ".join(cmd)
        assert "MAMBA component" in docker(root, "logs", "sglang").stdout
        assert docker(root, "stop", "--time", "5", "sglang").stdout.strip() == "sglang"
        assert proc.wait(timeout=10) == 143
        assert docker(root, "ps", "-a", "-q").stdout.strip() == ""
    finally:
        stop(proc)

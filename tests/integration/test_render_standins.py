"""What render.yml writes actually starts: both rendered units' ExecStart lines,
run through the docker and SGLang stand-ins on this machine (127.0.0.1 only),
form a TP group and answer like the seed says a correct deployment does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.harness import cluster as sim
from tests.lib.playbook import REPO, run_playbook
from tests.lib.unit_file import exec_lines

DOCKER = REPO / "tests" / "standins" / "bin" / "docker"
SERVER = REPO / "tests" / "standins" / "lib" / "sglang_server.py"
IMAGE = "lmsysorg/sglang:glm-5.3-flash-arm64"
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def get(port, path, headers=None):
    req = urllib.request.Request(f"http://{LOOPBACK}:{port}{path}", headers=headers or {})
    with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback only
        return json.loads(resp.read() or b"null")


def post(port, path, body, headers=None):
    req = urllib.request.Request(f"http://{LOOPBACK}:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback only
        return json.loads(resp.read())


@pytest.fixture
def node_roots(tmp_path):
    roots = {}
    for host in ("spark-0", "spark-1"):
        root = tmp_path / "nodes" / host
        (root / "etc/spark-sim").mkdir(parents=True)
        (root / "dev").mkdir()
        (root / "etc/spark-sim/node.json").write_text("{}")
        # The stand-ins' libraries as the harness installs them (the server reads the RoCE stand-in's through roce_port).
        sim.install_standin_libs(root)
        roots[host] = root
    return roots


@pytest.mark.parametrize("api_key", ["", "sk-e2e-secret-0123456789abcdef0123"], ids=["no key", "api key"])
def test_rendered_units_start_a_tp2_group_through_the_standins(tmp_path, node_roots, api_key):
    model = tmp_path / "models" / "glm53"
    model.mkdir(parents=True)
    (model / "processor_config.json").write_text("{}")
    port, dist = free_port(), free_port()
    out = tmp_path / "rendered"
    # Both "nodes" are this machine: every fabric address is on the loopback (distinct ones, as the
    # inventory check demands), and so is the fabric interface NCCL and Gloo bind to (the stand-in
    # looks it up like they do). The management addresses are the example's: render dials none.
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(json.dumps({"spark": {"children": {
        "spark_head": {"hosts": {"spark-0": {"ansible_host": "10.0.0.10", "spark_fabric_ip": "127.0.1.10"}}},
        "spark_workers": {"hosts": {"spark-1": {"ansible_host": "10.0.0.11", "spark_fabric_ip": "127.0.1.11"}}}}}}))
    result = run_playbook("playbooks/render.yml", inventory, extravars={
        "server_render_dir": str(out),
        "spark_fabric_interface": "lo",
        "server_host": LOOPBACK,
        "server_port": port,
        "server_dist_init_port": dist,
        "server_model_dir": str(model),
        "server_render_infiniband": False,
        "server_api_key": api_key,
        # Without a key only on purpose (a deployment would otherwise generate one).
        "server_allow_unauthenticated": not api_key,
    })
    assert result.rc == 0, result.stdout

    procs = {}
    try:
        # Workers first, then the head: the order a deployment restarts them in.
        for host in ("spark-1", "spark-0"):
            lines = exec_lines((out / host / "spark-llm.service").read_text())
            env = {**os.environ, "SPARK_SIM_ROOT": str(node_roots[host])}
            assert subprocess.run([sys.executable, str(DOCKER), "pull", IMAGE], env=env, check=False,
                                  capture_output=True).returncode == 0
            pre = lines["ExecStartPre"]
            assert subprocess.run([sys.executable, str(DOCKER), *pre[1:]], env=env, check=False).returncode == 0
            start = lines["ExecStart"]
            assert start[0] == "/usr/bin/docker"
            env_file = tmp_path / f"{host}.env"
            env_file.write_text((out / host / "spark-llm.env").read_text())
            start[start.index("--env-file") + 1] = str(env_file)
            # The key file the unit mounts, as the deployment installs it (the render holds no key).
            mount = "/etc/spark-llm/spark-llm.key:/run/spark-llm/api-key:ro"
            assert (mount in start) == bool(api_key)
            if api_key:
                key_file = tmp_path / f"{host}.key"
                key_file.write_text(api_key)
                key_file.chmod(0o600)
                start[start.index(mount)] = f"{key_file}:/run/spark-llm/api-key:ro"
            procs[host] = subprocess.Popen([sys.executable, str(DOCKER), *start[1:]], env=env,
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        deadline = time.monotonic() + 60
        while True:
            for host, proc in procs.items():
                assert proc.poll() is None, f"{host} exited: {proc.stdout.read()}"
            try:
                models = get(port, "/v1/models", headers)
                break
            except OSError:
                assert time.monotonic() < deadline, "head never served /v1/models"
                time.sleep(0.2)
        assert [m["id"] for m in models["data"]] == ["/models/glm53"]
        reply = post(port, "/v1/chat/completions", {
            "model": "glm53", "messages": [{"role": "user", "content": "17 × 23 = ?"}], "max_tokens": 512,
        }, headers)
        message = reply["choices"][0]["message"]
        assert message["content"] == "391"
        assert message["reasoning_content"] == "17 × 23 = 17 × 20 + 17 × 3 = 340 + 51 = 391"
        tool = post(port, "/v1/chat/completions", {"model": "glm53", "messages": [{"role": "user", "content": "w"}],
                                                   "tools": [{"type": "function", "function": {"name": "f"}}]},
                    headers)
        assert tool["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"
        # The head's ExecStop ends its container cleanly (SuccessExitStatus covers 143);
        # the worker's TP group is gone with it, so it fails on its own.
        stop = exec_lines((out / "spark-0" / "spark-llm.service").read_text())["ExecStop"]
        env = {**os.environ, "SPARK_SIM_ROOT": str(node_roots["spark-0"])}
        subprocess.run([sys.executable, str(DOCKER), *stop[1:]], env=env, check=True, capture_output=True)
        logs = {host: proc.communicate(timeout=20)[0] for host, proc in procs.items()}
        assert procs["spark-0"].returncode == 143
        assert procs["spark-1"].returncode == 1
        assert "NCCL error" in logs["spark-1"]
        assert "cuda graph: True" in logs["spark-0"]
        assert "MAMBA component" in logs["spark-1"]
        assert "Rank 1 joined" in logs["spark-0"]
        if api_key:
            assert all(api_key not in log for log in logs.values())
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

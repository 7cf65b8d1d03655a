"""playbooks/verify.yml against the stand-in SGLang server on 127.0.0.1 (no node needed).

Each bad behaviour comes from the stand-in server (tests/standins/lib/sglang_server.py, the
one the docker stand-in runs on the nodes) started with what causes it: no reasoning parser,
tool-call parser glm, an API key, a KV cache other than bfloat16 under the TileLang DSA kernels
(U+FFFD in the output). The server.yml guard rails refuse those flags, so they cannot be deployed
onto nodes. A wrong answer and malformed tool-call arguments, which no flag causes, come from the
server's `output_corruption` knob.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.lib.playbook import REPO, run_playbook
from tests.lib.seed import seed_args

SERVER = REPO / "tests" / "standins" / "lib" / "sglang_server.py"
LOOPBACK = "127.0.0.1"
API_KEY = "sk-VerifyPlant3dKey0123456789abcdef"  # noqa: S105 - planted on purpose
# The seed without its parsers: each test names the parsers it serves with.
SEED_FLAGS = seed_args(without=("--reasoning-parser", "--tool-call-parser"))
GOOD = ["--reasoning-parser", "glm45", "--tool-call-parser", "glm47"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def wait_for(port, proc, headers=None, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"stand-in exited {proc.returncode}: {proc.stdout.read()[-2000:]}")
        try:
            req = urllib.request.Request(f"http://{LOOPBACK}:{port}/v1/models", headers=headers or {})
            with urllib.request.urlopen(req, timeout=2):  # noqa: S310 - loopback only
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("stand-in did not answer")


class StandIns:
    """Stand-in servers started under ``base``, each with what a test serves with; ``stop`` ends them."""

    def __init__(self, base: Path):
        self.base = base
        self.procs: list[subprocess.Popen] = []
        self.model = base / "models" / "glm53"
        self.model.mkdir(parents=True)
        (self.model / "processor_config.json").write_text("{}")

    def start(self, flags=(), knobs=None, api_key=""):
        port = free_port()
        root = self.base / f"root{port}"
        (root / "etc/spark-sim").mkdir(parents=True)
        (root / "etc/spark-sim/node.json").write_text(json.dumps({"sglang": {"load_seconds": 0.1, **(knobs or {})}}))
        cmd = [sys.executable, str(SERVER), "--model-path", str(self.model), "--tp-size", "1", "--host", LOOPBACK,
               "--port", str(port), *SEED_FLAGS, *flags]
        if api_key:
            cmd += ["--api-key", api_key]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={"SPARK_SIM_ROOT": str(root), "PATH": "/usr/bin:/bin",
                                     # what docker run --gpus all gives the container
                                     "NVIDIA_VISIBLE_DEVICES": "all"})
        self.procs.append(proc)
        wait_for(port, proc)
        return port

    def stop(self):
        for proc in self.procs:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.fixture
def serve(tmp_path):
    servers = StandIns(tmp_path)
    yield servers.start
    servers.stop()


def write_inventory(directory: Path) -> Path:
    inv = directory / "inventory.json"
    inv.write_text(json.dumps({
        "spark": {
            # One node, acknowledged as the inventory check asks: verify asks the head's endpoint once for the
            # whole group and dials no worker, so a worker host would only add its share of every run's
            # controller-side tasks (the inventory check's plans, the commit and rollback includes).
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                     "spark_acknowledge_single_node": True},
            "children": {
                # A fabric address that is not the management one, as the inventory check demands; verify
                # never dials it (a loopback address all the same).
                "spark_head": {"hosts": {"spark-0": {"ansible_host": LOOPBACK, "spark_fabric_ip": "127.0.1.10"}}},
                "spark_workers": {"hosts": {}},
            },
        }
    }))
    return inv


@pytest.fixture
def local_inventory(tmp_path):
    return write_inventory(tmp_path)


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    """A good server (both parsers, no key) verified once, the report under the default timestamped name in
    a report directory: test_a_good_server_passes_every_check and
    test_default_report_path_is_timestamped_under_the_report_dir read the same run."""
    base = tmp_path_factory.mktemp("good")
    servers = StandIns(base)
    try:
        port = servers.start(flags=GOOD)
        result = run_playbook("playbooks/verify.yml", write_inventory(base), extravars={
            "verify_port": port, "verify_report_dir": str(base / "reports"),
            "server_allow_unauthenticated": True})
    finally:
        servers.stop()
    return result, base / "reports"


def verify(inventory, port, tmp_path, **extravars):
    """Most stand-ins here serve without a key: verify is told so (a WARN row) unless a test says otherwise."""
    report = tmp_path / "report.json"
    result = run_playbook("playbooks/verify.yml", inventory, extravars={
        "verify_port": port, "verify_report_path": str(report),
        "server_allow_unauthenticated": True, **extravars})
    assert report.exists(), result.stdout[-3000:]
    return result, json.loads(report.read_text())


def checks(report):
    return {c["name"]: c for c in report["checks"]}


def test_a_good_server_passes_every_check(good_run):
    result, reports = good_run
    assert result.rc == 0, result.stdout[-3000:]
    written = list(reports.glob("verify-*.json"))
    assert len(written) == 1, (written, result.stdout[-3000:])
    report = json.loads(written[0].read_text())
    assert report["ok"] is True
    assert all(c["ok"] for c in report["checks"]), report["checks"]
    table = "\n".join(result.results("Show the verification table")["spark-0"]["msg"])
    for name in ("models", "reasoning", "tool_call", "sanity", "gate"):
        assert f"{name}" in table
    assert table.count("PASS") == 5
    # The corruption gate's questions, twice each (verify_gate_rounds), judged with the checks' own answers.
    gate = report["gate"]
    assert (gate["answers"], gate["corrupt_answers"], gate["tool_calls"], gate["bad_tool_calls"]) == (12, 0, 3, 0)
    assert sorted(gate["by_prompt"]) == ["chinese", "code", "json", "korean", "seed", "tool_call"]
    # Served without a key, on purpose: a warning, not a pass.
    assert checks(report)["auth"]["warn"] is True and "WARN    served without an API key" in table
    assert report["exchanges"]["reasoning"]["body"]["choices"][0]["message"]["content"] == "391"


def test_missing_reasoning_parser_is_diagnosed(serve, local_inventory, tmp_path):
    port = serve(flags=["--tool-call-parser", "glm47"])
    result, report = verify(local_inventory, port, tmp_path)
    assert result.rc != 0
    c = checks(report)
    assert not c["reasoning"]["ok"]
    assert "reasoning parser is not active" in c["reasoning"]["diagnosis"]
    assert "glm45" in c["reasoning"]["remedy"]
    assert c["tool_call"]["ok"] and c["models"]["ok"]
    assert "Verification of" in result.failure_messages() and "reasoning" in result.failure_messages()


def test_tool_call_parser_glm_is_diagnosed(serve, local_inventory, tmp_path):
    port = serve(flags=["--reasoning-parser", "glm45", "--tool-call-parser", "glm"])
    result, report = verify(local_inventory, port, tmp_path)
    assert result.rc != 0
    c = checks(report)
    assert not c["tool_call"]["ok"]
    assert "fingerprint of --tool-call-parser glm " in c["tool_call"]["diagnosis"]
    assert "glm47" in c["tool_call"]["remedy"]
    assert c["reasoning"]["ok"]


def test_api_key_is_honoured_and_never_shown(serve, local_inventory, tmp_path):
    port = serve(flags=["--reasoning-parser", "glm45", "--tool-call-parser", "glm47"], api_key=API_KEY)
    result, report = verify(local_inventory, port, tmp_path, server_api_key=API_KEY,
                            server_allow_unauthenticated=False)
    assert result.rc == 0, result.stdout[-3000:]
    assert report["ok"] is True and report["api_key_sent"] is True
    # Without a key and with a wrong one: 401, proven on every run.
    assert checks(report)["auth"]["detail"] == "without a key: HTTP 401, wrong key: HTTP 401, the right key: HTTP 200"
    assert report["exchanges"]["unauthenticated"]["status"] == 401 == report["exchanges"]["wrong_key"]["status"]
    assert API_KEY not in result.stdout
    assert API_KEY not in (tmp_path / "report.json").read_text()
    assert API_KEY not in json.dumps(result.events)

    # No key known (none given, none generated beside the inventory): refused, with where it was looked for.
    result, report = verify(local_inventory, port, tmp_path, server_allow_unauthenticated=False)
    assert result.rc != 0
    assert not checks(report)["models"]["ok"]
    assert "server_api_key" in checks(report)["models"]["remedy"]
    key_file = tmp_path / ".credentials" / "spark_llm_api_key"
    assert f"{key_file} does not exist" in checks(report)["auth"]["detail"]

    # The key the server role generated beside the inventory is the one sent.
    key_file.parent.mkdir(mode=0o700)
    key_file.write_text(API_KEY + "\n")
    result, report = verify(local_inventory, port, tmp_path, server_allow_unauthenticated=False)
    assert result.rc == 0, result.stdout[-3000:]
    assert report["api_key_sent"] is True and checks(report)["auth"]["ok"] and not checks(report)["auth"]["warn"]
    assert API_KEY not in result.stdout and API_KEY not in json.dumps(result.events)


def test_a_server_that_checks_no_key_fails_the_auth_check(serve, local_inventory, tmp_path):
    port = serve(flags=["--reasoning-parser", "glm45", "--tool-call-parser", "glm47"])
    result, report = verify(local_inventory, port, tmp_path, server_api_key=API_KEY,
                            server_allow_unauthenticated=False)
    assert result.rc != 0
    auth = checks(report)["auth"]
    assert not auth["ok"] and auth["detail"].startswith("served without a key and with a wrong key")
    assert "re-run playbooks/server.yml" in auth["remedy"]
    assert all(checks(report)[name]["ok"] for name in ("models", "reasoning", "tool_call", "sanity"))



@pytest.mark.parametrize("case", [
    ("fffd", GOOD + ["--kv-cache-dtype", "fp8_e4m3"], None, "sanity", "corruption symptom"),
    ("bad-tool-args", GOOD, "bad-tool-args", "tool_call", "not valid JSON"),
    ("wrong-answer", GOOD, "wrong-answer", "reasoning", "garbage"),
], ids=lambda case: case[0])
def test_corrupted_output_is_diagnosed(serve, local_inventory, tmp_path, case):
    _, flags, corruption, failing, phrase = case
    port = serve(flags=flags, knobs={"output_corruption": corruption} if corruption else None)
    result, report = verify(local_inventory, port, tmp_path)
    assert result.rc != 0
    c = checks(report)
    assert not c[failing]["ok"]
    assert phrase in c[failing]["diagnosis"]
    assert "kv-cache-dtype bfloat16" in c[failing]["remedy"]
    # Only the corrupted part fails: the parsers are right.
    assert c["models"]["ok"] and all(c[name]["ok"] for name in ("reasoning", "tool_call") if name != failing)


def test_the_gate_finds_korean_broken_now_and_then_that_the_english_check_never_sees(serve, local_inventory, tmp_path):
    # The field report: a build that breaks a few characters of Korean answers now and then, English ones never.
    port = serve(flags=GOOD, knobs={"corrupt_rate": 0.5, "corrupt_scripts": ["hangul"]})
    result, report = verify(local_inventory, port, tmp_path)
    assert result.rc != 0
    c = checks(report)
    assert all(c[name]["ok"] for name in ("models", "reasoning", "tool_call", "sanity")), report["checks"]
    assert not c["gate"]["ok"]
    korean = report["gate"]["by_prompt"]["korean"]
    assert (korean["answers"], korean["corrupt_answers"]) == (2, 1) and report["gate"]["fffd_rate"] == round(1 / 12, 4)
    assert "korean 1 of 2" in c["gate"]["diagnosis"] and "verify_max_fffd_rate" in c["gate"]["remedy"]
    assert "Verification of" in result.failure_messages() and "gate" in result.failure_messages()
    # The rate is what is judged: with a threshold above it, the next two Korean answers (one broken) pass.
    result, report = verify(local_inventory, port, tmp_path, verify_max_fffd_rate=0.1)
    assert result.rc == 0 and checks(report)["gate"]["ok"], report["checks"]
    assert report["gate"]["by_prompt"]["korean"]["corrupt_answers"] == 1


def test_the_gate_counts_tool_calls_that_do_not_parse(serve, local_inventory, tmp_path):
    port = serve(flags=GOOD, knobs={"bad_tool_call_rate": 0.5})
    result, report = verify(local_inventory, port, tmp_path)
    assert result.rc != 0
    gate = checks(report)["gate"]
    # Every tool call of the run, the tool-call check's and the gate's: the second of three broke.
    assert not gate["ok"] and (report["gate"]["tool_calls"], report["gate"]["bad_tool_calls"]) == (3, 1)
    assert report["gate"]["corrupt_answers"] == 0


def test_the_quality_run_asks_ten_times_and_finds_what_one_answer_in_ten_breaks(serve, local_inventory, tmp_path):
    # One Korean answer in ten broken: verify's two rounds would see none; quality.yml's ten see one.
    port = serve(flags=GOOD, knobs={"corrupt_rate": 0.1, "corrupt_scripts": ["hangul"]})
    result = run_playbook("playbooks/quality.yml", local_inventory, extravars={
        "verify_port": port, "verify_report_dir": str(tmp_path / "reports"), "server_allow_unauthenticated": True})
    assert result.rc != 0
    assert "Verification of" in result.failure_messages() and "gate" in result.failure_messages()
    (written,) = (tmp_path / "reports").glob("quality-*.json")
    gate = json.loads(written.read_text())["gate"]
    assert (gate["answers"], gate["corrupt_answers"]) == (52, 1) and gate["by_prompt"]["korean"]["answers"] == 10
    assert result.changed == []


SOAK = {"verify_quality_rounds": 1, "verify_soak_seconds": 3, "verify_soak_burst_seconds": 1,
        "verify_soak_idle_seconds": 0.5, "verify_soak_max_tokens": 8, "verify_soak_prompt_tokens": 32,
        # The memory read here is this machine's, which other work moves: only the stand-in's faults are judged.
        "verify_soak_max_memory_growth_gib": 1000}


def soak(local_inventory, port, tmp_path):
    result = run_playbook("playbooks/quality.yml", local_inventory, extravars={
        "verify_port": port, "verify_report_dir": str(tmp_path / "reports"), "server_allow_unauthenticated": True,
        **SOAK})
    written = list((tmp_path / "reports").glob("soak-*.json"))
    assert len(written) == 1, result.stdout[-3000:]
    return result, json.loads(written[0].read_text())


def test_a_steady_soak_reports_its_bursts_and_passes(serve, local_inventory, tmp_path):
    # Tokens slow enough (30 ms) that a loaded machine's scheduling cannot pass for a drift.
    port = serve(flags=GOOD, knobs={"token_seconds": 0.03})
    result, report = soak(local_inventory, port, tmp_path)
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    figures = report["soak"]
    # Three seconds: a burst, a gap, a burst, a gap, a burst; two streams each.
    assert len(figures["bursts"]) >= 2 and figures["requests"] > 2 * len(figures["bursts"]), figures
    assert (figures["errors"], figures["error_rate"], report["failed"]) == (0, 0.0, [])
    assert figures["latency_drift"] < 1.5 and set(report["memory_growth_gib"]) == {"spark-0"}
    lines = "\n".join(result.results("Show the soak's figures")["spark-0"]["msg"])
    assert "requests in" in lines and "drift" in lines and "available memory lost per rank" in lines
    assert result.changed == []


def test_a_rank_that_slows_down_as_it_serves_fails_the_soak_by_its_drift(serve, local_inventory, tmp_path):
    # Each request makes a token take 8% longer: over the soak's few dozen requests the last burst is several times
    # slower than the first.
    port = serve(flags=GOOD, knobs={"token_seconds": 0.002, "token_seconds_growth": 0.08})
    result, report = soak(local_inventory, port, tmp_path)
    assert result.rc != 0
    (failed,) = report["failed"]
    assert "above verify_soak_max_latency_drift 1.5" in failed and report["soak"]["latency_drift"] > 1.5
    assert "The soak of http://127.0.0.1:" in result.failure_messages()


def test_bad_gate_settings_are_refused_before_any_question(serve, local_inventory, tmp_path):
    port = serve(flags=GOOD)
    report = tmp_path / "report.json"
    result = run_playbook("playbooks/verify.yml", local_inventory, extravars={
        "verify_port": port, "verify_report_path": str(report), "server_allow_unauthenticated": True,
        "verify_max_fffd_rate": 5, "verify_gate_rounds": -1})
    assert result.rc != 0 and not report.exists()
    said = result.failure_messages()
    assert "Refusing the verify settings of spark-0:" in said
    assert "verify_max_fffd_rate = 5: must be a share from 0 to 1" in said
    assert "verify_gate_rounds = -1: must be a whole number from 0" in said


def test_unreachable_endpoint_fails_with_a_pointer(local_inventory, tmp_path):
    result, report = verify(local_inventory, free_port(), tmp_path)
    assert result.rc != 0
    assert "not reachable" in checks(report)["models"]["diagnosis"]


def test_default_report_path_is_timestamped_under_the_report_dir(good_run):
    # good_run gives verify a report directory and no report path.
    result, reports = good_run
    assert result.rc == 0, result.stdout[-3000:]
    written = list(reports.glob("verify-*.json"))
    assert len(written) == 1 and json.loads(written[0].read_text())["ok"] is True

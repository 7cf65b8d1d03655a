"""playbooks/benchmark.yml against the stand-in SGLang server on 127.0.0.1 (no node needed).

The stand-in (tests/standins/lib/sglang_server.py) serves with knob-set timings: a time to first
token, a prefill rate, an inter-token latency and a per-request slowdown with concurrency, at most
max-running-requests at once (the rest queue). The figures the benchmark reports are compared
with what those knobs make them, within 10%: timings of hundreds and tens of milliseconds, large
against a loaded 2-core machine's scheduling noise. Injected HTTP errors and cut streams are
counted by the stand-in itself (/run/spark-sim/sglang-requests.json under its root), and the
report must count exactly as many. The planted facts are found only when the stand-in recalls.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.lib.playbook import REPO, run_playbook
from tests.lib.role_module import run_module
from tests.lib.seed import seed_args

SERVER = REPO / "tests" / "standins" / "lib" / "sglang_server.py"
LOOPBACK = "127.0.0.1"
CONTEXT = 16384
# The knobs' truths: large against scheduler noise, small enough for a short run.
TTFT, PREFILL, ITL, SLOWDOWN = 0.3, 5000, 0.04, 0.25
TIMING = {"ttft_seconds": TTFT, "prefill_tokens_per_second": PREFILL, "token_seconds": ITL,
          "concurrency_slowdown": SLOWDOWN}
OUTPUT = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class StandIn:
    """One stand-in server for the module; its knobs are read at each request."""

    def __init__(self, root: Path, port: int, proc: subprocess.Popen):
        self.root, self.port, self.proc = root, port, proc

    def knobs(self, **values) -> None:
        path = self.root / "etc/spark-sim/node.json"
        path.write_text(json.dumps({"sglang": {"load_seconds": 0.1, **values}}))

    def counts(self) -> dict:
        path = self.root / "run/spark-sim/sglang-requests.json"
        return json.loads(path.read_text()) if path.exists() else {"requests": 0, "errors": 0, "cuts": 0}


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("standin")
    model = tmp / "models" / "glm53"
    model.mkdir(parents=True)
    (model / "processor_config.json").write_text("{}")
    port = free_port()
    (tmp / "etc/spark-sim").mkdir(parents=True)
    server = StandIn(tmp, port, None)
    server.knobs(**TIMING)
    cmd = [sys.executable, str(SERVER), "--model-path", str(model), "--tp-size", "1", "--host", LOOPBACK, "--port",
           str(port), *seed_args(without=("--context-length", "--max-running-requests")), "--context-length",
           str(CONTEXT), "--max-running-requests", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            env={"SPARK_SIM_ROOT": str(tmp), "PATH": "/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES": "all"})
    server.proc = proc
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the stand-in exited"
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/health", timeout=2):  # noqa: S310 - loopback
                break
        except (OSError, urllib.error.URLError):
            time.sleep(0.2)
    yield server
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    inv = tmp_path_factory.mktemp("inventory") / "inventory.json"
    inv.write_text(json.dumps({"spark": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "children": {
            "spark_head": {"hosts": {"spark-0": {"ansible_host": LOOPBACK, "spark_fabric_ip": "127.0.1.10"}}},
            "spark_workers": {"hosts": {"spark-1": {"ansible_host": LOOPBACK, "spark_fabric_ip": "127.0.1.11"}}},
        }}}))
    return inv


def settings(standin, reports, **more):
    # The stand-in runs on this machine: its context and concurrency are given, not read from a node.
    return {"benchmark_port": standin.port, "benchmark_context_length": CONTEXT,
            "benchmark_max_running_requests": 2, "benchmark_max_tokens": OUTPUT,
            "benchmark_rounds": 2, "benchmark_min_requests": 4, "benchmark_report_dir": str(reports),
            "benchmark_report_name": "run", "benchmark_recall_max_tokens": 256, **more}


def benchmark(inventory, extravars):
    result = run_playbook("playbooks/benchmark.yml", inventory, extravars=extravars, timeout=600)
    report = Path(extravars["benchmark_report_dir"]) / f"{extravars['benchmark_report_name']}.json"
    return result, (json.loads(report.read_text()) if report.exists() else None)


def within(measured, truth, share=0.10):
    return measured is not None and abs(measured - truth) <= share * truth


@pytest.fixture(scope="module")
def measured(standin, inventory, tmp_path_factory):
    """One run with every figure: levels 1, 2, 3 (max-running-requests 2, one beyond) of short and long
    prompts, the recall check with recall on, and errors and cut streams injected."""
    standin.knobs(**TIMING, recall=True, error_every=7, cut_every=5)
    before = standin.counts()
    reports = tmp_path_factory.mktemp("reports")
    result, report = benchmark(inventory, settings(standin, reports, benchmark_prompts=["short", "long"],
                                                   benchmark_long_fraction=0.25))
    after = standin.counts()
    standin.knobs(**TIMING)
    assert result.rc == 0, result.failure_messages() or result.stdout[-4000:]
    return result, report, {k: after[k] - before[k] for k in after}, reports


def level(report, prompt, concurrency):
    return next(lv for lv in report["levels"] if lv["prompt"] == prompt and lv["concurrency"] == concurrency)


def test_levels_go_one_step_beyond_max_running_requests_for_each_prompt(measured):
    _result, report, _counts, reports = measured
    assert [(lv["prompt"], lv["concurrency"]) for lv in report["levels"]] == [
        ("short", 1), ("short", 2), ("short", 3), ("long", 1), ("long", 2), ("long", 3)]
    for name in ("run.json", "run.md", "run.png"):
        assert (reports / name).stat().st_size > 0, name
    assert (reports / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (reports / "run.md").read_text()
    assert "| short (1" in md and "| long (" in md and "Long-context recall" in md
    # Raw per-request timings are in the JSON: a first-token time and one arrival per token.
    raw = [r for r in level(report, "short", 1)["records"] if r["error"] is None]
    assert raw and all(len(r["chunks"]) == OUTPUT and r["ttft"] == r["chunks"][0] for r in raw)


def test_each_figure_is_the_knobs_truth_within_ten_percent(measured):
    _result, report, _counts, _reports = measured
    for prompt in ("short", "long"):
        lv1 = level(report, prompt, 1)
        tokens = lv1["summary"]["prompt_tokens_p50"]
        ttft = TTFT + tokens / PREFILL
        assert within(lv1["summary"]["ttft_ms"]["p50"] / 1000, ttft), (prompt, lv1["summary"], ttft)
        for n in (1, 2):
            s = level(report, prompt, n)["summary"]
            itl = ITL * (1 + SLOWDOWN * (n - 1))
            assert within(s["itl_ms"]["p50"] / 1000, itl), (prompt, n, s)
            assert within(s["decode_tok_s_per_stream"]["p50"], 1 / itl), (prompt, n, s)
            # Closed loop: every stream's request takes the first token's time plus the decoding steps.
            per_request = ttft + (OUTPUT - 1) * itl
            if not s["errors"]:
                assert within(s["output_tok_s"], n * OUTPUT / per_request), (prompt, n, s)
                assert within(s["requests_per_s"], n / per_request), (prompt, n, s)
        # One step beyond max-running-requests: a request waits for a slot, and it shows in TTFT p99.
        beyond = level(report, prompt, 3)["summary"]
        assert beyond["ttft_ms"]["p99"] / 1000 > ttft + (OUTPUT - 1) * ITL, beyond
    assert abs(level(report, "short", 1)["summary"]["prompt_tokens_p50"] - 128) <= 2


def test_injected_errors_and_cut_streams_are_counted_exactly(measured):
    _result, report, counts, _reports = measured
    assert counts["errors"] > 0 and counts["cuts"] > 0
    records = [r for lv in report["levels"] for r in lv["records"]] + [report["recall_record"]]
    calibration = report["calibration"].get("errors") or []
    http = sum((r.get("error") or "").startswith("http_") for r in records) + sum(e.startswith("http_") for e in calibration)
    cut = sum(r.get("error") == "truncated" for r in records) + calibration.count("truncated")
    assert (http, cut) == (counts["errors"], counts["cuts"])
    # Every request the server saw is in the report: levels, the recall question, calibration (2 that answered).
    answered = 2 if report["calibration"]["source"] == "usage" else 0
    assert len(records) + len(calibration) + answered == counts["requests"]
    # The level tables count what their raw records say.
    for lv in report["levels"]:
        kinds = [r["error"] for r in lv["records"] if r.get("error")]
        assert lv["summary"]["errors"] == {k: kinds.count(k) for k in set(kinds)}, lv["summary"]


def test_the_planted_facts_are_found_only_when_the_server_recalls(measured, standin, tmp_path):
    """The role's client module, as the playbook ran it in the measured run, once with recall and once without."""
    _result, report, _counts, _reports = measured
    assert report["recall"]["prompt_tokens_target"] == int(CONTEXT * 0.9)
    runs = {}
    for recall in (True, False):
        standin.knobs(**TIMING, recall=recall)
        runs[recall] = run_module("benchmark_run", {
            "endpoint": f"http://{LOOPBACK}:{standin.port}", "mode": "recall", "model": report["meta"]["model"],
            "calibration": report["calibration"], "prompt_tokens": int(CONTEXT * 0.9), "max_tokens": 256}, tmp_path)["recall"]
    standin.knobs(**TIMING)
    assert runs[True]["error"] is None and runs[False]["error"] is None, runs
    assert [f["recalled"] for f in runs[True]["facts"]] == [True, True, True], runs[True]
    assert [f["recalled"] for f in runs[False]["facts"]] == [False, False, False], runs[False]
    assert [f["depth"] for f in runs[True]["facts"]] == [0.1, 0.5, 0.9]
    recall = runs[False]
    assert recall["prompt_tokens"] > 0.85 * CONTEXT
    assert within(recall["prefill_ms"] / 1000, TTFT + recall["prompt_tokens"] / PREFILL), recall


def test_an_earlier_report_stands_beside_a_new_one(measured, standin, inventory, tmp_path):
    _result, _report, _counts, reports = measured
    result, report = benchmark(inventory, settings(
        standin, tmp_path, benchmark_concurrency=[1], benchmark_prompts=["short"],
        benchmark_min_requests=2, benchmark_recall=False, benchmark_report_name="again",
        benchmark_compare=str(reports / "run.json")))
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    assert report["compare"]["file"] == str(reports / "run.json") and report["recall"] is None
    assert (tmp_path / "again.png").read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "again.md").read_text()
    assert f"Compared with {reports / 'run.json'}" in md and "before: output tok/s" in md
    row = next(line for line in md.splitlines() if line.startswith("| short ("))
    before = level(json.loads((reports / "run.json").read_text()), "short", 1)["summary"]["output_tok_s"]
    assert row.split("|")[-3].strip() == f"{before:.1f}", row


def test_bad_input_is_refused_before_any_request_or_restart(standin, inventory, tmp_path):
    not_a_report = tmp_path / "verify.json"
    not_a_report.write_text(json.dumps({"kind": "spark-llm-verify", "ok": True}))
    before = standin.counts()["requests"]
    result, report = benchmark(inventory, settings(standin, tmp_path, benchmark_concurrency=[],
                                                   benchmark_compare=str(not_a_report)))
    assert result.rc != 0 and report is None
    assert {d["task"] for d in result.failed} == {"Refuse unusable benchmark settings before any request"}
    for text in ("benchmark_concurrency = []: is empty",
                 f"= '{not_a_report}' is not a benchmark report (kind 'spark-llm-verify'"):
        assert text in result.failure_messages(), result.failure_messages()
    assert standin.counts()["requests"] == before
    # The tune refuses a context above the model's window before it restarts anything (or reads a node).
    result = run_playbook("playbooks/tune.yml", inventory, extravars={"tune_contexts": [65536, 2097152],
                                                                      "tune_dir": str(tmp_path)})
    assert result.rc != 0
    assert {d["task"] for d in result.failed} == {"Refuse unusable tune settings before any restart"}
    assert "2097152 is above the model's window of 1048576" in result.failure_messages()
    ran = {(e["event_data"].get("role"), e["event_data"]["task"]) for e in result.task_events()}
    assert {task for role, task in ran if role in ("tune", "fabric", "server", "verify")
            and not task.startswith("Validating arguments")} <= {"Refuse unusable tune settings before any restart",
                                                                  "Compute the launch plan from the flag model",
                                                                  "Refuse invalid server settings before any change"}


def test_ctrl_c_leaves_no_client_running(standin, inventory, tmp_path):
    """An operator's Ctrl-C reaches the whole foreground process group: ansible-playbook, its workers and the
    module streaming the level. Nothing of the benchmark may go on sending."""
    standin.knobs(**{**TIMING, "token_seconds": 0.2})
    extra = settings(standin, tmp_path, benchmark_concurrency=[2], benchmark_prompts=["short"],
                     benchmark_max_tokens=200, benchmark_recall=False)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                             "playbooks/benchmark.yml", "-e", json.dumps(extra)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        before = standin.counts()["requests"]
        deadline = time.monotonic() + 120
        # The level runs once the stand-in has its requests (calibration sends two first).
        while standin.counts()["requests"] < before + 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert standin.counts()["requests"] >= before + 4
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        gone = time.monotonic() + 10
        while (session(proc.pid) or connections(standin.port)) and time.monotonic() < gone:
            time.sleep(0.2)
        assert session(proc.pid) == [] and connections(standin.port) == 0
        sent = standin.counts()["requests"]
        time.sleep(1.0)  # a client left behind would send its next request within a token or two
        assert standin.counts()["requests"] == sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        standin.knobs(**TIMING)


def session(sid: int) -> list[str]:
    """Processes still in the session the playbook was started in (its workers, the module, their shells)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[3]) == sid:
            out.append(f"{pid} {cmd[:120]}")
    return out


def connections(port: int) -> int:
    """Established TCP connections to the stand-in's port from a client on this machine."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        if remote_port == port and fields[3] == "01":
            count += 1
    return count


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (the role's clients trust the certificate as the CA)."""
    import datetime  # noqa: PLC0415
    import ipaddress  # noqa: PLC0415

    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, LOOPBACK)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(LOOPBACK))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


PROXY = """
import asyncio, ssl, sys
ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    finally:
        w.close()
async def handle(cr, cw):
    sr, sw = await asyncio.open_connection("127.0.0.1", int(sys.argv[3]))
    await asyncio.gather(pipe(cr, sw), pipe(sr, cw), return_exceptions=True)
async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[4]), ssl=ctx)
    print("ready", flush=True)
    async with srv:
        await srv.serve_forever()
asyncio.run(main())
"""


def test_the_client_speaks_https_with_the_ca_and_sends_the_key(tmp_path):
    """As a deployment with server_tls serves (a TLS proxy in front of SGLang, a key): the CA file and the
    key reach every request; without the CA no stream starts, without the key /v1/models refuses."""
    key = "sk-BenchPlant3dKey0123456789abcdef"  # noqa: S105 - planted on purpose
    cert, private = self_signed(tmp_path)
    model = tmp_path / "models" / "glm53"
    model.mkdir(parents=True)
    (model / "processor_config.json").write_text("{}")
    (tmp_path / "etc/spark-sim").mkdir(parents=True)
    (tmp_path / "etc/spark-sim/node.json").write_text(json.dumps({"sglang": {"load_seconds": 0.1, "token_seconds": 0.01}}))
    port, tls_port = free_port(), free_port()
    server = subprocess.Popen([sys.executable, str(SERVER), "--model-path", str(model), "--tp-size", "1", "--host", LOOPBACK,
                               "--port", str(port), *seed_args(), "--api-key", key], stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT, env={"SPARK_SIM_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin",
                                                             "NVIDIA_VISIBLE_DEVICES": "all"})
    proxy = subprocess.Popen([sys.executable, "-c", PROXY, str(cert), str(private), str(port), str(tls_port)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert proxy.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/health", timeout=2):  # noqa: S310 - loopback
                    break
            except OSError:
                time.sleep(0.2)
        endpoint = f"https://{LOOPBACK}:{tls_port}"

        def run(**args):
            return run_module("benchmark_run", {"endpoint": endpoint, **args}, tmp_path)

        cal = run(mode="calibrate", api_key=key, ca_file=str(cert))
        assert cal["calibration"]["source"] == "usage", cal
        level = run(mode="level", api_key=key, ca_file=str(cert), model=cal["calibration"]["model"], concurrency=2,
                    requests=2, max_tokens=8, calibration=cal["calibration"])
        assert level["summary"]["ok"] == 2 and level["summary"]["tokens_from"] == "usage", level
        untrusted = run(mode="level", api_key=key, model="m", requests=1, max_tokens=4)
        assert untrusted["summary"]["errors"] == {"connect": 1}, untrusted
        unkeyed = run(mode="level", ca_file=str(cert), model="m", requests=1, max_tokens=4)
        assert unkeyed["summary"]["errors"] == {"http_401": 1}, unkeyed
        refused = run(mode="calibrate", ca_file=str(cert))
        assert refused.get("failed") and "HTTP Error 401" in refused["msg"], refused
        assert key not in json.dumps([cal, level, untrusted, unkeyed, refused])
    finally:
        proxy.terminate()
        server.terminate()
        proxy.wait(timeout=10)
        server.wait(timeout=10)

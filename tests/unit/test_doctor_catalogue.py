"""The doctor's fingerprint catalogue: each failure's log lines map to its cause and remedy.

The remedies asserted here are written out from deployment-facts.md (known
failures 1-4) and issue 6, not read from the catalogue: a test that compared
the catalogue with itself could not fail. The log lines are written out here
from the real engines' messages (SGLang, TileLang, torch.distributed, Gloo,
NCCL, huggingface_hub, systemd); the last tests feed the doctor what the
stand-in SGLang server itself prints for each failure, so the stand-in and the
catalogue cannot drift apart (tests/integration/test_doctor.py does the same
through the rank's unit on simulated nodes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.lib.roles import filter_plugin, flag_model

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "sglang_doctor"


doctor = filter_plugin("sglang_doctor")
SERVER = REPO / "tests" / "standins" / "lib" / "sglang_server.py"

# name -> (log lines, the unit's exit status, whether the unit is still active)
LINES: dict[str, tuple[list[str], int, bool]] = {
    "hybrid_cache": ([
        "[2026-11-29 10:01:12 TP0] Load weight end. type=Glm5NextForConditionalGeneration, dtype=torch.bfloat16",
        "[2026-11-29 10:01:13 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
        "max_mamba_cache_size=1, mamba_ratio=5, resulting max_num_reqs=0.",
    ], 1, False),
    "tilelang_smem": ([
        "[2026-11-29 10:02:40 TP0] Capture cuda graph begin. This can take up to several minutes.",
        "Exception: Capture cuda graph failed: Failed to set the allowed dynamic shared memory size to 169984 with "
        "error: invalid argument",
    ], 1, False),
    "tilelang_smem_drafter": ([
        "[2026-11-29 10:02:40 TP0] Capture draft cuda graph begin. speculative_algorithm=EAGLE",
        "Exception: Capture draft cuda graph failed: Failed to set the allowed dynamic shared memory size to 169984 "
        "with error: invalid argument",
    ], 1, False),
    "processor_config_repo_id": ([
        "FileNotFoundError: [Errno 2] No such file or directory: 'LibertAIDAI/GLM-5.3-Flash-NVFP4/processor_config.json'",
    ], 1, False),
    "processor_config_local": ([
        "FileNotFoundError: [Errno 2] No such file or directory: '/models/glm53/processor_config.json'",
    ], 1, False),
    "nccl_timeout": ([
        "[2026-11-29 10:03:00 TP1] Init torch distributed begin.",
        "spark-1:77:91 [0] NCCL WARN NET/Socket : Connect to 10.232.1.10<20000> failed : Connection timed out",
        "torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to connect "
        "to (10.232.1.10, 20000).",
    ], 1, False),
    "gloo_timeout": ([
        "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error",
    ], 1, False),
    "init_hang": (["[2026-11-29 10:04:00 TP0] Init torch distributed begin."], 0, True),
    "oom_137": ([
        "[2026-11-29 10:05:10 TP0] Load weight begin. avail mem=118.20 GB",
        "sglang.service: Main process exited, code=exited, status=137/n/a",
    ], 137, False),
    "cuda_oom": ([
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "119.70 GiB",
    ], 1, False),
    "download_at_boot": ([
        "requests.exceptions.ConnectionError: (MaxRetryError(\"HTTPSConnectionPool(host='huggingface.co', port=443): "
        "Max retries exceeded with url: /LibertAIDAI/GLM-5.3-Flash-NVFP4/resolve/main/config.json",
        "huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the file on the Hub "
        "and we cannot find the requested files in the local cache.",
    ], 1, False),
    "offline_missing": ([
        "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested files in the disk cache and "
        "outgoing traffic has been disabled. To enable hf.co look-ups and downloads online, set 'local_files_only' "
        "to False.",
    ], 1, False),
    "healthy": ([
        "[2026-11-29 10:06:00 TP0] Decode batch. #running-req: 1, #token: 812, token usage: 0.01, cuda graph: True",
        "[2026-11-29 10:06:01] The server is fired up and ready to roll!",
    ], 0, True),
}
CATALOGUE = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__sglang_doctor_fingerprints"]
FLAG_MODEL = flag_model()

NOW = 1_800_000_000.0


def ctx(**changes):
    flags = doctor.current_flags([], FLAG_MODEL, changes.pop("overrides", {}))
    base = {
        "flags": flags["flags"],
        "overrides": {},
        "unit": "sglang.service",
        "model_dir": "/opt/models/glm53",
        "container_memory": "120g",
        "image": "lmsysorg/sglang:glm-5.3-flash-arm64",
        "fabric_interface": "enp1s0f1np1",
        "fabric_ip": "192.168.100.11",
        "dist_init_port": 20000,
        "expected_mtu": 9000,
        "mtu": 9000,
        "route": "192.168.100.10 via enp1s0f1np1",
        "env_host_ip": "192.168.100.11",
        "env_offline": "1",
        "checkpoint_state": "present",
        "stall_seconds": 900,
    }
    base.update(changes)
    return base


def node(lines, status="1", active="failed", age=5.0, raw=None):
    journal = [{"t": NOW - age - (len(lines) - i), "msg": line} for i, line in enumerate(lines)]
    return {"journal": journal, "unit": {"ActiveState": active, "ExecMainStatus": status, "Result": "exit-code"},
            "now": NOW, "raw": raw or {}}


def planted(name, **kw):
    lines, status, active = LINES[name]
    return node(lines, status=str(status), active="active" if active else "failed", **kw)


def ids(found):
    return [f["id"] for f in found]


def test_catalogue_is_well_formed():
    seen = set()
    for entry in CATALOGUE:
        assert entry["id"] not in seen
        seen.add(entry["id"])
        assert entry["title"] and entry["cause"] and entry["remedy"]
        assert any(k in entry for k in ("patterns", "exit_status", "stall", "probe")), entry["id"]
        for pattern in entry.get("patterns", []):
            __import__("re").compile(pattern)


def test_hybrid_cache_lowers_concurrency_first_with_the_override():
    found = doctor.findings(planted("hybrid_cache"), CATALOGUE, ctx())
    assert ids(found) == ["hybrid_state_cache"]
    f = found[0]
    assert "max-running-requests 2" in f["cause"] and "context-length 65536" in f["cause"]
    assert "lower max-running-requests 2 -> 1" in f["remedy"]
    assert "sglang_server_flag_overrides: {max-running-requests: 1}" in f["remedy"]
    assert f["override"] == {"max-running-requests": 1}


def test_hybrid_cache_at_one_request_lowers_context_next_and_keeps_other_overrides():
    c = ctx(overrides={"max-running-requests": 1})
    c["overrides"] = {"max-running-requests": 1, "served-model-name": "glm53"}
    found = doctor.findings(planted("hybrid_cache"), CATALOGUE, c)
    f = found[0]
    assert f["override"] == {"context-length": 32768}
    assert "context-length 65536 -> 32768" in f["remedy"]
    assert ("sglang_server_flag_overrides: {max-running-requests: 1, served-model-name: \"glm53\", "
            "context-length: 32768}") in f["remedy"]


def test_values_on_the_node_win_over_the_inventory():
    args = doctor.unit_args("{ path=/usr/bin/docker ; argv[]=/usr/bin/docker run --rm img python3 -m sglang.launch_server "
                            "--model-path /models/glm53 --max-running-requests 4 --context-length 131072 ; ignore_errors=no }")
    current = doctor.current_flags(args, FLAG_MODEL, {})
    assert current["source"] == "unit"
    found = doctor.findings(planted("hybrid_cache"), CATALOGUE, ctx(flags=current["flags"]))
    assert "lower max-running-requests 4 -> 2" in found[0]["remedy"]


@pytest.mark.parametrize("name", ["tilelang_smem", "tilelang_smem_drafter"])
def test_tilelang_shared_memory_names_the_gb10_tile(name):
    found = doctor.findings(planted(name), CATALOGUE, ctx())
    assert ids(found) == ["tilelang_shared_memory"]
    f = found[0]
    assert "169984" in f["cause"] and "101376" in f["cause"]
    for part in ("block_I=32", "num_stages=1", "threads=128", "threads to 128 before block_I", "block_I=16 trips an MMA"):
        assert part in f["remedy"]
    assert ("drafter" in f["remedy"]) is (name == "tilelang_smem_drafter")


def test_tilelang_drafter_also_from_the_flags():
    c = ctx(overrides={"speculative-algorithm": "EAGLE"})
    found = doctor.findings(planted("tilelang_smem"), CATALOGUE, c)
    assert "drafter" in found[0]["remedy"]


@pytest.mark.parametrize("name", ["processor_config_repo_id", "processor_config_local"])
def test_missing_processor_config_asks_for_a_local_directory(name):
    found = doctor.findings(planted(name), CATALOGUE, ctx())
    assert ids(found) == ["processor_config_missing"]
    assert "LOCAL directory" in found[0]["remedy"]
    assert "sglang_server_model_dir" in found[0]["remedy"] and "/opt/models/glm53" in found[0]["remedy"]


@pytest.mark.parametrize("name", ["nccl_timeout", "gloo_timeout"])
def test_distributed_timeouts_point_at_the_fabric(name):
    found = doctor.findings(planted(name), CATALOGUE, ctx(mtu=1500))
    assert "distributed_timeout" in ids(found)
    f = next(f for f in found if f["id"] == "distributed_timeout")
    for part in ("sglang_server_fabric_interface", "route", "MTU must be 9000", "now 1500", "SGLANG_HOST_IP"):
        assert part in f["remedy"]


def test_hang_after_init_needs_silence_and_an_active_unit():
    hung = planted("init_hang", age=1200)
    assert ids(doctor.findings(hung, CATALOGUE, ctx())) == ["init_hang"]
    fresh = planted("init_hang", age=10)
    assert doctor.findings(fresh, CATALOGUE, ctx()) == []
    progressed = node(["Init torch distributed begin.", "Init torch distributed ends. mem usage=0.1 GB"],
                      status="0", active="active", age=1200)
    assert doctor.findings(progressed, CATALOGUE, ctx()) == []
    f = doctor.findings(hung, CATALOGUE, ctx())[0]
    assert "playbooks/restart.yml" in f["remedy"] and "SGLANG_HOST_IP" in f["remedy"]


@pytest.mark.parametrize("name", ["oom_137", "cuda_oom"])
def test_out_of_memory_names_cap_context_and_concurrency(name):
    found = doctor.findings(planted(name), CATALOGUE, ctx())
    assert ids(found) == ["out_of_memory"]
    f = found[0]
    assert "sglang_server_container_memory" in f["cause"] and "120g" in f["cause"]
    assert "mem-fraction-static" in f["remedy"] and "max-running-requests 2 -> 1" in f["remedy"]


def test_exit_137_alone_is_out_of_memory():
    found = doctor.findings(node([], status="137"), CATALOGUE, ctx())
    assert ids(found) == ["out_of_memory"]


@pytest.mark.parametrize("name", ["download_at_boot", "offline_missing"])
def test_download_at_boot_asks_for_offline_mode_and_checkpoint_state(name):
    found = doctor.findings(planted(name), CATALOGUE, ctx(checkpoint_state="missing"))
    assert ids(found) == ["download_at_boot"]
    f = found[0]
    assert "HF_HUB_OFFLINE=1" in f["remedy"] and "playbooks/checkpoint.yml" in f["remedy"]
    assert "stamp on this node: missing" in f["remedy"]


def test_a_healthy_rank_has_no_finding():
    assert doctor.findings(planted("healthy"), CATALOGUE, ctx()) == []


def test_most_recent_failure_comes_first():
    lines = LINES["hybrid_cache"][0] + LINES["tilelang_smem"][0]
    found = doctor.findings(node(lines), CATALOGUE, ctx())
    assert ids(found) == ["tilelang_shared_memory", "hybrid_state_cache"]


@pytest.mark.parametrize(("raw", "expected"), [
    ({"load_state": "not-found"}, "unit_missing"),
    ({"smi_rc": 9, "smi_out": "NVIDIA-SMI has failed"}, "gpu_unavailable"),
    ({"link_rc": 1, "link_out": "Device does not exist"}, "fabric_link"),
    ({"link_rc": 0, "mtu": 1500}, "fabric_mtu"),
    ({"routes": {"192.168.100.10": "enP7s7"}}, "fabric_route"),
    ({"env_rc": 0, "env_text": "SGLANG_HOST_IP=10.0.0.11\nHF_HUB_OFFLINE=1\nNCCL_SOCKET_IFNAME=enp1s0f1np1\n"}, "env_host_ip"),
    ({"env_rc": 0, "env_text": "SGLANG_HOST_IP=192.168.100.11\nHF_HUB_OFFLINE=1\nNCCL_SOCKET_IFNAME=eth0\n"}, "env_ifname"),
    ({"env_rc": 0, "env_text": "SGLANG_HOST_IP=192.168.100.11\nNCCL_SOCKET_IFNAME=enp1s0f1np1\n"}, "env_offline"),
])
def test_probe_problems(raw, expected):
    found = doctor.findings(node([], status="0", active="active", raw=raw), CATALOGUE, ctx())
    assert ids(found) == [expected]


def test_good_probes_have_no_finding():
    raw = {"load_state": "loaded", "smi_rc": 0, "link_rc": 0, "mtu": 9000, "routes": {"192.168.100.10": "enp1s0f1np1"},
           "env_rc": 0, "env_text": "SGLANG_HOST_IP=192.168.100.11\nHF_HUB_OFFLINE=1\nNCCL_SOCKET_IFNAME=enp1s0f1np1\n"}
    assert doctor.findings(node([], status="0", active="active", raw=raw), CATALOGUE, ctx()) == []


SECRET_KEY = "sk-Plant3dS3cretKeyValue0123"  # noqa: S105 - planted on purpose
HF_TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"  # noqa: S105 - planted on purpose


@pytest.mark.parametrize("text", [
    f"SGLANG_API_KEY={SECRET_KEY}",
    f"server_args=ServerArgs(model_path='/models/glm53', api_key='{SECRET_KEY}', port=30000)",
    f"python3 -m sglang.launch_server --api-key {SECRET_KEY}",
    f"Authorization: Bearer {SECRET_KEY}",
    f"HF_TOKEN={HF_TOKEN}",
    f"token {HF_TOKEN} rejected",
    "some value Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1 in a line",
])
def test_redaction_removes_secrets_by_shape(text):
    out = doctor.redact(text)
    assert SECRET_KEY not in out and HF_TOKEN not in out and "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1" not in out
    assert "<redacted>" in out


def test_redaction_of_known_values_and_keeps_diagnostic_text():
    text = ("key=abc plain: mykey1234 used\nimage sha256:" + "a" * 64 + " GPU-5b1e0000-0000-4000-8000-000000000000\n"
            "--context-length 65536 type=Glm5NextForConditionalGeneration")
    out = doctor.redact(text, ["mykey1234"])
    assert "mykey1234" not in out
    assert "sha256:" + "a" * 64 in out and "GPU-5b1e0000-0000-4000-8000-000000000000" in out
    assert "--context-length 65536 type=Glm5NextForConditionalGeneration" in out


def test_env_secrets_are_collected_for_redaction_elsewhere():
    env = f"# comment\nSGLANG_API_KEY={SECRET_KEY}\nHF_TOKEN='{HF_TOKEN}'\nSGLANG_HOST_IP=1.2.3.4\n"
    assert doctor.env_secrets(env) == [SECRET_KEY, HF_TOKEN]


def test_journal_json_with_byte_array_message():
    lines = "\n".join([
        json.dumps({"__REALTIME_TIMESTAMP": "1800000000000000", "MESSAGE": "hello"}),
        json.dumps({"__REALTIME_TIMESTAMP": "1800000001000000", "MESSAGE": list(b"bad \xff byte")}),
        "not json",
    ])
    entries = doctor.journal_entries(lines)
    assert [e["t"] for e in entries] == [1800000000.0, 1800000001.0]
    assert entries[1]["msg"] == "bad \ufffd byte"


# --- what the stand-in server prints, through the catalogue -----------------------------------


def standin(tmp_path, *flags, knobs=None, env=None, nnodes=1):
    """Run the stand-in SGLang server to its end; its output as a failed rank's journal."""
    model = tmp_path / "glm53"
    model.mkdir(exist_ok=True)
    (model / "processor_config.json").write_text("{}")
    root = tmp_path / "root"
    (root / "etc/spark-sim").mkdir(parents=True, exist_ok=True)
    (root / "etc/spark-sim/node.json").write_text(json.dumps({"sglang": {"load_seconds": 0, "rendezvous_timeout": 1,
                                                                         **(knobs or {})}}))
    args = ["--model-path", str(model), "--tp-size", str(nnodes), "--nnodes", str(nnodes), "--node-rank", "0",
            "--dist-init-addr", "127.0.0.1:1", "--attention-backend", "dsa", "--dsa-prefill-backend", "tilelang",
            "--dsa-decode-backend", "tilelang", "--context-length", "65536", "--max-running-requests", "2",
            "--host", "127.0.0.1", "--port", "1", *flags]
    environ = {"PATH": "/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES": "all", "SPARK_SIM_ROOT": str(root),
               "HF_HUB_OFFLINE": "1", **(env or {})}
    proc = subprocess.run([sys.executable, str(SERVER), *args], env=environ, capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 1, proc.stdout[-2000:]
    return node(proc.stdout.splitlines())


@pytest.mark.parametrize(("case", "expected"), [
    ((("--max-running-requests", "8"), None, None, 1), "hybrid_state_cache"),
    (((), {"tilelang_tile": "default"}, None, 1), "tilelang_shared_memory"),
    ((("--speculative-algorithm", "EAGLE"), None, None, 1), "tilelang_shared_memory"),
    ((("--model-path", "LibertAIDAI/GLM-5.3-Flash-NVFP4"), None, {"HF_HUB_OFFLINE": ""}, 1), "download_at_boot"),
    ((("--model-path", "LibertAIDAI/GLM-5.3-Flash-NVFP4"), None, None, 1), "download_at_boot"),
    ((("--model-path", "LibertAIDAI/GLM-5.3-Flash-NVFP4"), {"hub_reachable": True}, {"HF_HUB_OFFLINE": ""}, 1),
     "processor_config_missing"),
    (((), None, None, 2), "distributed_timeout"),
], ids=["hybrid", "tilelang", "drafter", "hub online", "hub offline", "hub reachable", "rank 0 alone"])
def test_what_the_standin_prints_maps_to_its_finding(tmp_path, case, expected):
    flags, knobs, env, nnodes = case  # a later --model-path wins, as with argparse
    found = doctor.findings(standin(tmp_path, *flags, knobs=knobs, env=env, nnodes=nnodes), CATALOGUE, ctx())
    assert ids(found) == [expected]

"""The doctor's fingerprint catalogue and its judgement: each failure's log lines map to its cause and remedy.

The remedies asserted here are written out from deployment-facts.md (known
failures 1-4) and issues 6 and 15, not read from the catalogue: a test that
compared the catalogue with itself could not fail. The log lines are written
out here from the real engines' and tools' messages (SGLang, TileLang,
torch.distributed, Gloo, NCCL, huggingface_hub, systemd, docker); the last
tests feed the doctor what the stand-in SGLang server itself prints for each
failure, so the stand-in and the catalogue cannot drift apart
(tests/integration/test_doctor.py does the same through the rank's unit on
simulated nodes).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.lib.checkpoint_site import free_port
from tests.lib.roles import filter_plugin, flag_model

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "doctor"


doctor = filter_plugin("doctor")
SERVER = REPO / "tests" / "standins" / "lib" / "sglang_server.py"
HYBRID = "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "

# name -> (log lines, the unit's exit status, whether the unit is still active)
LINES: dict[str, tuple[list[str], int, bool]] = {
    "hybrid_cache": ([
        "[2026-11-29 10:01:12 TP0] Load weight end. type=Glm5NextForConditionalGeneration, dtype=torch.bfloat16",
        "[2026-11-29 10:01:13 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        HYBRID + "max_mamba_cache_size=1, mamba_ratio=5, resulting max_num_reqs=0.",
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
    "store_timeout": ([
        "torch.distributed.DistStoreError: Timed out after 6 seconds waiting for clients. 1/2 clients joined.",
    ], 1, False),
    "init_hang": (["[2026-11-29 10:04:00 TP0] Init torch distributed begin."], 0, True),
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
    "gpu_at_start": ([
        "docker: Error response from daemon: failed to create task for container: failed to create shim task: OCI "
        "runtime create failed: runc create failed: unable to start container process: error during container init: "
        "error running prestart hook #0: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'",
        "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown",
    ], 125, False),
    "healthy": ([
        "[2026-11-29 10:06:00 TP0] Decode batch. #running-req: 1, #token: 812, token usage: 0.01, cuda graph: True",
        "[2026-11-29 10:06:01] The server is fired up and ready to roll!",
    ], 0, True),
    # NCCL 2.27 with NCCL_DEBUG=INFO: a rank with RDMA, and one that found no device and serves over sockets.
    "nccl_ib": ([
        "spark-0:77:91 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB "
        "enp1s0f1np1:10.232.1.10<0>",
        "spark-0:77:91 [0] NCCL INFO Using network IB",
        "[2026-11-29 10:06:01] The server is fired up and ready to roll!",
    ], 0, True),
    "nccl_socket": ([
        "spark-1:78:92 [0] NCCL INFO NET/IB : No device found.",
        "spark-1:78:92 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:10.232.1.11<0>",
        "spark-1:78:92 [0] NCCL INFO Using network Socket",
        "[2026-11-29 10:06:01] The server is fired up and ready to roll!",
    ], 0, True),
}
ALL_ENTRIES = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__doctor_fingerprints"]
# What the doctor matches on an SGLang group (vLLM's own entries are tests/unit/test_doctor_vllm.py's).
CATALOGUE = doctor.catalogue_for(ALL_ENTRIES, "sglang")
FLAG_MODEL = flag_model()

NOW = 1_800_000_000.0
UNIT = "spark-llm.service"
EXEC = ("{{ path=/usr/bin/docker ; argv[]=/usr/bin/docker run --rm --name spark-llm --gpus all --network host "
        "--memory {memory} --memory-swap {memory} --volume /opt/models/glm53:/models/glm53:ro "
        "--env-file /etc/spark-llm/spark-llm.env lmsysorg/sglang:glm-5.3-flash-arm64 python3 -m sglang.launch_server "
        "--model-path /models/glm53 --trust-remote-code --tp-size 2 --attention-backend dsa "
        "--dsa-prefill-backend tilelang --dsa-decode-backend tilelang --moe-runner-backend flashinfer_cutlass "
        "--kv-cache-dtype bfloat16 --disable-shared-experts-fusion --reasoning-parser glm45 --tool-call-parser glm47 "
        "--mem-fraction-static {fraction} --context-length {context} --max-running-requests {running} --enable-metrics "
        "--nnodes 2 --node-rank 0 --dist-init-addr 192.168.100.10:20000 --host 0.0.0.0 --port 30000 ; ignore_errors=no ; }}")


def exec_start(memory="120g", fraction="0.84", context=65536, running=2):
    return EXEC.format(memory=memory, fraction=fraction, context=context, running=running)


def deployed(**kw):
    return doctor.deployed_values({"ExecStart": exec_start(**kw)}, None, FLAG_MODEL)


def ctx(dep=None, **changes):
    dep = dep or deployed()
    base = {
        "flags": dep["flags"],
        "overrides": dep["overrides"],
        "deployed": dep,
        "container_memory": dep["memory"],
        "unit": UNIT,
        "model_dir": "/opt/models/glm53",
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
        "gpu_processes": "none",
        "gpu_memory_gib": 119.7,
        "runtime_overhead_gib": 4,
        "memory_margin_gib": 1,
        "default_mem_fraction": 0.84,
        "min_mem_fraction": 0.5,
    }
    base.update(changes)
    return base


def node(lines, status=1, active="failed", *, age=5.0, raw=None, events=None, container=None, code="exited"):
    journal = [{"t": NOW - age - (len(lines) - i), "msg": line} for i, line in enumerate(lines)]
    outcome = {"exit": None, "code": None, "result": None, "start_limit": False, "stopped": False}
    if active != "active":
        outcome.update(exit=status, code=code, result="exit-code" if status else None)
        journal.append({"t": NOW - age, "msg": f"{UNIT}: Main process exited, code={code}, status={status}/n/a"})
    start = journal[0]["t"] if journal else NOW - age
    return {"journal": journal, "unit": {"ActiveState": active, "SubState": "running" if active == "active" else "failed"},
            "outcome": outcome, "now": NOW, "raw": raw or {}, "events": events or [], "container": container or {},
            "kernel": [], "current": {"id": "cur", "start": start, "end": journal[-1]["t"] if journal else start}}


def planted(name, **kw):
    lines, status, active = LINES[name]
    return node(lines, status=status, active="active" if active else "failed", **kw)


def ids(found):
    return [f["id"] for f in found]


def test_catalogue_is_well_formed():
    seen = set()
    computed = {"peer_absent", "exit_unknown"}
    for entry in ALL_ENTRIES:
        assert entry["id"] not in seen
        seen.add(entry["id"])
        assert entry["title"] and entry["cause"] and entry["remedy"]
        assert set(entry.get("engines") or ["sglang"]) <= {"sglang", "vllm"}, entry["id"]
        assert entry["id"] in computed or any(k in entry for k in ("patterns", "exit_kill", "stall", "probe")), entry["id"]
        for pattern in entry.get("patterns", []):
            re.compile(pattern)
    assert computed <= seen


# --- the hybrid state cache: one step from the error's own figures -----------------------------------


def hybrid(size, ratio, reqs):
    return node([HYBRID + f"max_mamba_cache_size={size}, mamba_ratio={ratio}, resulting max_num_reqs={reqs}."])


def test_hybrid_cache_sets_the_requests_the_pool_backs_in_one_step():
    # 8 requests asked; the pool's 20 slots at 5 per request back 4: straight to 4, not 8 -> 4 -> 2 -> 1.
    c = ctx(deployed(running=8))
    found = doctor.findings(hybrid(20, 5, 4), CATALOGUE, c)
    assert ids(found) == ["hybrid_state_cache"]
    f = found[0]
    assert "deployed max-running-requests 8 and context-length 65536" in f["cause"]
    assert "20 // 5 = 4 request(s) fit" in f["remedy"] and "lower max-running-requests 8 -> 4" in f["remedy"]
    assert f["apply"] == {"server_flag_overrides": {"max-running-requests": 4}}
    assert "apply with: server_flag_overrides: {max-running-requests: 4}" in f["remedy"]


def test_hybrid_cache_keeps_every_other_deployed_override():
    """Deployed with context-length 262144, diagnosed without the deploying -e: the context is kept."""
    c = ctx(deployed(running=8, context=262144))
    f = doctor.findings(hybrid(5, 5, 1), CATALOGUE, c)[0]
    assert f["apply"] == {"server_flag_overrides": {"context-length": 262144, "max-running-requests": 1}}
    assert "keep context-length 262144" in f["remedy"]


def test_hybrid_cache_lowers_context_when_not_one_request_fits():
    c = ctx(deployed(running=2, context=1048576))
    f = doctor.findings(hybrid(1, 5, 0), CATALOGUE, c)[0]
    # 1048576 x 1 / 5 = 209715 tokens of state: one request at 208896 (a multiple of 1024).
    assert f["apply"] == {"server_flag_overrides": {"context-length": 208896, "max-running-requests": 1}}
    assert "1048576 x 1 / 5 = 209715 tokens" in f["remedy"] and "lower context-length 1048576 -> 208896" in f["remedy"]


def test_hybrid_cache_without_one_slot_gives_the_upper_bound():
    c = ctx(deployed(running=1, context=1048576))
    f = doctor.findings(hybrid(0, 5, 0), CATALOGUE, c)[0]
    # max-running-requests 1 is a deployed override too: kept.
    assert f["apply"]["server_flag_overrides"] == {"max-running-requests": 1, "context-length": 208896}
    assert "an upper bound" in f["remedy"]


# --- exits: OOM kill, signal, start limit, the GPU at start --------------------------------------


def test_oom_kill_is_told_by_dockers_oom_event_and_computed_from_the_deployed_cap():
    c = ctx(deployed(memory="96g"))
    oom = [{"t": NOW - 6, "action": "oom"}, {"t": NOW - 5, "action": "die", "exit_code": "137"}]
    found = doctor.findings(node([], status=137, events=oom), CATALOGUE, c)
    assert ids(found) == ["oom_killed"]
    f = found[0]
    assert "--memory 96g" in f["cause"]
    # 0.84 x 119.7 + 4 = 104.5 GiB held; raise to 106g (1 GiB margin), or (96 - 4 - 1) / 119.7 = 0.76.
    for part in ("0.84 x 119.7 GiB", "= 104.5 GiB", "--memory 96g (96.0 GiB)", "raise server_container_memory 96g -> 106g",
                 "lower mem-fraction-static 0.84 -> 0.76", "not max-running-requests"):
        assert part in f["remedy"], (part, f["remedy"])
    assert f["apply"] == {"server_container_memory": "106g"}
    assert f["alternative"] == {"server_flag_overrides": {"mem-fraction-static": 0.76}}
    assert "docker: container OOM-killed" in f["evidence"]


def test_oom_kill_above_the_gpus_memory_only_lowers_the_fraction():
    c = ctx(deployed(fraction="0.97"))
    found = doctor.findings(node([], status=137, container={"OOMKilled": True}), CATALOGUE, c)
    f = found[0]
    assert f["id"] == "oom_killed"
    assert f["apply"] == {"server_flag_overrides": {"mem-fraction-static": 0.96}}


def test_exit_137_without_an_oom_kill_is_a_signal():
    found = doctor.findings(node([], status=137, events=[{"t": NOW - 5, "action": "die", "exit_code": "137"}]),
                            CATALOGUE, ctx())
    assert ids(found) == ["signal_killed"]
    assert "not OOM-killed" in found[0]["evidence"] and "Memory settings are not the cause" in found[0]["cause"]
    assert found[0]["apply"] == {}


def test_a_killed_docker_client_is_a_signal():
    found = doctor.findings(node([], status=9, code="killed"), CATALOGUE, ctx())
    assert ids(found) == ["signal_killed"]


def test_the_start_limit_is_recognised_with_its_fix_beside_the_failure_that_repeated():
    lines = LINES["gpu_at_start"][0] + [f"{UNIT}: Start request repeated too quickly.",
                                       f"{UNIT}: Failed with result 'exit-code'.", f"Failed to start {UNIT}."]
    found = doctor.findings(node(lines, status=125, raw={"smi_rc": 0}), CATALOGUE, ctx())
    assert set(ids(found)) == {"start_limit", "gpu_at_start"}
    limit = next(f for f in found if f["id"] == "start_limit")
    assert "playbooks/restart.yml, which resets the start limit" in limit["remedy"]


def test_a_failed_starts_gpu_error_is_kept_when_the_gpu_is_back():
    found = doctor.findings(planted("gpu_at_start", raw={"smi_rc": 0}), CATALOGUE, ctx())
    assert ids(found) == ["gpu_at_start"]
    assert "nvml error: driver not loaded" in found[0]["evidence"]
    assert "nvidia-smi answers now" in found[0]["remedy"]
    still = doctor.findings(planted("gpu_at_start", raw={"smi_rc": 9, "smi_out": "NVIDIA-SMI has failed"}), CATALOGUE,
                            ctx())
    assert set(ids(still)) == {"gpu_at_start", "gpu_unavailable"}
    assert "nvidia-smi still fails now" in next(f for f in still if f["id"] == "gpu_at_start")["remedy"]


def test_an_unknown_failure_still_says_the_start_failed():
    found = doctor.findings(node(["Traceback (most recent call last):", "ValueError: something new"], status=1),
                            CATALOGUE, ctx())
    assert ids(found) == ["exit_unknown"]
    assert "status 1" in found[0]["cause"]


# --- peers: absent, died, or the fabric -------------------------------------------------------------


def peer(runs, why="", state="failed/failed"):
    return {"host": "spark-1", "rank": 1, "runs": runs, "why": why, "state": state}


def test_a_rendezvous_timeout_with_the_peers_start_failed_is_the_peers_absence():
    n = planted("store_timeout")
    # Rank 0 waited 6 s for its clients; the worker's start had failed at once, before it.
    n["journal"][0]["t"] += 6
    s = n["current"]["start"]
    n["peers"] = [peer([{"start": s - 1, "end": s, "failed": True, "running": False}],
                       why="The start could not get the GPU: nvml error: driver not loaded")]
    found = doctor.findings(n, CATALOGUE, ctx())
    assert ids(found) == ["peer_absent"]
    f = found[0]
    assert "spark-1 (rank 1)" in f["cause"] and "nvml error: driver not loaded" in f["cause"]
    assert "fabric.yml does not help" in f["remedy"]


def test_a_peer_never_started_is_absent_too():
    n = planted("store_timeout")
    n["peers"] = [peer([], state="inactive/dead")]
    found = doctor.findings(n, CATALOGUE, ctx())
    assert ids(found) == ["peer_absent"] and "never started" in found[0]["cause"]


def test_a_rendezvous_timeout_with_the_peer_there_points_at_the_fabric():
    n = planted("nccl_timeout")
    s = n["current"]["start"]
    n["peers"] = [peer([{"start": s - 1, "end": NOW, "failed": False, "running": True}], state="active/running")]
    found = doctor.findings(n, CATALOGUE, ctx(mtu=1500))
    f = next(f for f in found if f["id"] == "distributed_timeout")
    assert "every peer's rank was running then" in f["cause"]
    for part in ("server_fabric_interface", "MTU must be 9000", "now 1500", "SGLANG_HOST_IP", "playbooks/fabric.yml"):
        assert part in f["remedy"]


def test_a_fabric_fault_on_this_node_wins_over_an_absent_peer():
    n = planted("gloo_timeout", raw={"link_rc": 0, "link_flags": ["NO-CARRIER", "BROADCAST", "UP"], "mtu": 9000})
    n["peers"] = [peer([])]
    found = doctor.findings(n, CATALOGUE, ctx())
    assert "distributed_timeout" in ids(found) and "fabric_carrier" in ids(found) and "peer_absent" not in ids(found)


def test_a_rank_taken_down_by_its_peer_names_the_peers_cause():
    n = node(["RuntimeError: NCCL error: remote process exited or there was a network error"], status=1)
    end = n["current"]["end"]
    n["peers"] = [peer([{"start": end - 60, "end": end - 0.5, "failed": True, "running": False}],
                       why="Rank killed by a signal, not for memory (exit 137 without OOM kill)")]
    found = doctor.findings(n, CATALOGUE, ctx())
    assert ids(found) == ["peer_exited"]
    assert "Rank killed by a signal" in found[0]["cause"] and "no fault of its own" in found[0]["remedy"]


def test_a_peer_whose_container_outlived_its_death_still_took_this_rank_down():
    """The peer's last line came with this rank's failure; its unit ended 3 s later (its container's teardown on a
    busy node): the peer died first all the same. A peer still talking 8 s after this rank failed did not."""
    n = node(["RuntimeError: NCCL error: remote process exited or there was a network error"], status=1)
    end = n["current"]["end"]
    n["peers"] = [peer([{"start": end - 60, "end": end + 6, "last_output": end + 3, "failed": True,
                         "running": False}], why="KV cache too small for one request")]
    found = doctor.findings(n, CATALOGUE, ctx())
    assert ids(found) == ["peer_exited"]
    assert "spark-1 (rank 1) ended at" in found[0]["cause"], found[0]["cause"]
    n["peers"] = [peer([{"start": end - 60, "end": end + 8, "last_output": end + 8, "failed": True,
                         "running": False}], why="KV cache too small for one request")]
    assert "every peer's rank was running then" in doctor.findings(n, CATALOGUE, ctx())[0]["cause"]


def test_the_peer_run_that_took_this_rank_down_is_its_latest_start_not_one_stopped_just_before():
    """The peer's run before (stopped by hand, exit 143) ended 1 s before this rank failed; its next start died with
    this rank's failure. The doctor lists a node's runs current first: the one that was there is the latest start."""
    n = node(["RuntimeError: NCCL error: remote process exited or there was a network error"], status=1)
    end = n["current"]["end"]
    died = {"start": end - 2, "end": end, "last_output": end, "failed": True, "running": False}
    stopped = {"start": end - 30, "end": end - 1, "last_output": end - 1, "failed": False, "running": False}
    n["peers"] = [peer([died, stopped], why="KV cache too small for one request")]
    found = doctor.findings(n, CATALOGUE, ctx())
    assert ids(found) == ["peer_exited"]
    assert "spark-1 (rank 1) ended at" in found[0]["cause"], found[0]["cause"]


def test_hang_after_init_needs_silence_and_an_active_unit():
    hung = planted("init_hang", age=1200)
    assert ids(doctor.findings(hung, CATALOGUE, ctx())) == ["init_hang"]
    fresh = planted("init_hang", age=10)
    assert doctor.findings(fresh, CATALOGUE, ctx()) == []
    progressed = node(["Init torch distributed begin.", "Init torch distributed ends. mem usage=0.1 GB"],
                      status=0, active="active", age=1200)
    assert doctor.findings(progressed, CATALOGUE, ctx()) == []
    f = doctor.findings(hung, CATALOGUE, ctx())[0]
    assert "playbooks/restart.yml" in f["remedy"] and "SGLANG_HOST_IP" in f["remedy"]


# --- the other fingerprints --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tilelang_smem", "tilelang_smem_drafter"])
def test_tilelang_shared_memory_names_the_gb10_tile(name):
    found = doctor.findings(planted(name), CATALOGUE, ctx())
    assert ids(found) == ["tilelang_shared_memory"]
    f = found[0]
    assert "169984" in f["cause"] and "101376" in f["cause"]
    for part in ("block_I=32", "num_stages=1", "threads=128", "threads to 128 before block_I", "block_I=16 trips an MMA"):
        assert part in f["remedy"]
    assert ("drafter" in f["remedy"]) is (name == "tilelang_smem_drafter")


def test_tilelang_drafter_also_from_the_deployed_flags():
    dep = doctor.deployed_values({"ExecStart": exec_start().replace(" ; ignore", " --speculative-algorithm EAGLE ; ignore")},
                                 None, FLAG_MODEL)
    assert dep["overrides"] == {"speculative-algorithm": "EAGLE"}
    found = doctor.findings(planted("tilelang_smem"), CATALOGUE, ctx(dep))
    assert "drafter" in found[0]["remedy"]


@pytest.mark.parametrize("name", ["processor_config_repo_id", "processor_config_local"])
def test_missing_processor_config_asks_for_a_local_directory(name):
    found = doctor.findings(planted(name), CATALOGUE, ctx())
    assert ids(found) == ["processor_config_missing"]
    assert "LOCAL directory" in found[0]["remedy"]
    assert "server_model_dir" in found[0]["remedy"] and "/opt/models/glm53" in found[0]["remedy"]


def test_cuda_out_of_memory_is_not_the_containers_limit():
    found = doctor.findings(planted("cuda_oom"), CATALOGUE, ctx(gpu_processes="4242, python3, [N/A]"))
    assert ids(found) == ["cuda_out_of_memory"]
    assert "4242, python3" in found[0]["cause"]


@pytest.mark.parametrize("name", ["download_at_boot", "offline_missing"])
def test_download_at_boot_asks_for_offline_mode_and_checkpoint_state(name):
    found = doctor.findings(planted(name), CATALOGUE, ctx(checkpoint_state="missing"))
    assert ids(found) == ["download_at_boot"]
    f = found[0]
    assert "HF_HUB_OFFLINE=1" in f["remedy"] and "playbooks/checkpoint.yml" in f["remedy"]
    assert "stamp on this node: missing" in f["remedy"]


def test_a_healthy_rank_has_no_finding():
    assert doctor.findings(planted("healthy"), CATALOGUE, ctx()) == []
    assert doctor.findings(planted("nccl_ib"), CATALOGUE, ctx()) == []


def test_a_rank_serving_over_nccls_sockets_is_named_with_the_way_back_to_rdma():
    found = doctor.findings(planted("nccl_socket"), CATALOGUE, ctx())
    assert ids(found) == ["nccl_socket_fallback"]
    assert "fell back to its socket transport on enp1s0f1np1" in found[0]["cause"]
    assert "playbooks/fabric.yml" in found[0]["remedy"] and "playbooks/restart.yml" in found[0]["remedy"]


def test_most_recent_failure_comes_first():
    lines = LINES["processor_config_local"][0] + LINES["tilelang_smem"][0]
    found = doctor.findings(node(lines), CATALOGUE, ctx())
    assert ids(found) == ["tilelang_shared_memory", "processor_config_missing"]


@pytest.mark.parametrize(("raw", "expected"), [
    ({"load_state": "not-found"}, "unit_missing"),
    ({"smi_rc": 9, "smi_out": "NVIDIA-SMI has failed"}, "gpu_unavailable"),
    ({"link_rc": 1, "link_out": "Device does not exist"}, "fabric_link"),
    ({"link_rc": 0, "mtu": 1500}, "fabric_mtu"),
    ({"link_rc": 0, "mtu": 9000, "link_flags": ["BROADCAST", "MULTICAST"]}, "fabric_down"),
    ({"link_rc": 0, "mtu": 9000, "link_flags": ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"]}, "fabric_carrier"),
    ({"routes": {"192.168.100.10": "enP7s7"}}, "fabric_route"),
    ({"env_rc": 0, "env_text": "SGLANG_HOST_IP=10.0.0.11\nHF_HUB_OFFLINE=1\nNCCL_SOCKET_IFNAME=enp1s0f1np1\n"}, "env_host_ip"),
    ({"env_rc": 0, "env_text": "SGLANG_HOST_IP=192.168.100.11\nHF_HUB_OFFLINE=1\nNCCL_SOCKET_IFNAME=eth0\n"}, "env_ifname"),
    ({"env_rc": 0, "env_text": "SGLANG_HOST_IP=192.168.100.11\nNCCL_SOCKET_IFNAME=enp1s0f1np1\n"}, "env_offline"),
])
def test_probe_problems(raw, expected):
    found = doctor.findings(node([], status=0, active="active", raw=raw), CATALOGUE, ctx())
    assert ids(found) == [expected]


def test_good_probes_have_no_finding():
    raw = {"load_state": "loaded", "smi_rc": 0, "link_rc": 0, "mtu": 9000, "link_flags": ["BROADCAST", "UP", "LOWER_UP"],
           "routes": {"192.168.100.10": "enp1s0f1np1"},
           "env_rc": 0, "env_text": "SGLANG_HOST_IP=192.168.100.11\nHF_HUB_OFFLINE=1\nNCCL_SOCKET_IFNAME=enp1s0f1np1\n"}
    assert doctor.findings(node([], status=0, active="active", raw=raw), CATALOGUE, ctx()) == []


# --- the current start, the history, the drift ---------------------------------------------------


def journal(*runs):
    """journalctl -o json lines of the unit: each run (inv, t0, [own lines], [systemd lines after])."""
    out = []
    for inv, t0, own, after in runs:
        out.append({"__REALTIME_TIMESTAMP": str(int(t0 * 1e6)), "MESSAGE": f"Started {UNIT}.", "INVOCATION_ID": inv})
        for i, line in enumerate(own):
            out.append({"__REALTIME_TIMESTAMP": str(int((t0 + 1 + i) * 1e6)), "MESSAGE": line,
                        "_SYSTEMD_INVOCATION_ID": inv})
        for i, line in enumerate(after):
            out.append({"__REALTIME_TIMESTAMP": str(int((t0 + 1 + len(own) + i) * 1e6)), "MESSAGE": line,
                        "INVOCATION_ID": inv})
    return "\n".join(json.dumps(o) for o in out)


FAILED = [f"{UNIT}: Main process exited, code=exited, status=1/FAILURE", f"{UNIT}: Failed with result 'exit-code'."]


def evidence_of(text, props=None):
    return doctor.evidence({"unit": {"status": {"ActiveState": "active", "SubState": "running", **(props or {})}},
                            "journal": {"stdout": f"--- journal\n{text}\n--- now\n{int(NOW)}"}}, "enp1s0f1np1", FLAG_MODEL)


def test_a_fixed_then_healthy_rank_has_no_current_finding_and_keeps_the_failure_as_history():
    text = journal(("aaa", NOW - 600, LINES["hybrid_cache"][0], FAILED), ("bbb", NOW - 300, LINES["healthy"][0], []))
    ev = evidence_of(text)
    assert doctor.findings(ev["node"], CATALOGUE, ctx()) == []
    past = doctor.history(ev["earlier"], CATALOGUE, [], [])
    assert [(h["how"], [f["id"] for f in h["findings"]]) for h in past] == [("exit 1 (exit-code)", ["hybrid_state_cache"])]
    lines = doctor.report_lines("spark-0", [], None, past)
    assert lines[0] == "spark-0: no current finding (the current start shows no known failure)"
    assert any("Hybrid (mamba/linear-attention) state cache too small" in line for line in lines[2:])
    assert not any(line.lstrip().startswith("remedy:") for line in lines)


def test_a_new_failure_after_a_fixed_one_shows_only_the_new_cause():
    text = journal(("aaa", NOW - 900, LINES["hybrid_cache"][0], FAILED), ("bbb", NOW - 600, LINES["healthy"][0],
                                                                          [f"Stopped {UNIT}."]),
                   ("ccc", NOW - 300, LINES["tilelang_smem"][0], FAILED))
    ev = evidence_of(text, {"ActiveState": "failed", "SubState": "failed", "InvocationID": "ccc"})
    assert ev["node"]["current"]["id"] == "ccc"
    assert ids(doctor.findings(ev["node"], CATALOGUE, ctx())) == ["tilelang_shared_memory"]
    assert [h["how"] for h in doctor.history(ev["earlier"], CATALOGUE, [], [])] == ["stopped", "exit 1 (exit-code)"]


def test_a_unit_that_forgot_its_invocation_is_judged_by_its_last_start():
    text = journal(("aaa", NOW - 600, LINES["healthy"][0], []), ("bbb", NOW - 300, LINES["processor_config_local"][0],
                                                                 FAILED + [f"Stopped {UNIT}."]))
    ev = evidence_of(text, {"ActiveState": "inactive", "SubState": "dead", "InvocationID": ""})
    assert ev["node"]["current"]["id"] == "bbb"
    assert ids(doctor.findings(ev["node"], CATALOGUE, ctx())) == ["processor_config_missing"]


def test_deployed_values_come_from_the_loaded_unit_and_differences_are_drift():
    dep = deployed(memory="96g", context=262144)
    assert dep["memory"] == "96g" and dep["memory_bytes"] == 96 << 30
    assert dep["flags"]["context-length"] == "262144" and dep["overrides"] == {"context-length": 262144}
    assert dep["image"] == "lmsysorg/sglang:glm-5.3-flash-arm64"
    found = doctor.drift(dep, FLAG_MODEL, {}, "120g", "lmsysorg/sglang:glm-5.3-flash-arm64")
    assert found == [{"what": "flag context-length", "inventory": "65536", "node": "262144"},
                     {"what": "container memory (server_container_memory)", "inventory": "120g", "node": "96g"}]
    assert doctor.drift(dep, FLAG_MODEL, {"context-length": 262144}, "96g", None) == []


def test_a_flag_the_node_runs_and_the_inventory_does_not_set_is_drift_but_topology_and_keys_are_not():
    """A flag outside the seed's set (here a hand-added drafter) is drift too; the per-node topology flags and a
    hand-edited key are never inventory flags."""
    unit = exec_start().replace(" ; ignore", " --speculative-algorithm EAGLE --api-key zz ; ignore")
    dep = doctor.deployed_values({"ExecStart": unit}, None, FLAG_MODEL)
    assert doctor.drift(dep, FLAG_MODEL, {}, "120g", None) == [
        {"what": "flag speculative-algorithm", "inventory": "unset", "node": "EAGLE"}]
    assert doctor.drift(dep, FLAG_MODEL, {"speculative-algorithm": "EAGLE"}, "120g", None) == []


def test_a_hand_edited_unit_is_named():
    dep = doctor.deployed_values({"ExecStart": exec_start().replace(" ; ignore", " --admin-api-key zz ; ignore")},
                                 json.dumps(doctor.unit_args(exec_start())), FLAG_MODEL)
    assert dep["hand_edited"] == ["--admin-api-key"]
    assert "admin-api-key" not in dep["overrides"]


# --- redaction -----------------------------------------------------------------------------------


SECRET_KEY = "sk-Plant3dS3cretKeyValue0123"  # noqa: S105 - planted on purpose
HF_TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"  # noqa: S105 - planted on purpose
PLAIN_KEY = "plainlowercasekeyvalue"  # noqa: S105 - planted on purpose: no shape, only its name gives it away


@pytest.mark.parametrize("text", [
    f"SGLANG_API_KEY={PLAIN_KEY}",
    f"server_args=ServerArgs(model_path='/models/glm53', api_key='{PLAIN_KEY}', port=30000)",
    f'{{"admin_api_key": "{PLAIN_KEY}"}}',
    f'{{"admin-api-key": "{PLAIN_KEY}", "port": "30000"}}',
    f"server_api_key: {PLAIN_KEY}",
    f"-----BEGIN PRIVATE KEY-----\n{PLAIN_KEY}\n-----END PRIVATE KEY-----",
    f"python3 -m sglang.launch_server --api-key {PLAIN_KEY} --port 30000",
    f"--admin-api-key={PLAIN_KEY}",
    f'[\n    "--model-path",\n    "/models/glm53",\n    "--api-key",\n    "{PLAIN_KEY}"\n]',
    f"Authorization: Bearer {PLAIN_KEY}",
    f"HF_TOKEN={HF_TOKEN}",
    f"token {HF_TOKEN} rejected",
    f"key {SECRET_KEY} used",
    "some value Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1 in a line",
])
def test_redaction_removes_secrets_by_shape(text):
    out = doctor.redact(text)
    for secret in (PLAIN_KEY, SECRET_KEY, HF_TOKEN, "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1"):
        assert secret not in out
    assert "<redacted>" in out


def test_diagnostic_numbers_stay_readable():
    text = ("max_total_num_tokens=524288, max_total_tokens=524288, chunked_prefill_size=8192, max_prefill_tokens=16384\n"
            "server_args=ServerArgs(model_path='/models/glm53', tokenizer_path='/models/glm53', api_key=None)\n"
            "Hybrid radix cache initialized: max_mamba_cache_size=20, mamba_ratio=5, max_num_reqs=2, "
            "full KV cache tokens=65536\n"
            "Decode batch. #running-req: 1, #token: 812, token usage: 0.01, cuda graph: True\n"
            "usage: prompt_tokens=12 completion_tokens=53 reasoning_tokens=43\n"
            "image sha256:" + "a" * 64 + " GPU-5b1e0000-0000-4000-8000-000000000000 type=Glm5NextForConditionalGeneration")
    assert doctor.redact(text, ["plainlowercasekeyvalue"]) == text


def test_redaction_of_known_values():
    out = doctor.redact("key=abc plain: mykey1234 used", ["mykey1234"])
    assert "mykey1234" not in out and "key=abc" in out


def test_env_secrets_are_collected_by_name_and_numbers_are_not():
    env = (f"# comment\nSGLANG_API_KEY={SECRET_KEY}\nHF_TOKEN='{HF_TOKEN}'\nSGLANG_HOST_IP=1.2.3.4\n"
           "SGLANG_MAX_TOKENS=4096\nSOME_TOKEN=12345\n")
    assert doctor.env_secrets(env) == [SECRET_KEY, HF_TOKEN]


def test_journal_json_with_byte_array_message_and_invocations():
    lines = "\n".join([
        json.dumps({"__REALTIME_TIMESTAMP": "1800000000000000", "MESSAGE": "hello", "INVOCATION_ID": "x"}),
        json.dumps({"__REALTIME_TIMESTAMP": "1800000001000000", "MESSAGE": list(b"bad \xff byte"),
                    "_SYSTEMD_INVOCATION_ID": "y"}),
        "not json",
    ])
    entries = doctor.journal_entries(lines)
    assert [(e["t"], e["inv"]) for e in entries] == [(1800000000.0, "x"), (1800000001.0, "y")]
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
            "--dist-init-addr", f"127.0.0.1:{free_port()}", "--attention-backend", "dsa", "--dsa-prefill-backend", "tilelang",
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


@pytest.mark.parametrize(("running", "context", "apply"), [
    (8, 65536, {"max-running-requests": 4}),
    (8, 262144, {"max-running-requests": 1, "context-length": 262144}),
    (2, 1048576, {"max-running-requests": 1, "context-length": 208896}),
])
def test_the_standins_hybrid_figures_give_a_remedy_it_then_starts_with(tmp_path, running, context, apply):
    """One step: the override computed from the stand-in's error is one the stand-in then serves with."""
    n = standin(tmp_path, "--max-running-requests", str(running), "--context-length", str(context))
    f = doctor.findings(n, CATALOGUE, ctx(deployed(running=running, context=context)))[0]
    assert f["apply"] == {"server_flag_overrides": apply}
    fixed = {"max-running-requests": running, "context-length": context, **apply}
    model = tmp_path / "glm53"
    args = ["--model-path", str(model), "--tp-size", "1", "--nnodes", "1", "--node-rank", "0",
            "--max-running-requests", str(fixed["max-running-requests"]), "--context-length", str(fixed["context-length"]),
            "--host", "127.0.0.1", "--port", "1"]
    # The state check passes; the start goes on until a tile that cannot launch stops it at graph capture.
    (tmp_path / "root/etc/spark-sim/node.json").write_text(json.dumps(
        {"sglang": {"load_seconds": 0, "tilelang_tile": "default"}}))
    args += ["--dsa-prefill-backend", "tilelang"]
    proc = subprocess.run([sys.executable, str(SERVER), *args], capture_output=True, text=True, timeout=30, check=False,
                          env={"PATH": "/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES": "all",
                               "SPARK_SIM_ROOT": str(tmp_path / "root"), "HF_HUB_OFFLINE": "1"})
    assert "Hybrid radix cache initialized" in proc.stdout and HYBRID not in proc.stdout, proc.stdout[-2000:]
    assert "Capture cuda graph failed" in proc.stdout

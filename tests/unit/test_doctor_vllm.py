"""The doctor on a vLLM group: vLLM's launch arguments read from its unit, its names in the texts, and its failure
fingerprints mapped to their cause and remedy.

The log lines are vLLM's wording (torch.distributed, vLLM's shm_broadcast.py, pynccl.py, kv_cache_utils.py, CUDA),
and the last tests feed the doctor what the vLLM stand-in itself prints for a failure, so the stand-in and the
catalogue cannot drift apart. The remedies asserted are written out from deployment-facts.md and
vllm-and-gateway.md, not read from the catalogue.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.lib.roles import filter_plugin, flag_model
from tests.unit import test_sglang_standins as sglang_tests
from tests.unit.test_doctor_catalogue import NOW, UNIT, ids, node
from tests.unit.test_sglang_standins import free_port, read_until, stop
from tests.unit.test_vllm_standins import FABRIC_ENV, knob_root, serve_args, start

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "tests" / "standins" / "lib" / "vllm_server.py"
doctor = filter_plugin("doctor")
VLLM = flag_model("vllm")
SGLANG = flag_model("sglang")
ALL_ENTRIES = yaml.safe_load((REPO / "roles/doctor/vars/main.yml").read_text())["__doctor_fingerprints"]
CATALOGUE = doctor.catalogue_for(ALL_ENTRIES, "vllm")
model_dir = sglang_tests.model_dir

HEAD_IP, WORKER_IP = "192.168.100.10", "192.168.100.11"
LAUNCHER = ("-c \"import os,runpy,sys; os.environ['VLLM_API_KEY']=open(sys.argv[1]).read().strip(); "
            "sys.argv=['vllm','serve']+sys.argv[2:]; runpy.run_module('vllm.entrypoints.cli.main',run_name='__main__',"
            "alter_sys=True)\" /run/spark-llm/api-key")
ARGS = ("{model} --trust-remote-code --tensor-parallel-size 2 --reasoning-parser {parser} --tool-call-parser glm47 "
        "--enable-auto-tool-choice --chat-template-content-format string --gpu-memory-utilization 0.84 "
        "--max-model-len {context} --max-num-seqs {seqs} --enforce-eager --nnodes 2 --node-rank 1 "
        "--master-addr {master} --master-port 20000 --headless")


def exec_start(*, keyed=True, model="/models/glm53", parser="deepseek_r1", context=65536, seqs=2, master=HEAD_IP):
    """The ExecStart systemd shows for a worker's unit as server.yml renders it (with a key, or without)."""
    program = f"--entrypoint python3 vllm/vllm-openai:glm51-cu130 {LAUNCHER}" if keyed else \
        "--entrypoint vllm vllm/vllm-openai:glm51-cu130 serve"
    args = ARGS.format(model=model, parser=parser, context=context, seqs=seqs, master=master)
    return ("{ path=/usr/bin/docker ; argv[]=/usr/bin/docker run --rm --name spark-llm --gpus all --network host "
            "--memory 120g --memory-swap 120g --volume /opt/models/glm53:/models/glm53:ro "
            f"--env-file /etc/spark-llm/spark-llm.env {program} {args} ; ignore_errors=no ; }}")


def deployed(**kw):
    return doctor.deployed_values({"ExecStart": exec_start(**kw)}, None, VLLM)


def ctx(dep=None, **changes):
    """The role's __doctor_ctx for a vLLM worker, with the engine's names as the role derives them."""
    dep = dep or deployed()
    base = {"flags": dep["flags"], "overrides": dep["overrides"], "deployed": dep, "container_memory": dep["memory"],
            "unit": UNIT, "model_dir": "/opt/models/glm53", "image": "vllm/vllm-openai:glm51-cu130",
            "fabric_interface": "enp1s0f1np1", "fabric_ip": WORKER_IP, "head_fabric_ip": HEAD_IP,
            "dist_init_port": 20000, "expected_mtu": 9000, "mtu": 9000, "route": f"{HEAD_IP} via enp1s0f1np1",
            "env_host_ip": WORKER_IP, "env_ib_hca": "NCCL_IB_HCA unset", "stall_seconds": 900, "gpu_processes": "none",
            "gpu_memory_gib": 119.7, "runtime_overhead_gib": 4, "memory_margin_gib": 1, "default_mem_fraction": 0.84,
            "min_mem_fraction": 0.5, **doctor.engine_terms(VLLM)}
    base.update(changes)
    return base


# --- reading vLLM's unit ------------------------------------------------------------------------------------


@pytest.mark.parametrize("keyed", [True, False], ids=["key file launcher", "vllm serve"])
def test_the_positional_model_and_vllms_flags_are_read_from_the_unit(keyed):
    dep = deployed(keyed=keyed)
    assert dep["installed"]
    assert dep["flags"]["model"] == "/models/glm53"
    assert dep["flags"]["max-num-seqs"] == "2" and dep["flags"]["headless"] is True
    assert dep["rendezvous"] == HEAD_IP and dep["refused"] == []
    # The rendered unit is the flag model's: nothing to report as an override.
    assert dep["overrides"] == {}
    recorded = json.dumps(ARGS.format(model="/models/glm53", parser="deepseek_r1", context=65536, seqs=2,
                                      master=HEAD_IP).split())
    assert doctor.deployed_values({"ExecStart": exec_start(keyed=keyed)}, recorded, VLLM)["hand_edited"] == []
    # A hub repo id put in the unit by hand, in the model's place: server-args.json does not record it.
    edited = doctor.deployed_values({"ExecStart": exec_start(keyed=keyed, model="LibertAIDAI/GLM-5.3-Flash-NVFP4")},
                                    recorded, VLLM)
    assert edited["hand_edited"] == ["--model"], edited["hand_edited"]


def test_the_engines_names_come_from_the_flag_model():
    assert doctor.engine_terms(VLLM) == {
        "engine": "vllm", "label": "vLLM", "host_ip_env": "VLLM_HOST_IP", "memory_flag": "gpu-memory-utilization",
        "context_flag": "max-model-len", "concurrency_flag": "max-num-seqs", "rendezvous_flag": "master-addr",
        "rendezvous_form": "address"}
    assert doctor.engine_terms(SGLANG)["host_ip_env"] == "SGLANG_HOST_IP"
    assert doctor.engine_terms(SGLANG)["rendezvous_flag"] == "dist-init-addr"


def test_each_engine_gets_its_own_entries_and_the_neutral_ones():
    vllm, sglang = {e["id"] for e in CATALOGUE}, {e["id"] for e in doctor.catalogue_for(ALL_ENTRIES, "sglang")}
    own = {"rendezvous_store_timeout", "nccl_init_hang", "shm_broadcast_block", "no_kernel_image", "kv_cache_too_small"}
    assert own <= vllm and not own & sglang
    assert {"hybrid_state_cache", "tilelang_shared_memory"} <= sglang - vllm
    assert {"oom_killed", "distributed_timeout", "env_host_ip", "rendezvous_address", "flag_refused"} <= vllm & sglang


# --- vLLM's fingerprints --------------------------------------------------------------------------------------


STORE = "torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. 1/2 clients joined."


def peer(rendezvous, running=True):
    return {"host": "spark-1", "rank": 1, "why": "", "state": "active/running", "rendezvous": rendezvous,
            "runs": [{"id": "w", "start": NOW - 2000, "end": NOW, "failed": False, "running": running}]}


def test_a_store_timeout_names_the_workers_master_address_and_the_worker_its_own():
    head = node(["(Worker_TP0 pid=1) INFO Rank 0 waiting for 1 other rank(s) at 0.0.0.0:20000", STORE])
    head["peers"] = [peer("127.0.0.1")]
    head_ctx = ctx(deployed(master=HEAD_IP), fabric_ip=HEAD_IP, env_host_ip=HEAD_IP)
    found = doctor.findings(head, CATALOGUE, head_ctx)
    # vLLM's own entry supersedes the engine-neutral timeout the same line matches.
    assert ids(found) == ["rendezvous_store_timeout"], ids(found)
    f = found[0]
    assert "spark-1 (rank 1) joins at 127.0.0.1" in f["cause"] and "vLLM's default is 127.0.0.1" in f["cause"]
    assert "--master-addr 192.168.100.10:20000" in f["cause"]
    for part in ("head's spark_fabric_ip", "server_dist_init_port (20000)", "playbooks/server.yml",
                 "playbooks/restart.yml"):
        assert part in f["remedy"], (part, f["remedy"])

    # The worker whose unit was edited to a loopback master address: its own fault, named from the unit.
    worker = node(["torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying "
                   "to connect to (127.0.0.1, 20000)."])
    found = {f["id"]: f for f in doctor.findings(worker, CATALOGUE, ctx(deployed(master="127.0.0.1")))}
    assert set(found) == {"rendezvous_address", "distributed_timeout"}, sorted(found)
    assert found["rendezvous_address"]["evidence"] == (
        "--master-addr 127.0.0.1 in the unit: rank 0 (the head) listens on its fabric address 192.168.100.10; a "
        "loopback address points this rank at its own node")
    assert "Fabric problems on this node: --master-addr 127.0.0.1" in found["distributed_timeout"]["cause"]
    assert "VLLM_HOST_IP must be this node's" in found["distributed_timeout"]["remedy"]


def test_a_store_timeout_with_the_worker_not_running_is_the_workers_absence():
    head = node([STORE])
    head["peers"] = [{**peer(HEAD_IP), "runs": []}]
    found = doctor.findings(head, CATALOGUE, ctx(fabric_ip=HEAD_IP, env_host_ip=HEAD_IP))
    assert ids(found) == ["peer_absent"], ids(found)


def test_nccls_communicator_setup_silent_past_the_stall_time_is_the_unpinned_hca():
    lines = ["(Worker_TP1 pid=7) INFO 12-04 10:00:00 [parallel_state.py:1208] rank 1 in world size 2 is assigned as "
             "DP rank 0, PP rank 0, TP rank 1, EP rank 1",
             "spark-1:7:7 [0] NCCL INFO NCCL_IB_HCA unset: using every device",
             "(Worker_TP1 pid=7) INFO 12-04 10:00:01 [pynccl.py:103] vLLM is using nccl==2.27.7"]
    hung = node(lines, active="active", age=1000)
    hung["peers"] = [peer(HEAD_IP)]
    found = doctor.findings(hung, CATALOGUE, ctx())
    assert ids(found) == ["nccl_init_hang"], ids(found)
    f = found[0]
    assert "vLLM is using nccl==2.27.7" in f["evidence"]
    assert "env file: NCCL_IB_HCA unset" in f["cause"] and "every peer's rank was running then" in f["cause"]
    for part in ("playbooks/fabric.yml", "NCCL_IB_HCA", "playbooks/server.yml", "playbooks/restart.yml"):
        assert part in f["remedy"], (part, f["remedy"])
    # Not before the stall time, and not once the start went on.
    assert doctor.findings(node(lines, active="active", age=5), CATALOGUE, ctx()) == []
    went_on = lines + ["(Worker_TP1 pid=7) INFO 12-04 10:00:09 [gpu_model_runner.py:2602] Starting to load model "
                       "/models/glm53..."]
    assert doctor.findings(node(went_on, active="active", age=1000), CATALOGUE, ctx()) == []


def test_a_lost_broadcast_block_is_systemd_loginds_remove_ipc():
    line = ("(Worker_TP1 pid=7) WARNING 12-04 10:02:00 [shm_broadcast.py:466] No available shared memory broadcast "
            "block found in 60 seconds. This typically happens when some processes are hanging or doing some "
            "time-consuming work (e.g. compilation, weight/kv cache quantization).")
    found = doctor.findings(node([line, line], active="active", age=1), CATALOGUE, ctx())
    assert ids(found) == ["shm_broadcast_block"]
    assert "RemoveIPC=yes" in found[0]["cause"]
    for part in ("RemoveIPC=no", "/etc/systemd/logind.conf.d/", "systemctl restart systemd-logind",
                 "playbooks/restart.yml"):
        assert part in found[0]["remedy"], (part, found[0]["remedy"])


def test_a_glm45_reasoning_parser_in_the_unit_is_the_silent_drop():
    found = doctor.findings(node([], active="active"), CATALOGUE, ctx(deployed(parser="glm45")))
    assert ids(found) == ["flag_refused"]
    assert "--reasoning-parser glm45: vLLM's glm45 reasoning parser silently drops the whole reply" in \
        found[0]["evidence"]
    assert "for vLLM" in found[0]["cause"] and "playbooks/server.yml" in found[0]["remedy"]


def test_a_wrong_vllm_host_ip_is_named_by_vllms_variable():
    raw = {"env_rc": 0, "env_text": f"VLLM_HOST_IP={HEAD_IP}\nHF_HUB_OFFLINE=1\nNCCL_SOCKET_IFNAME=enp1s0f1np1\n"}
    found = doctor.findings(node([], active="active", raw=raw), CATALOGUE, ctx(env_host_ip=HEAD_IP))
    assert ids(found) == ["env_host_ip"]
    assert found[0]["evidence"] == f"VLLM_HOST_IP={HEAD_IP} but spark_fabric_ip is {WORKER_IP}"
    assert found[0]["cause"] == f"The env file says VLLM_HOST_IP={HEAD_IP}; spark_fabric_ip is {WORKER_IP}."


def test_an_oom_kill_remedy_speaks_of_the_gpu_memory_utilization():
    events = [{"t": NOW - 5, "action": "oom", "exit_code": None, "signal": None, "name": "spark-llm"}]
    dep = doctor.deployed_values({"ExecStart": exec_start().replace("--memory 120g", "--memory 96g")}, None, VLLM)
    f = doctor.findings(node([], status=137, events=events), CATALOGUE, ctx(dep))[0]
    assert f["id"] == "oom_killed"
    assert "follows gpu-memory-utilization, not max-num-seqs" in f["remedy"]
    assert "lower gpu-memory-utilization 0.84 -> 0.76" in f["remedy"]
    assert f["alternative"] == {"server_flag_overrides": {"gpu-memory-utilization": 0.76}}


KV = ("ValueError: The model's max seq len ({}) is larger than the maximum number of tokens that can be stored in KV "
      "cache ({}). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")


@pytest.mark.parametrize(("seqs", "context", "tokens", "apply"), [
    (8, 65536, 49954, {"max-num-seqs": 4}),
    # max-num-seqs 1 is a deployed override too: kept.
    (1, 131072, 98304 + 500, {"max-num-seqs": 1, "max-model-len": 98304}),
], ids=["concurrency first", "then context"])
def test_a_context_the_kv_cache_cannot_hold_lowers_concurrency_first_then_context(seqs, context, tokens, apply):
    dep = deployed(seqs=seqs, context=context)
    found = doctor.findings(node([KV.format(context, tokens)]), CATALOGUE, ctx(dep))
    assert ids(found) == ["kv_cache_too_small"]
    f = found[0]
    assert f["apply"] == {"server_flag_overrides": apply}
    assert f"--max-num-seqs {seqs} sequences" in f["cause"] and f"--max-model-len {context} tokens" in f["cause"]
    assert "Lower max-num-seqs first, then max-model-len" in f["remedy"]


# --- what the vLLM stand-in prints, through the catalogue ---------------------------------------------------


def standin_failure(tmp_path, model, *, knobs=None, gpu=None, nnodes=1, **flags):
    """Run the stand-in vLLM to its end, as a failed rank's journal."""
    root = knob_root(tmp_path, vllm={"rendezvous_timeout": 1, **(knobs or {})}, gpu=gpu)
    args = serve_args(model, 1, nnodes=nnodes, master_port=free_port() if nnodes > 1 else None, **flags)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NVIDIA_VISIBLE_DEVICES": "all", **FABRIC_ENV,
           "SPARK_SIM_ROOT": str(root)}
    proc = subprocess.run([sys.executable, str(SERVER), *args], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 1, proc.stdout[-2000:]
    return node(proc.stdout.splitlines()), args


@pytest.mark.parametrize(("case", "expected"), [
    ({"max_num_seqs": "8"}, "kv_cache_too_small"),
    ({"knobs": {"sparse_mla_sm121": False}, "gpu": {"compute_cap": "12.1"}}, "no_kernel_image"),
    ({"nnodes": 2}, "rendezvous_store_timeout"),
], ids=["8 x 64k", "upstream image on sm_121", "rank 0 alone"])
def test_what_the_vllm_standin_prints_maps_to_its_finding(tmp_path, model_dir, case, expected):
    n, args = standin_failure(tmp_path, model_dir, **case)
    dep = doctor.deployed_values({"ExecStart": "/usr/bin/docker run --entrypoint vllm vllm/vllm-openai:x "
                                               + " ".join(args)}, None, VLLM)
    found = doctor.findings(n, CATALOGUE, ctx(dep, head_fabric_ip="127.0.0.1"))
    assert ids(found) == [expected], [(f["id"], f["evidence"]) for f in found]
    if expected == "kv_cache_too_small":
        assert found[0]["apply"]["server_flag_overrides"]["max-num-seqs"] == 4
        # The remedy's figures are ones the stand-in then starts with: past the KV cache check.
        proc = start(tmp_path, serve_args(model_dir, free_port(), max_num_seqs="4"))
        try:
            assert "GPU KV cache size" in read_until(proc, "Maximum concurrency for 65,536 tokens per request")
        finally:
            stop(proc)

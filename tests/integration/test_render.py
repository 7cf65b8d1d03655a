"""playbooks/render.yml: what a deployment would install, written on the controller.

Runs the real playbook through ansible-runner against the example inventory
(no node is reachable from here, so a run that tried to contact one would fail).
"""

from __future__ import annotations

import json
import re
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from tests.lib.playbook import REPO, SITE_CHECK, run_playbook
from tests.lib.seed import ADDED_FLAGS, FACTS, SEED_FLAGS, facts_launch_args
from tests.lib.unit_file import exec_words, launch_args

INVENTORY = REPO / "inventory" / "spark"
PLAYBOOK = "playbooks/render.yml"

# deployment-facts.md, "The field-tested launch command", in its order
# (model-path and tp-size are derived and checked separately).
SEED = SEED_FLAGS
NODES = {"spark-0": ("0", "192.168.100.10"), "spark-1": ("1", "192.168.100.11")}


def pairs(args: list[str]) -> list[tuple[str, str | None]]:
    out = []
    for token in args:
        if token.startswith("--"):
            out.append((token, None))
        else:
            out[-1] = (out[-1][0], token)
    return out


def render(out: Path, extravars: dict | None = None, **kwargs):
    return run_playbook(PLAYBOOK, INVENTORY, extravars={"server_render_dir": str(out), **(extravars or {})}, **kwargs)


def assert_refused_before_any_change(result, out: Path, *fragments: str):
    assert result.rc != 0
    failed_tasks = {d["task"] for d in result.failed}
    assert failed_tasks == {SITE_CHECK}, failed_tasks
    assert result.changed_before_first_failure() == []
    assert result.changed == []
    message = result.failure_messages()
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message}"
    assert not out.exists() or not any(out.rglob("*")), list(out.rglob("*"))


def _ssh_inventory(tmp_path: Path) -> Path:
    """The example inventory whose hosts say ssh to a closed port on this machine: any connection attempt
    would be UNREACHABLE at once. Render beats it with a local connection, and renders what it would from
    the example itself (the connection variables are no input of the rendered files)."""
    inv, hosts = _inventory_copy(tmp_path)
    for group in ("spark_head", "spark_workers"):
        for host_vars in hosts["spark"]["children"][group]["hosts"].values():
            host_vars.update(ansible_connection="ssh", ansible_host="127.0.0.1", ansible_port=1)
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inv


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The example site rendered twice into one directory (the second run has nothing to change), from an
    inventory that says ssh (test_render_contacts_no_node_even_when_the_inventory_says_ssh reads the runs)."""
    inv = _ssh_inventory(tmp_path_factory.mktemp("ssh-inventory"))
    out = tmp_path_factory.mktemp("rendered")
    first = run_playbook(PLAYBOOK, inv, extravars={"server_render_dir": str(out)})
    assert first.rc == 0, first.stdout
    second = run_playbook(PLAYBOOK, inv, extravars={"server_render_dir": str(out)})
    return out, first, second


def test_render_writes_three_files_per_host(rendered):
    out, first, _ = rendered
    assert sorted(p.name for p in out.iterdir()) == sorted(NODES)
    for host in NODES:
        assert sorted(p.name for p in (out / host).iterdir()) == ["server-args.json", "spark-llm.env", "spark-llm.service"]
    assert first.failed == []


def test_render_contacts_no_node_even_when_the_inventory_says_ssh(rendered):
    # The module's renders come from an inventory whose hosts say ssh to a closed port (_ssh_inventory).
    out, first, second = rendered
    assert first.rc == 0, first.stdout
    assert first.task_events("runner_on_unreachable") == [] and second.task_events("runner_on_unreachable") == []
    assert sorted(p.name for p in out.iterdir()) == sorted(NODES)


@pytest.mark.parametrize("host", sorted(NODES))
def test_server_args_are_the_seed_flag_by_flag_plus_topology(rendered, host):
    out, _, _ = rendered
    args = json.loads((out / host / "server-args.json").read_text())
    assert all(isinstance(a, str) for a in args)
    got = pairs(args)
    rank, _ = NODES[host]
    assert got[0] == ("--model-path", "/models/glm53")
    assert ("--tp-size", "2") in got
    seed_only = [p for p in got if p[0] in {name for name, _ in SEED}]
    for expected, actual in zip(SEED, seed_only, strict=True):
        assert actual == expected
    # The collection's own additions come right after the seed (SGLang's /metrics for the monitoring role).
    nnodes = got.index(("--nnodes", "2"))
    assert got[nnodes - len(ADDED_FLAGS):nnodes] == ADDED_FLAGS
    tail = dict(got[nnodes:])
    assert tail == {
        "--nnodes": "2",
        "--node-rank": rank,
        "--dist-init-addr": "192.168.100.10:20000",
        "--host": "0.0.0.0",  # noqa: S104 - rendered text, nothing binds here
        "--port": "30000",
    }
    assert len(got) == 1 + 1 + len(SEED) + len(ADDED_FLAGS) + len(tail)


def test_seed_list_of_this_test_is_the_facts_file_one():
    if not FACTS.exists():
        pytest.skip(f"{FACTS} is not beside this checkout")
    facts = [p for p in pairs(facts_launch_args()) if p[0] not in ("--model-path", "--tp-size")]
    assert facts == SEED


@pytest.mark.parametrize("host", sorted(NODES))
def test_unit_runs_exactly_the_json_args_with_what_a_gb10_rank_needs(rendered, host):
    out, _, _ = rendered
    unit = (out / host / "spark-llm.service").read_text()
    args = json.loads((out / host / "server-args.json").read_text())
    assert unit.startswith("#\n# Ansible managed\n")
    assert launch_args(unit) == args
    words = exec_words(unit)
    assert words[:2] == ["/usr/bin/docker", "run"]
    docker_opts = " ".join(words[: words.index("lmsysorg/sglang:glm-5.3-flash-arm64")])
    for option in (
        "--gpus all", "--network host", "--ipc host", "--shm-size 32g", "--ulimit memlock=-1",
        "--ulimit stack=67108864", "--cap-add IPC_LOCK", "--device /dev/infiniband",
        "--memory 120g --memory-swap 120g", "--oom-score-adj -500", "--volume /opt/models/glm53:/models/glm53:ro",
        "--env-file /etc/spark-llm/spark-llm.env", "--rm --name spark-llm",
    ):
        assert option in docker_opts, option
    assert " -d " not in f" {docker_opts} " and "--detach" not in docker_opts
    # The old container goes, then the page cache (dirty pages written first): in that order, before the start.
    assert re.findall(r"^ExecStartPre=.*$", unit, re.M) == [
        "ExecStartPre=-/usr/bin/docker rm -f spark-llm",
        "ExecStartPre=+/bin/sh -c 'sync && echo 3 > /proc/sys/vm/drop_caches'"]
    assert "ExecStop=-/usr/bin/docker stop --time 60 spark-llm" in unit
    assert "SuccessExitStatus=143\n" in unit, "137 (an OOM kill) must stay a failure"
    assert re.search(r"^TimeoutStartSec=3600$", unit, re.M)
    assert re.search(r"^After=network-online.target docker.service$", unit, re.M)
    assert re.search(r"^Wants=network-online.target docker.service$", unit, re.M)
    # Supervised (the default): the group supervisor restarts the whole group, never one rank alone.
    assert re.search(r"^Restart=no$", unit, re.M) and "RestartSec=" not in unit
    assert re.search(r"^WantedBy=multi-user.target$", unit, re.M)


@pytest.fixture(scope="module")
def off_switches(tmp_path_factory):
    """One render with the supervisor off, no API key and no page-cache drop: three settings of their own, each
    read by its test (the restart policy and the drop from the unit; the key's absence from the env file and
    the launcher)."""
    out = tmp_path_factory.mktemp("unsupervised") / "rendered"
    result = render(out, {"supervisor_enabled": False, "server_allow_unauthenticated": True,
                          "server_drop_page_cache": False})
    return out, result


def test_without_the_supervisor_each_rank_restarts_itself(off_switches):
    out, result = off_switches
    assert result.rc == 0, result.stdout[-3000:]
    unit = (out / "spark-1" / "spark-llm.service").read_text()
    assert re.search(r"^Restart=on-failure$", unit, re.M) and re.search(r"^RestartSec=30$", unit, re.M)
    assert re.search(r"^StartLimitBurst=3$", unit, re.M)


def test_without_the_page_cache_drop_the_unit_only_removes_the_old_container(off_switches):
    out, result = off_switches
    assert result.rc == 0, result.stdout[-3000:]
    unit = (out / "spark-1" / "spark-llm.service").read_text()
    assert re.findall(r"^ExecStartPre=.*$", unit, re.M) == ["ExecStartPre=-/usr/bin/docker rm -f spark-llm"]


@pytest.mark.parametrize("host", sorted(NODES))
def test_env_file_carries_fabric_facts_and_is_private(rendered, host):
    out, _, _ = rendered
    path = out / host / "spark-llm.env"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = path.read_text().splitlines()
    assert lines[1] == "# Ansible managed"
    env = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    assert env == {
        "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
        "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
        "TP_SOCKET_IFNAME": "enp1s0f1np1",
        "SGLANG_HOST_IP": NODES[host][1],
        "HF_HUB_OFFLINE": "1",
        # NCCL's choice of network at each start, in the journal.
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
    }


def test_serving_without_a_key_needs_allow_unauthenticated(off_switches):
    out, result = off_switches
    assert result.rc == 0, result.stdout[-3000:]
    env = (out / "spark-0" / "spark-llm.env").read_text()
    unit = (out / "spark-0" / "spark-llm.service").read_text()
    assert "API_KEY" not in env and "python3 -m sglang.launch_server" in unit and "python3 -c" not in unit
    assert "spark-llm.key" not in unit and "/run/spark-llm/api-key" not in unit


# vLLM: this version renders its units (and refuses to deploy them). ONE render of the example site with the engine
# switched, read by the tests of its files; ONE refusal with several bad vLLM settings at once.
VLLM_IMAGE = "vllm/vllm-openai:glm51-cu130"


@pytest.fixture(scope="module")
def vllm_rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm") / "rendered"
    return out, render(out, {"spark_engine": "vllm"})


@pytest.mark.parametrize("host", sorted(NODES))
def test_vllm_renders_its_units_for_both_nodes_without_contacting_them(vllm_rendered, host):
    out, result = vllm_rendered
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    assert result.task_events("runner_on_unreachable") == []
    assert sorted(p.name for p in (out / host).iterdir()) == ["server-args.json", "spark-llm.env", "spark-llm.service"]
    rank, fabric_ip = NODES[host]
    args = json.loads((out / host / "server-args.json").read_text())
    # vllm serve <dir>: the container path of the checkpoint first, without a flag name.
    assert args[0] == "/models/glm53"
    serving = ["--trust-remote-code", "--tensor-parallel-size", "2", "--reasoning-parser", "deepseek_r1",
               "--tool-call-parser", "glm47", "--enable-auto-tool-choice", "--chat-template-content-format", "string",
               "--gpu-memory-utilization", "0.84", "--max-model-len", "65536", "--max-num-seqs", "2", "--enforce-eager"]
    topology = ["--nnodes", "2", "--node-rank", rank, "--master-addr", "192.168.100.10", "--master-port", "20000"]
    # The head serves HTTP; the worker runs headless.
    http = ["--host", "0.0.0.0", "--port", "30000"] if rank == "0" else ["--headless"]  # noqa: S104 - rendered text
    assert args == ["/models/glm53", *serving, *topology, *http]

    unit = (out / host / "spark-llm.service").read_text()
    assert launch_args(unit) == args
    words = exec_words(unit)
    image = words.index(VLLM_IMAGE)
    # The image's own entrypoint (vllm serve) is replaced by the keyed launcher: the key never reaches an argv.
    assert words[image - 2:image] == ["--entrypoint", "python3"] and words[image + 1] == "-c"
    assert "os.environ['VLLM_API_KEY']=open(sys.argv[1])" in words[image + 2] and "'vllm','serve'" in words[image + 2]
    # ... from the rank's key file, mounted read-only: its container path is the launcher's own argument.
    assert words[image + 3] == "/run/spark-llm/api-key"
    assert "--api-key" not in words and "sglang" not in unit.lower()
    for option in ("--gpus all", "--network host", "--ipc host", "--shm-size 32g", "--ulimit memlock=-1",
                   "--cap-add IPC_LOCK", "--device /dev/infiniband", "--volume /opt/models/glm53:/models/glm53:ro",
                   "--volume /etc/spark-llm/spark-llm.key:/run/spark-llm/api-key:ro",
                   "--env-file /etc/spark-llm/spark-llm.env"):
        assert option in " ".join(words[:image]), option
    description = re.search(r"^Description=(.*)$", unit, re.M).group(1)
    assert description == f"vLLM GLM-5.3-Flash-NVFP4 rank {rank} of 2 (TP=2)" + ("" if rank == "0" else ", headless")
    assert re.search(r"^Documentation=https://docs.vllm.ai/$", unit, re.M)

    path = out / host / "spark-llm.env"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    env = dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))
    assert env == {
        "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
        "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
        "TP_SOCKET_IFNAME": "enp1s0f1np1",
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "VLLM_HOST_IP": fabric_ip,
        "NCCL_CUMEM_ENABLE": "0",
        "HF_HUB_OFFLINE": "1",
    }


# Several bad vLLM settings at once: each fragment list must be in the refusal.
VLLM_REFUSALS = {
    "reasoning-parser": ["server_flag_overrides['reasoning-parser'] = 'glm45'", "silently drops the whole reply",
                         "Fix: set 'reasoning-parser' to 'deepseek_r1'"],
    "enable-auto-tool-choice": ["server_flag_overrides['enable-auto-tool-choice'] = false", "HTTP 400",
                                "Fix: remove 'enable-auto-tool-choice'"],
    "distributed-executor-backend": ["server_flag_overrides['distributed-executor-backend'] = 'ray'", "ship no Ray",
                                     "Fix: remove 'distributed-executor-backend'"],
    "gpu-memory-utilization": ["server_flag_overrides['gpu-memory-utilization'] = 0.9", "between 0.5 and 0.88"],
    "tensor-parallel-size": ["server_flag_overrides['tensor-parallel-size'] = 4", "topology flag"],
    "max-num-seq": ["server_flag_overrides['max-num-seq'] = 1", "not a vllm serve flag",
                    "did you mean 'max-num-seqs'"],
    "server_image": ["server_image = 'lmsysorg/sglang:glm-5.3-flash-arm64'", "names sglang",
                     f"Fix: leave server_image empty for vLLM's {VLLM_IMAGE}"],
}


def test_vllm_guard_rails_refuse_at_validation_before_any_change(tmp_path):
    out = tmp_path / "r"
    result = render(out, {
        "spark_engine": "vllm",
        "server_image": "lmsysorg/sglang:glm-5.3-flash-arm64",
        "server_flag_overrides": {"reasoning-parser": "glm45", "enable-auto-tool-choice": False,
                                  "distributed-executor-backend": "ray", "gpu-memory-utilization": 0.9,
                                  "tensor-parallel-size": 4, "max-num-seq": 1},
    })
    assert_refused_before_any_change(result, out, "Refusing to deploy vLLM on", *(
        fragment for fragments in VLLM_REFUSALS.values() for fragment in fragments))
    assert {d["host"] for d in result.failed} == set(NODES)
    for host in NODES:
        own = "\n".join(str(d["res"].get("msg", "")) for d in result.failed if d["host"] == host)
        assert own.count("\n- ") == len(VLLM_REFUSALS), own


def test_second_render_changes_nothing(rendered):
    _, first, second = rendered
    assert first.changed, "the first render must write files"
    assert second.rc == 0
    assert second.changed == []


def test_check_mode_writes_nothing(tmp_path):
    out = tmp_path / "fresh"
    result = render(out, check=True, diff=True)
    assert result.rc == 0, result.stdout
    assert not out.exists()


def test_check_mode_on_a_current_render_reports_no_change(rendered):
    out, _, _ = rendered
    result = render(out, check=True)
    assert result.rc == 0
    assert result.changed == []


def test_overrides_are_reflected_and_a_change_is_reported(rendered, tmp_path):
    # The render of the defaults to change: a copy of the module's (modes kept), as a render of its own made it.
    out = tmp_path / "r"
    shutil.copytree(rendered[0], out)
    result = render(out, {
        "server_flag_overrides": {
            "context-length": 32768,
            "disable-shared-experts-fusion": False,
            "enable-cache-report": True,
        },
        "server_acknowledge_backend_change": True,
        "server_api_key": "sk-render-test-key-0123456789abcdef",
        "server_nccl_ib_hca": ["mlx5_0", "mlx5_1"],
        "server_render_infiniband": False,
    })
    assert result.rc == 0, result.stdout
    changed_tasks = {d["task"] for d in result.changed}
    assert "Render the node's unit, environment file and launch arguments" in changed_tasks
    for host in NODES:
        args = json.loads((out / host / "server-args.json").read_text())
        assert args[args.index("--context-length") + 1] == "32768"
        assert "--disable-shared-experts-fusion" not in args
        assert args[-1] == "--enable-cache-report"
        unit = (out / host / "spark-llm.service").read_text()
        assert launch_args(unit) == args
        assert "/dev/infiniband" not in unit
        env = (out / host / "spark-llm.env").read_text()
        assert "NCCL_IB_HCA=mlx5_0,mlx5_1\n" in env
        assert "API_KEY" not in env, "docker records the env file in the container's configuration"
        # With a key the launcher reads the rank's key file, mounted read-only, not argv or the environment.
        assert "--volume /etc/spark-llm/spark-llm.key:/run/spark-llm/api-key:ro" in unit
        assert re.search(r'python3 -c "[^"]*open\(sys\.argv\[1\]\)[^"]*" /run/spark-llm/api-key \\\n', unit)
    # The key is in no rendered file and in no event the run produced.
    assert not [p for p in out.rglob("*") if p.is_file() and "sk-render-test-key-0123456789abcdef" in p.read_text()]
    assert "sk-render-test-key-0123456789abcdef" not in json.dumps(result.events)


# Guard rails through the real playbook: (extravars, fragments of the refusal).
GUARD_RAILS = {
    "tool-call-parser glm": (
        {"server_flag_overrides": {"tool-call-parser": "glm"}},
        ["server_flag_overrides['tool-call-parser'] = 'glm'", '"tool_calls": null', "glm47"],
    ),
    "reasoning-parser missing": (
        {"server_flag_overrides": {"reasoning-parser": None}},
        ["drops --reasoning-parser", "</think>", "glm45"],
    ),
    "reasoning-parser glm47": (
        {"server_flag_overrides": {"reasoning-parser": "glm47"}},
        ["['reasoning-parser'] = 'glm47'", "differ on purpose"],
    ),
    "kv cache fp8 with tilelang": (
        {"server_flag_overrides": {"kv-cache-dtype": "fp8_e4m3"}},
        ["['kv-cache-dtype'] = 'fp8_e4m3'", "tilelang", "bfloat16"],
    ),
    "backend change without acknowledgement": (
        {"server_flag_overrides": {"moe-runner-backend": "triton", "attention-backend": "fa3"}},
        ["['moe-runner-backend'] = 'triton'", "['attention-backend'] = 'fa3'", "server_acknowledge_backend_change"],
    ),
    "shared experts fusion dropped": (
        {"server_flag_overrides": {"disable-shared-experts-fusion": False}},
        ["['disable-shared-experts-fusion'] = false", "server_acknowledge_backend_change"],
    ),
    "numbers out of range or not numeric": (
        {"server_flag_overrides": {"context-length": "64k", "max-running-requests": 0, "mem-fraction-static": 1.5}},
        ["['context-length'] = '64k'", "['max-running-requests'] = 0", "['mem-fraction-static'] = 1.5"],
    ),
    "model dir is a repo id": (
        {"server_model_dir": "LibertAIDAI/GLM-5.3-Flash-NVFP4"},
        ["server_model_dir = 'LibertAIDAI/GLM-5.3-Flash-NVFP4'", "processor_config.json"],
    ),
    "model dir relative": (
        {"server_model_dir": "glm53"},
        ["server_model_dir = 'glm53'", "absolute"],
    ),
    "gid index out of range": (
        {"server_nccl_ib_gid_index": "300"},
        ["server_nccl_ib_gid_index = '300'", "from 0 to 255"],
    ),
    "model dir with metacharacters": (
        {"server_model_dir": "/opt/models/$(id)"},
        ["server_model_dir = '/opt/models/$(id)'", "metacharacters"],
    ),
    "topology flag in overrides": (
        {"server_flag_overrides": {"tp-size": 4, "node-rank": 0}},
        ["['tp-size'] = 4", "['node-rank'] = 0", "topology flag"],
    ),
    "typo": (
        {"server_flag_overrides": {"max-runing-requests": 1}},
        ["did you mean 'max-running-requests'"],
    ),
}


# The plan judges each host's settings on its own and reports every problem of every host at once, so the
# guard rails go through ONE render of a four-host site (four ranks: --tp-size 4 divides the 64 attention
# heads, so the topology is sound), each case on a host with others that touch other flags and other
# variables; a case is proven by its fragments in its own host's refusal.
GUARD_RAIL_HOSTS = {
    "spark-0": ["tool-call-parser glm", "kv cache fp8 with tilelang", "numbers out of range or not numeric",
                "model dir is a repo id"],
    "spark-1": ["reasoning-parser missing", "backend change without acknowledgement",
                "shared experts fusion dropped", "model dir relative"],
    "spark-2": ["reasoning-parser glm47", "topology flag in overrides", "model dir with metacharacters"],
    "spark-3": ["typo", "gid index out of range"],
}


@pytest.fixture(scope="module")
def guard_rail_render(tmp_path_factory):
    assert sorted(c for cases in GUARD_RAIL_HOSTS.values() for c in cases) == sorted(GUARD_RAILS)
    inv, hosts = _inventory_copy(tmp_path_factory.mktemp("guard-rails"))
    workers = hosts["spark"]["children"]["spark_workers"]["hosts"]
    for n in (2, 3):
        workers[f"spark-{n}"] = {"ansible_host": f"10.0.0.1{n}", "spark_fabric_ip": f"192.168.100.1{n}"}
    every = {**hosts["spark"]["children"]["spark_head"]["hosts"], **workers}
    for host, cases in GUARD_RAIL_HOSTS.items():
        overrides = {}
        for case in cases:
            settings = dict(GUARD_RAILS[case][0])
            overrides.update(settings.pop("server_flag_overrides", {}))
            every[host].update(settings)
        if overrides:
            every[host]["server_flag_overrides"] = overrides
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    out = inv.parent / "r"
    return run_playbook(PLAYBOOK, inv, extravars={"server_render_dir": str(out)}), out


@pytest.mark.parametrize("case", sorted(GUARD_RAILS))
def test_guard_rail_refuses_at_validation_before_any_change(guard_rail_render, case):
    _, fragments = GUARD_RAILS[case]
    result, out = guard_rail_render
    assert_refused_before_any_change(result, out, *fragments, "Fix:")
    host = next(h for h, cases in GUARD_RAIL_HOSTS.items() if case in cases)
    own = "\n".join(str(d["res"].get("msg", "")) for d in result.failed if d["host"] == host)
    for fragment in (*fragments, "Fix:"):
        assert fragment in own, f"{fragment!r} not in {host}'s refusal: {own}"


def _inventory_copy(tmp_path: Path) -> tuple[Path, dict]:
    inv = tmp_path / "inventory"
    shutil.copytree(INVENTORY, inv)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    return inv, hosts


def test_one_bad_host_stops_every_host(tmp_path):
    inv, hosts = _inventory_copy(tmp_path)
    hosts["spark"]["children"]["spark_workers"]["hosts"]["spark-1"]["server_flag_overrides"] = {
        "tool-call-parser": "glm"
    }
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    out = tmp_path / "r"
    result = run_playbook(PLAYBOOK, inv, extravars={"server_render_dir": str(out)})
    assert result.rc != 0
    assert {d["host"] for d in result.failed} == {"spark-1"}
    assert result.changed == []
    assert not out.exists()


SHAPES = {
    "two heads": (lambda h: h["spark"]["children"]["spark_head"]["hosts"].update(
        {"spark-2": {"ansible_host": "10.0.0.12", "spark_fabric_ip": "192.168.100.12"}}),
        "spark_head = ['spark-0', 'spark-2']: it must hold exactly one host"),
    "worker without fabric ip": (lambda h: h["spark"]["children"]["spark_workers"]["hosts"]["spark-1"].pop("spark_fabric_ip"),
                                 "hostvars['spark-1'].spark_fabric_ip = null"),
}


@pytest.fixture(scope="module")
def misshapen_render(tmp_path_factory):
    """One render of an inventory with every shape problem of SHAPES: the plan reports them all at once."""
    inv, hosts = _inventory_copy(tmp_path_factory.mktemp("misshapen"))
    for mutate, _ in SHAPES.values():
        mutate(hosts)
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    out = inv.parent / "r"
    return run_playbook(PLAYBOOK, inv, extravars={"server_render_dir": str(out)}), out


@pytest.mark.parametrize("shape", list(SHAPES), ids=["two heads", "worker without fabric ip"])
def test_inventory_shape_is_validated(misshapen_render, shape):
    _, fragment = SHAPES[shape]
    result, out = misshapen_render
    assert_refused_before_any_change(result, out, fragment, "Fix:")


def _legacy_inventory(tmp_path: Path, site_values: dict) -> Path:
    inv, _hosts = _inventory_copy(tmp_path)
    spark = inv / "group_vars" / "spark.yml"
    values = yaml.safe_load(spark.read_text()) or {}
    spark.write_text(yaml.safe_dump({**values, **site_values}))
    return inv


def test_an_inventory_written_for_the_old_names_renders_the_same_with_one_deprecation_line_each(rendered, tmp_path):
    # The names before the engine-neutral rename (sglang_server_*, sglang_verify_*, ...) still apply.
    old = {"sglang_server_flag_overrides": {"context-length": 32768}, "sglang_server_port": 30123,
           "sglang_server_api_key": "sk-legacy-name-key-0123456789abcdef", "sglang_verify_port": 30123}
    new_out, old_out = tmp_path / "new", tmp_path / "old"
    by_new = run_playbook(PLAYBOOK, _legacy_inventory(tmp_path / "n", {k[len("sglang_"):]: v for k, v in old.items()}),
                          extravars={"server_render_dir": str(new_out)})
    by_old = run_playbook(PLAYBOOK, _legacy_inventory(tmp_path / "o", old), extravars={"server_render_dir": str(old_out)})
    assert by_new.rc == 0 and by_old.rc == 0, by_old.stdout[-3000:]
    for host in NODES:
        for name in ("server-args.json", "spark-llm.service", "spark-llm.env"):
            assert (old_out / host / name).read_text() == (new_out / host / name).read_text(), (host, name)
        args = json.loads((old_out / host / "server-args.json").read_text())
        assert args[args.index("--port") + 1] == "30123" and args[args.index("--context-length") + 1] == "32768"
    lines = [line for line in by_old.stdout.splitlines() if "DEPRECATION WARNING" in line]
    assert sorted(re.findall(r"\]: (sglang_\w+) \(set for spark-0, spark-1\) is now (\w+):", "\n".join(lines))) == \
        sorted((k, k[len("sglang_"):]) for k in old), lines
    assert "DEPRECATION WARNING" not in by_new.stdout
    # The key's value shows nowhere, under either name.
    assert "sk-legacy-name-key-0123456789abcdef" not in json.dumps(by_old.events) + by_old.stdout


def test_an_inventory_that_sets_a_setting_under_both_names_is_refused_before_any_change(tmp_path):
    out = tmp_path / "out"
    result = run_playbook(PLAYBOOK, _legacy_inventory(tmp_path, {"sglang_server_port": 30123, "server_port": 30124}),
                          extravars={"server_render_dir": str(out)})
    assert result.rc != 0
    message = result.stdout
    assert "spark-0 sets both sglang_server_port (its name before 1.1.0) and server_port" in message, message[-3000:]
    assert "Fix: keep only the new name" in message
    assert result.changed == [] and not out.exists()


def test_the_four_node_example_renders_one_tp4_group_whose_ranks_meet_at_the_head(tmp_path):
    out = tmp_path / "r"
    result = run_playbook(PLAYBOOK, REPO / "inventory" / "spark-tp4", extravars={"server_render_dir": str(out)})
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["spark-0", "spark-1", "spark-2", "spark-3"]
    for rank in range(4):
        host = f"spark-{rank}"
        tail = dict(pairs(json.loads((out / host / "server-args.json").read_text())))
        assert (tail["--tp-size"], tail["--nnodes"], tail["--node-rank"]) == ("4", "4", str(rank)), host
        assert tail["--dist-init-addr"] == "192.168.100.10:20000", host
        env = (out / host / "spark-llm.env").read_text()
        assert f"SGLANG_HOST_IP=192.168.100.1{rank}\n" in env, env
        # A group on a switch gets none of a ring's NCCL settings.
        assert "NCCL_CROSS_NIC" not in env and "NCCL_ALGO" not in env, env


def test_the_ring_example_renders_the_node_address_device_and_the_rings_nccl_settings(tmp_path):
    out = tmp_path / "r"
    result = run_playbook(PLAYBOOK, REPO / "inventory" / "spark-ring4", extravars={"server_render_dir": str(out)})
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    for rank in range(4):
        env = (out / f"spark-{rank}" / "spark-llm.env").read_text()
        for line in ("NCCL_SOCKET_IFNAME=fabric0", "NCCL_CROSS_NIC=1", "NCCL_ALGO=Ring", f"SGLANG_HOST_IP=192.168.100.1{rank}"):
            assert f"\n{line}\n" in env, (rank, line, env)


TWO_GROUPS = REPO / "inventory" / "spark-2x2"


def _args(out: Path, host: str) -> dict:
    return dict(pairs(json.loads((out / host / "server-args.json").read_text())))


def test_the_two_group_example_renders_each_group_meeting_at_its_own_head(tmp_path):
    out = tmp_path / "r"
    result = run_playbook(PLAYBOOK, TWO_GROUPS, extravars={"server_render_dir": str(out)})
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    # One group per batch: the second group's run did not prune the first group's renders.
    assert sorted(p.name for p in out.iterdir()) == ["spark-0", "spark-1", "spark-2", "spark-3"]
    # The gateway's unit and settings beside spark-0's own (server_render_dir holds every render).
    assert {"spark-llm-gateway.service", "gateway.json", "spark-llm.service"} <= {p.name for p in (out / "spark-0").iterdir()}
    for head, worker, fabric in (("spark-0", "spark-1", "192.168.100.10"), ("spark-2", "spark-3", "192.168.110.12")):
        for rank, host in enumerate((head, worker)):
            tail = _args(out, host)
            assert (tail["--tp-size"], tail["--nnodes"], tail["--node-rank"]) == ("2", "2", str(rank)), host
            assert tail["--dist-init-addr"] == f"{fabric}:20000", host


def _two_group_copy(tmp_path: Path) -> tuple[Path, dict]:
    inv = tmp_path / "inventory"
    shutil.copytree(TWO_GROUPS, inv)
    return inv, yaml.safe_load((inv / "hosts.yml").read_text())


def _refused_two_group_render(tmp_path: Path, mutate) -> tuple:
    inv, hosts = _two_group_copy(tmp_path)
    mutate(hosts["spark"]["children"])
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    out = tmp_path / "r"
    return run_playbook(PLAYBOOK, inv, extravars={"server_render_dir": str(out)}), out


def test_groups_that_share_a_host_leave_one_out_or_lack_a_head_are_refused_at_once(tmp_path):
    def mutate(spark):
        tp = spark["spark_tp_groups"]["children"]
        tp["replica_b"]["hosts"]["spark-1"] = None
        tp["replica_c"] = {"hosts": {"spark-4": {"ansible_host": "10.0.0.14", "spark_fabric_ip": "192.168.120.14"}}}
        spark["spark_workers"]["hosts"]["spark-4"] = None
        spark["spark_workers"]["hosts"]["spark-5"] = {"ansible_host": "10.0.0.15", "spark_fabric_ip": "192.168.120.15"}

    result, out = _refused_two_group_render(tmp_path, mutate)
    assert_refused_before_any_change(
        result, out,
        "inventory host 'spark-1' is in the TP groups replica_a, replica_b: a host holds one rank of one group. "
        "Fix: keep spark-1 in one child group of spark_tp_groups",
        "inventory host 'spark-5' is in spark but in no child group of spark_tp_groups (replica_a, replica_b, replica_c)",
        "TP group replica_c: holds 0 host(s) of spark_head ([]); a group needs exactly one head",
        "Fix: put exactly one host of replica_c in spark_head")


def test_a_fabric_address_across_groups_a_group_size_and_the_gateway_port_are_refused_at_once(tmp_path):
    def mutate(spark):
        tp = spark["spark_tp_groups"]["children"]
        tp["replica_b"]["hosts"]["spark-3"]["spark_fabric_ip"] = "192.168.100.10"
        tp["replica_a"]["hosts"]["spark-1"]["spark_fabric_ip"] = "10.0.0.12"
        tp["replica_a"]["hosts"]["spark-0"]["gateway_port"] = 30000
        tp["replica_b"]["hosts"]["spark-4"] = {"ansible_host": "10.0.0.14", "spark_fabric_ip": "192.168.110.14"}
        spark["spark_workers"]["hosts"]["spark-4"] = None

    result, out = _refused_two_group_render(tmp_path, mutate)
    assert_refused_before_any_change(
        result, out,
        "spark_fabric_ip 192.168.100.10 is held by spark-0, spark-3 in the TP groups replica_a, replica_b",
        "hostvars['spark-1'].spark_fabric_ip = 10.0.0.12: is the management address (ansible_host) of spark-2, "
        "outside spark-1's group",
        # Per group, named: replica_b's three nodes, not the site's five, with the sizes that work.
        "inventory, TP group replica_b: 3 node(s) x server_gpus_per_node 1 gives --tp-size 3, which does not divide",
        "Fix: give the group 2, 4 or 8 nodes",
        # The addresses moved off their group's subnet: spark-3's (onto replica_a's) and spark-1's (a management one).
        "TP group replica_b: its fabric addresses (spark_fabric_ip / spark_fabric_prefix) lie in 2 subnets "
        "(192.168.110.0/24: spark-2 (192.168.110.12/24), spark-4 (192.168.110.14/24); 192.168.100.0/24: spark-3 "
        "(192.168.100.10/24))",
        "TP group replica_a: its fabric addresses (spark_fabric_ip / spark_fabric_prefix) lie in 2 subnets "
        "(192.168.100.0/24: spark-0 (192.168.100.10/24); 10.0.0.0/24: spark-1 (10.0.0.12/24))",
        "gateway_port = 30000: is server_port of spark-0, a head, which also runs the gateway")
    # The site's problems are told once, by the first host; each group's own by its hosts.
    told = [d["host"] for d in result.failed if "is held by spark-0, spark-3" in str(d["res"].get("msg", ""))]
    assert told == ["spark-0"], told

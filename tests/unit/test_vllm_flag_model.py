"""vLLM's flag model (spark_flag_models.vllm) through the server plan: the argument list, every guard
rail, the engine's validation, the render-only refusal, SGLang-named profiles, the image per engine.

The expected argument lists are written out here on purpose instead of being read from the model: a test
that compared the model with itself could not fail.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys

import pytest

from tests.lib.roles import filter_plugin, flag_model, keyed_launcher
from tests.lib.server_plan import FILTER, ctx

VLLM = flag_model("vllm")
SGLANG = flag_model("sglang")
HEAD_IP = "192.168.100.10"


def vctx(host="spark-0", **changes):
    """A vLLM site as playbooks/render.yml hands it to the plan (render only: this version deploys no vLLM)."""
    return ctx(host=host, **{"spark_engine": "vllm", "server_render_only": True, **changes})


def plan(host="spark-0", **changes):
    return FILTER.server_plan(vctx(host, **changes), VLLM)


def only_error(**changes):
    errors = plan(**changes)["errors"]
    assert len(errors) == 1, errors
    return errors[0]


# The seed's vLLM rules (deployment-facts.md) and the sourced values, in the model's launch order.
SERVING = [
    "--trust-remote-code",
    "--tensor-parallel-size", "2",
    "--reasoning-parser", "deepseek_r1",
    "--tool-call-parser", "glm47",
    "--enable-auto-tool-choice",
    "--chat-template-content-format", "string",
    "--gpu-memory-utilization", "0.84",
    "--max-model-len", "65536",
    "--max-num-seqs", "2",
    "--enforce-eager",
]


def test_the_head_serves_http_and_hosts_the_rendezvous():
    result = plan("spark-0")
    assert result["errors"] == []
    assert result["args"] == [
        "/models/glm53", *SERVING,
        "--nnodes", "2", "--node-rank", "0",
        "--master-addr", HEAD_IP, "--master-port", "20000",
        "--host", "0.0.0.0",  # noqa: S104 - the rendered bind address, nothing binds here
        "--port", "30000",
    ]
    assert result["headless"] is False


def test_the_worker_is_headless_and_meets_the_head_at_its_fabric_address():
    result = plan("spark-1")
    assert result["errors"] == []
    assert result["args"] == [
        "/models/glm53", *SERVING,
        "--nnodes", "2", "--node-rank", "1",
        "--master-addr", HEAD_IP, "--master-port", "20000",
        "--headless",
    ]
    assert result["headless"] is True


def test_the_model_directory_is_positional_and_its_own_unit_line():
    result = plan(server_model_dir="/srv/models/glm53")
    assert result["args"][0] == "/models/glm53" and result["container_model_dir"] == "/models/glm53"
    assert result["arg_lines"][:2] == ["/models/glm53", "--trust-remote-code"]
    assert " ".join(result["arg_lines"]).split() == result["args"]


def test_behind_tls_the_head_listens_on_loopback_at_the_backend_port(tmp_path):
    result = plan(server_tls=True)
    assert result["errors"] == [], result["errors"]
    args = result["args"]
    assert args[args.index("--host") + 1] == "127.0.0.1" and args[args.index("--port") + 1] == "30001"


def test_a_four_node_group_has_three_headless_workers():
    c = vctx(host="w2", worker_group=["w1", "w2", "w3"])
    c["head_group"] = ["h"]
    c["fabric_ips"] = {"h": "10.9.0.1", "w1": "10.9.0.2", "w2": "10.9.0.3", "w3": "10.9.0.4"}
    args = FILTER.server_plan(c, VLLM)["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert args[args.index("--node-rank") + 1] == "2" and args[args.index("--master-addr") + 1] == "10.9.0.1"
    assert args[-1] == "--headless" and "--host" not in args


# Each guard rail: overrides, then fragments of the single message (variable, value, why, fix).
GUARD_RAILS = {
    "reasoning-parser glm45": (
        {"reasoning-parser": "glm45"},
        ["server_flag_overrides['reasoning-parser'] = 'glm45'", "silently drops the whole reply",
         "the opposite of SGLang's", "Fix: set 'reasoning-parser' to 'deepseek_r1'"],
    ),
    "reasoning-parser glm47": (
        {"reasoning-parser": "glm47"},
        ["['reasoning-parser'] = 'glm47'", "TOOL-CALL parser", "Fix: set 'reasoning-parser' to 'deepseek_r1'"],
    ),
    "reasoning-parser dropped": (
        {"reasoning-parser": None},
        ["['reasoning-parser'] drops --reasoning-parser", "reasoning_content", "deepseek_r1", "Fix: remove"],
    ),
    "tool-call-parser glm": (
        {"tool-call-parser": "glm"},
        ["['tool-call-parser'] = 'glm'", '"tool_calls": null', "Fix: set 'tool-call-parser' to 'glm47'"],
    ),
    "tool-call-parser glm45": (
        {"tool-call-parser": "glm45"},
        ["['tool-call-parser'] = 'glm45'", "REASONING parser", "Fix: set 'tool-call-parser' to 'glm47'"],
    ),
    "auto tool choice dropped": (
        {"enable-auto-tool-choice": False},
        ["['enable-auto-tool-choice'] = false", "HTTP 400",
         '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
         "Fix: remove 'enable-auto-tool-choice'"],
    ),
    "gpu memory above GB10's limit": (
        {"gpu-memory-utilization": 0.9},
        ["['gpu-memory-utilization'] = 0.9", "between 0.5 and 0.88", "Fix: choose a value"],
    ),
    "gpu memory dropped": (
        {"gpu-memory-utilization": None},
        ["['gpu-memory-utilization'] = null", "free-memory check", "Fix: give a value instead", "0.84"],
    ),
    "context dropped": (
        {"max-model-len": False},
        ["['max-model-len'] = false", "1M-token window", "Fix: give a value instead"],
    ),
    "context not a number": (
        {"max-model-len": "64k"},
        ["['max-model-len'] = '64k'", "whole number", "between 1024 and 1048576"],
    ),
    "concurrency zero": (
        {"max-num-seqs": 0},
        ["['max-num-seqs'] = 0", "between 1 and 64"],
    ),
    "concurrency dropped": (
        {"max-num-seqs": None},
        ["drops --max-num-seqs", "KDA", "Fix:"],
    ),
    "ray executor": (
        {"distributed-executor-backend": "ray"},
        ["['distributed-executor-backend'] = 'ray'", "ship no Ray", "--nnodes/--node-rank/--master-addr",
         "--headless workers", "Fix: remove 'distributed-executor-backend'"],
    ),
    "trust-remote-code dropped": (
        {"trust-remote-code": False},
        ["['trust-remote-code'] = false", "remote code", "server_acknowledge_backend_change: true"],
    ),
    "tensor-parallel-size by hand": (
        {"tensor-parallel-size": 4},
        ["['tensor-parallel-size'] = 4", "topology flag", "server_gpus_per_node"],
    ),
    "SGLang's tp-size spelling": (
        {"tp-size": 4},
        ["['tp-size'] = 4", "topology flag"],
    ),
    "master-addr by hand": (
        {"master-addr": "127.0.0.1"},
        ["['master-addr'] = '127.0.0.1'", "topology flag", "spark_fabric_ip"],
    ),
    "master-port by hand": (
        {"master-port": 29500},
        ["['master-port'] = 29500", "server_dist_init_port"],
    ),
    "headless by hand": (
        {"headless": True},
        ["['headless'] = true", "topology flag", "every rank but 0"],
    ),
    "model directory by hand": (
        {"model": "/models/other"},
        ["['model'] = '/models/other'", "server_model_dir"],
    ),
    "SGLang's model-path spelling": (
        {"model-path": "/models/other"},
        ["['model-path'] = '/models/other'", "server_model_dir"],
    ),
    "typo": (
        {"max-model-lenght": 32768},
        ["['max-model-lenght'] = 32768", "not a vllm serve flag", "did you mean 'max-model-len'"],
    ),
    "underscores": (
        {"max_num_seqs": 1},
        ["not a vllm serve flag", "did you mean 'max-num-seqs'", "vLLM flags use dashes"],
    ),
    "api key as a flag": (
        {"api-key": "sk-never-on-a-command-line"},
        ["['api-key'] = <redacted>", "server_api_key"],
    ),
    "two names of one flag": (
        {"context-length": 32768, "max-model-len": 65536},
        ["['max-model-len'] = 65536", "sets --max-model-len", "['context-length']", "Fix: keep one"],
    ),
}


@pytest.mark.parametrize("case", sorted(GUARD_RAILS))
def test_guard_rail_refuses_with_variable_value_why_and_fix(case):
    overrides, fragments = GUARD_RAILS[case]
    message = only_error(server_flag_overrides=overrides)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert message.startswith("server_flag_overrides[") and "Fix:" in message
    assert "sglang.launch_server" not in message and "sk-never" not in message


def test_every_guard_rail_is_reported_at_once_and_no_arguments_are_computed():
    overrides = {}
    for case in ("reasoning-parser glm45", "auto tool choice dropped", "ray executor", "gpu memory above GB10's limit",
                 "headless by hand", "typo"):
        overrides.update(GUARD_RAILS[case][0])
    result = plan(server_flag_overrides=overrides)
    assert len(result["errors"]) == 6, result["errors"]
    assert result["args"] == []


def test_the_tilelang_kv_cache_rule_is_sglang_s_alone():
    # vLLM has no tilelang DSA backends: its kv-cache-dtype is an ordinary flag.
    result = plan(server_flag_overrides={"kv-cache-dtype": "fp8_e4m3"})
    assert result["errors"] == []
    assert result["args"][-2:] == ["--kv-cache-dtype", "fp8_e4m3"]
    sglang = FILTER.server_plan(ctx(server_flag_overrides={"kv-cache-dtype": "fp8_e4m3"}), SGLANG)["errors"]
    assert len(sglang) == 1 and "tilelang" in sglang[0]


def test_the_sourced_values_may_change_and_known_flags_pass_through():
    result = plan(server_flag_overrides={
        "enforce-eager": False, "chat-template-content-format": "openai", "gpu-memory-utilization": 0.8,
        "served-model-name": "glm53", "enable-prefix-caching": True, "distributed-executor-backend": "mp"})
    assert result["errors"] == []
    args = result["args"]
    assert "--enforce-eager" not in args
    assert args[args.index("--chat-template-content-format") + 1] == "openai"
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.8"
    assert args[args.index("--distributed-executor-backend") + 1] == "mp"
    assert args[-3:] == ["--enable-prefix-caching", "--served-model-name", "glm53"]


# The engine: a value the collection has no model for, and one it renders but does not deploy.
def test_an_unknown_engine_is_refused_alone_with_the_engines_there_are():
    result = FILTER.server_plan(ctx(spark_engine="vlm", server_flag_overrides={"tool-call-parser": "glm"}), SGLANG)
    assert len(result["errors"]) == 1, result["errors"]
    message = result["errors"][0]
    for fragment in ("spark_engine = 'vlm'", "no launch arguments, image or unit", "Fix: set spark_engine to one of",
                     "sglang, vllm"):
        assert fragment in message, message
    assert result["args"] == []


def test_a_vllm_deployment_needs_the_kernel_fix_and_may_be_monitored(tmp_path):
    result = FILTER.server_plan(vctx(server_render_only=False, spark_monitoring=True), VLLM)
    assert len(result["errors"]) == 1, result["errors"]
    (build,) = result["errors"]
    for fragment in ("spark_engine = 'vllm' with server_image and server_image_build_context empty",
                     "lacks the seed's sparse-MLA kernel fix for GB10 (sm_121)", "cudaErrorNoKernelImageForDevice",
                     "Fix: set server_image_build_context to a build context that applies the fix from vLLM's recipe "
                     "on top of vllm/vllm-openai:glm51-cu130", "or server_image to an image of your own"):
        assert fragment in build, build
    # The site's own image, or a build on top of vLLM's, with the monitoring on or off: deployed.
    for monitoring in (True, False):
        assert FILTER.server_plan(vctx(server_render_only=False, spark_monitoring=monitoring,
                                       server_image="registry.example/vllm-gb10:0.19.1"), VLLM)["errors"] == []
    context = tmp_path / "fix"
    context.mkdir()
    (context / "Dockerfile").write_text("ARG SPARK_BASE_IMAGE\nFROM ${SPARK_BASE_IMAGE}\n")
    pins = {"Dockerfile": hashlib.sha256((context / "Dockerfile").read_bytes()).hexdigest()}
    built = FILTER.server_plan(vctx(server_render_only=False, spark_monitoring="true", server_image_build_context=str(context),
                                    server_image_build_sha256=pins), VLLM)
    assert built["errors"] == [] and built["args"][0] == "/models/glm53"
    # A render needs neither: it writes files, it starts nothing.
    assert FILTER.server_plan(vctx(spark_monitoring=True), VLLM)["errors"] == []


@pytest.mark.parametrize(("engine", "override"), [("vllm", {"disable-log-stats": True}),
                                                  ("sglang", {"enable-metrics": False}),
                                                  ("sglang", {"enable-metrics": None})])
def test_the_monitoring_refuses_an_engine_whose_metrics_are_turned_off(engine, override):
    """vLLM serves /metrics unless --disable-log-stats, SGLang only with --enable-metrics: with the monitoring on,
    an override that empties /metrics would leave the engine's alerts blind, so it is refused; monitoring off, not."""
    model, context = (VLLM, vctx) if engine == "vllm" else (SGLANG, ctx)
    (name,) = override
    errors = FILTER.server_plan(context(spark_monitoring=True, server_flag_overrides=override), model)["errors"]
    assert len(errors) == 1, errors
    for fragment in (f"server_flag_overrides[{name!r}] = ", "with spark_monitoring = true",
                     f"{model['label']} then serves no metrics at /metrics", "would never fire", "Fix: ",
                     "or set spark_monitoring: false"):
        assert fragment in errors[0], errors[0]
    assert FILTER.server_plan(context(spark_monitoring=False, server_flag_overrides=override), model)["errors"] == []
    # The switch the other way is the engine's default, and passes.
    kept = {"disable-log-stats": False} if engine == "vllm" else {"enable-metrics": True}
    assert FILTER.server_plan(context(spark_monitoring=True, server_flag_overrides=kept), model)["errors"] == []


def test_render_only_changes_nothing_for_sglang_and_must_be_a_boolean():
    assert FILTER.server_plan(ctx(server_render_only=False), SGLANG)["errors"] == []
    assert FILTER.server_plan(ctx(server_render_only=True), SGLANG)["args"] == \
        FILTER.server_plan(ctx(), SGLANG)["args"]
    message = FILTER.server_plan(ctx(server_render_only="maybe"), SGLANG)["errors"]
    assert len(message) == 1 and message[0].startswith("server_render_only = 'maybe'") and "Fix:" in message[0]


# Profiles: the tune writes SGLang's capacity names; vLLM's flags take them.
TUNED = {"ctx131072-req1": {"context-length": 131072, "max-running-requests": 1, "mem-fraction-static": 0.8}}


def test_a_tuned_profile_in_sglang_names_sets_vllm_s_capacity_flags():
    result = plan(server_profiles=TUNED, server_profile="ctx131072-req1")
    assert result["errors"] == []
    args = result["args"]
    assert args[args.index("--max-model-len") + 1] == "131072"
    assert args[args.index("--max-num-seqs") + 1] == "1"
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.8"
    assert not {"--context-length", "--max-running-requests", "--mem-fraction-static"} & set(args)


def test_a_profile_and_an_override_of_one_flag_are_compared_by_the_flag_they_set():
    same = plan(server_profiles=TUNED, server_profile="ctx131072-req1", server_flag_overrides={"max-model-len": 131072})
    assert same["errors"] == []
    assert same["args"].count("--max-model-len") == 1
    differ = plan(server_profiles=TUNED, server_profile="ctx131072-req1", server_flag_overrides={"max-model-len": 32768})
    assert len(differ["errors"]) == 1, differ["errors"]
    for fragment in ("server_flag_overrides['max-model-len'] = 32768", "server_profile = 'ctx131072-req1' sets "
                     "context-length = 131072", "two values for one flag", "Fix: remove 'max-model-len'"):
        assert fragment in differ["errors"][0], differ["errors"][0]


def test_a_profile_beyond_vllm_s_range_is_refused_naming_the_profile():
    profiles = {"hot": {"mem-fraction-static": 0.9}}
    message = only_error(server_profiles=profiles, server_profile="hot")
    for fragment in ("server_profiles['hot']['mem-fraction-static'] = 0.9", "--gpu-memory-utilization",
                     "between 0.5 and 0.88"):
        assert fragment in message, message


def test_the_built_in_profile_names_the_engine_s_own_capacity_flags():
    message = only_error(server_profiles={"default": {}})
    assert "(max-model-len 65536, max-num-seqs 2)" in message
    sglang = FILTER.server_plan(ctx(server_profiles={"default": {}}), SGLANG)["errors"]
    assert "(context-length 65536, max-running-requests 2)" in sglang[0]


# The image follows the engine; another engine's is refused.
def test_an_empty_server_image_is_the_engine_s_own():
    assert plan(server_image="")["errors"] == []
    assert FILTER.server_plan(ctx(server_image=""), SGLANG)["errors"] == []
    assert VLLM["image"] == "vllm/vllm-openai:glm51-cu130"
    assert SGLANG["image"] == "lmsysorg/sglang:glm-5.3-flash-arm64"


@pytest.mark.parametrize(("engine", "image", "other"), [
    ("vllm", "lmsysorg/sglang:glm-5.3-flash-arm64", "sglang"),
    ("vllm", "registry.local:5000/mirror/sglang:glm-5.3-flash-arm64", "sglang"),
    ("sglang", "vllm/vllm-openai:glm51-cu130", "vllm"),
])
def test_the_other_engine_s_image_is_refused(engine, image, other):
    model = flag_model(engine)
    c = vctx(server_image=image) if engine == "vllm" else ctx(server_image=image)
    errors = FILTER.server_plan(c, model)["errors"]
    assert len(errors) == 1, errors
    for fragment in (f"server_image = {image!r}", f"names {other}", f"spark_engine = {engine!r}",
                     f"Fix: leave server_image empty for {model['label']}'s {model['image']}", f"spark_engine: {other}"):
        assert fragment in errors[0], errors[0]


def test_a_registry_host_named_after_an_engine_is_no_mismatch():
    assert plan(server_image="vllm.mirror.local:5000/team/glm-serving:1")["errors"] == []
    assert FILTER.server_plan(ctx(server_image="registry.local:5000/sglang:glm-5.3-flash-arm64"), SGLANG)["errors"] == []


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_latest_refusal_names_the_engine_s_image(engine):
    model = flag_model(engine)
    image = "vllm/vllm-openai:latest" if engine == "vllm" else "lmsysorg/sglang:latest"
    c = vctx(server_image=image) if engine == "vllm" else ctx(server_image=image)
    errors = FILTER.server_plan(c, model)["errors"]
    assert len(errors) == 1 and ":latest" in errors[0] and f"Fix: {model['label']}'s image for this model, " \
        f"{model['image']}" in errors[0], errors


# The model itself.
def test_every_model_is_well_formed_and_its_derived_flags_are_computable():
    for engine in ("sglang", "vllm"):
        model = flag_model(engine)
        assert model["engine"] == engine and model["label"] and model["program"] and model["image"]
        names = [spec["name"] for spec in model["flags"]]
        assert len(names) == len(set(names)), engine
        aliases = [a for spec in model["flags"] for a in spec.get("aliases", [])]
        assert len(aliases) == len(set(aliases)) and not set(aliases) & set(names), engine
        assert {s["name"] for s in model["flags"] if s["kind"] == "derived"} <= FILTER.DERIVED, engine
        assert [s["name"] for s in model["flags"] if s.get("positional")] in ([], [names[0]]), engine
        assert len([s for s in model["flags"] if s.get("capacity")]) == 2, engine
        assert not set(model["known"]) & (set(names) | set(aliases)), engine
    # Every value vLLM's seed rules do not give names where it comes from.
    for spec in VLLM["flags"]:
        if spec["kind"] != "derived" and "require" not in spec and spec.get("default") is not None:
            assert spec.get("source") or spec.get("keep") or spec.get("why"), spec["name"]


def test_the_vllm_keyed_launcher_sets_vllm_s_key_and_runs_vllm_serve(tmp_path):
    # A stand-in vllm package: its CLI module records what vLLM would receive.
    cli = tmp_path / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for folder in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", cli):
        (folder / "__init__.py").write_text("")
    record = tmp_path / "record.txt"
    (cli / "main.py").write_text(
        "import os, sys\n"
        "if __name__ == '__main__':\n"
        f"    open({str(record)!r}, 'w').write(repr((sys.argv[1:], os.environ.get('VLLM_API_KEY'))))\n")
    # The key comes from the mounted key file, whose container path is the launcher's first argument.
    key_file = tmp_path / "api-key"
    key_file.write_text("sk-launcher-test\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    args = ["/models/glm53", "--tensor-parallel-size", "2"]
    subprocess.run([sys.executable, "-c", keyed_launcher("vllm"), str(key_file), *args], env=env, check=True,
                   timeout=60)
    argv, key = eval(record.read_text())  # noqa: S307 - the repr this test's own stand-in wrote
    assert argv == ["serve", *args]
    assert key == "sk-launcher-test"
    assert "api-key" not in " ".join(argv)
    assert not re.search(r"--api-key", keyed_launcher("vllm"))


def test_ranks_that_the_inventory_gives_different_engines_are_refused():
    hostvars = {"spark-0": {"spark_fabric_ip": HEAD_IP, "spark_engine": "vllm"},
                "spark-1": {"spark_fabric_ip": "192.168.100.11", "spark_engine": "sglang"}}
    c = vctx()
    del c["fabric_ips"]
    errors = FILTER.server_plan(c, VLLM, hostvars)["errors"]
    assert len(errors) == 1, errors
    for fragment in ("spark_engine = 'vllm' on spark-0, but 'sglang' on spark-1", "one engine",
                     "Fix: set spark_engine once for the whole group"):
        assert fragment in errors[0], errors[0]
    # An engine the inventory does not set (the role's default is in no hostvars) is no disagreement.
    del hostvars["spark-1"]["spark_engine"]
    assert FILTER.server_plan(c, VLLM, hostvars)["errors"] == []


def test_each_engine_names_its_capacity_flags_for_the_remedy_order():
    """A failed start's summary gives the seed's remedy order in the engine's own flag names."""
    names = filter_plugin("spark").spark_capacity_flags
    assert names(flag_model("sglang")) == {"context": "context-length", "concurrency": "max-running-requests"}
    assert names(flag_model("vllm")) == {"context": "max-model-len", "concurrency": "max-num-seqs"}
    with pytest.raises(Exception, match="no flag with capacity: context"):
        names({"label": "X", "flags": []})

"""The server flag model: defaults, derived topology, every guard rail.

The expected seed flags are written out (tests/lib/seed.py) on purpose (and checked against
the facts file when it is beside the checkout) instead of being read from the
model: a test that compared the model with itself could not fail.
"""

from __future__ import annotations

import re

import pytest

from tests.lib.seed import ADDED_FLAGS, FACTS, flatten
from tests.lib.seed import SEED_ARGS as SEED
from tests.lib.seed import facts_launch_args as seed_from_facts
from tests.lib.server_plan import FILTER, MODEL, ctx


def plan(**changes):
    return FILTER.server_plan(ctx(**changes), MODEL)


def errors_for(**changes):
    return plan(**changes)["errors"]


def only_error(**changes):
    errors = errors_for(**changes)
    assert len(errors) == 1, errors
    return errors[0]


def test_seed_in_this_test_matches_the_facts_file():
    if not FACTS.exists():
        pytest.skip(f"{FACTS} is not beside this checkout")
    facts = seed_from_facts()
    assert facts[:2] == ["--model-path", "./glm53"]
    facts = facts[2:]
    i = facts.index("--tp-size")
    assert facts[i + 1] == "2"
    assert facts[:i] + facts[i + 2:] == SEED


@pytest.mark.parametrize(
    ("host", "rank"), [("spark-0", "0"), ("spark-1", "1")]
)
def test_default_plan_is_the_seed_plus_topology(host, rank):
    result = plan(host=host)
    assert result["errors"] == []
    assert result["args"] == [
        "--model-path", "/models/glm53",
        "--trust-remote-code",
        "--tp-size", "2",
        *SEED[1:],
        *flatten(ADDED_FLAGS),
        "--nnodes", "2",
        "--node-rank", rank,
        "--dist-init-addr", "192.168.100.10:20000",
        "--host", "0.0.0.0",  # noqa: S104 - the rendered bind address, nothing binds here
        "--port", "30000",
    ]


def test_arg_lines_are_the_args_grouped_per_flag():
    result = plan()
    assert " ".join(result["arg_lines"]).split() == result["args"]
    assert all(line.startswith("--") for line in result["arg_lines"])
    assert "--context-length 65536" in result["arg_lines"]


def test_tp_size_is_nodes_times_gpus_and_workers_keep_inventory_order():
    # Four nodes of two GPUs: --tp-size 8 divides the model's heads (three nodes would not).
    c = ctx(host="w2", worker_group=["w1", "w2", "w3"], server_gpus_per_node=2)
    c["head_group"] = ["h"]
    c["fabric_ips"] = {"h": "10.9.0.1", "w1": "10.9.0.2", "w2": "10.9.0.3", "w3": "10.9.0.4"}
    result = FILTER.server_plan(c, MODEL)
    args = result["args"]
    assert result["errors"] == []
    assert args[args.index("--tp-size") + 1] == "8"
    assert args[args.index("--nnodes") + 1] == "4"
    assert args[args.index("--node-rank") + 1] == "2"
    assert args[args.index("--dist-init-addr") + 1] == "10.9.0.1:20000"


def test_hostvars_supply_the_fabric_addresses():
    c = ctx()
    del c["fabric_ips"]
    hostvars = {"spark-0": {"spark_fabric_ip": "10.1.1.1"}, "spark-1": {"spark_fabric_ip": "10.1.1.2"}}
    result = FILTER.server_plan(c, MODEL, hostvars)
    assert result["dist_init_addr"] == "10.1.1.1:20000"


def test_overrides_change_numbers_in_place_and_append_extras_sorted():
    args = plan(server_flag_overrides={
        "context-length": 32768, "max-running-requests": "1", "mem-fraction-static": 0.8,
        "served-model-name": "glm53", "enable-cache-report": True, "log-level": "info",
    })["args"]
    assert args[args.index("--context-length") + 1] == "32768"
    assert args[args.index("--max-running-requests") + 1] == "1"
    assert args[args.index("--mem-fraction-static") + 1] == "0.8"
    assert args[-5:] == ["--enable-cache-report", "--log-level", "info", "--served-model-name", "glm53"]
    assert args.index("--context-length") < args.index("--nnodes")


def test_false_and_null_drop_flags():
    args = plan(
        server_flag_overrides={"disable-shared-experts-fusion": False, "enable-metrics": None},
        server_acknowledge_backend_change=True,
    )["args"]
    assert "--disable-shared-experts-fusion" not in args
    assert "--enable-metrics" not in args


def test_unknown_but_plausible_flag_passes_through():
    args = plan(server_flag_overrides={"enable-hierarchical-cache": True})["args"]
    assert args[-1] == "--enable-hierarchical-cache"


# Each guard rail: overrides/context change, then fragments the single message must contain.
GUARD_RAILS = {
    "tool-call-parser glm": (
        {"server_flag_overrides": {"tool-call-parser": "glm"}},
        ["server_flag_overrides['tool-call-parser'] = 'glm'", '"tool_calls": null', '"content": ""',
         "Fix: set 'tool-call-parser' to 'glm47'"],
    ),
    "tool-call-parser dropped": (
        {"server_flag_overrides": {"tool-call-parser": False}},
        ["drops --tool-call-parser", "glm47"],
    ),
    "reasoning-parser dropped": (
        {"server_flag_overrides": {"reasoning-parser": None}},
        ["drops --reasoning-parser", "</think>", "reasoning_content", "glm45"],
    ),
    "reasoning-parser glm47": (
        {"server_flag_overrides": {"reasoning-parser": "glm47"}},
        ["['reasoning-parser'] = 'glm47'", "differ on purpose", "Fix: set 'reasoning-parser' to 'glm45'"],
    ),
    "reasoning-parser deepseek_r1": (
        {"server_flag_overrides": {"reasoning-parser": "deepseek_r1"}},
        ["= 'deepseek_r1'", "vLLM", "glm45"],
    ),
    "kv-cache fp8 with tilelang": (
        {"server_flag_overrides": {"kv-cache-dtype": "fp8_e4m3"}},
        ["['kv-cache-dtype'] = 'fp8_e4m3'", "tilelang", "bfloat16", "Fix:"],
    ),
    "kv-cache dropped with tilelang": (
        {"server_flag_overrides": {"kv-cache-dtype": False}},
        ["['kv-cache-dtype'] dropped", "tilelang", "bfloat16"],
    ),
    "attention backend changed": (
        {"server_flag_overrides": {"attention-backend": "flashinfer"}},
        ["['attention-backend'] = 'flashinfer'", "load-bearing", "sm_121", "server_acknowledge_backend_change: true"],
    ),
    "dsa prefill backend changed": (
        {"server_flag_overrides": {"dsa-prefill-backend": "flashmla"}},
        ["['dsa-prefill-backend'] = 'flashmla'", "server_acknowledge_backend_change"],
    ),
    "dsa decode backend changed": (
        {"server_flag_overrides": {"dsa-decode-backend": "flashmla"}},
        ["['dsa-decode-backend'] = 'flashmla'", "server_acknowledge_backend_change"],
    ),
    "moe runner changed": (
        {"server_flag_overrides": {"moe-runner-backend": "triton"}},
        ["['moe-runner-backend'] = 'triton'", "NVFP4", "server_acknowledge_backend_change"],
    ),
    "shared experts fusion dropped": (
        {"server_flag_overrides": {"disable-shared-experts-fusion": False}},
        ["['disable-shared-experts-fusion'] = false", "drops", "server_acknowledge_backend_change"],
    ),
    "trust-remote-code dropped": (
        {"server_flag_overrides": {"trust-remote-code": False}},
        ["['trust-remote-code'] = false", "server_acknowledge_backend_change"],
    ),
    "context-length not numeric": (
        {"server_flag_overrides": {"context-length": "64k"}},
        ["['context-length'] = '64k'", "whole number", "between 1024 and 1048576"],
    ),
    "context-length out of range": (
        {"server_flag_overrides": {"context-length": 2097152}},
        ["['context-length'] = 2097152", "between 1024 and 1048576"],
    ),
    "context-length dropped": (
        {"server_flag_overrides": {"context-length": False}},
        ["drops --context-length", "hybrid"],
    ),
    "max-running-requests zero": (
        {"server_flag_overrides": {"max-running-requests": 0}},
        ["['max-running-requests'] = 0", "between 1 and 64"],
    ),
    "max-running-requests boolean": (
        {"server_flag_overrides": {"max-running-requests": True}},
        ["['max-running-requests'] = true", "whole number"],
    ),
    "max-running-requests dropped": (
        {"server_flag_overrides": {"max-running-requests": None}},
        ["drops --max-running-requests", "state cache"],
    ),
    "mem-fraction-static not numeric": (
        {"server_flag_overrides": {"mem-fraction-static": "most"}},
        ["['mem-fraction-static'] = 'most'", "takes a number"],
    ),
    "mem-fraction-static out of range": (
        {"server_flag_overrides": {"mem-fraction-static": 0.97}},
        ["['mem-fraction-static'] = 0.97", "between 0.5 and 0.92"],
    ),
    "model dir is a repo id": (
        {"server_model_dir": "LibertAIDAI/GLM-5.3-Flash-NVFP4"},
        ["server_model_dir = 'LibertAIDAI/GLM-5.3-Flash-NVFP4'", "repo id", "processor_config.json",
         "hf download LibertAIDAI/GLM-5.3-Flash-NVFP4 --local-dir"],
    ),
    "model dir relative": (
        {"server_model_dir": "./glm53"},
        ["server_model_dir = './glm53'", "relative", "absolute"],
    ),
    "model dir with metacharacters": (
        {"server_model_dir": "/opt/models/glm53;rm -rf /"},
        ["server_model_dir = '/opt/models/glm53;rm -rf /'", "metacharacters"],
    ),
    "model dir with a space": (
        {"server_model_dir": "/opt/my models/glm53"},
        ["server_model_dir = '/opt/my models/glm53'", "whitespace"],
    ),
    "tp-size in overrides": (
        {"server_flag_overrides": {"tp-size": 4}},
        ["['tp-size'] = 4", "topology flag", "server_gpus_per_node"],
    ),
    "tp alias in overrides": (
        {"server_flag_overrides": {"tensor-parallel-size": 2}},
        ["['tensor-parallel-size'] = 2", "topology flag"],
    ),
    "node-rank in overrides": (
        {"server_flag_overrides": {"node-rank": 1}},
        ["['node-rank'] = 1", "topology flag", "spark_head"],
    ),
    "nnodes in overrides": (
        {"server_flag_overrides": {"nnodes": 2}},
        ["['nnodes'] = 2", "topology flag"],
    ),
    "dist-init-addr in overrides": (
        {"server_flag_overrides": {"dist-init-addr": "10.0.0.1:5000"}},
        ["['dist-init-addr'] = '10.0.0.1:5000'", "spark_fabric_ip", "server_dist_init_port"],
    ),
    "model-path in overrides": (
        {"server_flag_overrides": {"model-path": "/opt/models/glm53"}},
        ["['model-path']", "server_model_dir"],
    ),
    "port in overrides": (
        {"server_flag_overrides": {"port": 8000}},
        ["['port'] = 8000", "server_port"],
    ),
    "host in overrides": (
        {"server_flag_overrides": {"host": "127.0.0.1"}},
        ["['host'] = '127.0.0.1'", "server_host"],
    ),
    "typo of a known flag": (
        {"server_flag_overrides": {"context-lenght": 32768}},
        ["['context-lenght'] = 32768", "did you mean 'context-length'"],
    ),
    "typo of a known extra": (
        {"server_flag_overrides": {"served-model-nam": "glm53"}},
        ["did you mean 'served-model-name'"],
    ),
    "underscores instead of dashes": (
        {"server_flag_overrides": {"max_running_requests": 1}},
        ["did you mean 'max-running-requests'", "dashes"],
    ),
    "argparse abbreviation": (
        {"server_flag_overrides": {"mem-fraction": 0.8}},
        ["abbreviation of --mem-fraction-static", "did you mean 'mem-fraction-static'"],
    ),
    "leading dashes": (
        {"server_flag_overrides": {"--context-length": 32768}},
        ["without the leading dashes", "'context-length'"],
    ),
    "api key as a flag": (
        {"server_flag_overrides": {"api-key": "hunter2"}},
        ["['api-key'] = <redacted>", "server_api_key"],
    ),
    "bare switch with a value": (
        {"server_flag_overrides": {"enable-cache-report": ["a", "b"]}},
        ["['enable-cache-report'] = ['a', 'b']", "single scalar"],
    ),
    "value with shell characters": (
        {"server_flag_overrides": {"served-model-name": "glm 53"}},
        ["['served-model-name'] = 'glm 53'", "unquoted"],
    ),
    "overrides not a mapping": (
        {"server_flag_overrides": ["context-length=1"]},
        ["server_flag_overrides = ['context-length=1']", "mapping"],
    ),
    "port clash": (
        {"server_dist_init_port": 30000},
        ["server_dist_init_port = 30000", "equals server_port"],
    ),
    "bad digest": (
        {"server_image_digest": "sha256:abc"},
        ["server_image_digest = 'sha256:abc'", "64"],
    ),
    "bad memory size": (
        {"server_container_memory": "lots"},
        ["server_container_memory = 'lots'", "120g"],
    ),
    "no head": (
        {"head_group": [], "inventory_hostname": "spark-1"},
        ["spark_head = []", "exactly one host"],
    ),
    "two heads": (
        {"head_group": ["spark-0", "spark-1"], "worker_group": []},
        ["spark_head = ['spark-0', 'spark-1']", "exactly one host"],
    ),
    "missing fabric ip": (
        {"fabric_ips": {"spark-0": "192.168.100.10"}},
        ["hostvars['spark-1'].spark_fabric_ip = null", "set spark_fabric_ip for spark-1"],
    ),
    "host without a rank": (
        {"inventory_hostname": "spark-9"},
        ["'spark-9' is in neither spark_head nor spark_workers"],
    ),
}


@pytest.mark.parametrize("case", sorted(GUARD_RAILS))
def test_guard_rail_refuses_with_variable_value_why_and_fix(case):
    changes, fragments = GUARD_RAILS[case]
    message = only_error(**changes)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "Fix:" in message
    assert re.match(r"^(server_\w+|inventory |hostvars\[)", message), message


@pytest.mark.parametrize(
    "name", ["attention-backend", "dsa-prefill-backend", "dsa-decode-backend", "moe-runner-backend"]
)
def test_acknowledgement_lets_a_backend_change_pass(name):
    overrides = {name: "triton"}
    if name.startswith("dsa-"):
        # Both tilelang backends gone: the bfloat16 requirement no longer applies.
        overrides = {"dsa-prefill-backend": "flashmla", "dsa-decode-backend": "flashmla", "kv-cache-dtype": "fp8_e4m3"}
    result = plan(server_flag_overrides=overrides, server_acknowledge_backend_change=True)
    assert result["errors"] == []
    args = result["args"]
    for flag, value in overrides.items():
        assert args[args.index(f"--{flag}") + 1] == value


def test_acknowledgement_does_not_excuse_the_parsers_or_the_kv_dtype():
    errors = errors_for(
        server_flag_overrides={"tool-call-parser": "glm", "reasoning-parser": None, "kv-cache-dtype": "fp8_e5m2"},
        server_acknowledge_backend_change=True,
    )
    assert len(errors) == 3, errors


def test_every_error_is_reported_together():
    errors = errors_for(
        server_flag_overrides={
            "tool-call-parser": "glm", "context-length": "x", "tp-size": 4, "context-lenght": 1,
        },
        server_model_dir="LibertAIDAI/GLM-5.3-Flash-NVFP4",
        head_group=[],
        inventory_hostname="spark-1",
    )
    joined = "\n".join(errors)
    assert len(errors) == 6, errors
    for fragment in ("tool-call-parser", "'context-length'", "'tp-size'", "context-lenght", "repo id", "spark_head"):
        assert fragment in joined


def test_no_args_are_computed_from_invalid_input():
    result = plan(server_flag_overrides={"tool-call-parser": "glm"})
    assert result["args"] == []


def test_api_key_never_appears_in_errors_or_plan():
    secret = "sk-very-secret\n"  # noqa: S105 - a fake key that must never leak
    result = plan(server_api_key=secret, server_flag_overrides={"api-key": "sk-other"})
    text = repr(result)
    assert "sk-very-secret" not in text
    assert "sk-other" not in text
    assert any("server_api_key = <redacted>" in e for e in result["errors"])


def test_model_dir_is_mounted_by_basename_and_refused_unless_normal():
    result = plan(server_model_dir="/srv/models/glm53")
    assert result["model_dir"] == "/srv/models/glm53"
    assert result["container_model_dir"] == "/models/glm53"
    # A trailing slash used to be normalised here while the checkpoint role refused it.
    assert "ends in a slash" in only_error(server_model_dir="/srv/models/glm53/")
    assert "Fix: /srv/models/glm53" in only_error(server_model_dir="/srv//models/./glm53")


def test_flag_model_is_well_formed():
    names = [spec["name"] for spec in MODEL["flags"]]
    assert len(names) == len(set(names))
    derived = {spec["name"] for spec in MODEL["flags"] if spec["kind"] == "derived"}
    assert derived == {"model-path", "tp-size", "nnodes", "node-rank", "dist-init-addr", "host", "port"}
    for spec in MODEL["flags"]:
        if spec["kind"] == "derived":
            assert spec["from"].strip()
            continue
        assert "default" in spec, spec["name"]
        if spec["kind"] in ("int", "float"):
            assert spec["min"] <= spec["default"] <= spec["max"], spec["name"]
        if spec.get("acknowledge") or "require" in spec:
            assert spec["why"].strip(), spec["name"]
        if "choices" in spec:
            assert spec["default"] in spec["choices"]
    assert not set(MODEL["known"]) & set(names)

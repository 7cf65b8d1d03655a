"""The monitoring in each engine's metric names: the flag models' maps against what the engines' stand-ins serve.

The alert rules and the shipped dashboard name the engine's figures neutrally (engine:<figure>); the monitoring
filter translates them with the group's engine's flag model (monitoring.metrics). Every name a translated rule or
panel selects is one the engine's stand-in serves - the list is read from the stand-in's own Metrics class, not
copied here - or one of the node's, Prometheus's or the collector's; a figure an engine does not have (vLLM's
throughput gauge and KV token counts) takes its queries out of the dashboard, never out of an alert.
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
import types

import pytest

from tests.lib.playbook import REPO
from tests.lib.prometheus_tools import sample
from tests.lib.roles import filter_plugin, flag_model
from tests.unit.test_monitoring_metrics import collect, gpu_holder, promql_metrics

FILTER = filter_plugin("monitoring")
DASHBOARD = REPO / "roles" / "monitoring" / "files" / "dashboard.json"
STANDINS = REPO / "tests" / "standins" / "lib"
ENGINES = ("sglang", "vllm")
HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")
RULES_CTX = {"ttft_p99_seconds": 30, "queue_threshold": 4, "filesystem_free_percent": 10,
             "gpu_temperature_celsius": 85, "speculative_min_accept_length": 1.3}


def standin_families(engine: str) -> dict[str, str]:
    """{name: type} of every family the engine's stand-in serves at /metrics, from its own Metrics class."""
    spec = importlib.util.spec_from_file_location(f"{engine}_server_families", STANDINS / f"{engine}_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if engine == "sglang":
        args = types.SimpleNamespace(context_length=65536, max_running_requests=2, decode_log_interval=40)
        metrics = module.Metrics("/models/glm53", None, args)
    else:
        metrics = module.Metrics("/models/glm53", None, 1)
    return {name: kind for name, kind, _, _ in metrics.families(0, 0, 0)}


def served_names(engine: str) -> set[str]:
    """The sample names of those families: a histogram's _bucket, _count and _sum."""
    names = set()
    for name, kind in standin_families(engine).items():
        names |= {name + s for s in HISTOGRAM_SERIES} if kind == "histogram" else {name}
    return names


def rules(engine: str) -> list[dict]:
    return FILTER.monitoring_rules({**RULES_CTX, "engine": flag_model(engine)})["groups"][0]["rules"]


def dashboard(engine: str) -> dict:
    return FILTER.monitoring_dashboard(json.loads(DASHBOARD.read_text()), {"engine": flag_model(engine)})


def engine_prefixed(names: set[str]) -> set[str]:
    return {n for n in names if re.match(r"^(sglang|vllm|engine):", n)}


def test_both_engines_map_the_same_figures_each_to_a_family_its_standin_serves():
    maps = {engine: flag_model(engine)["monitoring"]["metrics"] for engine in ENGINES}
    assert set(maps["sglang"]) == set(maps["vllm"])
    for engine, figures in maps.items():
        families = standin_families(engine)
        for figure, name in figures.items():
            if name is None:
                continue
            assert name in families, f"{engine}: {figure} = {name}, which its stand-in does not serve"
            histogram = figure in ("time_to_first_token", "inter_token_latency", "e2e_latency")
            assert (families[name] == "histogram") == histogram, (engine, figure, families[name])
    # Only vLLM lacks figures, and SGLang has every one.
    assert [f for f, n in maps["sglang"].items() if n is None] == []
    assert sorted(f for f, n in maps["vllm"].items() if n is None) == [
        "generation_throughput", "kv_cache_pool_tokens", "kv_cache_used_tokens", "speculative_accept_length",
        "speculative_accept_rate"]
    # The dashboard's acceptance is the gauges the tune promotes a speculative profile by.
    speculative = flag_model("sglang")["speculative"]["metrics"]
    assert (maps["sglang"]["speculative_accept_length"], maps["sglang"]["speculative_accept_rate"]) == (
        speculative["accept_length"], speculative["accept_rate"])


@pytest.mark.parametrize("engine", ENGINES)
def test_every_rule_and_panel_names_only_metrics_the_engines_standin_serves(engine):
    served = served_names(engine)
    in_rules = set().union(*(promql_metrics(r["expr"]) for r in rules(engine)))
    in_panels = set().union(*(promql_metrics(t["expr"]) for p in dashboard(engine)["panels"]
                              for t in p.get("targets", [])))
    for where, names in (("rules", in_rules), ("dashboard", in_panels)):
        engine_names = engine_prefixed(names)
        assert engine_names, where
        assert engine_names <= served, f"{where} of {engine} name what its stand-in does not serve: {engine_names - served}"
    # The engine's figures the alerts watch: running, queued, the first token's and the later tokens' counts.
    assert {flag_model(engine)["monitoring"]["metrics"]["running_requests"],
            flag_model(engine)["monitoring"]["metrics"]["queued_requests"]} <= in_rules
    prefix = flag_model(engine)["monitoring"]["alert_prefix"]
    assert {f"{prefix}EndpointDown", f"{prefix}GroupNotServing", f"{prefix}TimeToFirstTokenHigh",
            f"{prefix}QueueGrowing"} <= {r["alert"] for r in rules(engine)}


def test_sglang_keeps_every_panel_query_and_vllm_loses_only_those_of_figures_it_lacks():
    shipped = json.loads(DASHBOARD.read_text())
    targets = {e: [(p["title"], t["legendFormat"]) for p in dashboard(e)["panels"] for t in p.get("targets", [])]
               for e in ENGINES}
    every = [(p["title"], t["legendFormat"]) for p in shipped["panels"] for t in p.get("targets", [])]
    assert targets["sglang"] == every
    lacking = {f for f, n in flag_model("vllm")["monitoring"]["metrics"].items() if n is None}
    dropped = [(p["title"], t["legendFormat"]) for p in shipped["panels"] for t in p.get("targets", [])
               if {m.split(":", 1)[1] for m in engine_prefixed(promql_metrics(t["expr"]))} & lacking]
    assert dropped == [("Throughput (tokens/s)", "scheduler's gen throughput"), ("KV cache", "used / pool"),
                       ("Speculative decoding", "accept length"), ("Speculative decoding", "accept rate")]
    assert targets["vllm"] == [t for t in every if t not in dropped]
    # A panel left without a query goes with it (vLLM's has no speculative acceptance), and the tags name the engine.
    assert [p["title"] for p in dashboard("vllm")["panels"]] == [p["title"] for p in shipped["panels"]
                                                                   if p["title"] != "Speculative decoding"]
    assert dashboard("vllm")["tags"][0] == "vllm" and dashboard("sglang")["tags"][0] == "sglang"


def test_each_engine_has_its_own_dashboard_in_a_shared_grafana():
    shipped = json.loads(DASHBOARD.read_text())
    sglang, vllm = dashboard("sglang"), dashboard("vllm")
    # SGLang's keeps the uid and title sites have stored since 1.0; vLLM's would otherwise overwrite it.
    assert (sglang["uid"], sglang["title"]) == (shipped["uid"], shipped["title"]) == (
        "spark-sglang-glm53", "LLM TP group (GLM-5.3 on DGX Spark)")
    assert (vllm["uid"], vllm["title"]) == ("spark-vllm-glm53", "LLM TP group (GLM-5.3 on DGX Spark) - vLLM")


def test_a_figure_no_flag_model_knows_fails_the_translation():
    engine = FILTER._engine({"engine": flag_model("vllm")})
    assert FILTER.engine_expression("rate(engine:e2e_latency_count[1m])", engine) == \
        "rate(vllm:e2e_request_latency_seconds_count[1m])"
    with pytest.raises(ValueError, match="engine:tokens_per_second is no figure"):
        FILTER.engine_expression("engine:tokens_per_second", engine)
    # A figure the engine lacks: no expression. A panel drops the query; an alert cannot, and refuses.
    assert FILTER.engine_expression("sum(engine:generation_throughput)", engine) is None
    model = flag_model("vllm")
    lacking = {**model, "monitoring": {**model["monitoring"],
                                       "metrics": {**model["monitoring"]["metrics"], "queued_requests": None}}}
    with pytest.raises(ValueError, match="the alert VllmQueueGrowing needs a figure vLLM does not serve"):
        FILTER.monitoring_rules({**RULES_CTX, "engine": lacking})


def test_the_runbooks_name_the_engines_concurrency_flag():
    for engine, flag in (("sglang", "max-running-requests"), ("vllm", "max-num-seqs")):
        queue = next(r for r in rules(engine) if r["alert"].endswith("QueueGrowing"))
        assert f"Find the largest {flag} the group holds" in queue["annotations"]["runbook"], engine
        assert flag in queue["annotations"]["description"]


def test_the_collector_knows_a_vllm_rank_by_the_engine_its_flag_model_names(tmp_path):
    """A process holding the GPU under vLLM's process title is the rank's for a vLLM group, not for SGLang's."""
    with gpu_holder(tmp_path, "VLLM::Worker_TP0"):
        process = flag_model("vllm")["monitoring"]["process"]
        deadline = time.monotonic() + 10
        while sample(found := collect(tmp_path, "--rank-process", process), "spark_gpu_compute_processes",
                     gpu="0") != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sample(found, "spark_rank_process_present") == 1
        sglang = collect(tmp_path, "--rank-process", flag_model("sglang")["monitoring"]["process"])
        assert sample(sglang, "spark_gpu_compute_processes", gpu="0") == 1
        assert sample(sglang, "spark_rank_process_present") == 0

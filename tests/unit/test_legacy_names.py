"""The legacy_names module finds and moves the collection's files by the paths in plugins/module_utils/node_names.py;
the roles name the same paths in their vars. Rendered from the site role's names, the two must agree, or a
take-over would move files to where no role looks. The legacy names must differ from the new ones in every
name that said the engine, and the test inventory must not be able to pin them."""

from __future__ import annotations

import json
import re

import jinja2
import yaml

from tests.lib import role_module
from tests.lib.playbook import REPO
from tests.lib.roles import filter_plugin

role_module.collection_importable()
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_names import (  # noqa: E402
    NAMES,
    credentials,
    layout,
)
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.server_store import load as load_kept  # noqa: E402
from ansible_collections.dgx_spark.llm_serving.plugins.modules.legacy_names import TakeOver  # noqa: E402


def load(role: str, kind: str = "vars") -> dict:
    return yaml.safe_load((REPO / "roles" / role / kind / "main.yml").read_text())


SPARK = {**load("spark", "defaults"), **load("spark")}


def render(text, values):
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)  # noqa: S701 - paths, not HTML
    env.filters["dirname"] = lambda p: p.rsplit("/", 1)[0]
    env.filters["regex_replace"] = lambda s, pattern, repl: re.sub(pattern, repl, s)
    for _ in range(4):
        text = env.from_string(text).render(**values) if isinstance(text, str) and "{{" in text else text
    return text


def names(values: dict) -> dict:
    return {name: render(values[name], values) for name in NAMES}


def test_the_module_finds_files_where_the_roles_put_them():
    current = names(SPARK)
    where = layout(current)
    values = {**SPARK, **current}
    values["spark_container_name"] = render(SPARK["spark_container_name"], values)
    firewall, monitoring, server = load("firewall"), load("monitoring"), load("server")
    values.update({k: render(firewall[k], {**values, **firewall})
                   for k in ("__firewall_table", "__firewall_unit", "__firewall_rules_file")})
    mon = {k: monitoring[k] for k in (
        "__monitoring_config_dir", "__monitoring_prometheus_unit", "__monitoring_node_exporter_unit",
        "__monitoring_dropin_name", "__monitoring_prometheus_dropin", "__monitoring_node_exporter_dropin",
        "__monitoring_collector_program", "__monitoring_collector_unit", "__monitoring_journald_dropin",
        "__monitoring_state_dir")}
    for _ in range(3):
        mon = {k: render(v, {**values, **mon}) for k, v in mon.items()}
    assert where["firewall_rules"] == values["__firewall_rules_file"]
    assert where["firewall_unit"] == values["__firewall_unit"] and where["firewall_table"] == values["__firewall_table"]
    assert where["nginx_conf"] == render(server["__server_nginx_conf"], values)
    assert where["server_unit_path"] == render(SPARK["spark_unit_path"], values)
    assert where["config_dir"] + "/" + where["env_name"] == render(SPARK["spark_env_file"], values)
    assert where["collector_units"] == [mon["__monitoring_collector_unit"] + ".timer",
                                        mon["__monitoring_collector_unit"] + ".service"]
    assert where["collector_program_dir"] == mon["__monitoring_collector_program"].rsplit("/", 1)[0]
    assert where["monitoring_state_dir"] == mon["__monitoring_state_dir"]
    assert where["journald_dropin"] == mon["__monitoring_journald_dropin"]
    assert where["monitoring_dropins"] == [mon["__monitoring_prometheus_dropin"], mon["__monitoring_node_exporter_dropin"]]
    paths = {k: render(v, {**values, **mon}) for k, v in monitoring["__monitoring_paths"].items()}
    assert (where["prometheus_key"], where["prometheus_ca"]) == (paths["key"], paths["ca"])


def test_every_name_that_said_the_engine_has_a_new_one():
    legacy, current = SPARK["spark_legacy_names"], names(SPARK)
    assert set(legacy) == set(NAMES)
    for name in NAMES:
        assert "sglang" in legacy[name] and "sglang" not in current[name], name
    old, new = layout(legacy), layout(current)
    assert all(old[k] != new[k] for k in old), [k for k in old if old[k] == new[k]]
    assert credentials(legacy)[0] == "sglang_api_key" and credentials(current)[0] == "spark_llm_api_key"
    assert "sglang-ca.crt" in credentials(legacy) and "spark-llm-server.key" in credentials(current)


def test_a_kept_unit_is_rewritten_to_the_new_container_and_env_file_and_nothing_else(tmp_path):
    """A rollback after the take-over puts the kept unit back under the new names: it must start the new container
    with the moved env file, and leave the image and the engine's module alone."""
    unit = tmp_path / "sglang.service"
    unit.write_text(
        "Description=SGLang GLM-5.3-Flash-NVFP4 rank 0 of 2 (TP=2)\n"
        "ExecStartPre=-/usr/bin/docker rm -f sglang\n"
        "ExecStart=/usr/bin/docker run --rm --name sglang \\\n"
        "    --env-file /etc/sglang/sglang.env \\\n"
        "    lmsysorg/sglang:glm-5.3-flash-arm64 \\\n"
        "    python3 -m sglang.launch_server \\\n"
        "    --model-path /models/glm53\n"
        "ExecStop=-/usr/bin/docker stop --time 60 sglang\n")
    unit.chmod(0o640)
    job = TakeOver(None, layout(SPARK["spark_legacy_names"]), layout(names(SPARK)))
    job.rewrite_paths(str(unit))
    assert unit.read_text() == (
        "Description=SGLang GLM-5.3-Flash-NVFP4 rank 0 of 2 (TP=2)\n"
        "ExecStartPre=-/usr/bin/docker rm -f spark-llm\n"
        "ExecStart=/usr/bin/docker run --rm --name spark-llm \\\n"
        "    --env-file /etc/spark-llm/spark-llm.env \\\n"
        "    lmsysorg/sglang:glm-5.3-flash-arm64 \\\n"
        "    python3 -m sglang.launch_server \\\n"
        "    --model-path /models/glm53\n"
        "ExecStop=-/usr/bin/docker stop --time 60 spark-llm\n")
    assert unit.stat().st_mode & 0o777 == 0o640


def test_the_controllers_credentials_keep_their_content_under_the_new_names(tmp_path):
    legacy, current = SPARK["spark_legacy_names"], names(SPARK)
    folder = tmp_path / ".credentials"
    folder.mkdir()
    for name, text in (("sglang_api_key", "k" * 40), ("sglang-ca.crt", "CA"), ("sglang-server.key", "KEY")):
        (folder / name).write_text(text)
        (folder / name).chmod(0o600)
    args = {"legacy": legacy, "current": current, "parts": ["credentials"], "credentials_dir": str(folder)}
    found = role_module.run_module("legacy_names", args, tmp_path)
    assert found["changed"] is False and len(found["found"]) == 3, found
    preview = role_module.run_module("legacy_names", {**args, "take_over": True}, tmp_path, check=True)
    assert preview["changed"] is True and sorted(p.name for p in folder.iterdir()) == [
        "sglang-ca.crt", "sglang-server.key", "sglang_api_key"], preview
    moved = role_module.run_module("legacy_names", {**args, "take_over": True}, tmp_path)
    assert moved["changed"] is True, moved
    assert {p.name: p.read_text() for p in folder.iterdir()} == {
        "spark_llm_api_key": "k" * 40, "spark-llm-ca.crt": "CA", "spark-llm-server.key": "KEY"}
    assert (folder / "spark_llm_api_key").stat().st_mode & 0o777 == 0o600
    again = role_module.run_module("legacy_names", {**args, "take_over": True}, tmp_path)
    assert again["changed"] is False and again["found"] == [], again
    # Both names at once: which key the clients hold is the operator's call, so nothing moves.
    (folder / "sglang_api_key").write_text("other")
    both = role_module.run_module("legacy_names", {**args, "take_over": True}, tmp_path)
    assert both.get("failed") and "both" in both["msg"] and "sglang_api_key" in both["msg"], both
    assert (folder / "spark_llm_api_key").read_text() == "k" * 40


def test_a_kept_configuration_is_kept_under_the_installed_files_new_names(tmp_path):
    """The server role compares a kept copy with the installed files and restores it by its manifest's names."""
    store = tmp_path / "last-good"
    store.mkdir(mode=0o700)
    (store / "sglang.service").write_text("ExecStart=/usr/bin/docker run --rm --name sglang --env-file /etc/sglang/sglang.env\n")
    (store / "sglang.env").write_text("HF_HUB_OFFLINE=1\n")
    (store / "server-args.json").write_text("[]\n")
    (store / "config.json").write_text(json.dumps({"files": {"unit": "sglang.service", "env": "sglang.env",
                                                             "args": "server-args.json"},
                                                   "image": {"image_ref": "img"}, "kept": "then"}))
    TakeOver(None, layout(SPARK["spark_legacy_names"]), layout(names(SPARK))).rewrite_stores(str(tmp_path))
    kept = load_kept(str(tmp_path), "last-good")
    assert kept["files"]["unit"] == (b"ExecStart=/usr/bin/docker run --rm --name spark-llm "
                                      b"--env-file /etc/spark-llm/spark-llm.env\n")
    assert kept["files"]["env"] == b"HF_HUB_OFFLINE=1\n" and kept["image"] == {"image_ref": "img"}
    assert sorted(p.name for p in store.iterdir()) == ["config.json", "server-args.json", "spark-llm.env",
                                                       "spark-llm.service"]


def test_a_node_is_looked_at_for_every_old_unit_and_directory_and_nothing_of_today():
    paths = filter_plugin("spark").spark_legacy_paths(SPARK["spark_legacy_names"], names(SPARK))
    old = layout(SPARK["spark_legacy_names"])
    assert {old["server_unit_path"], old["config_dir"], old["supervisor_unit_path"], old["firewall_unit_path"],
            old["monitoring_state_dir"], *old["monitoring_dropins"]} <= set(paths)
    assert all("sglang" in p for p in paths), paths


def test_renamed_settings_are_announced_once_by_the_task_that_applies_them(monkeypatch):
    """The inventory check asks whether any setting still has its old name (announce=false) before it includes the
    task that applies them: only that task's call may print the deprecation line, or each would print twice."""
    spark = filter_plugin("spark")
    said = []
    monkeypatch.setattr(spark.Display, "deprecated", lambda self, msg, **kw: said.append(msg))
    hostvars = {"spark-0": {"sglang_server_port": 30001, "server_image": "x"}, "spark-1": {"server_port": 30000}}
    expected = [{"host": "spark-0", "old": "sglang_server_port", "new": "server_port", "value": 30001}]
    assert spark.spark_renamed_settings(hostvars, ["spark-0", "spark-1"], announce=False) == expected
    assert said == []
    assert spark.spark_renamed_settings(hostvars, ["spark-0", "spark-1"]) == expected
    assert said == ["sglang_server_port (set for spark-0) is now server_port: rename it in the inventory"]

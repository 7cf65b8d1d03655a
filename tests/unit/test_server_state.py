"""A no-change run reads each rank once: the server role's probe module and the filters that decide from it.

The module (plugins/modules/server_state.py) runs as Ansible runs it, against files in a
temporary root and the docker stand-in (SPARK_SIM_ROOT points its state there). The filters decide whether
the install step runs (any file, mode, owner or the boot switch that differs) and why the group restarts.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lib.role_module import run_module
from tests.lib.server_plan import FILTER
from tests.lib.standin_docker import DOCKER, docker, node_root

REPO = Path(__file__).resolve().parents[2]
IMAGE = "lmsysorg/sglang:glm-5.3-flash-arm64"
KEY = "k3y-that-must-never-be-shown-0123456789abcdef"
drift = FILTER.server_install_drift
reasons = FILTER.server_restart_reasons



def sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()  # noqa: S324 - what the module reports


@pytest.fixture
def node(tmp_path, monkeypatch):
    root = node_root(tmp_path, monkeypatch)
    store = root / "etc" / "spark-llm"
    paths = {"unit": root / "etc" / "systemd" / "system" / "spark-llm.service", "env": store / "spark-llm.env",
             "args": store / "server-args.json"}
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    store.chmod(0o700)
    paths["unit"].write_text(f"[Service]\nExecStart=/usr/bin/docker run --name sglang {IMAGE}\n")
    paths["env"].write_text("HF_HUB_OFFLINE=1\n")
    paths["env"].chmod(0o600)
    (store / "spark-llm.key").write_text(KEY)
    (store / "spark-llm.key").chmod(0o600)
    paths["args"].write_text(json.dumps(["--port", "30000"]) + "\n")
    model = root / "opt" / "models" / "glm53"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"num_attention_heads": 64}))
    return {"root": root, "store": store, "paths": paths, "model": model, "tmp": tmp_path}


def probe(node, check=False, **extra):
    args = {"image_ref": IMAGE, "model_config": str(node["model"] / "config.json"),
            "files": {k: str(v) for k, v in node["paths"].items()}, "config_dir": str(node["store"]),
            "unit": "sglang-test-absent.service", "nginx_conf": str(node["root"] / "nginx.conf"),
            "store": str(node["store"]), "container": "spark-llm", "docker": str(DOCKER), **extra}
    return run_module("server_state", args, node["tmp"], check=check)


def test_pull_reports_a_change_only_when_it_downloads_and_never_in_check_mode(node):
    first = probe(node, check=True)
    assert first["changed"] is False and first["image"]["rc"] != 0, "check mode pulled"
    pulled = probe(node)
    assert pulled["changed"] is True
    assert pulled["image"]["Id"] == docker(node["root"], "image", "inspect", "--format", "{{.Id}}", IMAGE)
    assert (pulled["image"]["Os"], pulled["image"]["Architecture"]) == ("linux", "arm64")
    again = probe(node)
    assert again["changed"] is False and again["image"]["Id"] == pulled["image"]["Id"]


def test_reads_files_and_config_without_their_content(node):
    result = probe(node, check=True)
    for kind, path in node["paths"].items():
        got = result["files"][kind]
        assert got["exists"] and got["sha1"] == sha1(path), kind
    assert result["files"]["env"]["mode"] == "0600"
    assert result["files"]["dir"]["isdir"] and result["files"]["dir"]["mode"] == "0700"
    assert json.loads(base64.b64decode(result["model_config"]["content"])) == {"num_attention_heads": 64}
    assert "key" not in result["files"], "no key file asked for"
    keyed = probe(node, check=True, key_file=str(node["store"] / "spark-llm.key"))["files"]["key"]
    assert keyed["exists"] and keyed["mode"] == "0600" and keyed["sha1"] == sha1(node["store"] / "spark-llm.key")
    assert KEY not in json.dumps(keyed), "the key file's content reached the answer"
    node["paths"]["args"].unlink()
    assert probe(node, check=True)["files"]["args"] == {"exists": False}


def test_recorded_only_when_what_runs_is_kept_and_nothing_else_is_pending(node):
    docker(node["root"], "pull", IMAGE)
    container = subprocess.Popen(  # noqa: S603 - the docker stand-in, a script of this repository
        [sys.executable, str(DOCKER), "run", "--rm", "--name", "spark-llm", IMAGE, "sleep", "120"],
        env={**os.environ, "SPARK_SIM_ROOT": str(node["root"])}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while docker(node["root"], "inspect", "--type", "container", "--format", "{{.State.Running}}", "spark-llm",
                     check=False) != "true":
            assert time.monotonic() < deadline, "the container did not start"
            time.sleep(0.1)
        first = probe(node, check=True)
        assert (first["recorded"], first["pending"]) == (False, False), "nothing kept yet"
        config = {"files": {k: str(v) for k, v in node["paths"].items()}, "store": str(node["store"]),
                  "container": "spark-llm", "docker": str(DOCKER)}
        run_module("server_config", {**config, "state": "pending"}, node["tmp"])
        pending = probe(node, check=True)
        assert (pending["recorded"], pending["pending"]) == (True, True), "pending"
        run_module("server_config", {**config, "state": "commit"}, node["tmp"])
        # Committed: nothing pending is left, so the next commit after verify has nothing to do.
        committed = probe(node, check=True)
        assert (committed["recorded"], committed["pending"]) == (True, False), "last good"
        node["paths"]["env"].write_text("HF_HUB_OFFLINE=1\nEXTRA=1\n")
        assert probe(node, check=True)["recorded"] is False, "an edited env file is not what was kept"
    finally:
        docker(node["root"], "stop", "--time", "1", "spark-llm", check=False)
        container.wait(30)
    assert probe(node, check=True)["recorded"] is False, "no running container"


def test_supervisor_held_by_a_pause_or_a_give_up(node):
    config, state = node["root"] / "supervisor.json", node["root"] / "state"
    state.mkdir()
    extra = {"supervisor_config": str(config), "supervisor_state_dir": str(state)}
    assert probe(node, check=True, **extra)["supervisor_held"] is False
    (state / "paused").write_text("{}")
    assert probe(node, check=True, **extra)["supervisor_held"] is False, "no supervisor installed"
    config.write_text("{}")
    assert probe(node, check=True, **extra)["supervisor_held"] is True
    (state / "paused").unlink()
    (state / "gave-up.json").write_text("{}")
    assert probe(node, check=True, **extra)["supervisor_held"] is True
    assert probe(node, check=True, supervisor_config="", supervisor_state_dir=str(state))["supervisor_held"] is False


def found(**changes):
    files = {kind: {"exists": True, "isdir": False, "sha1": kind * 4, "mode": mode, "owner": "root", "group": "root"}
             for kind, mode in (("unit", "0644"), ("env", "0600"), ("args", "0644"))}
    files["dir"] = {"exists": True, "isdir": True, "mode": "0700", "owner": "root", "group": "root"}
    probe_result = {"files": files, "unit": {"ActiveState": "active", "UnitFileState": "enabled"}}
    for key, value in changes.items():
        kind, _, attr = key.partition("__")
        target = probe_result["unit"] if kind == "unit_state" else files[kind]
        target[attr] = value
    return probe_result


EXPECTED = {"files": {kind: {"sha1": kind * 4, "mode": mode} for kind, mode in
                      (("unit", "0644"), ("env", "0600"), ("args", "0644"))},
            "dir_mode": "0700", "owner": "root", "group": "root", "enabled": True}


@pytest.mark.parametrize(("changes", "expected", "want"), [
    ({}, EXPECTED, []),
    ({"env__sha1": "edited"}, EXPECTED, ["env content"]),
    ({"args__exists": False}, EXPECTED, ["args missing"]),
    ({"unit__mode": "0664"}, EXPECTED, ["unit mode or owner"]),
    ({"env__owner": "nobody"}, EXPECTED, ["env mode or owner"]),
    ({"dir__mode": "0755"}, EXPECTED, ["configuration directory"]),
    ({"unit_state__UnitFileState": "disabled"}, EXPECTED, ["start at boot (disabled)"]),
    ({}, {**EXPECTED, "enabled": False}, ["start at boot (enabled)"]),
    ({"unit_state__UnitFileState": "disabled"}, {**EXPECTED, "enabled": False}, []),
], ids=["in-place", "edited", "removed", "mode", "owner", "directory", "disabled", "to-disable", "supervised"])
def test_install_runs_when_anything_it_owns_differs(changes, expected, want):
    assert drift(found(**changes), expected) == want


def test_the_key_file_is_installed_where_the_ranks_are_keyed_and_removed_where_not():
    keyed = {**EXPECTED, "files": {**EXPECTED["files"], "key": {"sha1": "key" * 4, "mode": "0600"}}}
    with_key = found()
    with_key["files"]["key"] = {"exists": True, "isdir": False, "sha1": "key" * 4, "mode": "0600", "owner": "root",
                                "group": "root"}
    assert drift(with_key, keyed) == []
    with_key["files"]["key"]["sha1"] = "rotated"
    assert drift(with_key, keyed) == ["key content"]
    with_key["files"]["key"]["sha1"], with_key["files"]["key"]["mode"] = "key" * 4, "0644"
    assert drift(with_key, keyed) == ["key mode or owner"]
    assert drift(found(), keyed) == ["key missing"], "a node deployed before the key had a file of its own"
    unkeyed = {**EXPECTED, "files": {**EXPECTED["files"], "key": {"absent": True}}}
    assert drift(found(), unkeyed) == []
    assert drift(with_key, unkeyed) == ["key present"]


def test_a_fresh_node_installs_everything():
    fresh = {"files": {kind: {"exists": False} for kind in ("unit", "env", "args", "dir")},
             "unit": {"ActiveState": "inactive", "UnitFileState": ""}}
    assert drift(fresh, EXPECTED) == ["configuration directory", "unit missing", "env missing", "args missing",
                                      "start at boot (unknown)"]


def test_restart_reasons_name_each_rank_and_cause():
    active = {"changed": False, "unit": {"ActiveState": "active"}}
    hostvars = {
        "spark-0": {"__server_probe": active},
        "spark-1": {"__server_probe": active, "__server_env_result": {"changed": False}},
    }
    assert reasons(["spark-0", "spark-1"], hostvars) == {}
    hostvars["spark-1"]["__server_env_result"] = {"changed": True}
    hostvars["spark-0"]["__server_probe"] = {"changed": True, "unit": {"ActiveState": "failed"}}
    assert reasons(["spark-0", "spark-1"], hostvars) == {
        "spark-0": ["a newer image was pulled", "unit failed"], "spark-1": ["env file changed"]}
    hostvars["spark-1"] = {"__server_probe": active, "__server_unit_result": {"changed": True}}
    assert reasons(["spark-1"], hostvars) == {"spark-1": ["unit changed"]}
    hostvars["spark-1"] = {"__server_probe": active, "__server_key_result": {"changed": True}}
    assert reasons(["spark-1"], hostvars) == {"spark-1": ["API key changed"]}

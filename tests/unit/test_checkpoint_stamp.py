"""The server's refusal of an unverified checkpoint: the checkpoint role's stamp check.

The stamp is the checkpoint role's: checkpoint_verify writes it after a
passing deep verification, and the role's stamp entry point (tasks/stamp.yml,
module checkpoint_stamp) reads it for the server role, on each node and by
delegation for the ranks --limit left out. Both go through one digest in
plugins/module_utils/checkpoint_common.py.

The stamps below are written out the way deployed stamps are (the digest
formula spelled out here, not imported), so a change of the formula or of the
stamp's fields fails here instead of refusing every deployed checkpoint. The
messages are the ones the server prints, with the server role's variable
names, which it hands to the entry point (pinned below).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import uuid
from pathlib import Path

import pytest
import yaml

from tests.lib.role_module import module_utils, run_module

REPO = Path(__file__).resolve().parents[2]
CHECKPOINT = REPO / "roles" / "checkpoint"
SERVER = REPO / "roles" / "server"
REVISION = "7ce4007804ddbb1b33185febc1669f76f90fb53e"
MODEL_DIR = "/opt/models/glm53"
EXPECTED = {
    "revision": REVISION,
    "model_dir": MODEL_DIR,
    "stamp_path": "/opt/models/glm53.verified",
    "record_path": "/opt/models/glm53.record.json",
}


common = module_utils("checkpoint_common")


def _server_stamp_includes() -> list[dict]:
    """The server role's include_role of the checkpoint role's stamp entry point, in each task file."""
    found = []
    for name in ("checkpoint.yml", "outside.yml"):
        for task in yaml.safe_load((SERVER / "tasks" / name).read_text()):
            include = task.get("ansible.builtin.include_role")
            if include and include.get("name") == "dgx_spark.llm_serving.checkpoint" and include.get("tasks_from") == "stamp":
                found.append(dict(task, file=name))
    return found


def _server_names() -> dict:
    (names,) = {(t["vars"]["checkpoint_stamp_model_dir_variable"], t["vars"]["checkpoint_stamp_revision_variable"])
                for t in _server_stamp_includes()}
    return {"model_dir_variable": names[0], "revision_variable": names[1]}


def problems(stamp_read, record_read, expected) -> list[str]:
    """What the server role is told for its model directory and revision (see _server_names)."""
    return common.stamp_problems(stamp_read, record_read, **expected, **_server_names())


def slurped(data):
    """A read of a file holding ``data`` (a JSON value, or the text as it is)."""
    text = data if isinstance(data, str) else json.dumps(data, indent=1)
    return common.decode_json(text.encode())


def missing(path: str):
    # What reading an absent file gives (the path is shown by the message, not by the read).
    del path
    return common.read_json(f"/nonexistent-{uuid.uuid4().hex}/file")


def record(files=None) -> dict:
    return {
        "repo_id": "LibertAIDAI/GLM-5.3-Flash-NVFP4",
        "revision": REVISION,
        "files": files if files is not None else {
            "config.json": {"size": 1234, "sha256": "a" * 64},
            "model-00001-of-00120.safetensors": {"size": 99, "sha256": "b" * 64},
        },
    }


def stamp_for(rec: dict, **changes) -> dict:
    stamp = {
        "repo_id": rec["repo_id"],
        "revision": rec["revision"],
        "record_sha256": hashlib.sha256(json.dumps(rec["files"], sort_keys=True).encode()).hexdigest(),
        "model_dir": MODEL_DIR,
        "mode": "deep",
        "verified_at": "2026-11-29T19:22:39Z",
    }
    stamp.update(changes)
    return stamp


def test_a_deep_stamp_of_the_pinned_record_passes():
    rec = record()
    assert problems(slurped(stamp_for(rec)), slurped(rec), EXPECTED) == []


def test_a_trailing_slash_in_the_model_dir_is_the_same_directory():
    rec = record()
    assert problems(slurped(stamp_for(rec)), slurped(rec), dict(EXPECTED, model_dir=MODEL_DIR + "/")) == []


def test_missing_stamp_is_refused_with_its_path():
    rec = record()
    found = problems(missing(EXPECTED["stamp_path"]), slurped(rec), EXPECTED)
    assert found == ["the verified-stamp /opt/models/glm53.verified does not exist"]


def test_missing_record_is_refused():
    rec = record()
    found = problems(slurped(stamp_for(rec)), missing(EXPECTED["record_path"]), EXPECTED)
    assert found == ["the checkpoint record /opt/models/glm53.record.json does not exist"]


def test_unreadable_stamp_says_why():
    rec = record()
    found = problems((None, ("unread", "Permission denied")), slurped(rec), EXPECTED)
    assert found == ["the verified-stamp /opt/models/glm53.verified could not be read (Permission denied)"]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\"deep\""])
def test_a_stamp_that_is_not_a_json_object_is_refused(text):
    rec = record()
    found = problems(slurped(text), slurped(rec), EXPECTED)
    assert len(found) == 1
    assert found[0].startswith("the verified-stamp /opt/models/glm53.verified is not")


def test_a_fast_only_stamp_is_refused():
    rec = record()
    found = problems(slurped(stamp_for(rec, mode="fast")), slurped(rec), EXPECTED)
    assert found == ["the stamp /opt/models/glm53.verified records a 'fast' check, not a deep one"]


def test_a_stamp_of_another_revision_is_refused():
    old = "0" * 40
    rec = dict(record(), revision=old)
    found = problems(slurped(stamp_for(rec)), slurped(rec), EXPECTED)
    assert found == [f"the stamp /opt/models/glm53.verified is for revision '{old}', the pinned revision is '{REVISION}'"]


def test_a_stamp_written_for_an_older_record_is_refused():
    rec = record()
    stamp = stamp_for(rec)
    newer = record(dict(rec["files"], **{"model-input-scales.safetensors": {"size": 7, "sha256": "c" * 64}}))
    found = problems(slurped(stamp), slurped(newer), EXPECTED)
    assert len(found) == 1
    assert "was written for another record" in found[0]


def test_a_stamp_of_another_directory_is_refused():
    rec = record()
    found = problems(slurped(stamp_for(rec, model_dir="/srv/other")), slurped(rec), EXPECTED)
    assert found == [
        "the stamp /opt/models/glm53.verified vouches for '/srv/other', not for server_model_dir = "
        "'/opt/models/glm53'"
    ]


def test_a_record_of_another_repository_is_refused():
    rec = record()
    other = dict(rec, repo_id="someone/else")
    found = problems(slurped(stamp_for(rec)), slurped(other), EXPECTED)
    assert len(found) == 1
    assert "someone/else" in found[0]


@pytest.mark.parametrize("revision", ["", "main", "7ce4007", None, REVISION.upper()])
def test_without_a_pinned_revision_nothing_can_vouch(revision):
    rec = record()
    found = problems(slurped(stamp_for(rec)), slurped(rec), dict(EXPECTED, revision=revision))
    assert any("server_checkpoint_revision" in p and "not a pinned 40-hex commit" in p for p in found)


def test_every_problem_is_reported_at_once():
    rec = record()
    stamp = stamp_for(rec, mode="fast", model_dir="/elsewhere", revision="1" * 40)
    found = problems(slurped(stamp), slurped(rec), EXPECTED)
    assert len(found) >= 3


def test_the_server_asks_the_checkpoint_role_and_names_its_own_variables():
    includes = _server_stamp_includes()
    assert sorted(t["file"] for t in includes) == ["checkpoint.yml", "outside.yml"]
    for task in includes:
        assert task["vars"]["checkpoint_stamp_model_dir"] == "{{ server_model_dir }}"
        assert task["vars"]["checkpoint_stamp_revision"] == "{{ server_checkpoint_revision }}"
    outside = next(t for t in includes if t["file"] == "outside.yml")
    assert outside["vars"]["checkpoint_stamp_hosts"] == "{{ __server_outside }}"
    assert _server_names() == {"model_dir_variable": "server_model_dir",
                               "revision_variable": "server_checkpoint_revision"}


def test_the_stamp_digest_is_written_once():
    """The checkpoint role owns the stamp: no other file of any role reads its digest or recomputes it."""
    holders = sorted(str(p.relative_to(REPO)) for p in [*(REPO / "roles").rglob("*"), *(REPO / "plugins").rglob("*")]
                     if p.is_file() and p.suffix in (".py", ".yml") and "record_sha256" in p.read_text())
    assert holders == ["plugins/module_utils/checkpoint_common.py"]
    common_source = (REPO / "plugins" / "module_utils" / "checkpoint_common.py").read_text()
    assert common_source.count("hashlib.sha256(") == 1
    assert "slurp" not in (SERVER / "tasks" / "checkpoint.yml").read_text()


def _tiny_checkpoint(base: Path) -> tuple[Path, Path]:
    """A complete one-shard checkpoint and its record, as checkpoint_fetch would leave them."""
    model = base / "glm53"
    model.mkdir(parents=True)
    shard = "model-00001-of-00001.safetensors"
    contents = {
        shard: os.urandom(4096),
        "model.safetensors.index.json": json.dumps({"weight_map": {"w": shard}}).encode(),
        "config.json": json.dumps({"model_type": "glm5_next", "quantization_config": {}}).encode(),
        "processor_config.json": b"{}",
    }
    files = {}
    for name, data in contents.items():
        (model / name).write_bytes(data)
        if name.endswith(".safetensors"):
            files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        else:
            blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data, usedforsecurity=False).hexdigest()
            files[name] = {"size": len(data), "git_sha1": blob}
    rec = dict(record(dict(sorted(files.items()))), format=1)
    (base / "glm53.record.json").write_text(json.dumps(rec, indent=1))
    return model, base / "glm53.record.json"


def stamp_module(model: Path, tmp: Path, revision=REVISION, **kw) -> dict:
    return run_module("checkpoint_stamp", {"model_dir": str(model), "revision": revision,
                                                              **_server_names(), **kw}, tmp)


def test_a_stamp_written_by_checkpoint_verify_vouches_and_keeps_the_deployed_format(tmp_path):
    model, rec_path = _tiny_checkpoint(tmp_path / "m")
    before = stamp_module(model, tmp_path)
    assert before["problems"] == [f"the verified-stamp {model}.verified does not exist"]
    assert not before["ok"] and not before["changed"]
    verified = run_module("checkpoint_verify", {
        "model_dir": str(model), "record_path": str(rec_path), "mode": "deep", "shard_count": 1,
        "stamp_path": str(model) + ".verified"}, tmp_path)
    assert verified["ok"] and verified["changed"], verified
    written = json.loads(Path(str(model) + ".verified").read_text())
    # A stamp deployed before this module existed carries these fields and this digest; a stamp
    # also remembers each file's state ("files", read by the checkpoint role's fast check only).
    assert {k: v for k, v in written.items() if k != "files"} == stamp_for(
        json.loads(rec_path.read_text()), model_dir=str(model), verified_at=written["verified_at"])
    assert sorted(written["files"]) == sorted(json.loads(rec_path.read_text())["files"])
    after = stamp_module(model, tmp_path)
    assert after["ok"] and after["problems"] == [] and after["stamp"] == written and not after["changed"]
    # Check mode reads the same.
    checked = run_module("checkpoint_stamp", {"model_dir": str(model), "revision": REVISION},
                              tmp_path, check=True)
    assert checked["ok"] and not checked["changed"]


def test_the_stamp_vouches_only_for_files_in_the_state_it_verified_them_in(tmp_path):
    """The entry point reads the per-file states the stamp remembers, as the fast verification does: a shard
    rewritten in place with its mtime put back, or a file gone, is not vouched for; the same files the fast
    check would hash again."""
    model, rec_path = _tiny_checkpoint(tmp_path / "m")
    stamp_path = Path(str(model) + ".verified")
    verified = run_module("checkpoint_verify", {
        "model_dir": str(model), "record_path": str(rec_path), "mode": "deep", "shard_count": 1,
        "stamp_path": str(stamp_path)}, tmp_path)
    assert verified["ok"] and stamp_module(model, tmp_path)["ok"]
    shard = model / "model-00001-of-00001.safetensors"
    times = shard.stat()
    shard.write_bytes(os.urandom(times.st_size))
    os.utime(shard, ns=(times.st_atime_ns, times.st_mtime_ns))
    res = stamp_module(model, tmp_path)
    assert not res["ok"] and res["problems"] == [
        f"1 files changed since the stamp {stamp_path} verified them (size, mtime, inode or ctime), "
        "e.g. ['model-00001-of-00001.safetensors']"]
    fast = run_module("checkpoint_verify", {
        "model_dir": str(model), "record_path": str(rec_path), "mode": "fast", "shard_count": 1,
        "stamp_path": str(stamp_path), "fail_on_problems": False}, tmp_path, check=True)
    assert fast["changed_since_verified"] == ["model-00001-of-00001.safetensors"]
    (model / "processor_config.json").unlink()
    assert stamp_module(model, tmp_path)["problems"][0] == (
        f"1 files of the record are missing from {model}, e.g. ['processor_config.json']")


def test_a_stamp_without_per_file_memory_vouches_for_files_older_than_its_verification(tmp_path):
    """A stamp written before stamps remembered each file: a file whose ctime is newer than verified_at changed."""
    model, rec_path = _tiny_checkpoint(tmp_path / "m")
    stamp_path = Path(str(model) + ".verified")
    stamp_path.write_text(json.dumps(stamp_for(json.loads(rec_path.read_text()), model_dir=str(model),
                                               verified_at="2099-01-01T00:00:00Z")))
    assert stamp_module(model, tmp_path)["ok"]
    stamp_path.write_text(json.dumps(stamp_for(json.loads(rec_path.read_text()), model_dir=str(model),
                                               verified_at="2001-01-01T00:00:00Z")))
    res = stamp_module(model, tmp_path)
    assert not res["ok"] and res["problems"][0].startswith("4 files changed since the stamp"), res["problems"]


def test_the_module_reports_what_the_server_prints(tmp_path):
    model, rec_path = _tiny_checkpoint(tmp_path / "m")
    stamp_path = Path(str(model) + ".verified")
    stamp_path.write_text(json.dumps(stamp_for(json.loads(rec_path.read_text()), model_dir=str(model), mode="fast")))
    res = stamp_module(model, tmp_path, revision="main")
    assert res["problems"] == [
        "server_checkpoint_revision = 'main' is not a pinned 40-hex commit, so no stamp can be matched "
        "against it (set checkpoint_revision in the inventory)",
        f"the stamp {stamp_path} records a 'fast' check, not a deep one",
        f"the stamp {stamp_path} is for revision '{REVISION}', the pinned revision is 'main'",
    ]
    stamp_path.unlink()
    stamp_path.mkdir()
    res = stamp_module(model, tmp_path)
    assert res["problems"] == [f"the verified-stamp {stamp_path} could not be read (Is a directory)"]


def test_the_stamp_and_the_record_live_beside_the_model_directory():
    spec = importlib.util.spec_from_file_location("spark_filter", REPO / "plugins" / "filter" / "spark.py")
    spark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(spark)
    paths = spark.spark_checkpoint_paths(MODEL_DIR)
    assert (paths["stamp"], paths["record"]) == (EXPECTED["stamp_path"], EXPECTED["record_path"])
    cp_vars = yaml.safe_load((CHECKPOINT / "vars" / "main.yml").read_text())
    # The checkpoint role writes them where the entry point reads them: both through that filter.
    assert cp_vars["__checkpoint_paths"] == "{{ checkpoint_model_dir | dgx_spark.llm_serving.spark_checkpoint_paths }}"
    assert cp_vars["__checkpoint_stamp_path"] == "{{ __checkpoint_paths.stamp }}"
    assert cp_vars["__checkpoint_record_path"] == "{{ __checkpoint_paths.record }}"
    assert cp_vars["__checkpoint_stamp_of"] == "{{ checkpoint_stamp_model_dir | dgx_spark.llm_serving.spark_checkpoint_paths }}"
    stamp_task = yaml.safe_load((CHECKPOINT / "tasks" / "stamp.yml").read_text())[0]["dgx_spark.llm_serving.checkpoint_stamp"]
    assert (stamp_task["stamp_path"], stamp_task["record_path"]) == (
        "{{ __checkpoint_stamp_of.stamp }}", "{{ __checkpoint_stamp_of.record }}")

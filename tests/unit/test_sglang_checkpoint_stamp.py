"""The sglang_server role's refusal of an unverified checkpoint (the stamp check).

The stamp is the checkpoint role's: written by roles/checkpoint/library/
checkpoint_verify.py after a passing deep verification. The fixtures below
build it the way that module does; test_contract_with_checkpoint_verify pins
the two lines of that module this agreement rests on, so a change there
fails here instead of silently refusing (or passing) every deployment.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "sglang_server"
VERIFY = REPO / "roles" / "checkpoint" / "library" / "checkpoint_verify.py"
REVISION = "7ce4007804ddbb1b33185febc1669f76f90fb53e"
MODEL_DIR = "/opt/models/glm53"
EXPECTED = {
    "revision": REVISION,
    "model_dir": MODEL_DIR,
    "stamp_path": "/opt/models/glm53.verified",
    "record_path": "/opt/models/glm53.record.json",
}


def _load_filter():
    spec = importlib.util.spec_from_file_location("sglang_server_filter", ROLE / "filter_plugins" / "sglang_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


problems = _load_filter().sglang_server_checkpoint_problems


def slurped(data) -> dict:
    text = data if isinstance(data, str) else json.dumps(data, indent=1)
    return {"changed": False, "content": base64.b64encode(text.encode()).decode(), "encoding": "base64"}


def missing(path: str) -> dict:
    # What ansible.builtin.slurp answers for an absent file (with failed_when: false).
    return {"failed": True, "msg": f"file not found: {path}", "changed": False}


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
    found = problems({"failed": True, "msg": "Permission denied"}, slurped(rec), EXPECTED)
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
        "the stamp /opt/models/glm53.verified vouches for '/srv/other', not for sglang_server_model_dir = "
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
    assert any("sglang_server_checkpoint_revision" in p and "not a pinned 40-hex commit" in p for p in found)


def test_every_problem_is_reported_at_once():
    rec = record()
    stamp = stamp_for(rec, mode="fast", model_dir="/elsewhere", revision="1" * 40)
    found = problems(slurped(stamp), slurped(rec), EXPECTED)
    assert len(found) >= 3


def test_contract_with_checkpoint_verify():
    """The stamp fields and the record digest are computed where the checkpoint role writes them."""
    source = VERIFY.read_text()
    assert "record_digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()" in source
    assert re.search(r'"record_sha256": record_digest, "model_dir": model_dir, "mode": "deep"', source)
    assert 'files: dict = record["files"]' in source
    # Where the checkpoint role keeps the stamp and the record: beside the model directory.
    cp_vars = (REPO / "roles" / "checkpoint" / "vars" / "main.yml").read_text()
    assert '__checkpoint_stamp_path: "{{ __checkpoint_parent }}/{{ __checkpoint_name }}.verified"' in cp_vars
    assert '__checkpoint_record_path: "{{ __checkpoint_parent }}/{{ __checkpoint_name }}.record.json"' in cp_vars

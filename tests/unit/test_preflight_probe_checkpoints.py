"""preflight_probe's `checkpoints`: the records beside the model directory, run as the role runs the module.

Preflight's `checkpoint` check refuses a model directory whose record names another repository, and its disk
message names the checkpoints beside it; both read this.
"""

from __future__ import annotations

import json

from tests.lib.role_module import run_module


def record(parent, name, repo, revision, size):
    (parent / f"{name}.record.json").write_text(json.dumps({"repo_id": repo, "revision": revision, "total_bytes": size}))


def test_the_model_directory_s_own_record_and_the_others_beside_it(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    record(models, "glm53", "LibertAIDAI/GLM-5.3-Flash-NVFP4", "a" * 40, 100)
    (models / "glm53.verified").write_text("{}")
    record(models, "glm53-alt", "SparkSite/GLM-5.3-Flash-NVFP4-alt", "b" * 40, 200)
    # Not records: a file that is not JSON, a hidden one, the partial directory's.
    (models / "broken.record.json").write_text("{")
    record(models, ".hidden", "X/Y", "c" * 40, 1)
    result = run_module("preflight_probe", {"model_dir": str(models / "glm53"), "disk_only": True}, tmp_path)
    assert result["checkpoints"] == {
        "here": {"dir": str(models / "glm53"), "repo_id": "LibertAIDAI/GLM-5.3-Flash-NVFP4", "revision": "a" * 40,
                 "bytes": 100, "verified": True},
        "beside": [{"dir": str(models / "glm53-alt"), "repo_id": "SparkSite/GLM-5.3-Flash-NVFP4-alt",
                    "revision": "b" * 40, "bytes": 200, "verified": False}]}
    assert result["changed"] is False


def test_a_model_directory_whose_parent_does_not_exist_yet_has_none(tmp_path):
    result = run_module("preflight_probe", {"model_dir": str(tmp_path / "opt" / "models" / "glm53"), "disk_only": True},
                        tmp_path)
    assert result["checkpoints"] == {"here": {}, "beside": []}

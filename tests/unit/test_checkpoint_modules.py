"""The checkpoint role's modules, run as Ansible runs them (a script reading its arguments file).

The record is built by the real huggingface_hub client against the local hub emulator, so
these tests also pin the record format to what the hub reports.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from tests.lib.checkpoint_site import SCALES, SHARD, fetch_checkpoint, serve_hub
from tests.lib.role_module import module_utils, run_module
from tests.standins.hub_emulator import HubEmulator, build_checkpoint

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "plugins" / "modules"
MODULES = sorted(p.stem for p in LIBRARY.glob("checkpoint_*.py"))


def load_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



@pytest.fixture(scope="module")
def pristine(hub, tmp_path_factory):
    """A complete fetched checkpoint and its record, copied fresh for each test."""
    base = tmp_path_factory.mktemp("pristine")
    res = fetch_checkpoint(hub, base)
    assert not res.get("failed"), res
    return base


@pytest.fixture
def ckpt(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "m", symlinks=True)
    model = tmp_path / "m" / "glm53"
    return model, tmp_path / "m" / "glm53.record.json"


def verify(model: Path, record: Path, tmp: Path, **kw) -> dict:
    return run_module("checkpoint_verify", {"model_dir": str(model), "record_path": str(record),
                                            "fail_on_problems": False, **kw}, tmp)


@pytest.mark.parametrize("revision", ["main", "7ce4007", "7CE4007804DDBB1B33185FEBC1669F76F90FB53E", "v1.0", ""])
def test_fetch_refuses_unpinned_revision(revision, tmp_path):
    res = run_module("checkpoint_fetch", {"repo_id": "LibertAIDAI/GLM-5.3-Flash-NVFP4", "revision": revision,
                                          "model_dir": str(tmp_path / "glm53"),
                                          "endpoint": "http://127.0.0.1:9"}, tmp_path)
    assert res["failed"]
    assert "40 lowercase hex" in res["msg"] and "Fix" in res["msg"]
    assert not (tmp_path / "glm53").exists()


def test_record_matches_what_the_hub_reports(pristine, hub):
    record = json.loads((pristine / "glm53.record.json").read_text())
    assert record["revision"] == hub.info["new"]
    assert sorted(record["files"]) == hub.info["files"]
    shard = record["files"][SHARD]
    assert len(shard["sha256"]) == 64 and "git_sha1" not in shard
    assert "sha256" not in record["files"]["config.json"] and len(record["files"]["config.json"]["git_sha1"]) == 40
    assert oct(os.stat(pristine / "glm53.record.json").st_mode & 0o777) == "0o644"


def test_fetch_check_mode_changes_nothing(hub, tmp_path):
    res = run_module("checkpoint_fetch", {"repo_id": hub.info["repo_id"], "revision": hub.info["new"],
                                          "model_dir": str(tmp_path / "glm53"), "endpoint": hub.url}, tmp_path,
                     check=True)
    assert res["changed"] and len(res["fetched"]) == len(hub.info["files"])
    assert not (tmp_path / "glm53").exists() and not (tmp_path / "glm53.record.json").exists()


def test_fetch_refuses_a_filesystem_too_small(hub, tmp_path):
    res = run_module("checkpoint_fetch", {"repo_id": hub.info["repo_id"], "revision": hub.info["new"],
                                          "model_dir": str(tmp_path / "glm53"), "endpoint": hub.url,
                                          "disk_reserve_bytes": 1 << 62}, tmp_path)
    assert res["failed"] and "checkpoint_model_dir" in res["msg"] and "free" in res["msg"]
    assert not list((tmp_path / "glm53").iterdir())


def test_fast_verify_passes_on_a_complete_copy(ckpt, tmp_path):
    model, record = ckpt
    res = verify(model, record, tmp_path)
    assert res["ok"], res["problems"]
    assert res["refetch"] == [] and res["file_count"] == 130
    # Fast mode hashes the small files only, never the shards.
    assert res["hashed_bytes"] < res["total_bytes"] - 120 * 2048


def test_missing_and_truncated_files_are_refetched(ckpt, tmp_path):
    model, record = ckpt
    (model / "processor_config.json").unlink()
    with open(model / SHARD, "r+b") as f:
        f.truncate(100)
    res = verify(model, record, tmp_path)
    assert not res["ok"]
    assert res["missing"] == ["processor_config.json"]
    assert res["wrong_size"] == [SHARD]
    assert res["refetch"] == sorted(["processor_config.json", SHARD])


def test_corrupted_shard_is_found_by_deep_verify_only(ckpt, tmp_path):
    model, record = ckpt
    path = model / SHARD
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert verify(model, record, tmp_path)["ok"]
    res = verify(model, record, tmp_path, mode="deep")
    assert not res["ok"]
    assert res["wrong_content"] == [SHARD] and res["refetch"] == [SHARD]


def test_stale_input_scales_are_detected_in_fast_mode(ckpt, hub, tmp_path):
    model, record = ckpt
    old = Path(hub.store.root) / hub.info["repo_id"] / hub.info["old"] / SCALES
    shutil.copyfile(old, model / SCALES)
    res = verify(model, record, tmp_path)
    assert not res["ok"] and res["stale_scales"]
    assert res["refetch"] == [SCALES]
    assert any("2026-08-30" in p for p in res["problems"])


@pytest.mark.parametrize("kind", ["py", "sh", "so", "exec", "symlink", "nested_py"])
def test_code_like_files_not_in_the_record_are_refused(ckpt, tmp_path, kind):
    model, record = ckpt
    if kind == "exec":
        target = model / "helper"
        target.write_text("#!/bin/sh\n")
        target.chmod(0o755)
    elif kind == "symlink":
        target = model / "tokenizer_extra.json"
        target.symlink_to("/etc/passwd")
    elif kind == "nested_py":
        (model / "sub").mkdir()
        target = model / "sub" / "modeling_glm5_next.py"
        target.write_text("import os\n")
    else:
        target = model / f"modeling_glm5_next.{kind}"
        target.write_text("x\n")
    res = verify(model, record, tmp_path)
    assert res["failed"] and "--trust-remote-code" in res["msg"]
    assert res["refused"] == [target.relative_to(model).as_posix()]


def test_extra_data_file_is_reported_and_kept(ckpt, tmp_path):
    model, record = ckpt
    (model / "notes.txt").write_text("mine\n")
    res = verify(model, record, tmp_path)
    assert not res["ok"] and res["extra"] == ["notes.txt"] and res["refetch"] == []
    assert (model / "notes.txt").exists()
    res = verify(model, record, tmp_path, fail_on_problems=True)
    assert res["failed"] and "notes.txt" in res["msg"]


def test_client_metadata_dir_is_ignored(ckpt, tmp_path):
    model, record = ckpt
    (model / ".cache" / "huggingface").mkdir(parents=True)
    (model / ".cache" / "huggingface" / "config.json.metadata").write_text("x\n")
    assert verify(model, record, tmp_path)["ok"]


def test_record_of_another_model_is_refused(ckpt, tmp_path):
    model, record = ckpt
    data = json.loads(record.read_text())
    del data["files"]["model-00120-of-00120.safetensors"]
    record.write_text(json.dumps(data))
    (model / "model-00120-of-00120.safetensors").unlink()
    res = verify(model, record, tmp_path)
    assert res["failed"] and "expected 120" in res["msg"] and "checkpoint_revision" in res["msg"]


def test_config_without_glm5_next_is_refused(ckpt, tmp_path):
    model, record = ckpt
    res = verify(model, record, tmp_path, model_type="glm4_moe")
    assert res["failed"] and "glm5_next" in res["msg"]


def test_stamp_written_after_deep_and_removed_on_failure(ckpt, tmp_path):
    model, record = ckpt
    stamp = model.parent / "glm53.verified"
    res = verify(model, record, tmp_path, mode="deep", stamp_path=str(stamp))
    assert res["changed"] and json.loads(stamp.read_text())["revision"] == res["revision"]
    again = verify(model, record, tmp_path, mode="deep", stamp_path=str(stamp))
    assert not again["changed"] and again["stamp"]["revision"] == res["revision"]
    fast = verify(model, record, tmp_path, stamp_path=str(stamp))
    assert fast["stamp"] is not None and not fast["changed"]
    (model / "config.json").unlink()
    in_check = run_module("checkpoint_verify", {"model_dir": str(model), "record_path": str(record),
                                                "stamp_path": str(stamp), "fail_on_problems": False},
                          tmp_path, check=True)
    assert in_check["changed"] and stamp.exists()
    gone = verify(model, record, tmp_path, stamp_path=str(stamp))
    assert gone["changed"] and not stamp.exists()


def test_fast_verify_never_writes_a_stamp(ckpt, tmp_path):
    model, record = ckpt
    stamp = model.parent / "glm53.verified"
    res = verify(model, record, tmp_path, stamp_path=str(stamp))
    assert res["ok"] and res["stamp"] is None and not stamp.exists()


def _fake_rsh(tmp: Path) -> str:
    """An rsync remote shell that runs the 'remote' side locally, as ssh would on the worker."""
    script = tmp / "fake-rsh"
    script.write_text('#!/bin/sh\nwhile [ "$1" = "-l" ]; do shift 2; done\nshift\nexec sh -c "$*"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_sync_sends_only_listed_files_in_parallel_streams(ckpt, tmp_path):
    model, record = ckpt
    dest = tmp_path / "worker" / "glm53"
    dest.mkdir(parents=True)
    files = sorted(p.name for p in model.iterdir())
    res = run_module("checkpoint_sync", {"src_dir": str(model), "dest_host": "127.0.0.1", "dest_dir": str(dest),
                                         "files": files[:40], "streams": 4, "ssh_command": _fake_rsh(tmp_path),
                                         "progress_path": str(tmp_path / "p.json")}, tmp_path)
    assert not res.get("failed"), res
    assert res["changed"] and res["transferred_files"] == 40 and len(res["streams"]) == 4
    assert sorted(p.name for p in dest.iterdir()) == files[:40]
    assert sum(s["files"] for s in res["streams"]) == 40
    assert json.loads((tmp_path / "p.json").read_text())["state"] == "done"
    res = run_module("checkpoint_sync", {"src_dir": str(model), "dest_host": "127.0.0.1", "dest_dir": str(dest),
                                         "files": [], "ssh_command": _fake_rsh(tmp_path)}, tmp_path)
    assert not res["changed"]


def test_sync_repairs_a_corrupted_file_with_same_size_and_mtime(ckpt, tmp_path):
    model, record = ckpt
    dest = tmp_path / "worker" / "glm53"
    shutil.copytree(model, dest)
    path = dest / SHARD
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    res = run_module("checkpoint_sync", {"src_dir": str(model), "dest_host": "127.0.0.1", "dest_dir": str(dest),
                                         "files": [SHARD], "ssh_command": _fake_rsh(tmp_path)}, tmp_path)
    assert not res.get("failed"), res
    assert path.read_bytes() == (model / SHARD).read_bytes()
    assert verify(dest, record, tmp_path, mode="deep")["ok"]


def test_sync_failure_names_the_fix(ckpt, tmp_path):
    model, _ = ckpt
    res = run_module("checkpoint_sync", {"src_dir": str(model), "dest_host": "127.0.0.1",
                                         "dest_dir": str(tmp_path / "nowhere" / "deeper" / "glm53"),
                                         "files": [SHARD], "ssh_command": _fake_rsh(tmp_path)}, tmp_path)
    assert res["failed"] and "resume" in res["msg"]


def test_progress_ignores_an_older_run_and_sees_the_end(tmp_path):
    jobs = tmp_path / "async"
    jobs.mkdir()
    (jobs / "j1").write_text(json.dumps({"started": True, "finished": False}))
    progress = tmp_path / "progress.json"
    progress.write_text(json.dumps({"id": "old", "state": "done", "line": "stale line"}))
    args = {"path": str(progress), "progress_id": "new", "jid": "j1", "async_dir": str(jobs), "wait": 1}
    res = run_module("checkpoint_progress", args, tmp_path)
    assert res["line"] == "starting" and not res["finished"] and not res["changed"]
    progress.write_text(json.dumps({"id": "new", "state": "running", "line": "1.0 GiB / 2.0 GiB"}))
    (jobs / "j1").write_text(json.dumps({"changed": True, "fetched": []}))
    res = run_module("checkpoint_progress", args, tmp_path)
    assert res["finished"] and res["line"] == "1.0 GiB / 2.0 GiB"


def test_a_broken_stream_resumes_from_the_bytes_on_disk_within_the_run(tmp_path):
    # Bigger than the client's 10 MiB write chunk, so the broken first stream leaves bytes behind.
    with serve_hub(tmp_path / "hub", seed=11, big_shard=True) as hub:
        info, shard_path = hub.info, hub.source / SHARD
        size, cut = shard_path.stat().st_size, 16 << 20
        hub.fault(SHARD, drop_at=cut, then_unavailable=False)
        res = run_module("checkpoint_fetch", {"repo_id": info["repo_id"], "revision": info["new"],
                                              "model_dir": str(tmp_path / "glm53"), "endpoint": hub.url,
                                              "files": [SHARD]}, tmp_path)
        assert not res.get("failed"), res
        ranges = [rng for method, path, rng in hub.requests if path.endswith(SHARD) and method == "GET"]
        assert len(ranges) == 2 and ranges[0] is None, ranges
        resumed_at = int(ranges[1].removeprefix("bytes=").removesuffix("-"))
        assert 0 < resumed_at <= cut
        assert hub.served()[SHARD] == cut + size - resumed_at, "only the missing bytes are asked again"
    assert (tmp_path / "glm53" / SHARD).read_bytes() == shard_path.read_bytes()
    assert not (tmp_path / ".glm53.partial" / f"{SHARD}.part").exists()


def test_an_empty_file_of_the_repository_is_fetched(tmp_path):
    root = tmp_path / "hub"
    info = build_checkpoint(root, seed=12)
    (root / info["repo_id"] / info["new"] / "empty.txt").write_bytes(b"")
    with HubEmulator(root) as hub:
        res = run_module("checkpoint_fetch", {"repo_id": info["repo_id"], "revision": info["new"],
                                              "model_dir": str(tmp_path / "glm53"), "endpoint": hub.url,
                                              "files": ["empty.txt"]}, tmp_path)
    assert not res.get("failed"), res
    assert res["fetched"] == ["empty.txt"] and (tmp_path / "glm53" / "empty.txt").read_bytes() == b""


def test_fetch_uses_only_the_public_api_of_the_hub_client():
    """Names exported by huggingface_hub or huggingface_hub.utils only: an upgrade may move anything else."""
    import huggingface_hub  # noqa: PLC0415 - the pinned client of the toolchain venv
    import huggingface_hub.utils  # noqa: PLC0415

    public = {"huggingface_hub": set(huggingface_hub.__all__) | {"__version__"},
              "huggingface_hub.utils": set(huggingface_hub.utils.__all__)}
    source = (LIBRARY / "checkpoint_fetch.py").read_text()
    imported = [(node.module, alias.name) for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("huggingface_hub")
                for alias in node.names]
    assert imported, "checkpoint_fetch imports the client"
    assert [(m, n) for m, n in imported if n not in public.get(m, set())] == []
    assert "file_download" not in source and "http_get" not in source


@pytest.mark.parametrize("name", MODULES)
def test_every_module_documents_its_attributes_examples_and_return_values(name):
    tree = ast.parse((LIBRARY / f"{name}.py").read_text())
    blocks = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant)}
    doc = yaml.safe_load(blocks["DOCUMENTATION"])
    assert doc["module"] == name
    assert "checkpoint role's internal use" in " ".join(doc["description"])
    assert "ansible.builtin.action_common_attributes" in doc["extends_documentation_fragment"]
    for fragment in doc["extends_documentation_fragment"]:
        if fragment.startswith("dgx_spark.llm_serving."):  # the collection's own, as ansible-doc merges it
            fragment_doc = ast.parse((REPO / "plugins" / "doc_fragments" / f"{fragment.rsplit('.', 1)[1]}.py").read_text())
            text = next(n.value.value for n in ast.walk(fragment_doc) if isinstance(n, ast.Assign)
                        and n.targets[0].id == "DOCUMENTATION")
            doc.setdefault("attributes", {}).update(yaml.safe_load(text)["attributes"])
    assert doc["attributes"]["check_mode"]["support"] in ("full", "partial")
    assert doc["attributes"]["diff_mode"]["support"] in ("full", "partial", "none", "N/A")
    assert yaml.safe_load(blocks["EXAMPLES"]) and yaml.safe_load(blocks["RETURN"])


def test_helpers_are_written_once_in_module_utils():
    common = module_utils("checkpoint_common")
    shared = {n for n in dir(common) if not n.startswith("_")}
    for name in MODULES:
        tree = ast.parse((LIBRARY / f"{name}.py").read_text())
        defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)}
        assert defined & shared == set(), f"{name} defines its own copy of {defined & shared}"
        source = (LIBRARY / f"{name}.py").read_text()
        assert "hashlib.sha256(json.dumps" not in source, f"{name} computes the stamp digest itself"


def test_module_paths_follow_the_spark_role_rule():
    common = module_utils("checkpoint_common")
    spark = load_file("spark_filter", REPO / "plugins" / "filter" / "spark.py")
    for model_dir in ("/opt/models/glm53", "/srv/a/b/GLM-5.3_x+1"):
        assert common.checkpoint_paths(model_dir) == spark.spark_checkpoint_paths(model_dir)

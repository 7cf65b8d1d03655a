"""checkpoint_verify's probe mode: the checkpoint role's one read per node on a no-change run.

Done only when a fast check would pass without hashing a weight and without writing anything; any
change of an input (a file rewritten in place with its mtime put back, a stray file, another revision
or repository, a code pin, the hub client on the source host) makes it not done, so the role takes
its whole path. The probe itself never writes and never fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.lib.checkpoint_site import CODE, CODE_TEXT, SHARD, fetch_checkpoint, serve_hub
from tests.lib.role_module import run_module


def run(name: str, args: dict, tmp: Path, check: bool = False) -> dict:
    return run_module(name, args, tmp, check=check)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with serve_hub(tmp_path_factory.mktemp("hub"), code=True) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def stamped(hub, tmp_path_factory):
    """A fetched checkpoint with its code file pinned, deep-verified and stamped."""
    base = tmp_path_factory.mktemp("stamped")
    pins = {CODE: hashlib.sha256(CODE_TEXT.encode()).hexdigest()}
    res = fetch_checkpoint(hub, base, trusted_code_files=pins)
    assert not res.get("failed"), res
    deep = run("checkpoint_verify", {**paths(base / "glm53"), "mode": "deep", "trusted_code_files": pins}, base)
    assert deep["ok"] and deep["changed"], deep
    return base, pins


def paths(model: Path) -> dict:
    return {"model_dir": str(model), "record_path": str(model.parent / "glm53.record.json"),
            "stamp_path": str(model.parent / "glm53.verified")}


@pytest.fixture
def site(stamped, hub, tmp_path):
    base, pins = stamped
    # copy2 keeps mtimes but not inodes or ctimes: the stamp is written again for the copy.
    shutil.copytree(base, tmp_path / "m", symlinks=True)
    model = tmp_path / "m" / "glm53"
    res = run("checkpoint_verify", {**paths(model), "mode": "deep", "rehash": True, "trusted_code_files": pins},
              tmp_path)
    assert res["ok"], res
    return {"model": model, "pins": pins, "tmp": tmp_path,
            "args": {**paths(model), "mode": "probe", "revision": hub.info["new"], "repo_id": hub.info["repo_id"],
                     "trusted_code_files": pins}}


def probe(site, check: bool = False, **kw) -> dict:
    return run("checkpoint_verify", {**site["args"], **kw}, site["tmp"], check=check)


def state(directory: Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino, p.stat().st_ctime_ns)
            for p in sorted(directory.parent.rglob("*")) if p.is_file()}


def test_a_stamped_checkpoint_is_done_with_its_record_and_nothing_is_written(site):
    before = state(site["model"])
    res = probe(site)
    assert res["done"] and res["holds"] and res["reasons"] == [] and not res["changed"], res
    record = json.loads((site["model"].parent / "glm53.record.json").read_text())
    assert res["record"] == record
    assert probe(site, check=True)["done"]
    assert state(site["model"]) == before


def test_a_shard_changed_in_place_with_its_mtime_put_back_is_not_done(site):
    path = site["model"] / SHARD
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    res = probe(site)
    assert not res["done"] and not res["holds"] and res["record"] is None
    assert any(SHARD in r and "changed since" in r for r in res["reasons"]), res["reasons"]
    assert (site["model"].parent / "glm53.verified").exists(), "the probe removes nothing"


def test_a_missing_file_is_not_done(site):
    (site["model"] / SHARD).unlink()
    res = probe(site)
    assert not res["done"] and any("missing" in r for r in res["reasons"]), res


@pytest.mark.parametrize("name", ["notes.txt", "modeling_evil.py", "sub/extra.bin"])
def test_a_stray_file_is_not_done(site, name):
    (site["model"] / name).parent.mkdir(exist_ok=True)
    (site["model"] / name).write_text("x")
    res = probe(site)
    assert not res["done"] and any(name in r for r in res["reasons"]), res


def test_another_revision_or_repository_is_not_done(site, hub):
    assert not probe(site, revision=hub.info["old"])["done"]
    assert not probe(site, revision="main")["done"]
    res = probe(site, repo_id="someone/else")
    assert not res["done"] and any("someone/else" in r for r in res["reasons"]), res


def test_a_code_file_unpinned_or_pinned_to_other_content_is_not_done(site):
    assert site["pins"], "the checkpoint holds a code file"
    res = probe(site, trusted_code_files={})
    assert not res["done"] and any(CODE in r for r in res["reasons"]), res
    assert not probe(site, trusted_code_files={CODE: "0" * 64})["done"]


def test_a_changed_model_type_or_shard_count_is_not_done(site):
    assert not probe(site, model_type="glm4_moe")["done"]
    assert not probe(site, shard_count=119)["done"]


def test_no_stamp_or_no_record_is_not_done(site):
    stamp = site["model"].parent / "glm53.verified"
    kept = stamp.read_text()
    stamp.unlink()
    res = probe(site)
    assert not res["done"] and any("does not exist" in r for r in res["reasons"]), res
    stamp.write_text(kept)
    (site["model"].parent / "glm53.record.json").unlink()
    assert not probe(site)["done"]


def test_the_source_hosts_hub_client_must_be_installed_at_the_pinned_version(site, tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    site_packages = venv / "lib" / "python3.12" / "site-packages"
    (site_packages / "huggingface_hub-2.4.0.dist-info").mkdir(parents=True)
    assert probe(site, client_venv=str(venv), client_version="2.4.0")["done"]
    res = probe(site, client_venv=str(venv), client_version="2.5.0")
    assert not res["done"] and any("huggingface_hub 2.5.0" in r for r in res["reasons"]), res
    # Without the client this host would install it again, yet its bytes are verified: another node may take
    # the checkpoint from here, with the record.
    assert res["holds"] and res["record"]["revision"] == site["args"]["revision"], res
    assert not probe(site, client_venv=str(tmp_path / "gone"), client_version="2.4.0")["done"]

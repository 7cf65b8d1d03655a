"""The repository root is a collection: `ansible-galaxy collection build` gives a tarball of the content only.

Built from a copy of the checkout's files (tracked, or new and not ignored) with what a working checkout
also holds planted beside them (an API key generated beside an inventory, rendered files, reports, a test
run's leftovers), so that a `build_ignore` that lets any of them through fails here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GALAXY = Path(sys.executable).with_name("ansible-galaxy")
PLANTED = {
    "inventory/spark/.credentials/api-key": "sk-planted",
    "inventory/mysite/.credentials/tls/ca.key": "planted",
    "rendered/spark-0/spark-llm.env": "SGLANG_API_KEY=planted",
    "reports/verify-20261201T000000Z.json": "{}",
    "roles/spark/__pycache__/x.cpython-313.pyc": "",
    "benchmarks/results/latest.json": "{}",
    "old-build.tar.gz": "",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[list[str], dict]:
    source = tmp_path_factory.mktemp("checkout")
    listing = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    tracked = subprocess.run(listing, cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        path = REPO / name
        if path.is_symlink() or path.is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name, follow_symlinks=False)
    for name, text in PLANTED.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(text)
    out = tmp_path_factory.mktemp("built")
    build = subprocess.run([str(GALAXY), "collection", "build", "--output-path", str(out), str(source)],
                           capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = out.glob("*.tar.gz")
    with tarfile.open(tarball) as tar:
        return tar.getnames(), json.load(tar.extractfile("MANIFEST.json"))


@pytest.fixture(scope="module")
def members(built) -> list[str]:
    return built[0]


@pytest.fixture(scope="module")
def manifest(built) -> dict:
    return built[1]


def test_the_tarball_is_named_by_galaxy_yml_and_carries_the_manifest(members):
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    assert (galaxy["namespace"], galaxy["name"]) == ("dgx_spark", "llm_serving")
    assert {"MANIFEST.json", "FILES.json", "meta/runtime.yml", "README.md", "CHANGELOG.md"} <= set(members)
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())
    assert runtime["requires_ansible"].startswith(">=2.21")


def test_every_role_plugin_and_playbook_is_in_it(members):
    for role in sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir()):
        assert f"roles/{role}/meta/argument_specs.yml" in members, role
        assert f"roles/{role}/meta/main.yml" in members, role
    for playbook in sorted((REPO / "playbooks").glob("*.yml")):
        assert f"playbooks/{playbook.name}" in members, playbook.name
    for plugin in sorted((REPO / "plugins").rglob("*.py")):
        assert str(plugin.relative_to(REPO)) in members, plugin
    assert "inventory/spark/hosts.yml" in members, "the example inventory belongs to the content"


def test_it_leaves_out_tests_the_toolchain_reports_secrets_and_rendered_files(members):
    for planted in PLANTED:
        assert planted not in members, planted
    leaked = [m for m in members if m.split("/")[0] in {"molecule", "benchmarks", "scripts", ".ci", ".venv",
                                                          ".collections", "rendered", "reports", ".git"}
              or (m.startswith("tests/") and not m.startswith("tests/sanity"))
              or "/.credentials" in f"/{m}" or "__pycache__" in m]
    assert not leaked, leaked
    # The sanity ignore file is content (ansible-test reads it from the installed copy); the clone's own entry
    # point, configuration and callbacks are not.
    assert any(m.startswith("tests/sanity/ignore-") for m in members), members
    assert not {"site.yml", "group_vars", "ansible.cfg", "callback_plugins"} & set(members)
    assert not [m for m in members if m.endswith((".tar.gz", ".pyc"))]


def test_the_dependencies_are_the_pinned_collections():
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    pinned = {c["name"]: c["version"] for c in yaml.safe_load((REPO / "requirements.yml").read_text())["collections"]}
    assert galaxy["dependencies"] == pinned


def test_the_manifest_names_the_version_galaxy_yml_sets(manifest):
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    info = manifest["collection_info"]
    assert (info["namespace"], info["name"], info["version"]) == (galaxy["namespace"], galaxy["name"], galaxy["version"])
    assert info["dependencies"] == galaxy["dependencies"]

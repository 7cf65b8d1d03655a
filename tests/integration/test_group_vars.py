"""group_vars apply identically through site.yml and through playbooks/<name>.yml.

Ansible loads playbook-adjacent group_vars relative to the playbook being run (for a playbook of a
collection, relative to the collection's playbooks/): the wiring lives in playbooks/group_vars, where a
play started directly and a project that imports the collection's playbooks by FQCN find it, and the root's
group_vars links to it for site.yml. These tests run real playbooks from all three entry points and
compare what every host sees.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.lib.playbook import REPO, run_playbook

PROBED = ["spark_model_dir", "checkpoint_model_dir", "server_model_dir"]


def write_probe(path: Path, names: list[str], fallback: str = "") -> Path:
    """A play in the project that reports each of `names` as every host of group spark sees it."""
    path.write_text(textwrap.dedent(f"""\
        ---
        - name: Probe
          hosts: spark
          gather_facts: false
          # Like every project play (its roles depend on it): the site role brings the site's defaults.
          roles:
            - role: dgx_spark.llm_serving.spark
          tasks:
            - name: Report
              ansible.builtin.debug:
                msg: {{{', '.join(f'"{v}": "{{{{ {v}{fallback} }}}}"' for v in names)}}}
        """))
    return path


@pytest.fixture
def probe_playbooks():
    """A probe play in playbooks/, a site-like play at the top importing it, and one in an outside project
    importing it by its FQCN."""
    tag = uuid.uuid4().hex[:8]
    inner = write_probe(REPO / "playbooks" / f"_test_probe_{tag}.yml", PROBED, " | default('UNDEFINED')")
    outer = REPO / f"_test_site_probe_{tag}.yml"
    outer.write_text(f"---\n- name: Site probe\n  ansible.builtin.import_playbook: playbooks/{inner.name}\n")
    outside = Path(tempfile.mkdtemp(prefix="outside-project-")) / "site.yml"
    outside.write_text(f"---\n- name: Outside probe\n  ansible.builtin.import_playbook: dgx_spark.llm_serving.{inner.stem}\n")
    try:
        yield outer.name, f"playbooks/{inner.name}", outside
    finally:
        shutil.rmtree(outside.parent, ignore_errors=True)
        inner.unlink(missing_ok=True)
        outer.unlink(missing_ok=True)


def seen(result):
    per_host = result.results("Report")
    assert per_host, result.stdout
    return {host: res["msg"] for host, res in per_host.items()}


def write_inventory(tmp_path: Path, site_vars: str | None) -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(textwrap.dedent("""\
        spark:
          children:
            spark_head: {hosts: {spark-0: {spark_fabric_ip: 192.168.100.10}}}
            spark_workers: {hosts: {spark-1: {spark_fabric_ip: 192.168.100.11}}}
        """))
    if site_vars:
        (inv / "group_vars" / "spark.yml").write_text(site_vars)
    return inv


@pytest.mark.parametrize(
    ("site_vars", "expected"),
    [
        (None, "/opt/models/glm53"),
        ("spark_model_dir: /srv/models/glm53-r2\n", "/srv/models/glm53-r2"),
    ],
    ids=["project-default", "inventory-override"],
)
def test_same_variables_through_site_and_direct(tmp_path, probe_playbooks, site_vars, expected):
    site, direct, outside = probe_playbooks
    inv = write_inventory(tmp_path, site_vars)
    via_site = run_playbook(site, inv)
    via_direct = run_playbook(direct, inv)
    via_fqcn = run_playbook(str(outside), inv)
    assert via_site.rc == 0 and via_direct.rc == 0 and via_fqcn.rc == 0, via_site.stdout + via_direct.stdout + via_fqcn.stdout
    assert seen(via_site) == seen(via_direct) == seen(via_fqcn)
    for host, values in seen(via_direct).items():
        assert values == dict.fromkeys(PROBED, expected), host


def test_the_root_group_vars_is_the_collections_playbooks_group_vars():
    link = REPO / "group_vars"
    assert link.is_symlink() and os.path.realpath(link) == str((REPO / "playbooks" / "group_vars").resolve())
    assert not (REPO / "playbooks" / "group_vars").is_symlink()


BUILD_PROBED = ["spark_model_dir", "spark_checkpoint_bytes", "checkpoint_build", "server_checkpoint_revision",
                "preflight_checkpoint_repo_id", "server_checkpoint_refused_flags"]
ALT = {"repo_id": "SparkSite/GLM-5.3-Flash-NVFP4-alt", "revision": "b" * 40, "directory": "glm53-alt",
       "bytes": 1073741824, "shard_count": 120, "model_type": "glm5_next",
       "refused_flags": {"--speculative-algorithm": "no next-token heads"}}


@pytest.mark.parametrize(("site_vars", "expected"), [
    # A named site build: its directory, size and pinned revision, with no checkpoint_revision in the inventory.
    ({"spark_checkpoint_build": "alt", "spark_checkpoint_site_builds": {"alt": ALT}},
     {"spark_model_dir": "/opt/models/glm53-alt", "spark_checkpoint_bytes": 1073741824,
      "server_checkpoint_revision": "b" * 40, "preflight_checkpoint_repo_id": ALT["repo_id"],
      "server_checkpoint_refused_flags": ALT["refused_flags"]}),
    # The inventory's own revision (hosts.yml vars, which the collection's group_vars/all outranks) is what the
    # server checks: the build names none.
    ({"spark_checkpoint_build": "libertai-nvfp4", "spark_models_root": "/srv/models"},
     {"spark_model_dir": "/srv/models/glm53", "spark_checkpoint_bytes": 194347270144,
      "server_checkpoint_revision": "c" * 40, "preflight_checkpoint_repo_id": "LibertAIDAI/GLM-5.3-Flash-NVFP4",
      "server_checkpoint_refused_flags": {}}),
], ids=["site-build", "known-build"])
def test_a_named_build_gives_its_values_and_an_inventory_revision_in_hosts_yml_still_counts(tmp_path, site_vars,
                                                                                           expected):
    play = write_probe(REPO / "playbooks" / f"_test_build_probe_{uuid.uuid4().hex[:8]}.yml", BUILD_PROBED)
    inv = write_inventory(tmp_path, json.dumps(site_vars))
    hosts = (inv / "hosts.yml").read_text()
    if "libertai" in json.dumps(site_vars):
        hosts += "  vars:\n    checkpoint_revision: " + "c" * 40 + "\n"
    (inv / "hosts.yml").write_text(hosts)
    try:
        result = run_playbook(f"playbooks/{play.name}", inv)
    finally:
        play.unlink(missing_ok=True)
    assert result.rc == 0, result.stdout[-3000:]
    for host, values in seen(result).items():
        assert {k: v for k, v in values.items() if k != "checkpoint_build"} == expected, host
        assert values["checkpoint_build"]["repo_id"] == expected["preflight_checkpoint_repo_id"], host

"""group_vars apply identically through site.yml and through playbooks/<name>.yml.

Ansible loads playbook-adjacent group_vars relative to the playbook being run;
playbooks/group_vars links to the project's group_vars so that a play started
directly sees what it sees under site.yml. These tests run real playbooks from
both entry points and compare what every host sees.
"""

from __future__ import annotations

import os
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.lib.playbook import REPO, run_playbook

PROBED = ["spark_model_dir", "checkpoint_model_dir", "server_model_dir"]


@pytest.fixture
def probe_playbooks():
    """A probe play in playbooks/ and a site-like play at the top importing it."""
    tag = uuid.uuid4().hex[:8]
    inner = REPO / "playbooks" / f"_probe_{tag}.yml"
    outer = REPO / f"_site_probe_{tag}.yml"
    inner.write_text(textwrap.dedent(f"""\
        ---
        - name: Probe
          hosts: spark
          gather_facts: false
          # Like every project play (its roles depend on it): the site role brings the site's defaults.
          roles:
            - role: spark
          tasks:
            - name: Report
              ansible.builtin.debug:
                msg: {{{', '.join(f'"{v}": "{{{{ {v} | default(\'UNDEFINED\') }}}}"' for v in PROBED)}}}
        """))
    outer.write_text(f"---\n- name: Site probe\n  ansible.builtin.import_playbook: playbooks/{inner.name}\n")
    try:
        yield outer.name, f"playbooks/{inner.name}"
    finally:
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
    site, direct = probe_playbooks
    inv = write_inventory(tmp_path, site_vars)
    via_site = run_playbook(site, inv)
    via_direct = run_playbook(direct, inv)
    assert via_site.rc == 0 and via_direct.rc == 0, via_site.stdout + via_direct.stdout
    assert seen(via_site) == seen(via_direct)
    for host, values in seen(via_direct).items():
        assert values == dict.fromkeys(PROBED, expected), host


def test_playbooks_group_vars_is_the_project_group_vars():
    link = REPO / "playbooks" / "group_vars"
    assert link.is_symlink() and os.path.realpath(link) == str((REPO / "group_vars").resolve())

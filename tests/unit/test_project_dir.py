"""Where the controller keeps a site's reports and renders: the project the running playbook belongs to."""

from __future__ import annotations

import os

from tests.lib.roles import filter_plugin

spark = filter_plugin("spark")


def test_a_clones_playbooks_keep_their_files_in_the_clone(tmp_path):
    assert spark.spark_project_dir(tmp_path / "clone" / "playbooks") == str(tmp_path / "clone")
    # A playbook at the clone's root (site.yml) is in the project itself.
    assert spark.spark_project_dir(tmp_path / "clone") == str(tmp_path / "clone")


def test_the_clone_reached_through_its_collection_link_is_still_the_clone(tmp_path):
    clone = tmp_path / "clone"
    (clone / "playbooks").mkdir(parents=True)
    link = tmp_path / ".collections" / "ansible_collections" / "dgx_spark" / "llm_serving"
    link.parent.mkdir(parents=True)
    link.symlink_to(clone)
    assert spark.spark_project_dir(link / "playbooks") == str(link)


def test_an_installed_collections_playbooks_keep_their_files_in_the_project_that_runs_them(tmp_path, monkeypatch):
    installed = tmp_path / "venv" / "ansible_collections" / "dgx_spark" / "llm_serving" / "playbooks"
    installed.mkdir(parents=True)
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    assert spark.spark_project_dir(installed) == str(project)
    assert not str(spark.spark_project_dir(installed)).startswith(str(tmp_path / "venv"))
    assert os.getcwd() == str(project)

"""callback_plugins/spark_vars_untagged.py: the deprecated `vars` dictionary keeps its values, without the tag."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  vars:
    spark_example: {"ranks": [0, 1]}
  tasks:
    - ansible.builtin.debug:
        msg: "read through vars: {{ vars['spark_example'].ranks | sum }} {{ vars.inventory_hostname }}"
"""


def run(tmp_path: Path, **env: str) -> str:
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    out = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(tmp_path / "play.yml")],
                         capture_output=True, text=True, check=True, cwd=tmp_path,
                         env={**os.environ, "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "callback_plugins"),
                              "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_NOCOLOR": "1", **env})
    return out.stdout + out.stderr


def test_vars_holds_the_same_values_without_the_deprecation_tag(tmp_path):
    untagged = run(tmp_path)
    assert "read through vars: 1 localhost" in untagged
    assert '"vars" dictionary is deprecated' not in untagged
    # The option puts ansible-core's tag back: the same value, and the warning that proves the tag is there.
    tagged = run(tmp_path, SPARK_WARN_ON_VARS="true")
    assert "read through vars: 1 localhost" in tagged
    assert '"vars" dictionary is deprecated' in tagged

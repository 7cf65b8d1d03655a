"""callback_plugins/spark_template_layers.py: the renders one top-level render starts share its copy of the
variables, and nothing a render gives changes.

The playbook reads chains of derived variables (as roles/spark/vars does) in a loop, where the loop's item
changes the variables between renders, after a set_fact that changes one of their inputs, and through a
filter that renders in a nested template; the output must be the same with the plugin as without it, and
right.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from ansible._internal._templating import _jinja_bits, _lazy_containers
from ansible.template import Templar, trust_as_template

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  vars:
    spark_probe_base: 1
    spark_probe_scaled: "{{ item * 10 + spark_probe_base }}"
    spark_probe_pair: "{{ [spark_probe_scaled, spark_probe_scaled | int + 1] }}"
    spark_probe_label: "{{ spark_probe_pair | join('/') }} of {{ spark_probe_scaled }}"
    spark_probe_static: "{{ spark_probe_base * 100 }}"
  tasks:
    - name: Each item its own values
      ansible.builtin.debug:
        msg: "item {{ item }}: {{ spark_probe_label }} [{{ spark_probe_pair | map('string') | join(',') }}]"
      loop: [1, 2, 3]
    - name: Change an input
      ansible.builtin.set_fact:
        spark_probe_base: 5
    - name: The derived values follow it
      ansible.builtin.debug:
        msg: "after: {{ spark_probe_static }} {{ [7] | map('extract', {7: spark_probe_static}) | first }}"
    - name: Again in a loop
      ansible.builtin.debug:
        msg: "item {{ item }}: {{ spark_probe_label }}"
      loop: [4]
"""


def run(tmp_path: Path, **env: str) -> list[str]:
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    out = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(tmp_path / "play.yml")],
                         capture_output=True, text=True, check=True, cwd=tmp_path,
                         env={**os.environ, "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "callback_plugins"),
                              "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_NOCOLOR": "1", **env})
    return [line.split('"msg": ', 1)[1].strip().strip('"') for line in out.stdout.splitlines() if '"msg": ' in line]


def test_derived_variables_render_as_without_the_plugin_through_loops_and_changed_inputs(tmp_path):
    shared = run(tmp_path)
    assert shared == [
        "item 1: 11/12 of 11 [11,12]",
        "item 2: 21/22 of 21 [21,22]",
        "item 3: 31/32 of 31 [31,32]",
        "after: 500 500",
        "item 4: 45/46 of 45",
    ]
    assert run(tmp_path, SPARK_COPY_VARS_PER_RENDER="true") == shared


def load_plugin():
    spec = importlib.util.spec_from_file_location("spark_template_layers_under_test",
                                                  REPO / "callback_plugins" / "spark_template_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copies_of_the_variables(shared: bool) -> tuple[object, int]:
    """What `{{ spark_probe_a }}` renders to through a chain of three derived variables, and how many lazy copies
    of the variables that took."""
    plugin = load_plugin()
    # What set_options does with the option (its settings come from ansible-core's configuration, not read here).
    _jinja_bits._flatten_and_lazify_vars = (plugin._shared_flatten_and_lazify_vars if shared  # noqa: SLF001
                                            else plugin._original_flatten_and_lazify_vars)  # noqa: SLF001
    variables = {"spark_probe_a": trust_as_template("{{ spark_probe_b | int + spark_probe_c | int }}"),
                 "spark_probe_b": trust_as_template("{{ spark_probe_c | int * 10 }}"),
                 "spark_probe_c": trust_as_template("{{ spark_probe_d }}"), "spark_probe_d": 4}
    copies = []
    original = _lazy_containers._AnsibleLazyTemplateMixin._try_create  # noqa: SLF001

    def counted(item, *args, **kwargs):
        if item is variables:
            copies.append(item)
        return original(item, *args, **kwargs)

    _lazy_containers._AnsibleLazyTemplateMixin._try_create = staticmethod(counted)  # noqa: SLF001
    try:
        value = Templar(variables=variables).template(trust_as_template("{{ spark_probe_a }}"))
    finally:
        _lazy_containers._AnsibleLazyTemplateMixin._try_create = staticmethod(original)  # noqa: SLF001
        _jinja_bits._flatten_and_lazify_vars = plugin._original_flatten_and_lazify_vars  # noqa: SLF001
    return value, len(copies)


def test_the_nested_renders_of_one_render_share_its_copy_of_the_variables():
    assert copies_of_the_variables(shared=True) == (44, 1)
    # The control: ansible-core's own way, a copy for the top-level render and for each render of a derived
    # variable: spark_probe_c twice, once for spark_probe_a and once for spark_probe_b.
    assert copies_of_the_variables(shared=False) == (44, 5)

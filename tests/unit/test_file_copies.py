"""callback_plugins/spark_file_copies.py: each caller of DataLoader.load_from_file gets an equal, independent
copy of a parsed file, with its tags, made by unpickling; what pickle must not carry is deep-copied."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.module_utils._internal._datatag import AnsibleTagHelper
from ansible.parsing import dataloader
from ansible.parsing.dataloader import DataLoader

REPO = Path(__file__).resolve().parents[2]
SITE_VARS = REPO / "roles" / "spark" / "vars" / "main.yml"


@pytest.fixture
def plugin():
    spec = importlib.util.spec_from_file_location("spark_file_copies", REPO / "callback_plugins" / "spark_file_copies.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    dataloader.DataLoader.load_from_file = module._original_load_from_file


def tags_of(value) -> list:
    """Every value's tags, depth first, keys included."""
    out = [sorted(type(t).__name__ + repr(t) for t in AnsibleTagHelper.tags(value))]
    if isinstance(value, dict):
        for k, v in value.items():
            out += tags_of(k) + tags_of(v)
    elif isinstance(value, list):
        for v in value:
            out += tags_of(v)
    return out


def test_a_copy_equals_the_deep_copy_with_the_same_tags_and_shares_nothing(plugin):
    loader = DataLoader()
    deep = loader.load_from_file(str(SITE_VARS), trusted_as_template=True)
    kept = loader.load_from_file(str(SITE_VARS), unsafe=True)
    first = plugin.load_from_file(loader, str(SITE_VARS), trusted_as_template=True)
    second = plugin.load_from_file(loader, str(SITE_VARS), trusted_as_template=True)
    assert first == deep == kept
    assert tags_of(first) == tags_of(deep)
    assert any(tags for tags in tags_of(first)), "the site role's vars carry their origin"
    assert first is not kept and first["spark_flag_models"] is not kept["spark_flag_models"]
    first["spark_flag_models"].clear()
    first["spark_unit_name_added_by_a_caller"] = 1
    assert second == deep and kept == deep, "a caller's change reaches neither the kept data nor another copy"
    assert plugin.load_from_file(loader, str(SITE_VARS)) == deep
    # What the caller asked to have as it is, it gets as it is.
    assert plugin.load_from_file(loader, str(SITE_VARS), unsafe=True) is kept


def test_what_pickle_must_not_carry_is_deep_copied(plugin, tmp_path):
    secret = tmp_path / "vault.yml"
    secret.write_text("""token: !vault |
  $ANSIBLE_VAULT;1.1;AES256
  6161616161616161616161616161616161616161616161616161616161616161
""")
    loader = DataLoader()
    copied = plugin.load_from_file(loader, str(secret))
    assert plugin._pickles[id(loader.load_from_file(str(secret), unsafe=True))][1] is None
    assert type(copied["token"]).__name__ == "EncryptedString"
    assert copied is not loader.load_from_file(str(secret), unsafe=True)


PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: counter
      loop: [1, 2, 3]
"""
# A template in a role's vars renders only while the copy keeps the file's trust (a tag): a copy that lost it
# would show the text as written.
ROLE_VARS = """
counter_sum: "{{ [1, 2] | sum }}"
"""
ROLE_TASKS = """
- ansible.builtin.debug:
    msg: "sum {{ counter_sum }}"
"""


def run(tmp_path: Path, **env: str) -> str:
    for part, text in (("vars", ROLE_VARS), ("tasks", ROLE_TASKS)):
        (tmp_path / "roles" / "counter" / part).mkdir(parents=True, exist_ok=True)
        (tmp_path / "roles" / "counter" / part / "main.yml").write_text(text)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    out = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(tmp_path / "play.yml")],
                         capture_output=True, text=True, check=True, cwd=tmp_path,
                         env={**os.environ, "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "callback_plugins"),
                              "ANSIBLE_ROLES_PATH": str(tmp_path / "roles"),
                              "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_NOCOLOR": "1", **env})
    return out.stdout + out.stderr


def test_a_role_loaded_again_at_run_time_renders_its_vars_as_with_deep_copies(tmp_path):
    # Each include loads the role again at run time, after the callbacks are loaded.
    for env in ({}, {"SPARK_DEEP_COPY_FILES": "true"}):
        out = run(tmp_path, **env)
        assert out.count('"msg": "sum 3"') == 3, out


# What ansible-core does when it resolves a playbook's first import, before it parses the rest: it imports the vars
# plugins of its configured paths (the project's ansible.cfg names vars_plugins/), then the parse loads files.
EARLY = r"""
from ansible.parsing import dataloader
from ansible.plugins.loader import init_plugin_loader, vars_loader
init_plugin_loader()
before = dataloader.DataLoader.load_from_file.__module__
list(vars_loader.all(class_only=True))
print(before, dataloader.DataLoader.load_from_file.__module__)
"""


@pytest.mark.parametrize("deep_copy", ["false", "true"])
def test_the_copies_are_set_up_before_the_playbook_is_parsed_with_the_callbacks_option(deep_copy):
    done = subprocess.run([sys.executable, "-c", EARLY], capture_output=True, text=True, check=True, cwd=REPO,
                          timeout=120, env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                                            "SPARK_DEEP_COPY_FILES": deep_copy})
    before, after = done.stdout.split()
    assert before == "ansible.parsing.dataloader"
    assert ("spark_file_copies" in after) == (deep_copy == "false"), done.stdout + done.stderr

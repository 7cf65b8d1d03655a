"""callback_plugins/spark_build_cache.py and plugins/lookup/spark_template.py: what the controller builds
from unchanged sources is kept between runs, and what it serves from the cache is what it would build.

The Jinja cache is driven in child processes (it patches Ansible's environment class for the process
that installs it, as the main process does before its workers fork); the payload cache and the lookup
through real ansible-playbook runs on localhost with a role of the test's own.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import marshal
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from ansible.executor.module_common import _CachedModule

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "callback_plugins/spark_build_cache.py"
VENV_BIN = Path(sys.executable).parent

# Run in a child: install the cache under argv[1], render every case, print the renders and how many
# templates Jinja really compiled.
RENDER = textwrap.dedent(r"""
    import importlib.util, json, sys
    spec = importlib.util.spec_from_file_location("spark_build_cache", sys.argv[2])
    cache = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cache)
    if len(sys.argv) > 3 and sys.argv[3]:
        cache._MAX_TEMPLATES = int(sys.argv[3])
    cache._install_templates(sys.argv[1])
    if len(sys.argv) > 4:  # the entries are gone from the disk once the cache is installed
        import os
        for entry in os.scandir(cache._store.directory):
            os.unlink(entry.path)
    import jinja2
    compiled = []
    original = jinja2.Environment._compile  # the last step of a real compile, cached or not
    def counting(*args, **kwargs):
        compiled.append(1)
        return original(*args, **kwargs)
    jinja2.Environment._compile = counting
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    templar = Templar(loader=DataLoader(), variables={"name": "spark", "ranks": [0, 1], "flag": True})
    T = trust_as_template
    renders = [
        templar.template(T("{{ name | upper }}-{{ ranks | length }}{% if flag %} on{% endif %}")),
        templar.template(T("{{ 'a\\1' }}")),
        templar.template(T("{{ 'a\\1' }}"), escape_backslashes=False),
        templar.template(T("#jinja2:variable_start_string:'[%', variable_end_string:'%]'\n[% name %] {{ name }}")),
        templar.evaluate_expression(T("ranks | map('string') | join(',')")),
        templar.evaluate_conditional(T("name == 'spark' and flag")),
        templar.evaluate_conditional(T("name != 'spark'")),
    ]
    print(json.dumps({"renders": renders, "compiled": len(compiled)}))
""")


def render(cache_dir: str, max_templates: int | None = None, *, wipe_after_install: bool = False) -> dict:
    limit = ["" if max_templates is None else str(max_templates)] + (["wipe"] if wipe_after_install else [])
    out = subprocess.run([sys.executable, "-c", RENDER, cache_dir, str(PLUGIN), *limit], capture_output=True, text=True,
                         check=True, env={**os.environ, "HOME": str(Path(cache_dir).parent)})
    return json.loads(out.stdout)


def generations(root: Path, kind: str) -> list[Path]:
    return sorted(root.glob(f"{kind}-*"))


def test_a_second_process_renders_the_same_without_compiling(tmp_path):
    root = tmp_path / "cache"
    uncached = render("")
    first, second = render(str(root)), render(str(root))
    assert uncached["renders"] == first["renders"] == second["renders"]
    assert uncached["renders"][1] != uncached["renders"][2], "the backslash modes must differ, or the case proves nothing"
    assert uncached["renders"][3] == "spark {{ name }}"
    assert first["compiled"] > 0
    assert second["compiled"] == 0, "every template and expression came from the cache"
    [directory] = generations(root, "jinja")
    assert oct(directory.stat().st_mode & 0o777) == "0o700"


def test_the_entries_are_read_when_the_cache_is_installed_not_per_template(tmp_path):
    # Ansible's workers fork from the process that installed the cache: what it read, they have.
    root = tmp_path / "cache"
    first = render(str(root))
    assert first["compiled"] > 0
    assert render(str(root), wipe_after_install=True)["compiled"] == 0


def test_an_unreadable_entry_is_compiled_again_and_replaced(tmp_path):
    root = tmp_path / "cache"
    expected = render(str(root))
    [directory] = generations(root, "jinja")
    entries = list(directory.iterdir())
    for entry in entries:
        entry.write_bytes(b"not marshal data")
    again = render(str(root))
    assert again["renders"] == expected["renders"]
    assert again["compiled"] == expected["compiled"]
    assert all(entry.read_bytes() != b"not marshal data" for entry in entries)


def test_a_generation_past_its_size_starts_empty_again(tmp_path):
    root = tmp_path / "cache"
    first = render(str(root))
    [directory] = generations(root, "jinja")
    (directory / "an-old-text").write_bytes(b"")
    assert len(list(directory.iterdir())) > first["compiled"]
    again = render(str(root), max_templates=first["compiled"])
    assert again["compiled"] == first["compiled"], "it started empty and compiled everything again"
    assert len(list(directory.iterdir())) == first["compiled"], "the old text went with the rest"
    assert render(str(root), max_templates=first["compiled"])["compiled"] == 0, "at the limit, nothing is dropped"


def test_a_cache_directory_others_can_write_to_is_not_used(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    result = render(str(root))
    assert result["compiled"] > 0
    assert not generations(root, "jinja")
    assert render(str(root))["compiled"] == result["compiled"]


# ---- through ansible-playbook: the payload cache, a changed filter plugin, the lookup ---------------

ROLE_MODULE = """#!/usr/bin/python
from ansible.module_utils.basic import AnsibleModule
AnsibleModule(argument_spec={{}}).exit_json(changed=False, answer={answer!r})
"""

ROLE_FILTER = """
def shout(value):
    return str(value).upper() + {suffix!r}


class FilterModule:
    def filters(self):
        return {{"shout": shout}}
"""

PLAYBOOK = """
- name: Use the test role
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: cached
"""

TASKS = """
- name: Run the role's module
  cached_answer:
  register: answered
- name: Run the module in the library beside the playbook
  adjacent_answer:
  register: adjacent
- name: Run the module of a collection that is a source tree (no MANIFEST.json), as this checkout is
  testns.source.coll_answer:
  register: in_collection
- name: Render through the role's filter and both template lookups
  ansible.builtin.copy:
    dest: "{{ out }}"
    mode: "0600"
    content: "{{ {'answer': answered.answer, 'adjacent': adjacent.answer, 'collection': in_collection.answer,
                 'filtered': 'spark' | shout,
                 'builtin': lookup('ansible.builtin.template', 'unit.j2', template_vars={'extra': 'x'}),
                 'spark': lookup('dgx_spark.llm_serving.spark_template', 'unit.j2', template_vars={'extra': 'x'}),
                 'builtin_plain': lookup('ansible.builtin.template', 'plain.j2'),
                 'spark_plain': lookup('dgx_spark.llm_serving.spark_template', 'plain.j2')} | to_json }}"
"""

UNIT = """{{ ansible_managed | comment }}
[Service]
{% include 'part.j2' %}
Environment=NAME={{ name }} EXTRA={{ extra }}


"""


def make_adjacent_library(site: Path, answer: str) -> None:
    (site / "library").mkdir(exist_ok=True)
    (site / "library/adjacent_answer.py").write_text(ROLE_MODULE.format(answer=answer))


def make_source_collection(site: Path, answer: str) -> None:
    modules = site / "collections" / "ansible_collections" / "testns" / "source" / "plugins" / "modules"
    modules.mkdir(parents=True, exist_ok=True)
    (modules.parent.parent / "galaxy.yml").write_text("namespace: testns\nname: source\nversion: 1.0.0\n")
    (modules / "coll_answer.py").write_text(ROLE_MODULE.format(answer=answer))


def make_role(roles: Path, answer: str, suffix: str) -> None:
    role = roles / "cached"
    for sub in ("tasks", "library", "filter_plugins", "templates"):
        (role / sub).mkdir(parents=True, exist_ok=True)
    (role / "tasks/main.yml").write_text(TASKS)
    (role / "library/cached_answer.py").write_text(ROLE_MODULE.format(answer=answer))
    (role / "filter_plugins/shout.py").write_text(ROLE_FILTER.format(suffix=suffix))
    (role / "templates/unit.j2").write_text(UNIT)
    (role / "templates/part.j2").write_text("ExecStart=/bin/true {{ name }}\n")
    (role / "templates/plain.j2").write_text("no newline at the end {{ name }}")


def play(tmp_path: Path, cache: Path) -> dict:
    out = tmp_path / "out.json"
    (tmp_path / "site.yml").write_text(PLAYBOOK)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(tmp_path / "roles"),
           "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "callback_plugins"), "SPARK_BUILD_CACHE_DIR": str(cache),
           "ANSIBLE_COLLECTIONS_PATH": f"{tmp_path / 'collections'}:{REPO / '.collections'}",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "local"), "ANSIBLE_NOCOLOR": "1"}
    run = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", str(tmp_path / "site.yml"),
                          "-e", json.dumps({"out": str(out), "name": "spark", "ansible_python_interpreter": sys.executable})],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Five runs sharing one cache: the first fills it, the second reads it, the third follows a changed role
    module and filter plugin, the fourth a changed module in the library beside the playbook, the fifth a
    changed module of a collection that is a source tree."""
    tmp_path = tmp_path_factory.mktemp("site")
    cache = tmp_path / "cache"
    make_role(tmp_path / "roles", answer="first", suffix="!")
    make_adjacent_library(tmp_path, answer="beside")
    make_source_collection(tmp_path, answer="collected")
    first = play(tmp_path, cache)
    state = {kind: generations(cache, kind) for kind in ("jinja", "ansiballz")}
    payloads = {p.name: p.stat().st_mtime_ns for p in state["ansiballz"][0].iterdir()}
    second = play(tmp_path, cache)
    payloads_after = {p.name: p.stat().st_mtime_ns for p in state["ansiballz"][0].iterdir()}
    make_role(tmp_path / "roles", answer="second", suffix="?")
    third = play(tmp_path, cache)
    generations_before_fourth = generations(cache, "ansiballz")
    make_adjacent_library(tmp_path, answer="moved")
    fourth = play(tmp_path, cache)
    generations_before_fifth = generations(cache, "ansiballz")
    make_source_collection(tmp_path, answer="recollected")
    fifth = play(tmp_path, cache)
    return {"first": first, "second": second, "third": third, "fourth": fourth, "fifth": fifth, "state": state,
            "cache": cache, "generations_before_fourth": generations_before_fourth,
            "generations_before_fifth": generations_before_fifth,
            "payloads": payloads, "payloads_after": payloads_after}


def test_module_payloads_are_built_once_and_kept(runs):
    assert "ansible.legacy.cached_answer-ZIP_DEFLATED-none" in runs["payloads"]
    # The second run may send a module the first did not (copy finds the file in place and calls file).
    kept = {name: runs["payloads_after"].get(name) for name in runs["payloads"]}
    assert kept == runs["payloads"], "the second run built no payload of the first again"
    assert runs["first"] == runs["second"]


# A node runs a payload from its zip; the second run above ran the kept payload, bytecode and all.
IMPORT_FROM_ZIP = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import ansible.module_utils.basic as basic
    print(basic.__file__)
""")


def kept_payload(runs) -> zipfile.ZipFile:
    kept = _CachedModule.load(str(runs["state"]["ansiballz"][0] / "ansible.legacy.cached_answer-ZIP_DEFLATED-none"))
    return zipfile.ZipFile(io.BytesIO(base64.b64decode(kept.zip_data)))


def test_a_kept_payload_carries_each_files_bytecode_beside_it(runs):
    payload = kept_payload(runs)
    names = set(payload.namelist())
    sources = sorted(n for n in names if n.endswith(".py"))
    assert "ansible/module_utils/basic.py" in sources
    assert [n for n in sources if n + "c" not in names] == []
    for name in sources:
        pyc = payload.read(name + "c")
        # PEP 552: this Python's magic, hash-based and unchecked, the source's hash, its code.
        assert pyc[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(pyc[4:8], "little") == 0b01, name
        assert pyc[8:16] == importlib.util.source_hash(payload.read(name)), name
        code = compile(payload.read(name), name, "exec", dont_inherit=True)
        assert marshal.loads(pyc[16:]).co_code == code.co_code, name  # noqa: S302 - the test's own payload


def test_a_node_imports_the_bytecode_when_its_python_matches_and_the_source_when_not(runs, tmp_path):
    payload = kept_payload(runs)
    matching, other = tmp_path / "matching.zip", tmp_path / "other.zip"
    payload.fp.seek(0)
    matching.write_bytes(payload.fp.read())
    # Another Python's bytecode: the same files with another magic number.
    with zipfile.ZipFile(other, "w") as out:
        for info in payload.infolist():
            data = payload.read(info)
            out.writestr(info, b"\x00\x00" + data[2:] if info.filename.endswith(".pyc") else data)
    imported = {zip_path.name: subprocess.run([sys.executable, "-I", "-c", IMPORT_FROM_ZIP, str(zip_path)],
                                              capture_output=True, text=True, check=True).stdout.strip()
                for zip_path in (matching, other)}
    assert imported["matching.zip"].endswith("/matching.zip/ansible/module_utils/basic.pyc"), imported
    assert imported["other.zip"].endswith("/other.zip/ansible/module_utils/basic.py"), imported


def test_a_changed_module_or_filter_plugin_starts_a_new_generation(runs):
    assert runs["third"]["answer"] == "second", "the changed module ran, not the kept payload"
    assert runs["third"]["filtered"] == "SPARK?"
    cache = runs["cache"]
    for kind in ("jinja", "ansiballz"):
        assert set(runs["state"][kind]) < set(runs["generations_before_fourth"] if kind == "ansiballz"
                                              else generations(cache, kind)), f"{kind}: no new generation"
        # The old generation stays: another checkout may be using it.
        assert set(runs["state"][kind]) <= set(generations(cache, kind))


def test_a_changed_module_beside_the_playbook_starts_a_new_generation(runs):
    assert runs["third"]["adjacent"] == "beside"
    assert runs["fourth"]["adjacent"] == "moved", "the changed module beside the playbook ran, not the kept payload"
    assert len(runs["generations_before_fifth"]) == len(runs["generations_before_fourth"]) + 1


def test_a_changed_module_of_a_source_tree_collection_starts_a_new_generation(runs):
    # This checkout is such a collection (scripts/bootstrap links it into .collections): an installed one's
    # MANIFEST.json changes with its files, a source tree has none to read.
    assert runs["fourth"]["collection"] == "collected"
    assert runs["fifth"]["collection"] == "recollected", "the changed collection module ran, not the kept payload"
    assert len(generations(runs["cache"], "ansiballz")) == len(runs["generations_before_fifth"]) + 1


def test_the_lookup_renders_what_the_builtin_template_lookup_renders(runs):
    rendered = runs["first"]
    assert rendered["spark"] == rendered["builtin"]
    assert rendered["spark_plain"] == rendered["builtin_plain"]
    assert rendered["spark"].startswith("#")  # ansible_managed, as a comment
    assert "ExecStart=/bin/true spark" in rendered["spark"]
    assert "EXTRA=x" in rendered["spark"]

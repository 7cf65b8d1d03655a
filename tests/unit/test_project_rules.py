"""The project's written rules (CONTRIBUTING.md), checked on every role and playbook."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from tests.lib.roles import filter_plugin

REPO = Path(__file__).resolve().parents[2]
COLLECTION = "{namespace}.{name}".format(**yaml.safe_load((REPO / "galaxy.yml").read_text()))
ROLES = sorted(p for p in (REPO / "roles").iterdir() if p.is_dir())
PLAYBOOKS = sorted((REPO / "playbooks").glob("*.yml"))
ROLE_CALLS = ("ansible.builtin.include_role", "ansible.builtin.import_role")
# The playbooks whose plays on the ranks rely on the inventory check's validation; the check's own plays and the
# legacy play (on every host) follow the rule for roles.
RANK_PLAYBOOKS = [p for p in PLAYBOOKS if p.name not in ("inventory_check.yml", "legacy_names.yml")]
# Task files that only the plays on the ranks include (after the inventory check validated their options).
RANK_TASK_FILES = [REPO / "playbooks" / "tasks" / "rejoin_gateway.yml"]
COMMAND_MODULES = {"ansible.builtin.command", "ansible.builtin.shell", "ansible.builtin.raw", "ansible.builtin.script"}


class _Loader(yaml.SafeLoader):
    """Reads Ansible YAML, where `!unsafe` and `!vault` mark plain strings."""


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))
_Loader.add_constructor("!vault", lambda loader, node: loader.construct_scalar(node))


def load(path: Path):
    return yaml.load(path.read_text(), Loader=_Loader) or {}  # noqa: S506 - SafeLoader subclass


def tasks_in(node):
    """Every task dict in a task list, descending into blocks."""
    for item in node or []:
        if not isinstance(item, dict):
            continue
        yield item
        for key in ("block", "rescue", "always"):
            yield from tasks_in(item.get(key))


def all_task_files():
    for role in ROLES:
        for sub in ("tasks", "handlers"):
            yield from sorted((role / sub).glob("*.yml"))
    yield from PLAYBOOKS
    yield from sorted((REPO / "playbooks" / "tasks").glob("*.yml"))
    yield REPO / "site.yml"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_role_has_meta_and_argument_specs(role):
    assert (role / "meta" / "main.yml").is_file()
    specs = load(role / "meta" / "argument_specs.yml")["argument_specs"]
    if role.name == "spark":
        # The site role is every role's dependency for its values: its spec is the entry point `site`, which the
        # inventory check validates once per run, so that the dependency does not validate it again in every play.
        assert "main" not in specs and "site" in specs and (role / "tasks" / "site.yml").is_file()
        return
    assert "main" in specs


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_public_defaults_are_prefixed_and_documented(role):
    defaults_file = role / "defaults" / "main.yml"
    if not defaults_file.exists():
        pytest.skip("no public variables")
    defaults = load(defaults_file)
    documented = set()
    for entry in load(role / "meta" / "argument_specs.yml")["argument_specs"].values():
        documented |= set((entry.get("options") or {}).keys())
    for name in defaults:
        assert name.startswith(role.name + "_"), f"{role.name}: {name} lacks the {role.name}_ prefix"
        assert name in documented, f"{role.name}: {name} is not in meta/argument_specs.yml"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_internal_vars_are_double_underscore_prefixed(role):
    vars_file = role / "vars" / "main.yml"
    if not vars_file.exists():
        pytest.skip("no internal variables")
    published = ""
    if role.name == "spark":
        # The site role publishes derived, read-only values (topology, shared names, the flag model) that every
        # role reads: prefixed like public variables, out of the inventory's reach, and documented.
        published = " ".join(load(role / "meta" / "argument_specs.yml")["argument_specs"]["site"]["description"])
    for name in load(vars_file):
        if published:
            assert name.startswith("spark_") and name in published, f"spark: {name} is not a documented spark_ value"
            continue
        assert name.startswith(f"__{role.name}_"), f"{role.name}: internal {name} lacks __{role.name}_"


def test_templates_start_with_ansible_managed():
    templates = sorted((REPO / "roles").glob("*/templates/**/*.j2"))
    assert templates
    for t in templates:
        first = t.read_text().lstrip().splitlines()[0]
        assert first.startswith("{{ ansible_managed | comment"), t


def test_every_command_has_changed_when_and_fqcn():
    checked = 0
    for path in all_task_files():
        data = load(path)
        plays = data if isinstance(data, list) else []
        task_lists = []
        if path.parent.name in ("tasks", "handlers"):
            task_lists.append(plays)
        else:
            for play in plays:
                for key in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                    task_lists.append(play.get(key))
        for tasks in task_lists:
            for task in tasks_in(tasks):
                module = next((k for k in task if "." in k and not k.startswith("ansible.builtin.import_")
                               and k not in ("ansible.builtin.include_tasks",)), None)
                bare = [k for k in task if k in ("command", "shell", "copy", "template", "file", "service", "systemd")]
                assert not bare, f"{path}: task {task.get('name')!r} uses a short module name {bare}"
                if module in COMMAND_MODULES:
                    checked += 1
                    args = task.get(module) if isinstance(task.get(module), dict) else {}
                    # creates/removes make the module's own changed status honest.
                    honest = "changed_when" in task or "creates" in args or "removes" in args
                    assert honest, f"{path}: {task.get('name')!r} has no changed_when"
    assert checked > 0


def test_readme_names_every_playbook_and_the_two_commands():
    readme = (REPO / "README.md").read_text()
    for pb in PLAYBOOKS:
        assert f"playbooks/{pb.name}" in readme, f"README does not describe playbooks/{pb.name}"
    assert "scripts/test" in readme and "scripts/deploy" in readme


def test_site_imports_playbooks_that_exist():
    site = load(REPO / "site.yml")
    for entry in site:
        target = entry["ansible.builtin.import_playbook"]
        assert (REPO / target).is_file(), target


def test_requirements_are_pinned():
    for raw in (REPO / "requirements.txt").read_text().splitlines():
        requirement = raw.split("#")[0].strip()
        if requirement:
            assert re.match(r"^[A-Za-z0-9_.\-\[\]]+==[\w.]+$", requirement), requirement


# ---- One owner per concern (issue: one shape for the collection) ----------------------------------

def role_texts(*subdirs: str):
    for role in ROLES:
        for sub in subdirs:
            for path in sorted((role / sub).rglob("*")):
                if path.is_file() and path.suffix in (".yml", ".j2", ".py"):
                    yield role, path, path.read_text()


def test_inventory_groups_are_named_only_by_the_site_role():
    offenders = [str(path.relative_to(REPO)) for role, path, text in role_texts("tasks", "defaults", "vars", "meta",
                                                                            "templates", "library")
                 if role.name != "spark" and re.search(r"groups\[['\"]spark", text)]
    wiring = sorted((REPO / "playbooks" / "group_vars").rglob("*.yml"))
    plugins = sorted((REPO / "plugins").rglob("*.py"))
    offenders += [str(p.relative_to(REPO)) for p in [*PLAYBOOKS, REPO / "site.yml", *wiring, *plugins]
                  if re.search(r"groups\[['\"]spark", p.read_text())]
    # Where a play's hosts are decided no role's values exist yet: the inventory check's first play looks at the
    # default group names only to skip itself when they hold a TP group, and the site role's check decides.
    assert offenders == ["playbooks/inventory_check.yml"]


def test_no_role_loads_another_roles_files():
    offenders = [str(path.relative_to(REPO)) for role, path, text in role_texts("tasks")
                 if re.search(r"include_vars", text) and "../" in text]
    assert offenders == []


def test_role_defaults_never_fall_back_to_another_roles_variable():
    prefixes = tuple(f"{r.name}_" for r in ROLES)
    for role in ROLES:
        path = role / "defaults" / "main.yml"
        if not path.exists():
            continue
        for name, value in load(path).items():
            # The collection's filters (dgx_spark.llm_serving.spark_project_dir) are code, not variables.
            text = re.sub(re.escape(COLLECTION) + r"\.\w+", "", str(value))
            for used in re.findall(r"\b([a-z][a-z0-9_]*)\b", text) if "{{" in text else []:
                assert not (used.startswith(prefixes) and not used.startswith(f"{role.name}_")), (
                    f"{role.name}: {name} refers to {used}; wire it in playbooks/group_vars/all/spark.yml instead")


def test_group_vars_fallbacks_equal_the_owning_roles_defaults():
    """group_vars/all falls back to a role's default where that role is not in every play: the two must agree."""
    wiring = load(REPO / "playbooks" / "group_vars" / "all" / "spark.yml")
    found = 0
    for value in wiring.values():
        pattern = r"\b((?:server|supervisor|checkpoint|fabric)_[a-z0-9_]*) \| default\(([^)]*)\)"
        for name, literal in re.findall(pattern, str(value)):
            owner = next(r for r in ("server", "supervisor", "checkpoint", "fabric") if name.startswith(r + "_"))
            defaults = load(REPO / "roles" / owner / "defaults" / "main.yml")
            if name not in defaults:
                # A fact the role publishes (fabric_socket_ifname): the fallback covers a run without that role.
                facts = " ".join(p.read_text() for p in (REPO / "roles" / owner / "tasks").glob("*.yml"))
                assert re.search(rf"^\s+{name}:", facts, re.M), f"{name} is neither a default nor a fact of {owner}"
                continue
            default = defaults[name]
            assert yaml.safe_load(literal) == default, f"{name}: group_vars falls back to {literal}, the role says {default!r}"
            found += 1
    assert found > 0


def test_the_tp_group_is_stopped_and_started_in_one_place():
    """Only the server role's stop/start task files stop or start the rank's unit."""
    offenders = []
    for _role, path, _text in role_texts("tasks"):
        for task in tasks_in(load(path)):
            module = task.get("ansible.builtin.systemd_service") or task.get("ansible.builtin.systemd")
            if isinstance(module, dict) and module.get("state") in ("started", "stopped", "restarted"):
                if str(module.get("name")) in ("{{ spark_unit_name }}", "{{ server_unit_name }}"):
                    offenders.append(f"{path.relative_to(REPO)}: {task.get('name')}")
    allowed = {"roles/server/tasks/stop.yml", "roles/server/tasks/start.yml"}
    assert {o.split(":")[0] for o in offenders} <= allowed, offenders


def test_tasks_from_names_a_declared_entry_point():
    uses = []
    for path in all_task_files():
        for doc in [load(path)]:
            plays = doc if isinstance(doc, list) else []
            task_lists = [plays] if path.parent.name in ("tasks", "handlers") else [
                play.get(k) for play in plays for k in ("pre_tasks", "tasks", "post_tasks")]
            for tasks in task_lists:
                for task in tasks_in(tasks):
                    for key in ROLE_CALLS:
                        args = task.get(key)
                        if isinstance(args, dict) and args.get("tasks_from"):
                            uses.append((args["name"], args["tasks_from"], args.get("rolespec_validate", True), path))
    assert uses
    short = [f"{path.relative_to(REPO)}: {role}" for role, _, _, path in uses if not role.startswith(COLLECTION + ".")]
    assert not short, f"roles included by a name that is not the collection's FQCN ({COLLECTION}.<role>): {short}"
    uses = [(role.removeprefix(COLLECTION + "."), *rest) for role, *rest in uses]
    for role, entry, validated, path in uses:
        specs = load(REPO / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]
        assert entry in specs, f"{path.relative_to(REPO)} uses {role} tasks_from {entry}, not declared in its argument specs"
        if path in RANK_PLAYBOOKS or path in RANK_TASK_FILES:
            continue  # the plays on the ranks skip it: the inventory check validated their options (test below)
        # Elsewhere skipping the spec check is only for entry points whose spec has nothing to check (they validate
        # the variables themselves): an option added there later must not go unchecked.
        assert validated or not specs[entry].get("options"), (
            f"{path.relative_to(REPO)} skips the spec validation of {role} tasks_from {entry}, which declares options")


def test_the_playbooks_validate_the_ranks_settings_once_and_skip_only_what_the_check_validated():
    # The inventory check judges every role option a rank's settings give against the roles' specs, once per run.
    check = load(REPO / "playbooks" / "tasks" / "inventory_check.yml")
    validation = [t["ansible.builtin.validate_argument_spec"] for t in tasks_in(check)
                  if "ansible.builtin.validate_argument_spec" in t]
    assert validation and "spark_settings_spec" in validation[0]["argument_spec"], validation
    for path in RANK_PLAYBOOKS:
        for play in load(path):
            if "hosts" not in play:
                continue
            # A play's roles: would validate each role again, in every run.
            assert "roles" not in play, f"{path.name}: {play['name']}: import the role with rolespec_validate: false"
            calls = [task[key] for k in ("pre_tasks", "tasks", "post_tasks") for task in tasks_in(play.get(k))
                     for key in ROLE_CALLS if isinstance(task.get(key), dict)]
            # Only the ranks were checked: a play on other hosts (the monitoring host) keeps the role's own.
            ranks = play["hosts"] == BATCHED["hosts"] or play["hosts"].endswith(" else __spark_batches.hosts }}")
            for call in calls:
                assert call.get("rolespec_validate", True) is not ranks, (path.name, play["name"], call)


# A play over the ranks: one TP group per batch (playbooks/vars/site_batches.yml), so that run_once acts once per
# group and a failing group stops the play before the next.
BATCHED = {"hosts": "{{ __spark_batches.hosts }}", "serial": "{{ __spark_batches.sizes }}",
           "max_fail_percentage": "{{ __spark_batch_max_fail_percentage }}", "vars_files": ["vars/site_batches.yml"]}


# Plays that must see every group at once, before any batch, and change nothing: checkpoint.yml's choice of
# each node's source (the hub once per site, a node of a later group may feed an earlier one).
SITE_AT_ONCE = {("checkpoint.yml", "Find the nodes that hold the verified checkpoint and choose each node's source")}


def test_every_play_over_the_ranks_runs_one_tp_group_per_batch():
    plays = [(path.name, play) for path in RANK_PLAYBOOKS for play in load(path) if "hosts" in play]
    at_once = [(name, play) for name, play in plays if (name, play.get("name")) in SITE_AT_ONCE]
    assert len(at_once) == len(SITE_AT_ONCE)
    for name, play in at_once:
        assert play["hosts"] == BATCHED["hosts"] and "serial" not in play, (name, play["name"])
    plays = [(name, play) for name, play in plays if (name, play.get("name")) not in SITE_AT_ONCE]
    over_ranks = [(name, play) for name, play in plays if "spark" in str(play["hosts"])]
    assert over_ranks and not [(name, play["name"]) for name, play in over_ranks if "__spark_batches" not in play["hosts"]]
    for name, play in over_ranks:
        assert {k: play.get(k) for k in BATCHED if k != "hosts"} == {k: v for k, v in BATCHED.items() if k != "hosts"}, \
            (name, play["name"])


def test_an_option_means_the_same_in_every_role_and_entry_point():
    # The check validates every role's options at once (plugins/filter/spark.py, spark_settings_spec): one name,
    # one definition, or the merged spec would judge a value by whichever role came first.
    checked = filter_plugin("spark")._CHECKED  # noqa: SLF001 - what the validator reads of an option
    seen: dict[str, tuple[str, dict]] = {}
    for role in ROLES:
        for entry, spec in load(role / "meta" / "argument_specs.yml")["argument_specs"].items():
            for name, option in ((spec or {}).get("options") or {}).items():
                judged = {k: option.get(k) for k in checked}
                where, first = seen.setdefault(name, (f"{role.name} {entry}", judged))
                assert judged == first, f"{name}: {role.name} {entry} defines it otherwise than {where}"


def test_no_content_reads_the_deprecated_vars_dictionary():
    # callback_plugins/spark_vars_untagged.py drops ansible-core's deprecation tag on `vars` (its cost is paid
    # per host and task): the warning it would give is then missing, so nothing here may read `vars`.
    reads = re.compile(r"(?<![\w.'\"])vars\s*(\[|\.|\|)")
    files = [*all_task_files(), *(REPO / "roles").glob("*/vars/*.yml"), *(REPO / "roles").glob("*/defaults/*.yml"),
             *(REPO / "roles").glob("*/templates/*.j2"), *(REPO / "playbooks" / "group_vars").rglob("*.yml")]
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for path in files for number, line in enumerate(path.read_text().splitlines(), 1)
             if not line.lstrip().startswith("#") and reads.search(line)]
    assert not found, "read the variable by its name instead of through vars:\n" + "\n".join(found)


def test_checkpoint_modules_use_only_public_hub_api():
    for path in sorted((REPO / "roles" / "checkpoint").rglob("*.py")):
        text = path.read_text()
        assert "file_download" not in text, path
        assert not re.search(r"huggingface_hub(\.[a-z_]+)*\._", text), f"{path}: private huggingface_hub module"


def test_the_benchmarks_package_has_no_import_cycle():
    graph = {}
    for path in (REPO / "benchmarks").glob("*.py"):
        graph[path.stem] = {node.module for node in ast.walk(ast.parse(path.read_text()))
                            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}
    assert graph.get("figures"), "the benchmarks package moved: this rule reads nothing"

    def cycle_from(module, trail):
        if module in trail:
            return [*trail[trail.index(module):], module]
        for imported in graph.get(module, ()):
            found = cycle_from(imported, [*trail, module])
            if found:
                return found
        return None

    cycles = [" -> ".join(c) for c in (cycle_from(m, []) for m in sorted(graph)) if c]
    assert not cycles, "benchmark modules import each other: " + "; ".join(cycles)


def test_no_content_uses_a_name_from_before_the_engine_neutral_rename():
    # The old names (sglang_server_port, ...) live on only in the site role's filter that maps an inventory's
    # settings to the new ones (plugins/filter/spark.py) and in the tests of that mapping.
    old = re.compile(r"\b_{0,2}sglang_(server|supervisor|verify|doctor|benchmark|tune|monitoring|firewall)_[a-z]")
    places = [*REPO.glob("roles/**/*"), *REPO.glob("playbooks/**/*"), *REPO.glob("plugins/**/*"),
              *REPO.glob("inventory/**/*"), *REPO.glob("tests/inventory/**/*"), REPO / "site.yml",
              *REPO.glob("molecule/**/*.yml")]
    mapping = REPO / "plugins" / "filter" / "spark.py"
    found = [f"{path.relative_to(REPO)}:{number}" for path in places if path.is_file() and path != mapping
             and path.suffix in (".yml", ".yaml", ".j2", ".py", ".json", "")
             for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if old.search(line)]
    assert not found, "names from before the rename: " + ", ".join(found)


def test_playbooks_and_roles_reach_the_roles_by_their_fqcn():
    # A role named short resolves only through the clone's roles_path: from an installed collection it is not found.
    names = "|".join(r.name for r in ROLES)
    listed = re.compile(r"^\s*(?:- )?role: (" + names + r")\s*$", re.M)
    included = re.compile(r"_role:\s*\n\s+name: (" + names + r")\s*$", re.M)
    places = [*PLAYBOOKS, *sorted((REPO / "playbooks" / "tasks").glob("*.yml")),
              *sorted(REPO.glob("roles/*/tasks/*.yml")), *sorted(REPO.glob("roles/*/handlers/*.yml")),
              *sorted(REPO.glob("roles/*/meta/main.yml")), *sorted(REPO.glob("molecule/*/*.yml"))]
    found = [f"{p.relative_to(REPO)}: {m.group(1)}" for p in places for rx in (listed, included)
             for m in rx.finditer(p.read_text())]
    assert not found, f"roles named without {COLLECTION}.: {found}"


def test_the_collections_filters_are_called_by_their_fqcn():
    # A collection's filter has no short name: a template that calls one short fails when it is rendered, in
    # whichever run first reaches it.
    names = set()
    for path in sorted((REPO / "plugins" / "filter").glob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if isinstance(function, ast.FunctionDef) and function.name == "filters":
                names.update(key.value for node in ast.walk(function) if isinstance(node, ast.Dict)
                             for key in node.keys if isinstance(key, ast.Constant))
    assert "server_plan" in names and "spark_checkpoint_paths" in names
    short = re.compile(r"""(?:\|\s*|(?:map|select|reject)\(\s*['"])(""" + "|".join(sorted(names)) + r""")\b""")
    places = [p for p in [*REPO.glob("roles/**/*"), *REPO.glob("playbooks/**/*.yml"), *REPO.glob("molecule/**/*.yml")]
              if p.is_file() and p.suffix in (".yml", ".j2")]
    found = [f"{p.relative_to(REPO)}:{n}: {m.group(1)}" for p in places
             for n, line in enumerate(p.read_text().splitlines(), 1) for m in short.finditer(line)]
    assert not found, f"filters called without {COLLECTION}.: {found}"


def test_no_helper_is_written_twice_in_the_collections_code():
    # A helper that two plugins need lives once, in plugins/module_utils (the modules and the filters import it
    # by its FQCN): the same function body in two files is a copy that will drift. Short bodies (a return or
    # two) are not helpers worth sharing.
    bodies: dict[str, list[str]] = {}
    for path in sorted((REPO / "plugins").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                body = node.body[1:] if ast.get_docstring(node) else node.body
                if node.end_lineno - node.lineno < 5:
                    continue
                shape = ast.dump(ast.Module(body=body, type_ignores=[]), annotate_fields=False)
                bodies.setdefault(shape, []).append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    copies = [places for places in bodies.values() if len({p.split(":")[0] for p in places}) > 1]
    assert not copies, f"the same helper in several files: {copies}"


def test_every_sanity_ignore_is_justified_and_the_file_matches_the_pinned_ansible_core():
    pinned = re.search(r"^ansible-core==(\d+\.\d+)\.", (REPO / "requirements.txt").read_text(), re.M | re.I).group(1)
    files = sorted((REPO / "tests" / "sanity").glob("ignore-*.txt"))
    assert [f.name for f in files] == [f"ignore-{pinned}.txt"], files
    for number, line in enumerate(files[0].read_text().splitlines(), 1):
        path, _, why = line.partition(" # ")
        assert len(path.split()) == 2 and (REPO / path.split()[0]).exists(), f"line {number}: {line}"
        assert len(why.split()) >= 5, f"line {number} has no justification worth the name: {line}"

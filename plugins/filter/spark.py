"""Names the site derives once and every role reads.

The checkpoint role keeps its record, verified-stamp and partial files beside
the model directory and named after it; the server, the doctor and the day-2
verbs read them, for this host and (under --limit, by delegation) for others.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from pathlib import Path

import yaml
from ansible.errors import AnsibleFilterError
from ansible.utils.display import Display
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import checkpoint_builds, site_groups
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.checkpoint_common import checkpoint_paths
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.flag_models import CAPACITY_ROLES, capacity_flag
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_names import credentials, layout

# The concerns that carried the engine's name before the collection's engine-neutral rename (1.1.0): their
# settings were sglang_<concern>_*, and are <concern>_* since.
RENAMED_CONCERNS = ("server", "supervisor", "verify", "doctor", "benchmark", "tune", "monitoring", "firewall")
LEGACY_NAME = re.compile(r"^sglang_(" + "|".join(RENAMED_CONCERNS) + r")_[a-z0-9_]+$")
# Names that changed more than their prefix.
RENAMED = {f"sglang_monitoring_sglang_{x}": f"monitoring_server_{x}" for x in ("port", "tls", "tls_ca")}
# The collection's own wiring (playbooks/group_vars/all) sets some new names for every host: a site that sets
# the old name of one of them sets it once, not twice.
WIRING = Path(__file__).resolve().parents[2] / "playbooks" / "group_vars" / "all"
ROLES = Path(__file__).resolve().parents[2] / "roles"
# What ArgumentSpecValidator judges a value by; descriptions and documented defaults are for ansible-doc (a
# description may quote Jinja, which the validation task would template).
_CHECKED = ("type", "elements", "choices", "options", "required", "no_log", "aliases")


def spark_checkpoint_paths(model_dir):
    """The record, stamp and partial directories beside a model directory: the rule the checkpoint modules
    apply to their defaults (plugins/module_utils/checkpoint_common.py), for the roles' tasks."""
    return checkpoint_paths(str(model_dir))


def spark_checkpoint_build_errors(name, known, site, settings):
    """Every reason the named checkpoint build (and the site's table of builds) cannot be deployed, with the fix."""
    return checkpoint_builds.build_errors(name, dict(known or {}), site, dict(settings or {}))


def spark_project_dir(playbook_dir):
    """The directory the controller keeps a site's reports and renders in: the project the playbook belongs to.

    A clone's playbooks/ sit in the project, one level down. An installed collection's playbooks/ belong to
    no site (a shared, maybe read-only, collections path): a run of them keeps its files in the directory
    ansible-playbook runs in, the outside project's own.
    """
    playbook_dir = os.path.abspath(str(playbook_dir))
    # Where the directory really is: the clone's own link (.collections/ansible_collections/dgx_spark/llm_serving
    # -> the checkout) leads to a directory under no ansible_collections/.
    if f"{os.sep}ansible_collections{os.sep}" in os.path.realpath(playbook_dir) + os.sep:
        return os.getcwd()
    return os.path.dirname(playbook_dir) if os.path.basename(playbook_dir) == "playbooks" else playbook_dir


def _wired_names() -> set[str]:
    names = set()
    for path in sorted(WIRING.glob("*.yml")) if WIRING.is_dir() else ():
        names.update(re.findall(r"^([a-z_][a-z0-9_]*):", path.read_text(), re.M))
    return names


def spark_renamed_settings(hostvars, hosts, announce=True):
    """The settings `hosts` still set under their names before the rename, as [{host, old, new, value}].

    Each old name gets one deprecation line for the run, naming its hosts and the new name (unless `announce` is
    false: the question whether there is any, asked before the task that applies them announces them). A host
    that sets both names is refused: which of the two values it meant cannot be known.
    """
    wired = _wired_names()
    found, both = [], []
    seen: dict[str, list[str]] = {}
    for host in dict.fromkeys(hosts):
        names = hostvars[host]
        for old in sorted(k for k in names.keys() if LEGACY_NAME.match(k)):
            new = RENAMED.get(old, old[len("sglang_"):])
            if new in names and new not in wired:
                both.append(f"{host} sets both {old} (its name before 1.1.0) and {new}")
                continue
            seen.setdefault(old, []).append(host)
            found.append({"host": host, "old": old, "new": new, "value": names[old]})
    if both:
        raise AnsibleFilterError(
            "; ".join(both) + ". Which value is meant cannot be known, and nothing was changed. Fix: keep only the new "
            "name in the inventory (the old one is what it was called before the engine-neutral rename).")
    for old, where in seen.items() if announce else ():
        Display().deprecated(
            f"{old} (set for {', '.join(where)}) is now {RENAMED.get(old, old[len('sglang_'):])}: rename it in the "
            "inventory",
            version="2.0.0", collection_name="dgx_spark.llm_serving")
    return found


def spark_credential_file(folder, name, legacy_name):
    """`folder`/`name`, or `folder`/`legacy_name` while only that exists: a controller whose credentials still carry
    their names before 1.3.0 (the take-over renames them) keeps reaching the endpoint with the key it has."""
    path = os.path.join(str(folder), str(name))
    legacy = os.path.join(str(folder), str(legacy_name))
    return legacy if not os.path.isfile(path) and os.path.isfile(legacy) else path


def spark_legacy_credentials(folder, legacy_names, names):
    """The controller's credential files still under their names before 1.3.0, as "old -> new" (read here, on the
    controller, so that a run costs no task for them; the legacy_names module moves them)."""
    pairs = zip(credentials(legacy_names), credentials(names), strict=True)
    return [f"{os.path.join(str(folder), old)} -> {os.path.join(str(folder), new)}"
            for old, new in pairs if old != new and os.path.lexists(os.path.join(str(folder), old))]


def spark_legacy_paths(legacy_names, names):
    """The paths whose presence on a node shows something installed under a name before 1.3.0 (its units, their
    drop-ins and its directories), where that name differs from today's: a shell test for each costs the run far
    less than a module, and only a node where one exists gets the legacy_names module."""
    old, new = layout(legacy_names), layout(names)
    keys = ("server_unit_path", "config_dir", "supervisor_unit_path", "supervisor_state_dir", "firewall_unit_path",
            "firewall_rules", "collector_program_dir", "monitoring_state_dir", "journald_dropin", "nginx_conf")
    paths = [old[k] for k in keys if old[k] != new[k]]
    paths += [path for path, now in zip(old["monitoring_dropins"], new["monitoring_dropins"], strict=True) if path != now]
    return paths


def _checkable(spec: dict) -> dict:
    kept = {k: v for k, v in spec.items() if k in _CHECKED and k != "options"}
    if spec.get("options"):
        kept["options"] = {name: _checkable(sub) for name, sub in spec["options"].items()}
    return kept


@functools.cache
def _role_options() -> dict:
    """Every option of every entry point of the collection's roles but the site role's (its entry points validate
    where they run), as the validator judges it. One name has one definition in the whole collection (a unit
    test holds them to it), so the first one found stands for all."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C build of the safe loader: a tenth of the time
    options: dict = {}
    for path in sorted(ROLES.glob("*/meta/argument_specs.yml")):
        if path.parts[-3] == "spark":
            continue
        specs = yaml.load(path.read_text(), Loader=loader)["argument_specs"]  # noqa: S506 - a safe loader
        for entry in (specs or {}).values():
            for name, spec in ((entry or {}).get("options") or {}).items():
                options.setdefault(name, _checkable(spec))
    return options


def spark_settings_spec(names):
    """The argument spec of the role options among `names` (a host's variables: hostvars[inventory_hostname]),
    for one validation task per host and run: the collection's playbooks then skip each role's own."""
    options = _role_options()
    return {name: options[name] for name in names if name in options}


def spark_capacity_flags(model):
    """{context: name, concurrency: name}: the engine's own names of its two capacity flags (the flag model's
    `capacity` marks), for texts that give the seed's remedy order."""
    try:
        return {role: capacity_flag(model, role)["name"] for role in CAPACITY_ROLES}
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from e


def spark_site_groups(groups, names=None):
    """Every TP group of the site in inventory order: [{name, head, workers, nodes}] (one for today's shape)."""
    return site_groups.site_groups(groups, names)


def spark_tp_group(entries, host):
    """The entry of spark_site_groups that holds host (the first group for a host outside every group)."""
    return site_groups.group_of(entries, host)


def spark_site_errors(groups, hostvars, names=None, here=None):
    """The refusals of the site's groups as a whole: the inventory check's, before any node is contacted."""
    return site_groups.site_errors(groups, hostvars, names, here)


def spark_batches(groups, play_hosts, names=None):
    """A play over the site's hosts: {hosts, sizes} for `hosts:` and `serial:`, one batch per TP group."""
    return site_groups.batches(groups, play_hosts, names)


def spark_checkpoint_sources(entries, holders, hostvars, run_hosts, default_prefix=24):
    """{host: the node it takes the checkpoint from}: the hub once per site (module_utils/site_groups)."""
    return site_groups.checkpoint_sources(entries, holders, hostvars, run_hosts, default_prefix)


def spark_gateway(groups, entries, names=None):
    """{host, enabled}: the gateway's host (spark_gateway's one host, else the first head) and whether it runs."""
    return site_groups.gateway(groups, entries, names)


# Read here, in the process that imports the filters: the controller's plugin cache (callback_plugins) imports
# them before the task workers fork, so no worker parses the specs again. Unreadable specs are left to the call.
with contextlib.suppress(OSError, yaml.YAMLError, KeyError, TypeError):
    _role_options()


class FilterModule:
    def filters(self):
        return {"spark_checkpoint_paths": spark_checkpoint_paths, "spark_renamed_settings": spark_renamed_settings,
                "spark_project_dir": spark_project_dir, "spark_credential_file": spark_credential_file,
                "spark_legacy_credentials": spark_legacy_credentials, "spark_legacy_paths": spark_legacy_paths,
                "spark_settings_spec": spark_settings_spec, "spark_capacity_flags": spark_capacity_flags,
                "spark_site_groups": spark_site_groups, "spark_tp_group": spark_tp_group,
                "spark_site_errors": spark_site_errors, "spark_batches": spark_batches,
                "spark_gateway": spark_gateway, "spark_checkpoint_sources": spark_checkpoint_sources,
                "spark_checkpoint_build_errors": spark_checkpoint_build_errors}

#!/usr/bin/python
"""Find, and take over, what versions before 1.3.0 installed on a node under names that said the engine."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: legacy_names
short_description: Move a node's units and files from the names before 1.3.0 to the engine-neutral ones
description:
  - Versions 1.0.0 to 1.2.0 named the rank's unit, its container and configuration directory, the
    supervisor, the firewall's table and unit and the monitoring's files after the engine
    (C(sglang.service), C(/etc/sglang), C(sglang_guard), ...). This module finds them on a node and,
    with O(take_over), moves each to the name the roles now give it, so that the roles that run after
    it find their own files and install nothing twice.
  - What holds state moves and is kept - the configuration directory with the last good and pending
    configurations (their unit rewritten to the new container and env file names), the supervisor's
    state (a give-up stays a give-up), the monitoring's record of the packages it installed, the
    journal and Prometheus drop-ins, the TLS proxy's configuration, Prometheus's copies of the API key
    and CA. What the roles install again is stopped and removed - the units, the supervisor's and the
    collector's programs, the firewall's nftables table and rules file. The rank's unit is stopped
    (the supervisor first, on its own task); the server role starts the ranks under the new unit, so a
    node is restarted once.
  - Where a legacy name and its new name are the same (a site that set spark_unit_name or
    spark_config_dir itself), there is nothing to move for it.
  - A legacy and a new name both present is refused with both paths (a site half moved by hand), and the
    operator removes the one not in use.
author: LLM serving maintainers (@dgx-spark)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  legacy:
    description: The names before 1.3.0 (spark_legacy_names).
    type: dict
    required: true
  current:
    description: The names the roles use now, with the same keys.
    type: dict
    required: true
  parts:
    description:
      - What to look at; the supervisor is stopped on its own, before the ranks it watches.
      - C(credentials) is the controller's part (O(credentials_dir), delegated to the controller) - the generated
        API key and TLS files keep their content under their new names, so every client's key stays valid.
    type: list
    elements: str
    choices: [supervisor, server, firewall, monitoring, credentials]
    default: [supervisor, server, firewall, monitoring]
  credentials_dir:
    description: The controller's credentials directory (server_credentials_dir, or the inventory's .credentials).
    type: path
  take_over:
    description: Move what was found (false - only report it).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    details: Reports every step it would take and takes none.
  diff_mode:
    support: full
    details: The legacy paths before, the new ones after.
  platform:
    platforms: posix
notes:
  - The paths follow the roles' layout (plugins/module_utils/node_names.py).
"""

EXAMPLES = r"""
- name: Take a node deployed under the names before 1.3.0 over
  dgx_spark.llm_serving.legacy_names:
    legacy: "{{ spark_legacy_names }}"
    current: {spark_unit_name: spark-llm.service, spark_config_dir: /etc/spark-llm}
    take_over: true
"""

RETURN = r"""
found:
  description: Each legacy unit, directory or file on the node, as "old -> new".
  returned: always
  type: list
  elements: str
  sample: ["sglang.service -> spark-llm.service", "/etc/sglang -> /etc/spark-llm"]
steps:
  description: What the take-over did (in check mode, would do), in order.
  returned: always
  type: list
  elements: str
"""

import json
import os
import re
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.checkpoint_common import atomic_write
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_names import NAMES, credentials, layout
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.server_store import LAST_GOOD, MANIFEST, PENDING

# spark_supervisor_config's name in spark_config_dir.
SUPERVISOR_CONFIG = "supervisor.json"


class TakeOver:
    def __init__(self, module, old, new):
        self.module, self.old, self.new = module, old, new
        self.found, self.steps, self.actions = [], [], []
        self.units_touched = False

    def plan(self, text, action=None, unit=False):
        self.steps.append(text)
        if action:
            self.actions.append(action)
        self.units_touched = self.units_touched or unit

    def systemctl(self, *args):
        self.module.run_command(["systemctl", *args])

    def unit_gone(self, unit, path):
        """Stop and disable `unit` and remove its file (a unit the roles install again under its new name)."""
        def act():
            self.systemctl("stop", unit)
            self.systemctl("disable", unit)
            if os.path.lexists(path):
                os.unlink(path)
            self.systemctl("reset-failed", unit)
        self.plan(f"stop, disable and remove {unit}", act, unit=True)

    def old_unit(self, key):
        """The unit under the layout's `key` (its file at `key`_path), when its old name differs and it is there."""
        old, new = self.old[key], self.new[key]
        if old == new or not os.path.lexists(self.old[key + "_path"]):
            return False
        self.found.append(f"{old} -> {new}")
        self.unit_gone(old, self.old[key + "_path"])
        return True

    def moved(self, source, target, what, rewrite=None):
        """Move `source` to `target`; refuse when both exist (two copies: which one is in use is the operator's call)."""
        if source == target or not os.path.lexists(source):
            return
        self.found.append(f"{source} -> {target}")
        if os.path.lexists(target):
            self.module.fail_json(
                msg=f"{what}: {source} (its name before 1.3.0) and {target} both exist, so it was not "
                    f"moved. Fix: keep the one in use, remove the other (or move it aside), and run again.",
                found=self.found)

        def act():
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.rename(source, target)
            if rewrite:
                rewrite(target)
        self.plan(f"move {source} to {target}", act)

    def removed(self, path, what):
        if not os.path.lexists(path):
            return
        self.found.append(f"{path} ({what}, installed again under its new name)")

        def act():
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        self.plan(f"remove {path}", act)

    # --- the parts -------------------------------------------------------------------------------------

    def config_dir_now(self):
        """The rank's configuration directory as it is before this run moves it (or after a run cut short moved it)."""
        return self.old["config_dir"] if os.path.isdir(self.old["config_dir"]) else self.new["config_dir"]

    def supervisor(self):
        o, n = self.old, self.new
        if self.old_unit("supervisor_unit"):
            # Its configuration names the old unit; the supervisor role writes it again. Until then the server role
            # finds no supervisor to pause around the restart, as on a node that never had one.
            self.removed(os.path.join(self.config_dir_now(), SUPERVISOR_CONFIG), "the supervisor's configuration")
        if o["supervisor_program_dir"] != n["supervisor_program_dir"]:
            self.removed(o["supervisor_program_dir"], "the supervisor's program")
        self.moved(o["supervisor_state_dir"], n["supervisor_state_dir"], "the supervisor's state")

    def server(self):
        o, n = self.old, self.new
        if self.old_unit("server_unit"):
            docker = self.module.get_bin_path("docker")
            if docker:
                # docker run --rm removes the stopped rank's container; one that outlived its unit goes too.
                self.plan(f"remove the container {o['container']} if one is left",
                          lambda: self.module.run_command([docker, "rm", "-f", o["container"]]))
        if o["server_dropin_dir"] != n["server_dropin_dir"]:
            if os.path.lexists(o["server_dropin_dir"]):
                self.units_touched = True
            self.removed(o["server_dropin_dir"], "the rank unit's drop-ins")
        self.moved(o["nginx_conf"], n["nginx_conf"], "the TLS proxy's configuration", rewrite=self.rewrite_paths)
        now = self.config_dir_now()
        self.moved(o["config_dir"], n["config_dir"], "the rank's configuration directory")
        if not os.path.isdir(now) or o["config_dir"] == n["config_dir"] and o["env_name"] == n["env_name"]:
            return
        if o["env_name"] != n["env_name"] and os.path.lexists(os.path.join(now, o["env_name"])):
            if os.path.lexists(os.path.join(now, n["env_name"])):
                self.module.fail_json(msg=f"the rank's env file: both {o['env_name']} and {n['env_name']} are in "
                                          f"{now}. Fix: keep the one in use, remove the other, and run again.")
            self.found.append(f"{os.path.join(now, o['env_name'])} -> {os.path.join(n['config_dir'], n['env_name'])}")
            self.plan(f"rename {o['env_name']} to {n['env_name']} in {n['config_dir']}",
                      lambda: os.rename(os.path.join(n["config_dir"], o["env_name"]),
                                        os.path.join(n["config_dir"], n["env_name"])))
        old_key = os.path.join(now, o["key_name"])
        if o["key_name"] != n["key_name"] and os.path.lexists(old_key):
            # The server role installs the key again under its new name; the old file would keep a copy of it.
            self.found.append(f"{old_key} (the rank's API key file, installed again under its new name)")
            self.plan(f"remove {o['key_name']} from {n['config_dir']}",
                      lambda: os.unlink(os.path.join(n["config_dir"], o["key_name"])))
        if self.found:
            self.plan("rewrite the kept configurations' units to the new container and env file names",
                      lambda: self.rewrite_stores(n["config_dir"]))

    def firewall(self):
        o, n = self.old, self.new
        self.old_unit("firewall_unit")
        nft = self.module.get_bin_path("nft")
        if nft and o["firewall_table"] != n["firewall_table"]:
            rc, _out, _err = self.module.run_command([nft, "list", "table", "inet", o["firewall_table"]])
            if rc == 0:
                self.found.append(f"nftables table inet {o['firewall_table']} -> inet {n['firewall_table']}")
                self.plan(f"delete the nftables table inet {o['firewall_table']}", lambda: self.drop_table(nft))
        if o["firewall_rules"] != n["firewall_rules"]:
            self.removed(o["firewall_rules"], "the firewall's rules file")

    def drop_table(self, nft):
        # Stopping the old firewall unit may have deleted it already (its ExecStop).
        table = self.old["firewall_table"]
        if self.module.run_command([nft, "list", "table", "inet", table])[0] == 0:
            self.module.run_command([nft, "delete", "table", "inet", table], check_rc=True)

    def monitoring(self):
        o, n = self.old, self.new
        for old_unit, new_unit in zip(o["collector_units"], n["collector_units"], strict=True):
            path = os.path.join("/etc/systemd/system", old_unit)
            if old_unit != new_unit and os.path.lexists(path):
                self.found.append(f"{old_unit} -> {new_unit}")
                self.unit_gone(old_unit, path)
        if o["collector_program_dir"] != n["collector_program_dir"]:
            self.removed(o["collector_program_dir"], "the node collector")
        self.moved(o["monitoring_state_dir"], n["monitoring_state_dir"], "the monitoring's state")
        for old_path, new_path in zip([o["journald_dropin"], *o["monitoring_dropins"]],
                                      [n["journald_dropin"], *n["monitoring_dropins"]], strict=True):
            if old_path != new_path and os.path.lexists(old_path):
                self.units_touched = True
            self.moved(old_path, new_path, "a drop-in of the monitoring")
        self.moved(o["prometheus_key"], n["prometheus_key"], "Prometheus's copy of the API key")
        self.moved(o["prometheus_ca"], n["prometheus_ca"], "Prometheus's copy of the CA")

    # --- rewrites ------------------------------------------------------------------------------------

    def rewrite_paths(self, path):
        """The legacy configuration directory, container and env file named in a file that moved."""
        o, n = self.old, self.new
        with open(path) as f:
            text = f.read()
        new = text.replace(os.path.join(o["config_dir"], o["env_name"]), os.path.join(n["config_dir"], n["env_name"]))
        new = new.replace(o["config_dir"].rstrip("/") + "/", n["config_dir"].rstrip("/") + "/")
        # The container's name stands alone on the unit's docker lines (--name X, rm -f X, stop ... X); the
        # image (lmsysorg/...:tag) and the engine's module names are never a word of their own.
        new = re.sub(rf"(?<=[ \t=]){re.escape(o['container'])}(?=[ \t]|$)", n["container"], new, flags=re.M)
        if new != text:
            self.write_keeping_mode(path, new)

    def rewrite_stores(self, config_dir):
        """The kept configurations under the new names: the unit's text, and the unit's and env file's names (a
        copy is compared and restored by its manifest's names, so they must be the installed files' names)."""
        o, n = self.old, self.new
        renames = {os.path.basename(o["server_unit_path"]): os.path.basename(n["server_unit_path"]),
                   o["env_name"]: n["env_name"]}
        for name in (LAST_GOOD, PENDING):
            folder = os.path.join(config_dir, name)
            try:
                with open(os.path.join(folder, MANIFEST)) as f:
                    manifest = json.load(f)
                files = manifest["files"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if files.get("unit") and os.path.isfile(os.path.join(folder, files["unit"])):
                self.rewrite_paths(os.path.join(folder, files["unit"]))
            moved = False
            for kind, old_name in list(files.items()):
                new_name = renames.get(old_name)
                if new_name and new_name != old_name and os.path.isfile(os.path.join(folder, old_name)):
                    os.rename(os.path.join(folder, old_name), os.path.join(folder, new_name))
                    files[kind], moved = new_name, True
            if moved:
                self.write_keeping_mode(os.path.join(folder, MANIFEST),
                                        json.dumps(manifest, indent=1, sort_keys=True) + "\n")

    @staticmethod
    def write_keeping_mode(path, text):
        atomic_write(path, text.encode(), os.stat(path).st_mode & 0o7777)

    def credentials(self, folder, old_names, new_names):
        for old, new in zip(credentials(old_names), credentials(new_names), strict=True):
            self.moved(os.path.join(folder, old), os.path.join(folder, new), "a file of the controller's credentials")

    def run(self, parts, take_over):
        for part in ("supervisor", "server", "firewall", "monitoring"):
            if part in parts:
                getattr(self, part)()
        if self.units_touched:
            self.plan("reload systemd", lambda: self.systemctl("daemon-reload"))
        moved = bool(self.found) and take_over
        if moved and not self.module.check_mode:
            for action in self.actions:
                action()
        return moved


def main():
    module = AnsibleModule(
        argument_spec={
            "legacy": {"type": "dict", "required": True},
            "current": {"type": "dict", "required": True},
            "parts": {"type": "list", "elements": "str",
                      "choices": ["supervisor", "server", "firewall", "monitoring", "credentials"],
                      "default": ["supervisor", "server", "firewall", "monitoring"]},
            "credentials_dir": {"type": "path"},
            "take_over": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    for key in ("legacy", "current"):
        missing = [name for name in NAMES if not p[key].get(name)]
        if missing:
            module.fail_json(msg=f"{key} lacks {', '.join(missing)}")
    job = TakeOver(module, layout(p["legacy"]), layout(p["current"]))
    if "credentials" in p["parts"]:
        if not p["credentials_dir"]:
            module.fail_json(msg="parts credentials needs credentials_dir")
        job.credentials(p["credentials_dir"], p["legacy"], p["current"])
    changed = job.run(p["parts"], p["take_over"])
    result = {"changed": changed, "found": job.found, "steps": job.steps if changed else []}
    if changed and module._diff:
        result["diff"] = {"before": "".join(f"{f.split(' -> ')[0]}\n" for f in job.found),
                          "after": "".join(f"{f.split(' -> ')[1]}\n" for f in job.found if " -> " in f)}
    module.exit_json(**result)


if __name__ == "__main__":
    main()

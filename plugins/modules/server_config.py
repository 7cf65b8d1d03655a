#!/usr/bin/python
"""Keep a TP rank's last good configuration, mark a new one pending, promote it, or put the last good one back."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: server_config
short_description: Keep, promote and restore a TP rank's last good configuration
description:
  - For the server role's internal use; options and return values may change with the role.
  - A configuration is the rank's unit, its env file, its server-args.json and the ID of the image its
    container runs. Two copies are kept in O(store) (mode 0700) - C(pending/), a configuration that passed
    readiness and waits for verify, and C(last-good/), the last one that passed readiness and verify - each
    with the files byte for byte (the env file 0600 - one kept from before 1.8.0 holds the API key) and C(config.json) naming the
    image reference and ID.
  - C(state=read) reads only. C(state=pending) records what the rank runs now (the running container's image
    ID) as pending, or drops the pending copy when it equals the last good one. C(state=commit) makes the
    pending copy the last good one. C(state=restore) writes the last good files back over the installed ones
    and points the image reference at the kept image ID again where the tag has moved since.
  - Never returns a file's content.
version_added: "1.3.0"
author: LLM serving maintainers (@dgx-spark)
options:
  state:
    description: What to do.
    type: str
    choices: [read, pending, commit, restore]
    default: read
  files:
    description: The installed configuration's files, as C(unit), C(env) and C(args) paths.
    type: dict
    required: true
  store:
    description: Directory that holds C(pending/) and C(last-good/).
    type: path
    required: true
  container:
    description: The rank's container (O(state=pending) reads the image it was started from).
    type: str
    default: ""
  image_ref:
    description: The image reference the installed unit runs (O(state=read) compares its ID with the last good one's).
    type: str
    default: ""
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - dgx_spark.llm_serving.docker_cli
attributes:
  check_mode:
    support: full
    details: Says what it would change and changes nothing.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Keep what passed readiness until verify says it is good
  dgx_spark.llm_serving.server_config:
    state: pending
    files: {unit: /etc/systemd/system/spark-llm.service, env: /etc/spark-llm/spark-llm.env, args: /etc/spark-llm/server-args.json}
    store: /etc/spark-llm
    container: spark-llm
"""

RETURN = r"""
last_good:
  description: The last good configuration's image (C(image_ref), C(image_id)) and when it was kept (C(kept)); null when none.
  returned: always
  type: dict
pending:
  description: The pending configuration's image and when it was marked; null when none.
  returned: always
  type: dict
differs:
  description: Whether the installed configuration differs from the last good one (false when there is none).
  returned: always
  type: bool
differences:
  description: What differs from the last good configuration (C(unit), C(env file), C(server-args.json), C(image)).
  returned: always
  type: list
  elements: str
last_good_args:
  description: The last good server-args.json (the launch arguments; never secrets); empty when none.
  returned: always
  type: list
  elements: str
unit_changed:
  description: O(state=restore) wrote a different unit (systemd must reload).
  returned: always
  type: bool
retagged:
  description: O(state=restore) pointed the last good image reference at its kept image ID again.
  returned: always
  type: bool
"""

import json
import os
import shutil
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.checkpoint_common import atomic_write
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_reads import read_bytes
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.server_store import (
    KINDS,
    LAST_GOOD,
    MANIFEST,
    PENDING,
    installed_paths,
    load,
)

# An env file from before 1.8.0 holds the API key (the key has a file of its own since); the others are what systemd
# and the doctor read anyway.
MODES = {"unit": 0o644, "env": 0o600, "args": 0o644}
LABELS = {"unit": "unit", "env": "env file", "args": "server-args.json"}


def installed(paths):
    return {kind: read_bytes(paths[kind]) for kind in KINDS}


def differences(a_files, a_image_id, b):
    """What differs between installed-like files/ID and the copy `b` (None: everything)."""
    if b is None:
        return [LABELS[k] for k in KINDS] + ["image"]
    out = [LABELS[k] for k in KINDS if a_files.get(k) != b["files"].get(k)]
    if (a_image_id or "") != (b["image"].get("image_id") or ""):
        out.append("image")
    return out


def save(store, name, paths, files, image):
    """Replace the copy `name` in `store` with `files` and `image`, whole or not at all."""
    os.makedirs(store, mode=0o700, exist_ok=True)
    staging = tempfile.mkdtemp(dir=store, prefix=f".{name}.new-")
    try:
        os.chmod(staging, 0o700)
        names = {kind: os.path.basename(paths[kind]) for kind in KINDS}
        for kind in KINDS:
            atomic_write(os.path.join(staging, names[kind]), files[kind], MODES[kind])
        manifest = {"files": names, "image": image, "kept": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        atomic_write(os.path.join(staging, MANIFEST), (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode(), 0o600)
        replace_dir(staging, os.path.join(store, name))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def replace_dir(source, target):
    """Move directory `source` to `target`, taking the place of any directory there."""
    old = None
    if os.path.lexists(target):
        old = tempfile.mkdtemp(dir=os.path.dirname(target), prefix=f".{os.path.basename(target)}.old-")
        os.rmdir(old)
        os.rename(target, old)
    os.rename(source, target)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def drop(store, name):
    folder = os.path.join(store, name)
    if os.path.lexists(folder):
        shutil.rmtree(folder)
        return True
    return False


def public(copy):
    if copy is None:
        return None
    return {"image_ref": copy["image"].get("image_ref", ""), "image_id": copy["image"].get("image_id", ""),
            "kept": copy["kept"]}


def args_of(copy):
    if copy is None:
        return []
    try:
        value = json.loads(copy["files"]["args"].decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


class Docker:
    def __init__(self, module):
        self.module = module
        self.cli = module.params["docker"]

    def run(self, *argv):
        rc, out, err = self.module.run_command([self.cli, *argv])
        return rc, out.strip(), err.strip()

    def image_id(self, ref):
        """The ID `ref` names on this node, '' when it names none."""
        if not ref:
            return ""
        rc, out, dummy = self.run("image", "inspect", "--format", "{{.Id}}", ref)
        return out.splitlines()[0] if rc == 0 and out else ""

    def running(self, container):
        """(image ID, image reference) of the running container, or a failure."""
        rc, out, err = self.run("inspect", "--type", "container", "--format", "{{.State.Running}}|{{.Image}}|{{.Config.Image}}",
                                container)
        parts = out.split("|") if rc == 0 else []
        if len(parts) != 3 or parts[0] != "true":
            self.module.fail_json(msg=f"container {container} is not running ({err or out or 'no answer'}): the "
                                      "configuration this rank runs cannot be recorded")
        return parts[1], parts[2]


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "default": "read", "choices": ["read", "pending", "commit", "restore"]},
            "files": {"type": "dict", "required": True},
            "store": {"type": "path", "required": True},
            "container": {"type": "str", "default": ""},
            "image_ref": {"type": "str", "default": ""},
            "docker": {"type": "path", "default": "/usr/bin/docker"},
        },
        supports_check_mode=True,
    )
    p = module.params
    paths = installed_paths(module)
    store, state, docker = p["store"], p["state"], Docker(module)
    last_good, pending = load(store, LAST_GOOD), load(store, PENDING)
    result = {"changed": False, "differs": False, "differences": [], "unit_changed": False, "retagged": False}

    if state == "read":
        if last_good is not None:
            found = differences(installed(paths), docker.image_id(p["image_ref"]), last_good)
            result.update(differs=bool(found), differences=found)

    elif state == "pending":
        if not p["container"]:
            module.fail_json(msg="state=pending needs the container")
        image_id, image_ref = docker.running(p["container"])
        files = installed(paths)
        if any(content is None for content in files.values()):
            module.fail_json(msg="the installed configuration is incomplete: " + ", ".join(
                paths[k] for k in KINDS if files[k] is None))
        if not differences(files, image_id, last_good):
            # What runs is the last good configuration: nothing waits for verify.
            result["changed"] = pending is not None
            if result["changed"] and not module.check_mode:
                drop(store, PENDING)
            pending = None
        elif differences(files, image_id, pending):
            result["changed"] = True
            if not module.check_mode:
                save(store, PENDING, paths, files, {"image_ref": image_ref, "image_id": image_id})
                pending = load(store, PENDING)
            else:
                pending = {"files": files, "image": {"image_ref": image_ref, "image_id": image_id}, "kept": ""}

    elif state == "commit":
        if pending is not None:
            result["changed"] = True
            if not module.check_mode:
                replace_dir(os.path.join(store, PENDING), os.path.join(store, LAST_GOOD))
            last_good, pending = pending, None

    elif state == "restore":
        if last_good is None:
            module.fail_json(msg=f"no last good configuration in {os.path.join(store, LAST_GOOD)} to restore")
        now = installed(paths)
        changed = [k for k in KINDS if now[k] != last_good["files"][k]]
        ref, kept_id = last_good["image"].get("image_ref", ""), last_good["image"].get("image_id", "")
        retag = bool(ref and kept_id) and docker.image_id(ref) != kept_id
        if retag:
            if not docker.image_id(kept_id):
                module.fail_json(msg=f"the last good image {ref} ({kept_id}) is no longer on this node (removed since it "
                                     "was kept), so the last good configuration cannot run here")
            if "@" in ref:
                module.fail_json(msg=f"{ref} names {docker.image_id(ref)} here, not the kept {kept_id}")
        if not module.check_mode:
            for kind in changed:
                atomic_write(paths[kind], last_good["files"][kind], MODES[kind])
            if retag:
                rc, out, err = docker.run("tag", kept_id, ref)
                if rc != 0:
                    module.fail_json(msg=f"docker tag {kept_id} {ref} failed: {err or out}")
            drop(store, PENDING)
        result.update(changed=bool(changed) or retag or pending is not None, unit_changed="unit" in changed,
                      retagged=retag, differences=[LABELS[k] for k in changed] + (["image"] if retag else []))
        pending = None

    result.update(last_good=public(last_good), pending=public(pending), last_good_args=args_of(last_good))
    module.exit_json(**result)


if __name__ == "__main__":
    main()

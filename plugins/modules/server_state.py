#!/usr/bin/python
"""Pull a TP rank's image and read, in one pass, everything the server role owns on the node."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: server_state
short_description: Pull a TP rank's image and read the rank's installed state in one pass
description:
  - For the server role's internal use; options and return values may change with the role.
  - Pulls O(image_ref) (not in check mode) and reads what the role decides from on this node - the image's ID
    and platform, the checkpoint's C(config.json), the installed unit, env file and server-args.json (SHA-1,
    mode, owner) and their directory, the unit's state, RDMA devices, the TLS proxy's configuration, nginx,
    whether the running configuration is kept (pending or last good) and whether the group supervisor holds a
    pause or a give-up that a serving group clears - so that a run with nothing to do reads the node once.
  - Never returns a file's content, except C(config.json) (the model's public shape).
version_added: "1.4.0"
author: LLM serving maintainers (@dgx-spark)
options:
  image_ref:
    description: The image reference the unit runs.
    type: str
    required: true
  pull:
    description: Pull O(image_ref) first (never in check mode).
    type: bool
    default: true
  model_config:
    description: The checkpoint's C(config.json).
    type: path
    required: true
  files:
    description: The installed configuration's files, as C(unit), C(env) and C(args) paths.
    type: dict
    required: true
  key_file:
    description:
      - The rank's API key file. Read for its checksum, mode and owner only; it is not kept with a configuration
        (a rollback restores the unit, the env file and server-args.json, never an older key).
    type: path
    default: ""
  config_dir:
    description: The directory that holds the env file and server-args.json.
    type: path
    required: true
  unit:
    description: The rank's systemd unit.
    type: str
    required: true
  nginx_conf:
    description: The TLS proxy's configuration file.
    type: path
    required: true
  store:
    description: Directory that holds the kept configurations (C(pending/), C(last-good/)).
    type: path
    required: true
  container:
    description: The rank's container.
    type: str
    required: true
  supervisor_config:
    description: The group supervisor's settings (absent where it is not installed).
    type: path
    default: ""
  supervisor_state_dir:
    description: The group supervisor's state directory (its pause and give-up markers).
    type: path
    default: ""
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - dgx_spark.llm_serving.docker_cli
attributes:
  check_mode:
    support: full
    details: Pulls nothing; reads the same.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Pull the image and read the rank
  dgx_spark.llm_serving.server_state:
    image_ref: lmsysorg/sglang:glm-5.3-flash-arm64
    model_config: /opt/models/glm53/config.json
    files: {unit: /etc/systemd/system/spark-llm.service, env: /etc/spark-llm/spark-llm.env, args: /etc/spark-llm/server-args.json}
    key_file: /etc/spark-llm/spark-llm.key
    config_dir: /etc/spark-llm
    unit: spark-llm.service
    nginx_conf: /etc/nginx/conf.d/spark-llm.conf
    store: /etc/spark-llm
    container: spark-llm
"""

RETURN = r"""
image:
  description: C(rc), C(stderr) of docker image inspect, and the image's C(Id), C(Os), C(Architecture).
  returned: always
  type: dict
model_config:
  description: C(config.json) as the slurp module returns it (C(content) base64), or C(failed) and C(msg).
  returned: always
  type: dict
files:
  description:
    - Per C(unit), C(env), C(args), C(dir) and, with O(key_file), C(key) - C(exists), C(sha1) (files), C(mode),
      C(owner), C(group).
  returned: always
  type: dict
unit:
  description: The unit's C(ActiveState), C(UnitFileState) and C(LoadState).
  returned: always
  type: dict
rdma:
  description: /dev/infiniband is a directory (its devices go into the container).
  returned: always
  type: bool
proxy:
  description: The TLS proxy's configuration is installed.
  returned: always
  type: bool
nginx:
  description: nginx is installed.
  returned: always
  type: bool
recorded:
  description: The installed files and the running container's image are kept as the last good or the pending configuration.
  returned: always
  type: bool
pending:
  description:
    - A pending configuration is kept (it passed readiness and waits for verify); the commit after verify
      has nothing to do on a rank without one, unless readiness keeps one later in the run.
  returned: always
  type: bool
supervisor_held:
  description: The supervisor is installed and holds a pause or a give-up marker (a resume would clear it).
  returned: always
  type: bool
"""

import base64
import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import docker_images
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_reads import exists_facts as describe
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_reads import read_bytes, unit_properties
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.server_store import KINDS, installed_paths, load


def kept(store, name):
    """The kept copy `name`: ({kind: bytes}, image ID), or None."""
    copy = load(store, name)
    return None if copy is None else (copy["files"], copy["image"].get("image_id") or "")


def main():
    module = AnsibleModule(
        argument_spec={
            "image_ref": {"type": "str", "required": True},
            "pull": {"type": "bool", "default": True},
            "model_config": {"type": "path", "required": True},
            "files": {"type": "dict", "required": True},
            "key_file": {"type": "path", "default": ""},
            "config_dir": {"type": "path", "required": True},
            "unit": {"type": "str", "required": True},
            "nginx_conf": {"type": "path", "required": True},
            "store": {"type": "path", "required": True},
            "container": {"type": "str", "required": True},
            "supervisor_config": {"type": "path", "default": ""},
            "supervisor_state_dir": {"type": "path", "default": ""},
            "docker": {"type": "path", "default": "/usr/bin/docker"},
        },
        supports_check_mode=True,
    )
    p = module.params
    paths = installed_paths(module)
    result = {"changed": False}

    # The pull first: a moved tag is a change the run applies, like docker's own pull reports it.
    if p["pull"] and not module.check_mode:
        result["changed"], result["pull_stdout"] = docker_images.pull(module, p["docker"], p["image_ref"])

    result["image"] = docker_images.inspect(module, p["docker"], p["image_ref"])

    content = read_bytes(p["model_config"])
    result["model_config"] = (
        {"content": base64.b64encode(content).decode(), "encoding": "base64", "source": p["model_config"]}
        if content is not None else {"failed": True, "msg": f"file not found: {p['model_config']}"})

    result["files"] = {kind: describe(paths[kind]) for kind in KINDS}
    result["files"]["dir"] = describe(p["config_dir"], with_sum=False)
    if p["key_file"]:
        result["files"]["key"] = describe(p["key_file"])
    result["unit"] = unit_properties(module, [p["unit"]], ("ActiveState", "UnitFileState", "LoadState"))[p["unit"]]
    ib = "/dev/infiniband"
    result["rdma"] = os.path.isdir(ib) and not os.path.islink(ib)
    result["proxy"] = os.path.exists(p["nginx_conf"])
    result["nginx"] = shutil.which("nginx") is not None

    # What the readiness path would mark pending: nothing, when what runs is kept already.
    recorded = False
    installed = {kind: read_bytes(paths[kind]) for kind in KINDS}
    if all(v is not None for v in installed.values()):
        rc, out, dummy = module.run_command([p["docker"], "inspect", "--type", "container", "--format",
                                             "{{.State.Running}}|{{.Image}}", p["container"]])
        parts = out.strip().split("|") if rc == 0 else []
        running_id = parts[1] if len(parts) == 2 and parts[0] == "true" else None
        if running_id:
            same = {name: (copy is not None and copy[0] == installed and copy[1] == running_id, copy is not None)
                    for name in ("last-good", "pending") for copy in [kept(p["store"], name)]}
            # state=pending changes nothing when what runs is the last good one and nothing is
            # pending, or when it differs from the last good one and is pending already.
            recorded = (same["last-good"][0] and not same["pending"][1]) or (
                not same["last-good"][0] and same["pending"][0])
    result["recorded"] = recorded
    result["pending"] = os.path.isdir(os.path.join(p["store"], "pending"))

    state_dir = p["supervisor_state_dir"]
    result["supervisor_held"] = bool(
        p["supervisor_config"] and state_dir and os.path.exists(p["supervisor_config"])
        and any(os.path.exists(os.path.join(state_dir, marker)) for marker in ("paused", "gave-up.json")))
    module.exit_json(**result)


if __name__ == "__main__":
    main()

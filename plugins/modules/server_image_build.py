#!/usr/bin/python
"""Build a derived engine image on the head and give it to the workers over the fabric."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: server_image_build
short_description: Build a TP group's derived engine image once and give every rank the same image ID
description:
  - For the server role's internal use; options and return values may change with the role.
  - A derived image is the site's engine image (O(base_ref)) with an operator's build context on top (a kernel
    fix, for instance). It is built once, on the head, and moved to the workers over the fabric (C(docker save)
    piped into C(docker load) over SSH), so no registry is needed and every rank runs the same image ID.
  - C(state=plan) pulls the base (never in check mode), reads its ID and works out the build's identity from it
    and the pinned files, and the derived image's tag; it reports whether that image is on this node already.
  - C(state=build) checks the context copied to this node against the pins once more and builds it.
  - C(state=distribute) gives each peer that lacks the image (or holds another under its tag) this node's copy,
    and checks the peer's image ID afterwards.
version_added: "1.8.0"
author: LLM serving maintainers (@dgx-spark)
options:
  state:
    description: What to do.
    type: str
    choices: [plan, build, distribute]
    default: plan
  base_ref:
    description: The engine image the Dockerfile builds on (its build argument C(SPARK_BASE_IMAGE)).
    type: str
    default: ""
  engine:
    description: The engine, part of the derived image's name.
    type: str
    default: sglang
  sha256:
    description: Every file of the build context, by its path relative to the context, and its sha256.
    type: dict
    default: {}
  context:
    description: The build context's copy on this node (O(state=build)).
    type: path
    default: ""
  tag:
    description: The derived image's tag (O(state=build), O(state=distribute)).
    type: str
    default: ""
  build_id:
    description: The build's identity (O(state=build)), recorded as the image's C(org.spark-llm.build) label.
    type: str
    default: ""
  peers:
    description: The workers by name, each with its fabric address, for O(state=distribute).
    type: dict
    default: {}
  ssh_key:
    description: The key this node reaches its peers with over the fabric.
    type: path
    default: /root/.ssh/id_spark_fabric
  ssh_known_hosts:
    description: The peers' pinned host keys.
    type: path
    default: /root/.ssh/known_hosts
  ssh_user:
    description: The user on the peers.
    type: str
    default: root
  timeout:
    description: Seconds one peer's transfer may take (an engine image is tens of GB).
    type: int
    default: 3600
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - dgx_spark.llm_serving.docker_cli
attributes:
  check_mode:
    support: full
    details: O(state=plan) pulls nothing and O(state=distribute) sends nothing; both say what a run would do.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Work out the derived image on the head
  dgx_spark.llm_serving.server_image_build:
    state: plan
    base_ref: lmsysorg/sglang:glm-5.3-flash-arm64
    engine: sglang
    sha256:
      Dockerfile: 0b1f6f0e3d1a4c5b8e7d9a2c4f6e8b0a1c3e5f7a9b2d4f6e8a0c2e4f6a8b0c2d
      tile.patch: 6a8b0c2d0b1f6f0e3d1a4c5b8e7d9a2c4f6e8b0a1c3e5f7a9b2d4f6e8a0c2e4f
  register: plan

- name: Give the workers the head's copy over the fabric
  dgx_spark.llm_serving.server_image_build:
    state: distribute
    tag: "{{ plan.tag }}"
    peers: {spark-1: 192.168.100.11}
"""

RETURN = r"""
base:
  description: O(state=plan) - the base image's C(Id), C(Os), C(Architecture), and C(rc), C(stderr) of its inspection.
  returned: when state is plan
  type: dict
build_id:
  description: O(state=plan) - the build's identity (the base's ID and the pinned files).
  returned: when state is plan
  type: str
tag:
  description: The derived image's tag; empty in check mode when the base is not pulled yet.
  returned: always
  type: str
present:
  description: O(state=plan) - whether this node holds the derived image already.
  returned: when state is plan
  type: bool
image_id:
  description: The derived image's ID on this node (empty when it is not there).
  returned: always
  type: str
sent:
  description: O(state=distribute) - the peers that got this node's copy (in check mode - would get).
  returned: when state is distribute
  type: list
  elements: str
"""

import shlex

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import docker_images
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.image_build import (
    BASE_ARG,
    LABEL,
    build_id,
    context_files,
    derived_tag,
    pin_problems,
)
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_commands import pipe


def image_id(module, docker, ref):
    """The ID of a local image, '' when it is not there."""
    return docker_images.inspect(module, docker, ref)["Id"]


def plan(module, p, result):
    pulled = False
    if not module.check_mode:
        pulled = docker_images.pull(module, p["docker"], p["base_ref"], " on the head")[0]
    result["base"] = docker_images.inspect(module, p["docker"], p["base_ref"])
    base_id = result["base"]["Id"]
    result["changed"] = pulled
    if not base_id:
        # Check mode on a head that has not pulled the base: nothing to name yet.
        result.update(build_id="", tag="", present=False, image_id="")
        return
    identity = build_id(base_id, p["sha256"])
    tag = derived_tag(p["engine"], identity)
    derived = image_id(module, p["docker"], tag)
    result.update(build_id=identity, tag=tag, present=bool(derived), image_id=derived)


def build(module, p, result):
    result["changed"] = True
    if module.check_mode:
        # The copy of the context is not made in check mode either: the plan checked the controller's.
        return
    files, odd = context_files(p["context"])
    problems = pin_problems(files, odd, p["sha256"])
    if problems:
        module.fail_json(msg=f"the build context copied to {p['context']} is not the pinned one: {'; '.join(problems)}")
    rc, out, err = module.run_command([
        p["docker"], "build", "--build-arg", f"{BASE_ARG}={p['base_ref']}", "--label", f"{LABEL}={p['build_id']}",
        "--tag", p["tag"], p["context"]])
    if rc != 0:
        tail = "\n".join((err.strip() or out.strip()).splitlines()[-15:])
        module.fail_json(msg=f"docker build of {p['tag']} on top of {p['base_ref']} failed:\n{tail}", rc=rc)
    result["image_id"] = image_id(module, p["docker"], p["tag"])


def ssh(p, address, command):
    return ["ssh", "-i", p["ssh_key"], "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={p['ssh_known_hosts']}", "-o", "ConnectTimeout=10",
            f"{p['ssh_user']}@{address}", command]


def peer_image(module, p, address):
    command = shlex.join([p["docker"], "image", "inspect", "--format", "{{.Id}}", p["tag"]])
    rc, out, err = module.run_command(ssh(p, address, command))
    if rc == 255:
        module.fail_json(msg=f"cannot reach {address} over SSH from the head to give it {p['tag']}: {err.strip()}")
    return out.strip() if rc == 0 else ""


def send(module, p, name, address):
    """docker save here, piped into docker load on the peer: the image crosses the fabric once, no registry."""
    saved, loaded, said = pipe([p["docker"], "save", p["tag"]], ssh(p, address, shlex.join([p["docker"], "load"])),
                               p["timeout"])
    if saved != 0 or loaded != 0:
        module.fail_json(msg=f"giving {p['tag']} to {name} ({address}) failed: {said}")


def distribute(module, p, result):
    own = image_id(module, p["docker"], p["tag"])
    if not own and module.check_mode:
        # Not built yet (check mode builds nothing): every worker would get it.
        result.update(sent=sorted(p["peers"]), changed=bool(p["peers"]))
        return
    if not own:
        module.fail_json(msg=f"{p['tag']} is not on the head: nothing to give the workers")
    result.update(image_id=own, sent=[])
    for name, address in sorted(p["peers"].items()):
        if peer_image(module, p, address) == own:
            continue
        result["sent"].append(name)
        if module.check_mode:
            continue
        send(module, p, name, address)
        got = peer_image(module, p, address)
        if got != own:
            module.fail_json(msg=f"{name} holds {got or 'nothing'} under {p['tag']} after the load, not the head's {own}")
    result["changed"] = bool(result["sent"])


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["plan", "build", "distribute"], "default": "plan"},
            "base_ref": {"type": "str", "default": ""},
            "engine": {"type": "str", "default": "sglang"},
            "sha256": {"type": "dict", "default": {}},
            "context": {"type": "path", "default": ""},
            "tag": {"type": "str", "default": ""},
            "build_id": {"type": "str", "default": ""},
            "peers": {"type": "dict", "default": {}},
            "ssh_key": {"type": "path", "default": "/root/.ssh/id_spark_fabric"},
            "ssh_known_hosts": {"type": "path", "default": "/root/.ssh/known_hosts"},
            "ssh_user": {"type": "str", "default": "root"},
            "timeout": {"type": "int", "default": 3600},
            "docker": {"type": "path", "default": "/usr/bin/docker"},
        },
        required_if=[("state", "plan", ["base_ref"]), ("state", "build", ["base_ref", "context", "tag", "build_id"]),
                     ("state", "distribute", ["tag"])],
        supports_check_mode=True,
    )
    p = module.params
    result = {"changed": False, "tag": p["tag"], "image_id": ""}
    {"plan": plan, "build": build, "distribute": distribute}[p["state"]](module, p, result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()

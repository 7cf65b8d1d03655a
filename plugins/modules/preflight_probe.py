#!/usr/bin/python
"""Read everything preflight's check table needs from one node in one round trip."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_probe
short_description: Read a DGX Spark node's readiness evidence in one round trip
description:
  - For the preflight role's internal use (its C(probe.yml)); options and return values may change
    with the role.
  - Collects what the role's check table reads, each part in the shape of the task it replaces, so
    that the C(preflight_findings) filter reads the same evidence it always did.
  - The CPU architecture, the running kernel, its command line and the distribution, collected by the same
    fact collectors as M(ansible.builtin.setup) with C(gather_subset=min), returned as facts.
  - The GPUs, the processes holding them and each process's cgroups (C(nvidia-smi) and
    C(/proc/<pid>/cgroup)), Docker's container runtimes and the full ID of the server's container, the
    free space where the model directory will land and the bytes already in it, each a command result
    (C(rc), C(stdout), C(stderr)).
  - C(/proc/meminfo) as M(ansible.builtin.slurp) returns it, and the node's network interfaces as
    M(ansible.builtin.find) returns C(/sys/class/net).
  - Never fails because of what it finds; a tool that is missing or failing is evidence for a finding
    (a POSIX shell's exit 127 for a command that is not installed), not an error.
version_added: "1.1.0"
author: LLM serving maintainers (@dgx-spark)
options:
  model_dir:
    description:
      - The model directory. It may not exist yet; the free space is then measured on the filesystem
        of its nearest existing ancestor, where the download will land.
    type: path
    required: true
  server_container:
    description: Name of the server's container, whose full ID ties a rank's processes to the unit.
    type: str
    default: ""
  server_unit:
    description:
      - The server's systemd unit, whose state and cgroup are read first (before the GPU processes), as
        C(unit.status) with the properties C(ActiveState) and C(ControlGroup) only (the unit's other
        properties include its command line, which may carry a secret). Empty - not read.
    type: str
    default: ""
  list_netdevs:
    description: List the node's network interfaces (only needed when fabric interfaces are checked).
    type: bool
    default: false
  disk_only:
    description: Read only the disk (free space where the model directory lands, bytes already in it).
    type: bool
    default: false
  links:
    description: Interfaces whose link state is read (the fabric's).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - dgx_spark.llm_serving.read_only
seealso:
  - module: ansible.builtin.setup
    description: Collects the same architecture, kernel, command-line and distribution facts.
"""

EXAMPLES = r"""
# Inside the preflight role (tasks/probe.yml).
- name: Probe the node
  dgx_spark.llm_serving.preflight_probe:
    model_dir: /opt/models/glm53
    server_container: spark-llm
    list_netdevs: true
  register: __preflight_node
"""

RETURN = r"""
unit:
  description: The server unit's C(ActiveState) and C(ControlGroup) under C(status), empty when systemd cannot say.
  returned: when server_unit is given
  type: dict
links:
  description:
    - Each interface of O(links) that exists, C({up, carrier, operstate}) from C(/sys/class/net/<name>)
      (C(up) is the administrative state, C(carrier) null when the port is down and the kernel cannot tell).
  returned: unless O(disk_only)
  type: dict
ansible_facts:
  description: C(architecture), C(kernel), C(proc_cmdline), C(distribution) and C(distribution_version) (and the
    rest of the platform, command-line and distribution collectors' facts), as M(ansible.builtin.setup) gathers them.
  returned: unless O(disk_only)
  type: dict
gpu:
  description: C(nvidia-smi)'s GPU list, then C(--- apps) and the compute processes, then per process
    C(--- cgroup <pid>) and its cgroups (or C(--- gone <pid>) when it exited meanwhile).
  returned: unless O(disk_only)
  type: dict
  contains:
    rc: {description: The exit status (127 when nvidia-smi is not installed)., type: int}
    stdout: {description: The output., type: str}
    stderr: {description: The error output., type: str}
docker:
  description: C(docker info)'s runtimes as JSON, then C(--- container) and the server container's full ID (if any).
  returned: unless O(disk_only)
  type: dict
  contains:
    rc: {description: The exit status (127 when docker is not installed)., type: int}
    stdout: {description: The output., type: str}
    stderr: {description: The error output., type: str}
disk:
  description: C(df -B1 --output=avail,target) of the model directory's filesystem, then the bytes already in it.
  returned: always
  type: dict
  contains:
    rc: {description: The exit status., type: int}
    stdout: {description: The output., type: str}
    stderr: {description: The error output., type: str}
checkpoints:
  description:
    - The checkpoints beside the model directory, each C(<name>.record.json) in its parent (a record the checkpoint
      role wrote). C(here) is the model directory's own (empty when it has none), C(beside) the others.
    - "Each has C(dir), C(repo_id), C(revision), C(bytes) and C(verified), whether its verified-stamp exists."
  returned: always
  type: dict
meminfo:
  description: C(/proc/meminfo), as M(ansible.builtin.slurp) returns it.
  returned: unless O(disk_only)
  type: dict
  contains:
    content: {description: "The file, base64-encoded.", type: str}
    encoding: {description: Always C(base64)., type: str}
    source: {description: Always C(/proc/meminfo)., type: str}
netdevs:
  description: The entries of C(/sys/class/net) as M(ansible.builtin.find) lists them (empty unless O(list_netdevs)).
  returned: unless O(disk_only)
  type: dict
  contains:
    files: {description: "One C({path}) per interface.", type: list, elements: dict}
    matched: {description: How many., type: int}
"""

import base64
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.facts.system.cmdline import CmdLineFactCollector
from ansible.module_utils.facts.system.distribution import DistributionFactCollector
from ansible.module_utils.facts.system.platform import PlatformFactCollector
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.checkpoint_common import (
    RECORD_SUFFIX,
    checkpoint_paths,
    load_json,
)

# The same shell scripts the role ran as separate tasks. Tools run through sh:
# one that is not installed answers exit 127 (POSIX "not found").
GPU = r"""
nvidia-smi --query-gpu=index,name,compute_cap,driver_version --format=csv,noheader || exit
apps=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader)
echo '--- apps'
printf '%s\n' "$apps"
for pid in $(printf '%s\n' "$apps" | cut -d, -f1 | tr -d ' ' | grep -E '^[0-9]+$' | sort -u); do
  # The process may have exited since nvidia-smi listed it.
  if cgroup=$(cat "/proc/$pid/cgroup" 2>/dev/null); then
    echo "--- cgroup $pid"
    printf '%s\n' "$cgroup"
  else
    echo "--- gone $pid"
  fi
done
"""

# Docker's Go templates, passed as arguments.
DOCKER = r"""
docker info --format "$1" || exit
echo '--- container'
docker inspect --type container --format "$2" "$3" 2>/dev/null || :
"""

DISK = r"""
set -eu
d="$1"
while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done
df -B1 --output=avail,target -- "$d"
if [ -d "$1" ]; then
  # The pipe below hides find's exit status; this pass lets set -e see an unreadable tree.
  find "$1" -type f -printf '%s\n' > /dev/null
  find "$1" -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%d\n", s }'
else
  echo 0
fi
"""

NETDEVS = "/sys/class/net"


def _sh(module, name, script, *args):
    rc, out, err = module.run_command(["/bin/sh", "-c", script, name, *args])
    # As ansible.builtin.command returns them.
    return {"rc": rc, "stdout": out.rstrip("\r\n"), "stderr": err.rstrip("\r\n")}


def _slurp(path):
    with open(path, "rb") as f:
        return {"content": base64.b64encode(f.read()).decode("ascii"), "encoding": "base64", "source": path}


def _unit(module, name):
    """ActiveState and ControlGroup of a unit, in the shape of ansible.builtin.systemd_service's status."""
    rc, out, _err = module.run_command(["systemctl", "show", "--property=ActiveState,ControlGroup", "--", name])
    if rc != 0:
        return {"status": {}}
    return {"status": dict(line.split("=", 1) for line in out.splitlines() if "=" in line)}


def _checkpoints(model_dir):
    """The records in the model directory's parent: its own (here) and the other builds' (beside)."""
    model_dir = model_dir.rstrip("/")
    parent = os.path.dirname(model_dir)
    here, beside = {}, []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        names = []
    for name in names:
        if not name.endswith(RECORD_SUFFIX) or name.startswith("."):
            continue
        paths = checkpoint_paths(os.path.join(parent, name[: -len(RECORD_SUFFIX)]))
        record = load_json(paths["record"])
        if not isinstance(record, dict):
            continue
        found = {"dir": paths["model_dir"], "repo_id": str(record.get("repo_id") or ""),
                 "revision": str(record.get("revision") or ""),
                 "bytes": record.get("total_bytes") if isinstance(record.get("total_bytes"), int) else 0,
                 "verified": os.path.exists(paths["stamp"])}
        if paths["model_dir"] == model_dir:
            here = found
        else:
            beside.append(found)
    return {"here": here, "beside": beside}


def _netdevs():
    files = [{"path": os.path.join(NETDEVS, name)} for name in sorted(os.listdir(NETDEVS))]
    return {"files": files, "matched": len(files), "examined": len(files)}


IFF_UP = 0x1


def _links(names):
    """Administrative state, carrier and operstate of each named interface that exists."""
    out = {}
    for name in names:
        base = os.path.join(NETDEVS, name)
        if not name or "/" in name or not os.path.isdir(base):
            continue
        state = {}
        for item in ("flags", "carrier", "operstate"):
            try:
                with open(os.path.join(base, item)) as f:
                    state[item] = f.read().strip()
            except OSError:
                # carrier cannot be read on a port that is down (EINVAL).
                state[item] = None
        out[name] = {
            "up": bool(int(state["flags"] or "0", 16) & IFF_UP),
            "carrier": None if state["carrier"] is None else state["carrier"] == "1",
            "operstate": state["operstate"] or "unknown",
        }
    return out


def main():
    module = AnsibleModule(
        argument_spec={
            "model_dir": {"type": "path", "required": True},
            "server_container": {"type": "str", "default": ""},
            "server_unit": {"type": "str", "default": ""},
            "list_netdevs": {"type": "bool", "default": False},
            "links": {"type": "list", "elements": "str", "default": []},
            "disk_only": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    if p["disk_only"]:
        module.exit_json(changed=False, disk=_sh(module, "preflight-disk", DISK, p["model_dir"]),
                         checkpoints=_checkpoints(p["model_dir"]))
    # The unit before the GPU processes: a rank found holding a GPU belongs to a unit seen active.
    unit = _unit(module, p["server_unit"]) if p["server_unit"] else {"status": {}}
    facts = PlatformFactCollector().collect(module=module)
    facts.update(CmdLineFactCollector().collect(module=module, collected_facts=facts))
    facts.update(DistributionFactCollector().collect(module=module, collected_facts=facts))
    module.exit_json(
        changed=False,
        ansible_facts=facts,
        unit=unit,
        gpu=_sh(module, "preflight-gpu", GPU),
        docker=_sh(module, "preflight-docker", DOCKER, "{{json .Runtimes}}", "{{.Id}}", p["server_container"]),
        meminfo=_slurp("/proc/meminfo"),
        disk=_sh(module, "preflight-disk", DISK, p["model_dir"]),
        checkpoints=_checkpoints(p["model_dir"]),
        netdevs=_netdevs() if p["list_netdevs"] else {"files": [], "matched": 0, "examined": 0},
        links=_links(p["links"]),
    )


if __name__ == "__main__":
    main()

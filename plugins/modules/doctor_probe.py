#!/usr/bin/python
"""Read everything the doctor diagnoses on a node in one round trip, changing nothing."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: doctor_probe
short_description: Read a rank's unit, journal, files, container, GPU, host and fabric state in one pass
description:
  - For the doctor role's internal use (its C(probe.yml)); options and return values may change with the role.
  - Reads, in one module call instead of one task per read, the unit's state (C(systemctl show)), its journal by
    invocation with the kernel's OOM kills, docker's events and state of the container and the journal's boots, the
    unit file (C(systemctl cat)), the env file, the recorded launch arguments, nvidia-smi, memory, disk, the
    checkpoint's files and its download record, the fabric interface, the route to each peer's fabric address, the
    running container's image and, on the head, the group supervisor's state files.
  - Each read's result has the shape the role's probe tasks registered (command results with C(rc), C(stdout),
    C(stderr); file contents base64-encoded as slurp returns them, absent when the file cannot be read), so the
    analysis on the controller reads them unchanged. A read that fails is evidence, not an error.
  - The reads run concurrently (the slowest, docker's events, bounds the call).
version_added: "1.4.0"
author: LLM serving maintainers (@dgx-spark)
options:
  unit:
    description: The rank's unit.
    type: str
    required: true
  journal_lines:
    description: Journal lines of the unit to read (all its invocations).
    type: int
    required: true
  container:
    description: The rank's container name.
    type: str
    required: true
  env_file:
    description: The rank's env file.
    type: path
    required: true
  args_file:
    description: The rank's recorded launch arguments (server-args.json).
    type: path
    required: true
  model_dir:
    description: The checkpoint directory.
    type: path
    required: true
  fabric_interface:
    description: The fabric interface.
    type: str
    required: true
  peers:
    description: The fabric addresses of the peer ranks, each read with C(ip route get).
    type: list
    elements: str
    default: []
  supervisor_dir:
    description: The group supervisor's state directory, read on the head only (empty elsewhere).
    type: str
    default: ""
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - dgx_spark.llm_serving.read_only
"""

EXAMPLES = r"""
- name: Read the rank
  dgx_spark.llm_serving.doctor_probe:
    unit: spark-llm.service
    journal_lines: 2000
    container: spark-llm
    env_file: /etc/spark-llm/spark-llm.env
    args_file: /etc/spark-llm/server-args.json
    model_dir: /opt/models/glm53
    fabric_interface: enp1s0f1np1
    peers: [192.168.100.11]
  register: __doctor_probe
  no_log: true
"""

RETURN = r"""
unit:
  description: C(status), the unit's properties as C(systemctl show) lists them.
  returned: always
  type: dict
journal:
  description: The unit's journal, the kernel's OOM lines, docker's events and container state, the boots and the
    clock, in C(--- name) sections of C(stdout).
  returned: always
  type: dict
unit_file:
  description: C(systemctl cat) of the unit.
  returned: always
  type: dict
env:
  description: The env file (C(content), base64), no C(content) when it cannot be read.
  returned: always
  type: dict
args:
  description: server-args.json, as RV(env).
  returned: always
  type: dict
record:
  description: The checkpoint's download record, as RV(env).
  returned: always
  type: dict
smi:
  description: nvidia-smi's GPU and compute apps.
  returned: always
  type: dict
host:
  description: Memory, disk, the checkpoint's files and the clock, in C(--- name) sections of C(stdout).
  returned: always
  type: dict
link:
  description: C(ip -j -d link show) of the fabric interface.
  returned: always
  type: dict
routes:
  description: C(results), one C(ip -j route get) per peer (its C(cmd) ends with the address).
  returned: always
  type: dict
image:
  description: The running container's image reference and ID.
  returned: always
  type: dict
supervisor:
  description: C(results), for state.json and gave-up.json (C(item)), each with C(content) when present.
  returned: always
  type: dict
"""

import base64
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_commands import run_concurrently
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_reads import parse_show

# One round trip for what tells how the rank's starts went: the unit's journal with each line's invocation ID
# (the filter splits the current start from the earlier ones), the kernel's OOM kills, the docker daemon's events
# of the container (an `oom` event tells an OOM kill from a kill -9: both exit 137, and the unit's
# `docker run --rm` leaves no container to inspect), its state when it is still there, and the boots the
# journal keeps.
LOGS = r"""
now=$(date +%s)
echo '--- journal'
journalctl --no-pager -o json --output-fields=MESSAGE,_SYSTEMD_INVOCATION_ID,INVOCATION_ID -n "$1" -u "$2"
echo '--- kernel'
journalctl --no-pager -k -o json --output-fields=MESSAGE -n 200 --grep '(?i)out of memory|oom-kill|killed process'
echo '--- events'
timeout 20 docker events --since "$((now - 604800))" --until "$now" --filter "container=$3" --format '{{json .}}'
echo '--- container'
docker container inspect --format '{{json .State}}' "$3" 2>/dev/null
echo '--- boots'
journalctl --no-pager --list-boots -q 2>/dev/null
echo '--- now'
echo "$now"
"""

SMI = r"""
set -o pipefail
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.used,memory.total --format=csv,noheader &&
echo '--- compute apps' &&
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
"""

# $1 the model directory.
HOST = r"""
set -o pipefail
echo '--- meminfo'; grep -E '^(MemTotal|MemAvailable|SwapTotal|SwapFree):' /proc/meminfo
echo '--- df'; df -P -B1 / "$(dirname "$1")" 2>&1
echo '--- checkpoint'
for f in "$1/processor_config.json" "$1/config.json" "$1.verified" "$1.record.json"; do
  if [ -e "$f" ]; then echo "present $f"; else echo "missing $f"; fi
done
echo '--- now'; date +%s
"""

# docker ps + image inspect rather than container inspect: the ID is the one that must match across ranks.
IMAGE = r"""
set -o pipefail
ref=$(docker ps --filter "name=^$1\$" --format '{{.Image}}' | head -n 1)
test -n "$ref" && echo "$ref $(docker image inspect --format '{{.Id}}' "$ref")"
"""


def script(text, *args, name="spark-llm-doctor-probe"):
    return ["/bin/bash", "-c", text, name, *args]


def slurp(path):
    """A file as slurp returns it (base64 content), or no content when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return {"content": base64.b64encode(f.read()).decode("ascii"), "source": path}
    except OSError as exc:
        return {"msg": f"could not read {path}: {exc.strerror}", "source": path}


def main():
    module = AnsibleModule(argument_spec={
        "unit": {"type": "str", "required": True},
        "journal_lines": {"type": "int", "required": True},
        "container": {"type": "str", "required": True},
        "env_file": {"type": "path", "required": True},
        "args_file": {"type": "path", "required": True},
        "model_dir": {"type": "path", "required": True},
        "fabric_interface": {"type": "str", "required": True},
        "peers": {"type": "list", "elements": "str", "default": []},
        "supervisor_dir": {"type": "str", "default": ""},
    }, supports_check_mode=True)
    p = module.params
    unit, container, model_dir = p["unit"], p["container"], p["model_dir"]
    commands = {
        # Every property, as the systemd module registered them: the filter picks the ones it reads
        # (filter_plugins/doctor.py, UNIT_PROPERTIES), so the list lives there alone.
        "show": ["systemctl", "show", "--no-pager", "--", unit],
        "journal": script(LOGS, str(p["journal_lines"]), unit, container, name="spark-llm-doctor-logs"),
        "unit_file": ["systemctl", "cat", "--no-pager", "--", unit],
        "smi": script(SMI),
        "host": script(HOST, model_dir),
        "link": ["ip", "-j", "-d", "link", "show", "dev", p["fabric_interface"]],
        "image": script(IMAGE, container),
    }
    commands.update({f"route {i}": ["ip", "-j", "route", "get", peer] for i, peer in enumerate(p["peers"])})
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        futures = {name: pool.submit(run_concurrently, argv) for name, argv in commands.items()}
        done = {name: future.result() for name, future in futures.items()}
    supervisor = [{"item": name, **slurp(f"{p['supervisor_dir']}/{name}")} for name in ("state.json", "gave-up.json")
                  ] if p["supervisor_dir"] else []
    module.exit_json(
        changed=False,
        unit={"status": parse_show(done.pop("show")["stdout"])},
        journal=done.pop("journal"),
        unit_file=done.pop("unit_file"),
        env=slurp(p["env_file"]),
        args=slurp(p["args_file"]),
        record=slurp(f"{model_dir}.record.json"),
        smi=done.pop("smi"),
        host=done.pop("host"),
        link=done.pop("link"),
        routes={"results": [done[f"route {i}"] for i in range(len(p["peers"]))]},
        image=done.pop("image"),
        supervisor={"results": supervisor},
    )


if __name__ == "__main__":
    main()

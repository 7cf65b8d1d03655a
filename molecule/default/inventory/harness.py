#!/usr/bin/env python3
"""Ansible script inventory of the harness instance named by SPARK_SIM_INSTANCE.

Empty until `create` has brought the nodes up.
"""

import json
import os
import sys
from pathlib import Path

state = Path(os.environ.get("SPARK_SIM_STATE", "/run/spark-sim"))
instance = os.environ.get("SPARK_SIM_INSTANCE", "molecule")
source = state / instance / "inventory" / "hosts.json"


def flatten(name, group, out, hostvars):
    entry = out.setdefault(name, {"hosts": [], "children": [], "vars": {}})
    entry["vars"].update(group.get("vars", {}))
    for host, hv in (group.get("hosts") or {}).items():
        entry["hosts"].append(host)
        hostvars.setdefault(host, {}).update(hv or {})
    for child, sub in (group.get("children") or {}).items():
        entry["children"].append(child)
        flatten(child, sub, out, hostvars)


def main():
    if "--host" in sys.argv:
        print("{}")
        return
    out, hostvars = {}, {}
    if source.exists():
        for name, group in json.loads(source.read_text()).items():
            flatten(name, group, out, hostvars)
    out["_meta"] = {"hostvars": hostvars}
    print(json.dumps(out))


main()

"""The server filter and the input its plan is built from, for the unit tests of the plan.

Shared by the tests of the flag model and of the rejoin check, so that neither
test module imports the other.
"""

from __future__ import annotations

from tests.lib.roles import filter_plugin, flag_model, flag_models, role_defaults, role_vars

FILTER = filter_plugin("server")
MODEL = flag_model()
VARS = role_vars("server")
# The plan reads the site role's values (unit name, ...) beside the server role's own.
DEFAULTS = {**role_defaults("spark"), **role_defaults("server")}


def ctx(host="spark-0", **changes):
    """The plan's input as vars/main.yml builds it, with the role defaults."""
    base = {
        "inventory_hostname": host,
        "head_group": ["spark-0"],
        "worker_group": ["spark-1"],
        "fabric_ips": {"spark-0": "192.168.100.10", "spark-1": "192.168.100.11"},
        "container_model_root": VARS["__server_container_model_root"],
        "server_fabric_interface": "enp1s0f1np1",
        "spark_engines": list(flag_models()),
    }
    for key, value in DEFAULTS.items():
        if isinstance(value, str) and "{{" in value:
            continue
        base[key] = value
    base.update(changes)
    return base

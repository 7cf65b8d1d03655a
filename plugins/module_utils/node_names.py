"""Where the collection's units and files live on a node and on the controller, from the names the site role
sets (spark_unit_name, spark_config_dir, ... as in roles/spark/vars/main.yml, or the ones before 1.3.0 in
spark_legacy_names): the legacy_names module finds and moves a node's files with it. The roles name the same
paths in their vars; tests/unit/test_legacy_names.py holds the two together. Standard library only.
"""

from __future__ import annotations

import os

UNIT_DIR = "/etc/systemd/system"
# The monitoring role's drop-ins go into these units' directories, named after spark_monitoring_name.
MONITORED_UNITS = ("prometheus.service", "prometheus-node-exporter.service")
PROMETHEUS_CONFIG_DIR = "/etc/prometheus/spark"
NFT_RULES_DIR = "/etc/nftables.d"
NGINX_CONF_DIR = "/etc/nginx/conf.d"
NAMES = ("spark_unit_name", "spark_config_dir", "spark_supervisor_unit_name", "spark_supervisor_program",
         "spark_supervisor_state_dir", "spark_firewall_unit_name", "spark_firewall_table", "spark_monitoring_name",
         "spark_api_key_name", "spark_tls_name")


def container(names: dict) -> str:
    unit = names["spark_unit_name"]
    return unit[: -len(".service")] if unit.endswith(".service") else unit


def layout(names: dict) -> dict:
    """Every path and name the roles give a node under `names`."""
    mon = names["spark_monitoring_name"]
    config_dir = names["spark_config_dir"]
    return {
        "server_unit": names["spark_unit_name"],
        "server_unit_path": os.path.join(UNIT_DIR, names["spark_unit_name"]),
        "server_dropin_dir": os.path.join(UNIT_DIR, names["spark_unit_name"] + ".d"),
        "container": container(names),
        "config_dir": config_dir,
        "env_name": container(names) + ".env",
        "key_name": container(names) + ".key",
        "nginx_conf": os.path.join(NGINX_CONF_DIR, container(names) + ".conf"),
        "supervisor_unit": names["spark_supervisor_unit_name"],
        "supervisor_unit_path": os.path.join(UNIT_DIR, names["spark_supervisor_unit_name"]),
        "supervisor_program_dir": os.path.dirname(names["spark_supervisor_program"]),
        "supervisor_state_dir": names["spark_supervisor_state_dir"],
        "firewall_unit": names["spark_firewall_unit_name"],
        "firewall_unit_path": os.path.join(UNIT_DIR, names["spark_firewall_unit_name"]),
        "firewall_table": names["spark_firewall_table"],
        "firewall_rules": os.path.join(NFT_RULES_DIR, names["spark_firewall_table"] + ".nft"),
        "collector_units": [f"{mon}-collector.timer", f"{mon}-collector.service"],
        "collector_program_dir": f"/usr/local/lib/{mon}",
        "monitoring_state_dir": f"/var/lib/{mon}",
        "journald_dropin": f"/etc/systemd/journald.conf.d/60-{mon}.conf",
        "monitoring_dropins": [os.path.join(UNIT_DIR, unit + ".d", mon + ".conf") for unit in MONITORED_UNITS],
        "prometheus_key": os.path.join(PROMETHEUS_CONFIG_DIR, names["spark_api_key_name"]),
        "prometheus_ca": os.path.join(PROMETHEUS_CONFIG_DIR, names["spark_tls_name"] + "-ca.crt"),
    }


def credentials(names: dict) -> list[str]:
    """The controller's files in the credentials directory (the generated API key and TLS files), in order."""
    tls = names["spark_tls_name"]
    files = [f"{tls}-{what}.{ext}" for what in ("ca", "server") for ext in ("crt", "key", "csr")]
    return [names["spark_api_key_name"], *files]

"""The inventory check's one validation of the ranks' role settings (plugins/filter/spark.py spark_settings_spec)."""

from __future__ import annotations

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from tests.lib.playbook import REPO
from tests.lib.roles import filter_plugin

spark = filter_plugin("spark")


def test_the_spec_covers_every_option_of_every_role_but_the_site_roles():
    expected = set()
    for path in (REPO / "roles").glob("*/meta/argument_specs.yml"):
        if path.parts[-3] == "spark":
            continue
        for entry in yaml.safe_load(path.read_text())["argument_specs"].values():
            expected.update((entry or {}).get("options") or {})
    spec = spark.spark_settings_spec(sorted(expected) + ["spark_model_dir", "ansible_host", "sglang_server_port"])
    assert set(spec) == expected
    assert "fabric_mtu" in spec and "server_flag_overrides" in spec and "monitoring_retention_time" in spec


def test_only_the_names_a_host_sets_are_judged_by_what_the_validator_reads():
    spec = spark.spark_settings_spec({"fabric_mtu": 9000, "server_api_key": "k", "inventory_hostname": "spark-0"})
    assert spec == {"fabric_mtu": {"type": "int"}, "server_api_key": {"type": "str", "no_log": True}}
    # No description or documented default: the validation task templates its arguments, and a description
    # may quote Jinja.
    assert not any("description" in option or "default" in option for option in spark._role_options().values())


def test_a_value_of_the_wrong_type_is_refused():
    values = {"fabric_mtu": "jumbo", "server_port": "30000", "supervisor_enabled": "perhaps"}
    result = ArgumentSpecValidator(spark.spark_settings_spec(values)).validate(values, validate_role_argument_spec=True)
    errors = " ".join(result.error_messages)
    assert "fabric_mtu" in errors and "jumbo" in errors
    assert "supervisor_enabled" in errors
    assert "server_port" not in errors  # a number given as a string converts, as the role's own check allowed

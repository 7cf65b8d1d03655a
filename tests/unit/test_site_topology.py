"""The topology checks of the one validation (the server role's plan, run first by every playbook).

Each refusal names the variable, the value, why and the fix; the plan reports every problem
at once. tests/integration/test_inventory_check.py runs the same checks through the playbooks.
"""

from __future__ import annotations

import base64
import json

import pytest

from tests.lib.server_plan import FILTER, MODEL, ctx

CHECKPOINT = 194347270144


def errors(host="spark-0", head=("spark-0",), workers=("spark-1",), fabric=None, managed=None, **changes):
    c = ctx(host=host, **changes)
    c["head_group"], c["worker_group"] = list(head), list(workers)
    c["fabric_ips"] = fabric or {h: f"192.168.100.{10 + i}" for i, h in enumerate([*head, *workers])}
    c["ansible_hosts"] = managed or {h: f"10.0.0.{10 + i}" for i, h in enumerate([*head, *workers])}
    c.setdefault("checkpoint_bytes", CHECKPOINT)
    return FILTER.server_plan(c, MODEL)["errors"]


def test_two_nodes_pass():
    assert errors() == []


def test_one_node_is_refused_for_memory_unless_acknowledged():
    [error] = errors(workers=())
    assert error.startswith("inventory: one node (spark-0) gives --tp-size 1: 181 GiB (spark_checkpoint_bytes)")
    assert "does not fit one GB10's 128 GB" in error and "Fix: add the second node to spark_workers" in error
    assert "spark_acknowledge_single_node: true" in error
    assert errors(workers=(), acknowledge_single_node=True) == []


@pytest.mark.parametrize("size", [3, 5, 6, 7])
def test_tp_size_must_divide_the_heads(size):
    [error] = errors(workers=[f"spark-{i}" for i in range(1, size)])
    assert error.startswith(f"inventory: {size} node(s) x server_gpus_per_node 1 gives --tp-size {size}, which does not "
                            "divide the 64 attention heads and the 8 KV heads (the model's documented figures)"), error
    # The fix: the sizes that work.
    assert error.endswith("Fix: give the group 2, 4 or 8 nodes (the sizes that divide them at server_gpus_per_node 1) "
                          "in spark_workers."), error


def test_a_group_of_a_site_of_several_that_does_not_divide_the_heads_is_named():
    [error] = errors(workers=("spark-1", "spark-2"), tp_group_name="replica_b",
                     worker_group_name="spark_workers (of replica_b)", server_gpus_per_node=2)
    assert error.startswith("inventory, TP group replica_b: 3 node(s) x server_gpus_per_node 2 gives --tp-size 6"), error
    assert "Fix: give the group 2 or 4 nodes (the sizes that divide them at server_gpus_per_node 2) in spark_workers " \
           "(of replica_b)." in error, error


def test_four_nodes_divide_the_heads():
    assert errors(workers=("spark-1", "spark-2", "spark-3")) == []


def test_heads_from_the_checkpoints_config_win_over_the_documented_figures():
    three = ("spark-1", "spark-2")
    assert errors(workers=three, model_config={"num_attention_heads": 96, "num_key_value_heads": 96}) == []
    [error] = errors(model_config={"num_attention_heads": 12, "num_key_value_heads": 3})
    assert "gives --tp-size 2, which does not divide the 3 KV heads (the checkpoint's config.json)" in error


def test_config_json_is_read_from_the_nodes_slurp():
    slurped = {"content": base64.b64encode(json.dumps({"num_attention_heads": 12, "num_key_value_heads": 3}).encode())}
    [error] = errors(model_config=slurped)
    assert "does not divide the 3 KV heads (the checkpoint's config.json)" in error
    # A missing or unreadable file (failed slurp, damaged JSON) leaves the documented figures in charge.
    assert errors(model_config={"failed": True, "msg": "file not found"}) == []
    assert errors(model_config={"content": base64.b64encode(b"{not json")}) == []


def test_duplicate_fabric_addresses():
    [error] = errors(fabric={"spark-0": "192.168.100.10", "spark-1": "192.168.100.10"})
    assert error.startswith("spark_fabric_ip 192.168.100.10 of spark-0 is also the address of spark-1:")
    assert "Fix: give every host a distinct spark_fabric_ip" in error


def test_fabric_address_that_is_the_management_address():
    [error] = errors(managed={"spark-0": "10.0.0.10", "spark-1": "192.168.100.11"})
    assert error.startswith("hostvars['spark-1'].spark_fabric_ip = '192.168.100.11': equals its ansible_host")
    assert "Fix: give spark-1 its address on the direct ConnectX-7 link" in error


@pytest.mark.parametrize(("image", "why"), [
    ("lmsysorg/sglang:latest", ":latest, a tag that moves"),
    ("lmsysorg/sglang", "no tag means :latest"),
    ("registry.local:5000/sglang", "no tag means :latest"),
])
def test_moving_image_tags(image, why):
    [error] = errors(server_image=image)
    assert error.startswith(f"server_image = {image!r}: {why}") and "Fix:" in error


def test_latest_is_accepted_when_a_digest_pins_it():
    assert errors(server_image="lmsysorg/sglang:latest", server_image_digest="sha256:" + "a" * 64) == []


def test_registry_port_is_not_a_tag():
    assert errors(server_image="registry.local:5000/sglang:glm-5.3-flash-arm64") == []


@pytest.mark.parametrize("model_dir", ["/opt/models/glm53/", "/opt/models/glm53//"])
def test_trailing_slash(model_dir):
    [error] = errors(server_model_dir=model_dir)
    assert error.startswith(f"server_model_dir = {model_dir!r}: ends in a slash") and "Fix:" in error


def test_model_dir_must_be_two_levels_deep():
    [error] = errors(server_model_dir="/glm53")
    assert "at least two levels deep" in error


def test_group_names_in_messages_follow_the_parameters():
    c_errors = errors(head=(), workers=("spark-0", "spark-1"), head_group_name="heads", worker_group_name="ranks")
    assert any(e.startswith("inventory group heads = []: it must hold exactly one host") for e in c_errors)


def test_a_supervisor_needs_the_fabric_ssh_trust():
    [error] = errors(server_supervised=True, peer_ssh=False)
    assert error.startswith("supervisor_enabled = true with fabric_ssh_trust = false") and "Fix:" in error
    assert errors(server_supervised=False, peer_ssh=False) == []
    assert errors(server_supervised=True, peer_ssh=True) == []


def test_a_fabric_address_that_is_another_nodes_management_address_is_refused():
    [error] = errors(fabric={"spark-0": "192.168.100.10", "spark-1": "10.0.0.10"})
    assert error == ("hostvars['spark-1'].spark_fabric_ip = 10.0.0.10: is the management address (ansible_host) of "
                     "spark-0, so the ranks would reach spark-0's management port for spark-1. Fix: give spark-1 its own "
                     "address on the ConnectX-7 link (DGX default 192.168.100.x).")

"""The site's TP groups from the inventory's groups: the derived variables, the plays' batches and the
site-wide refusals (plugins/module_utils/site_groups.py through the spark filters).

tests/integration/test_render.py renders inventory/spark-2x2 and runs the refusals through the playbooks.
"""

from __future__ import annotations

from tests.lib.roles import filter_plugin

SPARK = filter_plugin("spark")


def two_groups(**extra):
    """The groups dict ansible-core gives for inventory/spark-2x2's shape (parents list every descendant)."""
    groups = {
        "all": ["s0", "s1", "s2", "s3"], "ungrouped": [],
        "spark": ["s0", "s1", "s2", "s3"], "spark_tp_groups": ["s0", "s1", "s2", "s3"],
        "replica_a": ["s0", "s1"], "replica_b": ["s2", "s3"],
        "spark_head": ["s0", "s2"], "spark_workers": ["s1", "s3"], "spark_gateway": [],
    }
    groups.update(extra)
    return groups


def hostvars(groups, **changes):
    hosts = groups["all"]
    found = {h: {"ansible_host": f"10.0.0.{10 + i}", "spark_fabric_ip": f"192.168.100.{10 + i}"} for i, h in enumerate(hosts)}
    for host, values in changes.items():
        found[host].update(values)
    return found


def site_errors(groups, found=None, here=None):
    return SPARK.spark_site_errors(groups, found or hostvars(groups), None, here)


def test_todays_inventory_is_one_group_named_after_the_site():
    groups = {"all": ["b", "a"], "spark": ["b", "a"], "spark_head": ["a"], "spark_workers": ["b"]}
    [group] = SPARK.spark_site_groups(groups)
    assert group == {"name": "spark", "head": "a", "workers": ["b"], "nodes": ["a", "b"]}
    assert SPARK.spark_tp_group([group], "localhost") == group
    # The play keeps the inventory's order and one batch: as before the groups.
    assert SPARK.spark_batches(groups, ["b", "a"]) == {"hosts": ["b", "a"], "sizes": [2], "groups": 1}
    assert SPARK.spark_gateway(groups, [group]) == {"host": "a", "enabled": False}
    assert site_errors(groups, hostvars({"all": ["a", "b"]})) == []


def test_two_groups_in_inventory_order_with_ranks_by_the_workers_order():
    groups = two_groups(spark_workers=["s3", "s1", "s4"], replica_b=["s2", "s3", "s4"],
                        spark=["s0", "s1", "s2", "s3", "s4"], spark_tp_groups=["s0", "s1", "s2", "s3", "s4"])
    entries = SPARK.spark_site_groups(groups)
    assert entries == [
        {"name": "replica_a", "head": "s0", "workers": ["s1"], "nodes": ["s0", "s1"]},
        {"name": "replica_b", "head": "s2", "workers": ["s3", "s4"], "nodes": ["s2", "s3", "s4"]},
    ]
    assert SPARK.spark_tp_group(entries, "s4")["name"] == "replica_b"
    # A host outside every group (the controller) takes the first.
    assert SPARK.spark_tp_group(entries, "localhost")["name"] == "replica_a"
    assert SPARK.spark_gateway(groups, entries) == {"host": "s0", "enabled": True}
    assert SPARK.spark_gateway(two_groups(spark_gateway=["gw"]), entries) == {"host": "gw", "enabled": True}


def test_batches_are_whole_groups_or_the_limited_part_of_one():
    groups = two_groups(spark=["s3", "s0", "s2", "s1"])
    assert SPARK.spark_batches(groups, groups["all"]) == {"hosts": ["s0", "s1", "s3", "s2"], "sizes": [2, 2], "groups": 2}
    # --limit replica_b, and --limit s1,s2: each group's part is a batch of its own.
    assert SPARK.spark_batches(groups, ["s2", "s3"]) == {"hosts": ["s3", "s2"], "sizes": [2], "groups": 1}
    assert SPARK.spark_batches(groups, ["s1", "s2"]) == {"hosts": ["s1", "s2"], "sizes": [1, 1], "groups": 2}
    # The monitoring host outside spark is no rank: no batch holds it.
    assert SPARK.spark_batches(groups, ["mon", "s0"]) == {"hosts": ["s0"], "sizes": [1], "groups": 1}


def test_renamed_groups_are_read_by_their_names():
    groups = {"all": ["a", "b"], "site": [], "spark": ["a", "b"], "pairs": ["a", "b"], "one": ["a", "b"],
              "leaders": ["a"], "followers": ["b"]}
    names = {"tp_groups_group": "pairs", "head_group": "leaders", "workers_group": "followers"}
    assert SPARK.spark_site_groups(groups, names) == [{"name": "one", "head": "a", "workers": ["b"], "nodes": ["a", "b"]}]


def test_a_valid_two_group_site_passes():
    assert site_errors(two_groups()) == []


def test_a_host_in_two_groups_and_a_host_in_none():
    groups = two_groups(replica_b=["s1", "s2", "s3"], spark=["s0", "s1", "s2", "s3", "s9"],
                        all=["s0", "s1", "s2", "s3", "s9"])
    errors = site_errors(groups)
    assert any(e.startswith("inventory host 's1' is in the TP groups replica_a, replica_b:") and "Fix: keep s1 in one"
               in e for e in errors)
    assert any(e.startswith("inventory host 's9' is in spark but in no child group of spark_tp_groups") and "Fix: add it"
               in e for e in errors)


def test_a_group_without_a_head_or_with_two():
    errors = site_errors(two_groups(spark_head=["s0", "s1"], spark_workers=["s3"]))
    assert [e.split(":")[0] for e in errors] == ["TP group replica_a", "TP group replica_b"]
    assert "holds 2 host(s) of spark_head (['s0', 's1'])" in errors[0] and "exactly one head" in errors[0]
    assert "holds 0 host(s) of spark_head ([])" in errors[1] and "Fix: put exactly one host of replica_b" in errors[1]


def test_two_groups_sharing_a_fabric_address():
    groups = two_groups()
    [error] = site_errors(groups, hostvars(groups, s2={"spark_fabric_ip": "192.168.100.10"}))
    assert error.startswith("spark_fabric_ip 192.168.100.10 is held by s0, s2 in the TP groups replica_a, replica_b:")
    assert "Fix: give every host a distinct spark_fabric_ip" in error


def test_a_fabric_address_on_any_other_hosts_management_address():
    groups = two_groups(all=["s0", "s1", "s2", "s3", "mon"])
    found = hostvars(groups, s3={"spark_fabric_ip": "10.0.0.10"}, s1={"spark_fabric_ip": "10.0.0.14"})
    errors = site_errors(groups, found)
    # Another group's node, and a host outside every group (the monitoring host).
    assert any(e.startswith("hostvars['s3'].spark_fabric_ip = 10.0.0.10: is the management address (ansible_host) of s0")
               for e in errors)
    assert any(e.startswith("hostvars['s1'].spark_fabric_ip = 10.0.0.14: is the management address (ansible_host) of mon")
               and "Fix: give s1 its own address" in e for e in errors)
    # Within a group the server plan tells it (tests/unit/test_site_topology.py): not twice.
    assert not any("of s1," in e or "management address (ansible_host) of s2" in e for e in errors)


def test_two_gateway_hosts_and_the_gateway_port_on_a_head():
    groups = two_groups(spark_gateway=["s0", "s2"])
    assert any(e.startswith("inventory group spark_gateway = ['s0', 's2']: at most one host") for e in site_errors(groups))
    here = {"host": "s0", "whole": False, "gateway_port": 30000, "ports": {"server_port": 30000}}
    [error] = site_errors(two_groups(), here=here)
    assert error.startswith("gateway_port = 30000: is server_port of s0, a head, which also runs the gateway")
    assert "Fix: set gateway_port (or server_port) to a free port" in error
    assert site_errors(two_groups(), here={**here, "gateway_port": 8000}) == []
    # Another head, or a one-group site without a gateway host, has no gateway beside its rank.
    assert site_errors(two_groups(), here={**here, "host": "s2"}) == []
    one = {"all": ["a", "b"], "spark": ["a", "b"], "spark_head": ["a"], "spark_workers": ["b"]}
    assert site_errors(one, hostvars(one), here={**here, "host": "a"}) == []


def test_a_group_whose_fabric_addresses_are_not_one_subnet():
    groups = two_groups()
    errors = site_errors(groups, hostvars(groups, s3={"spark_fabric_ip": "192.168.101.13"}))
    assert errors == [
        "TP group replica_b: its fabric addresses (spark_fabric_ip / spark_fabric_prefix) lie in 2 subnets "
        "(192.168.100.0/24: s2 (192.168.100.12/24); 192.168.101.0/24: s3 (192.168.101.13/24)): a group's ranks reach "
        "each other over one subnet on the fabric port, and without it the kernel sends their traffic elsewhere (or "
        "nowhere). Fix: put every fabric address of replica_b in one subnet with one prefix, e.g. 192.168.100.10/24, "
        "192.168.100.11/24, ..."]
    # A prefix of its own counts: /16 puts s3 in another network than its peer's /24.
    assert "TP group replica_b: " in site_errors(groups, hostvars(groups, s3={"spark_fabric_prefix": 16}))[0]
    # Groups need no common subnet with each other; the site's prefix is the default of a node without its own.
    far = hostvars(groups, s2={"spark_fabric_ip": "10.9.0.12"}, s3={"spark_fabric_ip": "10.9.0.13"})
    assert site_errors(groups, far) == []
    assert site_errors(groups, far, {"fabric_prefix": 8}) == []
    # A site of one group of four: the group is the site's.
    one = {"all": ["s0", "s1", "s2", "s3"], "spark": ["s0", "s1", "s2", "s3"], "spark_head": ["s0"],
           "spark_workers": ["s1", "s2", "s3"]}
    [error] = site_errors(one, hostvars(one, s1={"spark_fabric_ip": "192.168.7.11"}))
    assert error.startswith("the TP group: its fabric addresses (spark_fabric_ip / spark_fabric_prefix) lie in 2 "
                            "subnets (192.168.100.0/24: s0 (192.168.100.10/24), s2 (192.168.100.12/24), s3 "
                            "(192.168.100.13/24); 192.168.7.0/24: s1 (192.168.7.11/24))"), error
    assert "Fix: put every fabric address of the group in one subnet" in error


def sources(groups, holders, run=None, found=None):
    entries = SPARK.spark_site_groups(groups)
    return SPARK.spark_checkpoint_sources(entries, holders, found or hostvars(groups), run or groups["all"], 24)


def test_the_checkpoint_comes_from_the_hub_once_per_site_and_from_any_node_that_holds_it():
    groups = two_groups()
    # Nothing held anywhere: the first head fetches for the whole site (the hub once, not once per group).
    assert sources(groups, []) == {"s0": "s0", "s1": "s0", "s2": "s0", "s3": "s0"}
    # A node that holds it is its own source; a group's head that holds it feeds its group.
    assert sources(groups, ["s0", "s2"]) == {"s0": "s0", "s1": "s0", "s2": "s2", "s3": "s2"}
    # Heads lost: a worker of any group feeds the rest, the earlier group's nodes included.
    assert sources(groups, ["s3"]) == {"s0": "s3", "s1": "s3", "s2": "s3", "s3": "s3"}
    assert sources(groups, ["s1", "s3"]) == {"s0": "s1", "s1": "s1", "s2": "s1", "s3": "s3"}
    # A group cabled apart (its own fabric subnet) cannot be fed over the fabric: its head fetches for it.
    far = hostvars(groups, s2={"spark_fabric_ip": "10.9.0.12"}, s3={"spark_fabric_ip": "10.9.0.13"})
    assert sources(groups, [], found=far) == {"s0": "s0", "s1": "s0", "s2": "s2", "s3": "s2"}
    assert sources(groups, ["s1"], found=far) == {"s0": "s1", "s1": "s1", "s2": "s2", "s3": "s2"}
    # A node's own prefix counts: /16 takes s2 and s3 back onto s0's network.
    wide = hostvars(groups, **{h: {"spark_fabric_ip": f"192.168.{i}.1{i}", "spark_fabric_prefix": 16}
                               for i, h in enumerate(groups["all"])})
    assert sources(groups, ["s1"], found=wide) == {"s0": "s1", "s1": "s1", "s2": "s1", "s3": "s1"}


def test_a_limited_run_takes_the_checkpoint_from_a_node_left_out_before_the_hub():
    groups = two_groups()
    # --limit replica_b: a holder the run left out (found by the play's delegated read) feeds the group.
    assert sources(groups, ["s0"], run=["s2", "s3"]) == {"s2": "s0", "s3": "s0"}
    # None anywhere: the run's head fetches.
    assert sources(groups, [], run=["s2", "s3"]) == {"s2": "s2", "s3": "s2"}
    # A worker alone whose head the run leaves out keeps that head, which must hold it (as before the groups).
    assert sources(groups, [], run=["s1", "s2"]) == {"s1": "s0", "s2": "s2"}
    # Today's one-group inventory: the head, as before.
    one = {"all": ["a", "b"], "spark": ["a", "b"], "spark_head": ["a"], "spark_workers": ["b"]}
    assert sources(one, []) == {"a": "a", "b": "a"}
    assert sources(one, ["b"]) == {"a": "b", "b": "b"}

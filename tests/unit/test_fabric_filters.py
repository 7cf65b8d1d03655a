"""The fabric role's address arithmetic and nftables planning, without nodes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[2] / "roles/fabric/filter_plugins/fabric.py"
spec = importlib.util.spec_from_file_location("fabric_filters", PLUGIN)
fabric = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fabric)


@pytest.mark.parametrize(
    ("address", "prefix", "problem"),
    [
        ("192.168.100.10", 24, ""),
        ("192.168.100.0", 24, "network or broadcast"),
        ("192.168.100.255", 24, "network or broadcast"),
        ("192.168.100.10", 31, "outside 8..30"),
        ("192.168.100.10", "x", "not a number"),
        ("192.168.100.300", 24, "not an IPv4 address"),
        ("169.254.1.1", 16, "link-local"),
    ],
)
def test_ipv4_error(address, prefix, problem):
    error = fabric.fabric_ipv4_error(address, prefix)
    assert (problem in error) if problem else error == ""


def test_off_subnet_lists_only_strangers():
    ips = {"a": "10.0.0.10", "b": "10.0.0.11", "c": "10.0.1.12", "d": "bogus"}
    prefixes = {"a": 24, "b": 24, "c": 24, "d": 24}
    assert fabric.fabric_off_subnet(["b", "c", "d"], ips, prefixes, "10.0.0.0/24") == ["c", "d"]
    # Same address range, different prefix: not the same subnet either.
    assert fabric.fabric_off_subnet(["b"], ips, {"b": 16}, "10.0.0.0/24") == ["b"]


def test_ifaces_in_network_finds_the_twin():
    addrs = [
        {"ifname": "enP7s7", "addr_info": [{"family": "inet", "local": "10.0.0.100", "prefixlen": 25},
                                           {"family": "inet6", "local": "fe80::1", "prefixlen": 64}]},
        {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
    ]
    assert fabric.fabric_ifaces_in_network(addrs, "10.0.0.0/24") == ["enP7s7 (10.0.0.100/25)"]


def chain(policy="drop", family="inet", hook="input"):
    return {"chain": {"family": family, "table": "filter", "name": "input", "hook": hook, "policy": policy}}


def rule(expr=None, comment=None, family="inet"):
    r = {"family": family, "table": "filter", "chain": "input", "expr": expr or [{"accept": None}]}
    if comment:
        r["comment"] = comment
    return {"rule": r}


def test_nft_no_ruleset_or_accepting_chain_is_no_firewall():
    assert fabric.fabric_nft_missing({"nftables": [{"metainfo": {}}]}, ["10.0.0.11"], "eth1") == []
    assert fabric.fabric_nft_missing({"nftables": [chain("accept"), rule()]}, ["10.0.0.11"], "eth1") == []
    assert fabric.fabric_nft_missing({"nftables": [chain(hook="output")]}, ["10.0.0.11"], "eth1") == []
    assert fabric.fabric_nft_missing({"nftables": [chain(family="ip6")]}, ["10.0.0.11"], "eth1") == []


def test_nft_dropping_chain_needs_one_rule_per_missing_peer():
    ruleset = {"nftables": [chain("accept"), rule([{"drop": None}]), rule(comment="spark-fabric from 10.0.0.11")]}
    missing = fabric.fabric_nft_missing(ruleset, ["10.0.0.11", "10.0.0.12"], "eth1")
    assert missing == [{"family": "inet", "table": "filter", "chain": "input", "peer": "10.0.0.12",
                        "interface": "eth1", "comment": "spark-fabric from 10.0.0.12"}]

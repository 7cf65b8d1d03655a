"""Address arithmetic for the fabric role, on the controller.

Jinja has no IP arithmetic and ansible.utils (with netaddr) is not a
dependency of this project; Python's ipaddress module is always there.
"""

from __future__ import annotations

import ipaddress


def fabric_ipv4_error(address, prefix) -> str:
    """Why `address`/`prefix` cannot be a host address on a point-to-point or switched fabric ('' if it can)."""
    try:
        prefix = int(prefix)
    except (TypeError, ValueError):
        return f"prefix {prefix!r} is not a number"
    if not 8 <= prefix <= 30:
        return f"prefix /{prefix} is outside 8..30 (a /31 or /32 leaves no room for two hosts with a broadcast address)"
    try:
        ip = ipaddress.IPv4Address(str(address))
    except ValueError:
        return f"{address!r} is not an IPv4 address"
    net = ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False)
    if ip in (net.network_address, net.broadcast_address):
        return f"{ip} is the network or broadcast address of {net}"
    if ip.is_loopback or ip.is_multicast or ip.is_unspecified or ip.is_link_local:
        return f"{ip} is a loopback, multicast, link-local or unspecified address"
    return ""


def fabric_network(address, prefix) -> str:
    """The network `address`/`prefix` lies in, as 'a.b.c.d/n'."""
    return str(ipaddress.IPv4Network(f"{address}/{int(prefix)}", strict=False))


def fabric_in_network(address, network) -> bool:
    """Whether `address` lies in `network` (IPv4 only; anything else is False)."""
    try:
        return ipaddress.ip_address(str(address)) in ipaddress.ip_network(str(network), strict=False)
    except ValueError:
        return False


def fabric_off_subnet(hosts, ips, prefixes, subnet) -> list:
    """The hosts whose address/prefix (from the `ips` and `prefixes` maps) is not the network `subnet`."""
    out = []
    for host in hosts:
        try:
            if fabric_network(ips[host], prefixes[host]) == str(subnet):
                continue
        except (KeyError, TypeError, ValueError):
            pass
        out.append(host)
    return out


def fabric_ifaces_in_network(interfaces, network) -> list:
    """Names of the interfaces (entries of `ip -j addr show`) with an IPv4 address in `network`."""
    out = []
    for iface in interfaces:
        for addr in iface.get("addr_info", []):
            if addr.get("family") == "inet" and fabric_in_network(addr.get("local"), network):
                out.append(f"{iface.get('ifname')} ({addr.get('local')}/{addr.get('prefixlen')})")
    return out


NFT_COMMENT = "spark-fabric from {peer}"


def _nft_drops(rule_exprs) -> bool:
    return any(isinstance(e, dict) and ("drop" in e or "reject" in e) for e in rule_exprs or [])


def fabric_nft_missing(ruleset, peers, interface) -> list:
    """Accept rules the fabric still needs in an nftables ruleset (`nft -j list ruleset`, parsed).

    Only IPv4-capable base chains on the input hook that can drop traffic (a
    drop policy, or a drop/reject rule) need one; a ruleset without such a
    chain is no active firewall. Returns one {family, table, chain, peer,
    comment} per rule that is not there yet (recognised by its comment).
    """
    items = [entry for entry in (ruleset or {}).get("nftables", []) if isinstance(entry, dict)]
    chains = {}
    for entry in items:
        chain = entry.get("chain")
        if chain and chain.get("hook") == "input" and chain.get("family") in ("ip", "inet"):
            key = (chain["family"], chain["table"], chain["name"])
            chains[key] = {"drops": chain.get("policy") == "drop", "comments": set()}
    for entry in items:
        rule = entry.get("rule")
        if not rule:
            continue
        key = (rule.get("family"), rule.get("table"), rule.get("chain"))
        if key in chains:
            chains[key]["drops"] = chains[key]["drops"] or _nft_drops(rule.get("expr"))
            if rule.get("comment"):
                chains[key]["comments"].add(rule["comment"])
    out = []
    for (family, table, name), chain in sorted(chains.items()):
        if not chain["drops"]:
            continue
        for peer in peers:
            comment = NFT_COMMENT.format(peer=peer)
            if comment not in chain["comments"]:
                out.append({"family": family, "table": table, "chain": name, "peer": peer,
                            "interface": interface, "comment": comment})
    return out


class FilterModule:
    def filters(self):
        return {
            "fabric_ipv4_error": fabric_ipv4_error,
            "fabric_network": fabric_network,
            "fabric_in_network": fabric_in_network,
            "fabric_off_subnet": fabric_off_subnet,
            "fabric_ifaces_in_network": fabric_ifaces_in_network,
            "fabric_nft_missing": fabric_nft_missing,
        }

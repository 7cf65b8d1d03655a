"""Address arithmetic for the fabric role, on the controller.

Jinja has no IP arithmetic and ansible.utils (with netaddr) is not a
dependency of this project; Python's ipaddress module is always there.
"""

from __future__ import annotations

import ipaddress
import json

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import fabric_ring


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


RAILS_VAR = "fabric_extra_rails (spark_fabric_extra_rails)"


def _rail_network(subnet):
    """The IPv4 network `subnet` names (host bits refused), or the reason it is none."""
    try:
        net = ipaddress.IPv4Network(str(subnet), strict=True)
    except ValueError as e:
        return None, f"{subnet!r} is not an IPv4 network in CIDR form ({e})"
    if not 8 <= net.prefixlen <= 30:
        return None, f"prefix /{net.prefixlen} is outside 8..30"
    return net, ""


def fabric_rail_address(address, prefix, subnet) -> str:
    """A node's address on a further rail: the rail's `subnet` with the host number the node has on the fabric
    port (192.168.100.11/24 on a rail 192.168.101.0/24 -> 192.168.101.11); '' where there is none."""
    net = _rail_network(subnet)[0]
    try:
        own = ipaddress.IPv4Network(f"{address}/{int(prefix)}", strict=False)
        host = int(ipaddress.IPv4Address(str(address))) - int(own.network_address)
    except (TypeError, ValueError):
        return ""
    if net is None or not 0 < host < net.num_addresses - 1:
        return ""
    return str(net.network_address + host)


def fabric_rails(extra, interface, address, prefix) -> list:
    """Every rail of a node, the fabric port first (it carries the bootstrap sockets): [{interface, ip, prefix,
    primary}], each further rail's address derived by fabric_rail_address ('' where it cannot be)."""
    rails = [{"interface": interface, "ip": str(address), "prefix": prefix, "primary": True}]
    for entry in extra or []:
        rail = entry if isinstance(entry, dict) else {}
        net = _rail_network(rail.get("subnet"))[0]
        rails.append({"interface": str(rail.get("interface") or ""),
                      "ip": fabric_rail_address(address, prefix, rail.get("subnet")),
                      "prefix": net.prefixlen if net else "", "primary": False})
    return rails


def fabric_rail_ips(hosts, ips, prefixes, extra) -> dict:
    """{host: [its address on each rail, the fabric port's first]} from the `ips` and `prefixes` maps."""
    return {h: [r["ip"] for r in fabric_rails(extra, "", ips.get(h, ""), prefixes.get(h, ""))] for h in hosts or []}


def fabric_rail_probes(rails, rail_ips, peers) -> list:
    """Per rail, the peers' addresses on it: [{interface, peers}] in rail order (a peer without an address on a rail,
    its input refused, is left out)."""
    return [{"interface": rail["interface"],
             "peers": [ips[i] for ips in (rail_ips.get(p) or [] for p in peers or []) if i < len(ips) and ips[i]]}
            for i, rail in enumerate(rails or [])]


def fabric_rails_errors(extra, interface, address, prefix, netdevs=None) -> list:
    """Why `extra` (fabric_extra_rails) cannot be this node's further rails: one sentence per problem, each with
    its fix; empty when it can. `netdevs`: the node's interfaces (None: not read yet, not checked)."""
    if extra in (None, ""):
        return []
    if not isinstance(extra, list):
        return [f"{RAILS_VAR} is {extra!r}: it must be a list of {{interface, subnet}}, one per further rail. "
                "Fix: e.g. [{interface: enP2p1s0f1np1, subnet: 192.168.101.0/24}], or [] for one rail."]
    errors, seen, nets = [], {str(interface)}, []
    try:
        nets.append(("the fabric port's subnet", ipaddress.IPv4Network(f"{address}/{int(prefix)}", strict=False)))
    except (TypeError, ValueError):
        pass  # the fabric address's own check names it
    for i, rail in enumerate(extra):
        name = f"{RAILS_VAR}[{i}]"
        if not isinstance(rail, dict) or not rail.get("interface") or not rail.get("subnet"):
            errors.append(f"{name} is {rail!r}: each rail needs an interface and a subnet. "
                          "Fix: e.g. {interface: enP2p1s0f1np1, subnet: 192.168.101.0/24}.")
            continue
        iface, subnet = str(rail["interface"]), rail["subnet"]
        if iface in seen:
            errors.append(f"{name}.interface is {iface}, which is already "
                          + ("the fabric port (spark_fabric_interface)" if iface == str(interface) else "another rail")
                          + ": each rail is a port of its own. Fix: name the second RoCE port (rdma link show lists "
                            "each device's netdev), or remove the entry.")
        seen.add(iface)
        if netdevs is not None and iface not in netdevs:
            errors.append(f"{name}.interface is {iface}, which this node does not have (it has "
                          f"{', '.join(sorted(netdevs))}). Fix: the netdev of the second RoCE device "
                          "(rdma link show), e.g. enP2p1s0f1np1.")
        net, why = _rail_network(subnet)
        if net is None:
            errors.append(f"{name}.subnet is {subnet!r}: {why}. Fix: a network of its own with its host bits zero, "
                          "e.g. 192.168.101.0/24.")
            continue
        clash = next((what for what, other in nets if net.overlaps(other)), None)
        if clash:
            errors.append(f"{name}.subnet {net} overlaps {clash}: two interfaces in one subnet make the kernel send a "
                          "rail's traffic out of the other port. Fix: give each rail a subnet of its own.")
        nets.append((f"{RAILS_VAR}[{i}].subnet", net))
        if not fabric_rail_address(address, prefix, net) and not fabric_ipv4_error(address, prefix):
            errors.append(f"{name}.subnet {net} has no room for this node's host number (its fabric address is "
                          f"{address}/{prefix}; each rail takes the same host number in its own subnet). "
                          "Fix: a rail subnet at least as large as the fabric port's.")
    return errors


NFT_COMMENT = "spark-fabric from {peer}"
NFT_RING_COMMENT = "spark-fabric ring {inbound} -> {outbound}"


def _nft_drops(rule_exprs) -> bool:
    return any(isinstance(e, dict) and ("drop" in e or "reject" in e) for e in rule_exprs or [])


def _dropping_chains(ruleset, hook) -> dict:
    """{(family, table, chain): comments of its rules} of the IPv4-capable base chains on `hook` that can drop traffic
    (a drop policy, or a drop/reject rule)."""
    items = [entry for entry in (ruleset or {}).get("nftables", []) if isinstance(entry, dict)]
    chains = {}
    for entry in items:
        chain = entry.get("chain")
        if chain and chain.get("hook") == hook and chain.get("family") in ("ip", "inet"):
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
    return {key: chain["comments"] for key, chain in chains.items() if chain["drops"]}


def fabric_nft_missing(ruleset, peers, interface) -> list:
    """Accept rules the fabric still needs in an nftables ruleset (`nft -j list ruleset`, parsed).

    Only IPv4-capable base chains on the input hook that can drop traffic (a
    drop policy, or a drop/reject rule) need one; a ruleset without such a
    chain is no active firewall. Returns one {family, table, chain, peer,
    comment} per rule that is not there yet (recognised by its comment).
    """
    out = []
    for (family, table, name), comments in sorted(_dropping_chains(ruleset, "input").items()):
        for peer in peers:
            comment = NFT_COMMENT.format(peer=peer)
            if comment not in comments:
                out.append({"family": family, "table": table, "chain": name, "peer": peer,
                            "interface": interface, "comment": comment})
    return out


def fabric_nft_missing_forward(ruleset, ports) -> list:
    """The forward rules a ring of four still needs (`ports`: the node's two ring ports): the traffic across the ring
    goes in one port and out the other, and a dropping forward chain (Docker sets the filter table's FORWARD policy
    to drop) stops it. One {family, table, chain, in, out, comment} per direction and dropping chain, not there yet."""
    out = []
    for (family, table, name), comments in sorted(_dropping_chains(ruleset, "forward").items()):
        for inbound, outbound in (tuple(ports), tuple(reversed(ports))) if len(ports or []) == 2 else ():
            comment = NFT_RING_COMMENT.format(inbound=inbound, outbound=outbound)
            if comment not in comments:
                out.append({"family": family, "table": table, "chain": name, "in": inbound, "out": outbound,
                            "comment": comment})
    return out


def fabric_nft_missing_rails(ruleset, rails) -> list:
    """fabric_nft_missing for every rail ([{interface, peers}]: each peer's address on that rail, on its port)."""
    return [m for rail in rails or [] for m in fabric_nft_missing(ruleset, rail["peers"], rail["interface"])]


def _iface(addrs, interface):
    return next((i for i in addrs or [] if isinstance(i, dict) and i.get("ifname") == interface), None)


def fabric_port(addrs, interface):
    """The live state of the fabric port from `ip -j addr show`: {present, up, carrier, mtu, addresses}.

    `up` is the administrative state (an `ip link set down` clears it), `carrier` whether the
    cable and the peer's port are there (NO-CARRIER on a port that is up).
    """
    port = _iface(addrs, interface)
    if port is None:
        return {"present": False, "up": False, "carrier": False, "mtu": 0, "addresses": []}
    flags = port.get("flags") or []
    return {
        "present": True,
        "up": "UP" in flags,
        "carrier": "UP" in flags and "NO-CARRIER" not in flags,
        "mtu": int(port.get("mtu") or 0),
        "addresses": [f"{a.get('local')}/{a.get('prefixlen')}" for a in port.get("addr_info") or []
                      if a.get("family") == "inet"],
    }


def fabric_drift(addrs, interface, address, prefix, mtu):
    """How the live port differs from what the role configured: [sentence], empty when it matches.

    Only what netplan apply (and a link up) puts back: the administrative state, the MTU, the address.
    """
    port = fabric_port(addrs, interface)
    if not port["present"]:
        return []
    drift = []
    if not port["up"]:
        drift.append(f"{interface} is down (set down by hand: ip link set {interface} down)")
    if port["mtu"] != int(mtu):
        drift.append(f"{interface} has MTU {port['mtu']}, configured {mtu}")
    want = f"{address}/{prefix}"
    # networkd sets the address once the link has carrier: without carrier (a cable out) netplan apply adds nothing.
    if want not in port["addresses"] and port["carrier"]:
        drift.append(f"{interface} lacks its address {want} (has {', '.join(port['addresses']) or 'none'})")
    return drift


def fabric_ports_down(addrs, interfaces) -> list:
    """The ports of `interfaces` that exist and are administratively down (fabric_port's `up`), in their order."""
    ports = [(i, fabric_port(addrs, i)) for i in interfaces or []]
    return [i for i, port in ports if port["present"] and not port["up"]]


def fabric_rails_drift(addrs, rails, mtu) -> list:
    """fabric_drift over every rail ([{interface, ip, prefix}]): [sentence], empty when all match."""
    return [d for r in rails or [] for d in fabric_drift(addrs, r["interface"], r["ip"], r["prefix"], mtu)]


def fabric_rails_settled(addrs, rails, mtu) -> bool:
    """Whether every rail's port shows what netplan apply configures: up, the MTU, and the address where it has
    carrier (networkd sets it once the link is up)."""
    for rail in rails or []:
        port = fabric_port(addrs, rail["interface"])
        if not port["present"]:
            continue
        if not port["up"] or port["mtu"] != int(mtu):
            return False
        if port["carrier"] and f"{rail['ip']}/{rail['prefix']}" not in port["addresses"]:
            return False
    return True


def fabric_peer_port(peer, hostvars, play_hosts, interface):
    """A peer's port as its own play last read it ({host, in_play, port}; port None outside this run)."""
    if peer not in play_hosts:
        return {"host": peer, "in_play": False, "port": None}
    facts = hostvars[peer]
    link = facts.get("__fabric_link") or {}
    text = link.get("stdout") if link.get("stdout") and not link.get("skipped") else \
        ((facts.get("__fabric_probe") or {}).get("addrs") or {}).get("stdout")
    try:
        addrs = json.loads(text or "[]")
    except ValueError:
        addrs = []
    return {"host": peer, "in_play": True, "port": fabric_port(addrs, interface)}


def fabric_port_cause(port, want, peers, variable="spark_fabric_interface"):
    """Why the port is still not as configured after netplan apply: the real cause, not a guess.

    want: {interface, ip, prefix, mtu} as configured; peers: [{host, in_play, port (fabric_port of its
    live state, or None)}].
    """
    interface, address, prefix, mtu = want["interface"], want["ip"], want["prefix"], want["mtu"]
    causes = []
    if not port["present"]:
        return [f"{interface} does not exist"]
    if not port["up"]:
        causes.append(f"{interface} is still down after netplan apply and ip link set up: the driver refuses to bring "
                      "it up (ip link set up reports why; dmesg)")
    elif not port["carrier"]:
        down = [p["host"] for p in peers if p.get("in_play") and p.get("port") and not p["port"]["up"]]
        outside = [p["host"] for p in peers if not p.get("in_play")]
        if down:
            causes.append(f"no carrier: the peer's port is down on {', '.join(down)} (set down by hand there); this run "
                          "brings it up when that node is in it")
        elif outside:
            causes.append(f"no carrier: the peer {', '.join(outside)} (outside this run) is off, or its port is down "
                          f"(ip link show {interface} there), or the cable is not in this port")
        else:
            causes.append("no carrier although the peer's port is up: the cable is not in this port (ip -br link shows "
                          f"which ConnectX-7 port has carrier; set {variable} to it) or the cable is damaged")
    if port["mtu"] != int(mtu):
        causes.append(f"MTU {port['mtu']} after netplan apply, configured {mtu}: something else sets it on this port "
                      f"(networkctl status {interface}, nmcli device show {interface}); "
                      "the role's netplan file must be the only one naming the port")
    want = f"{address}/{prefix}"
    if want not in port["addresses"] and port["carrier"]:
        causes.append(f"address {want} missing after netplan apply: another renderer manages {interface} "
                      f"(networkctl status {interface}, nmcli device) or another file in /etc/netplan names it")
    elif want not in port["addresses"]:
        causes.append(f"address {want} not set while there is no carrier (networkd configures it once the link is up)")
    return causes


def fabric_route_faults(routes, interface, address) -> list:
    """Routes to peers (`ip -j route get` results with the peer as item) that do not leave through `interface` (or,
    a mapping, the peer's own: a ring's routes take either port) from `address`: [{peer, dev, prefsrc, local, want}],
    empty when all do."""
    out = []
    for result in routes or []:
        try:
            route = (json.loads(result.get("stdout") or "[]") or [{}])[0]
        except ValueError:
            route = {}
        local = route.get("type", "unicast") == "local"
        want = interface.get(result.get("item"), "?") if isinstance(interface, dict) else interface
        if local or route.get("dev") != want or route.get("prefsrc", "") != address:
            out.append({"peer": result.get("item"), "dev": route.get("dev", "?"), "prefsrc": route.get("prefsrc", "?"),
                        "local": local, "want": want})
    return out


def fabric_ping_faults(pings, peers) -> list:
    """Peers the full-size pings did not pass to: [{peer, small}] - small: whether small pings passed
    (None when the peer was not pinged at all: the port had no carrier when it was read)."""
    by_peer = {p.get("item"): p for p in pings or []}
    out = []
    for peer in peers or []:
        ping = by_peer.get(peer)
        if ping is None:
            out.append({"peer": peer, "small": None})
        elif ping.get("rc") != 0:
            out.append({"peer": peer, "small": (ping.get("small") or {}).get("rc") == 0})
    return out


def fabric_rail_faults(reading, addrs, rail, *, mtu, peers, peer_ports) -> list:
    """What keeps a further rail from carrying the peers' traffic, with the cause found: [sentence], empty when its
    port is up with carrier, its address and MTU live, and its routes and full-size pings to each peer pass.

    reading: the probe's {interface, routes, pings} for the rail; addrs: `ip -j addr show`; rail: {interface, ip,
    prefix}; peers: the peers' addresses on the rail; peer_ports: [{host, in_play, port}] of the rail's port.
    A rail is no bootstrap path: its faults are warnings, the group forms on the other rails.
    """
    interface, address = rail["interface"], rail["ip"]
    port = fabric_port(addrs, interface)
    want = {"interface": interface, "ip": address, "prefix": rail["prefix"], "mtu": mtu}
    if not (port["up"] and port["carrier"] and port["mtu"] == int(mtu)
            and f"{address}/{rail['prefix']}" in port["addresses"]):
        state = ("up" if port["up"] else "DOWN") + ("" if port["carrier"] or not port["up"] else " with NO CARRIER")
        return [f"rail {interface} is {state}, "
                f"MTU {port['mtu']}, addresses [{', '.join(port['addresses'])}] (want {address}/{rail['prefix']}, MTU "
                f"{mtu}): " + "; ".join(fabric_port_cause(port, want, peer_ports, "spark_fabric_extra_rails"))]
    faults = [f"rail {interface}: traffic to {r['peer']} leaves via {r['dev']} from {r['prefsrc']}, want {interface} from "
              f"{address}" + ("; the address is configured on this node itself: check the rail subnets" if r["local"]
                              else "; another interface has an address in the rail's subnet, or a more specific "
                                   "route sends it elsewhere (ip route)")
              for r in fabric_route_faults((reading or {}).get("routes"), interface, address)]
    size = int(mtu) - 28
    for f in fabric_ping_faults((reading or {}).get("pings"), peers):
        if f["small"]:
            faults.append(f"rail {interface}: {f['peer']} answers small pings but not {size}-byte ones with DF set: an "
                          f"MTU below {mtu} on the peer's port or a switch between")
        elif dark := [p["host"] for p in peer_ports or [] if p.get("port") and not p["port"]["carrier"]]:
            faults.append(f"rail {interface}: {f['peer']} does not answer: {', '.join(dark)}'s {interface} has no "
                          "carrier (its own warning names the cause)")
        else:
            faults.append(f"rail {interface}: {f['peer']} does not answer: the peer's rail is not configured yet, its "
                          "cable is elsewhere, or a firewall drops ICMP on it")
    return faults


def fabric_rails_report(readings, addrs, rails, *, mtu, rail_peers, peers, hostvars, play_hosts) -> dict:
    """The further rails' proof for the node's report: {lines, warnings}, one sentence per rail.

    readings: the probe's `rails` (routes and pings per further rail, in order); rails: every rail, the fabric port
    first; rail_peers: per rail (the fabric port's first), the peers' addresses on it; peers: the peer hosts.
    """
    lines, warnings = [], []
    for i, rail in enumerate(list(rails or [])[1:]):
        reading = (readings or [])[i] if i < len(readings or []) else {}
        on_rail = (rail_peers or [])[i + 1]["peers"] if i + 1 < len(rail_peers or []) else []
        ports = [fabric_peer_port(p, hostvars, play_hosts, rail["interface"]) for p in peers or []]
        faults = fabric_rail_faults(reading, addrs, rail, mtu=mtu, peers=on_rail, peer_ports=ports)
        if faults:
            warnings.append("; ".join(faults) + "; the ranks run on the other rails until it is fixed")
        else:
            lines.append(f"rail {rail['interface']} ({rail['ip']}/{rail['prefix']}, MTU {mtu}) reaches "
                         f"{', '.join(on_rail) or 'no peer'} with full-size frames")
    return {"lines": lines, "warnings": warnings}


def fabric_known_host_lines(host_keys, address) -> list:
    """known_hosts lines pinning a worker's host keys (the probe's {type, content}) for its fabric address."""
    out = []
    for key in host_keys or []:
        fields = str(key.get("content", "")).split()
        if len(fields) >= 2:
            out.append(f"{address} {fields[0]} {fields[1]}")
    return out


def fabric_stale_keys(lines, head) -> list:
    """The authorized_keys lines (as the probe read them) that let in a fabric key other than `head`'s (a
    worker's head; '' on a head, which lets in none): a former head's, left by a site regrouped or a head changed."""
    out = []
    for line in lines or []:
        comment = line.split()[-1] if line.split() else ""
        if comment.startswith("spark-fabric@") and comment != f"spark-fabric@{head}":
            out.append(line)
    return out


def fabric_stale_pins(lines, site_ips, kept_ips) -> list:
    """The known_hosts lines (as the probe read them) that pin a site node's fabric address other than `kept_ips`
    (a head's workers'; none elsewhere): a former head's pins, left by a site regrouped or a head changed."""
    stale = {str(ip) for ip in site_ips or [] if ip} - {str(ip) for ip in kept_ips or [] if ip}
    return [line for line in lines or [] if set(line.split(" ", 1)[0].split(",")) & stale]


def _stat_gap(stats, path, owner, mode, what):
    st = (stats or {}).get(path) or {}
    if not st.get("exists"):
        return [f"{what} {path} missing"]
    if (mode and st.get("mode") != mode) or st.get("owner") != owner:
        return [f"{what} {path} is {st.get('owner')} {st.get('mode')}, want {owner} {mode or ''}".rstrip()]
    return []


def fabric_trust_gaps(probes, head, workers, *, ips, user, key_path, authorized_keys):
    """What the head's SSH trust to `workers` still lacks, by the probes' readings: [sentence], empty when in place.

    probes: {host: the fabric_probe result} of the hosts in this run; a head outside the run is
    unknown, so everything is done again (by delegation). Each piece is what the role's tasks
    write: the head's key directory (owner, 0700) and key pair, each worker's authorized_keys line
    (from the head's fabric address only, restrict) with its directory (0700) and file (0600), and
    each worker's host keys pinned for its fabric address in the head's known_hosts.
    """
    head_probe = (probes or {}).get(head)
    if not head_probe:
        return [f"the head {head} is not in this run"]
    stats = head_probe.get("stats")
    gaps = _stat_gap(stats, key_path.rsplit("/", 1)[0] or "/", user, "0700", "the head's key directory")
    gaps += _stat_gap(stats, key_path, user, "", "the head's key")
    pub = str(head_probe.get("public_key") or "").split()
    if len(pub) < 2:
        return gaps + [f"the head's public key {key_path}.pub missing"]
    known = set(head_probe.get("known_hosts") or [])
    ssh_dir = authorized_keys.rsplit("/", 1)[0]
    want_line = f'from="{ips.get(head)}",restrict {pub[0]} {pub[1]} spark-fabric@{head}'
    for worker in workers:
        probe = probes.get(worker) or {}
        if want_line not in (probe.get("authorized_keys") or []):
            gaps.append(f"{worker}: the head's key is not in {authorized_keys}")
        gaps += [f"{worker}: {g}" for g in _stat_gap(probe.get("stats"), ssh_dir, user, "0700", "directory")]
        gaps += [f"{worker}: {g}" for g in _stat_gap(probe.get("stats"), authorized_keys, user, "0600", "file")]
        lines = fabric_known_host_lines(probe.get("host_keys"), ips.get(worker))
        if not lines or any(line not in known for line in lines):
            gaps.append(f"{worker}'s host keys are not all pinned for {ips.get(worker)} on the head")
    return gaps


# RoCE carries InfiniBand MTUs: the largest that fits in the netdev's MTU after the RoCE headers (GRH 40,
# UDP 8, BTH 12, XRC 4, AtomicETH 28, ICRC 4), as the kernel's iboe_get_mtu (include/rdma/ib_addr.h) picks it.
_ROCE_HEADERS = 96
_IB_MTUS = (4096, 2048, 1024, 512, 256)
# What NCCL does without a usable RoCE device: its socket transport, about a tenth of the link.
SOCKET_FALLBACK = ("NCCL falls back to its socket transport on {interface} (about 2 GB/s of all-reduce bus bandwidth, "
                   "a tenth of what RoCE gives tensor parallelism)")


def fabric_roce_mtu(netdev_mtu) -> int:
    """The RoCE (IB) MTU a port carries at the netdev MTU `netdev_mtu`: 9000 -> 4096, 1500 -> 1024."""
    room = int(netdev_mtu) - _ROCE_HEADERS
    return next((mtu for mtu in _IB_MTUS if room >= mtu), 0)


def _gid_ipv4(gid):
    """The IPv4 address of an IPv4-mapped GID (sysfs form), else None."""
    try:
        mapped = ipaddress.IPv6Address(str(gid)).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped else None


def _fabric_ports(rdma, interface):
    """(device, port) of every RDMA port behind the netdev `interface`."""
    return [(d, p) for d in (rdma or {}).get("devices") or [] if interface in (d.get("netdevs") or [])
            for p in d.get("ports") or []]


def _address_gids(port, interface, address):
    return [g for g in port.get("gids") or [] if g.get("ndev") in (interface, "") and _gid_ipv4(g.get("gid")) == address]


def _rails(rails):
    """The rails as [{interface, ip}]: a list of them, or one {interface, ip} mapping."""
    return [rails] if isinstance(rails, dict) else list(rails or [])


def fabric_rdma_usable(rdma, rails) -> dict:
    """What the ranks can give NCCL: {hcas, gid_index, gid_indexes} - the RDMA devices behind the rails' ports
    (`rails`: [{interface, ip}], the fabric port first) whose port is ACTIVE with a RoCE v2 GID for the rail's
    address, in rail order; each one's GID index; and the index they share (None where none is usable or where
    they differ: NCCL then picks each device's RoCE v2 IPv4 GID itself). The probe's `rdma` reading."""
    hcas, indexes = [], {}
    for rail in _rails(rails):
        for device, port in _fabric_ports(rdma, rail.get("interface")):
            v2 = [g["index"] for g in _address_gids(port, rail.get("interface"), rail.get("ip"))
                  if g.get("type") == "RoCE v2"]
            if port.get("state") == "ACTIVE" and v2 and device["name"] not in indexes:
                hcas.append(device["name"])
                indexes[device["name"]] = v2[0]
    shared = set(indexes.values())
    return {"hcas": hcas, "gid_index": shared.pop() if len(shared) == 1 else None, "gid_indexes": indexes}


def fabric_rdma_group_usable(rdma, host, interfaces, *, rail_ips, reads=None) -> dict:
    """fabric_rdma_usable for the ranks of a group: a rail's devices are given only where every member read in this
    run (`reads`: {host: its RDMA reading}) can use that rail too - NCCL pairs the ranks' devices by their order, and a
    rank with a rail its peers lack gains nothing from it. Adds `left_out`: [sentence] per rail usable here and left
    out, naming the members that cannot use it. `rdma`: this node's reading; interfaces: the rails' ports in order;
    rail_ips: {host: [its address on each rail]}."""
    def rail(h, i):
        ips = rail_ips.get(h) or []
        return {"interface": interfaces[i], "ip": ips[i] if i < len(ips) else ""}

    others = {h: r for h, r in (reads or {}).items() if h != host and r}
    kept, left_out = [], []
    for i, interface in enumerate(interfaces or []):
        if not fabric_rdma_usable(rdma, rail(host, i))["hcas"]:
            continue
        lacking = sorted(h for h, r in others.items() if not fabric_rdma_usable(r, rail(h, i))["hcas"])
        if lacking:
            left_out.append(f"rail {interface} is left out of NCCL_IB_HCA: {', '.join(lacking)} cannot use it (its "
                            "warning names why), and every rank is given the same rails")
        else:
            kept.append(rail(host, i))
    return {**fabric_rdma_usable(rdma, kept), "left_out": left_out}


def fabric_rdma_settled(rdma, rails) -> bool:
    """Whether the GID tables have caught up with the rails' addresses: every ACTIVE port behind a rail has a GID
    for the rail's address. The kernel fills them from the address events after netplan apply, a moment later
    than the address; a port that is not ACTIVE cannot get there and is not waited for."""
    for rail in _rails(rails):
        for _device, port in _fabric_ports(rdma, rail.get("interface")):
            if port.get("state") == "ACTIVE" and not _address_gids(port, rail.get("interface"), rail.get("ip")):
                return False
    return True


def fabric_rdma_reads(hosts, hostvars) -> dict:
    """{host: its newest RDMA reading} of `hosts`: read again after a change (tasks/reread.yml), else by the probe."""
    out = {}
    for host in hosts or []:
        facts = hostvars[host]
        reread = facts.get("__fabric_reread") or {}
        probe = facts.get("__fabric_probe") or {}
        out[host] = (reread.get("rdma") if "rdma" in reread and not reread.get("skipped") else probe.get("rdma")) or {}
    return out


def _rail_problems(rdma, rail, mtu):
    """(lines, problems, notes) of one rail's RDMA ports: a line per port, each cause that keeps NCCL off it,
    and what is not a fallback but costs bandwidth (a smaller active MTU)."""
    interface, address = rail.get("interface"), rail.get("ip")
    want_mtu = fabric_roce_mtu(mtu)
    lines, problems, notes = [], [], []
    ports = _fabric_ports(rdma, interface)
    if not ports:
        found = [f"{d['name']} ({', '.join(d.get('netdevs') or []) or 'no netdev'})" for d in rdma.get("devices") or []]
        if found:
            fix = ("set spark_fabric_interface to the cabled port that has one" if rail.get("primary", True)
                   else "name the netdev of a RoCE device in spark_fabric_extra_rails")
            problems.append(f"no RDMA device behind {interface}: the RoCE devices here serve {', '.join(found)}. "
                            f"Fix: {fix} (rdma link show lists each device's netdev)")
        else:
            problems.append("no RDMA device at all (/sys/class/infiniband is empty or absent): the ConnectX-7 RDMA "
                            "driver is not loaded. Fix: modprobe mlx5_ib (DGX OS loads it at boot; check dmesg for "
                            "why it did not)")
    devinfo = rdma.get("devinfo") or {}
    for device, port in ports:
        name = f"{device['name']} port {port.get('port')}"
        mine = _address_gids(port, interface, address)
        v2 = [g for g in mine if g.get("type") == "RoCE v2"]
        active = port.get("active_mtu")
        lines.append(f"{name} ({interface}): {port.get('state') or '?'}, active MTU {active or '?'}, "
                     + (f"RoCE v2 GID index {v2[0]['index']} ({address})" if v2 else f"no RoCE v2 GID for {address}"))
        if port.get("state") != "ACTIVE":
            if port.get("phys_state") != "LinkUp":
                problems.append(f"{name} is {port.get('state') or 'not active'} because {interface} has no link "
                                f"(physical state {port.get('phys_state') or 'unknown'}): the port check names the cause")
            else:
                problems.append(f"{name} is {port.get('state')} although {interface} has its link: the driver keeps "
                                "the RDMA port down. Fix: rdma link show and dmesg say why; reloading mlx5_ib or a "
                                "reboot brings it up")
        elif not v2:
            if mine:
                problems.append(f"{name} has {address} only in a GID of type {mine[0].get('type')} (index "
                                f"{mine[0]['index']}): NCCL uses RoCE v2, which is off on this device. Fix: turn RoCE "
                                "v2 on in its firmware configuration (mlxconfig) and check the GID table with show_gids")
            else:
                problems.append(f"{name} has no GID for {address}: the address is not on {interface}, so RoCE cannot "
                                f"reach the peers from it (ip addr show dev {interface})")
        if devinfo.get("rc") not in (0, None):
            lines.append(f"{name}: active MTU not read: ibv_devinfo "
                         + ("is not installed (apt install ibverbs-utils)" if devinfo.get("rc") == 127
                            else f"failed ({devinfo.get('stderr') or devinfo.get('rc')})"))
        elif active and active < want_mtu:
            cap = port.get("max_mtu")
            cause = f"the port's maximum is {cap}" if cap and cap < want_mtu else f"{interface}'s MTU is below {mtu}"
            notes.append(f"{name} runs RDMA at an active MTU of {active}, not the {want_mtu} that the fabric MTU "
                         f"{mtu} allows: {cause}. RDMA to the peers uses the smaller MTU: fewer bytes per packet")
    return lines, problems, notes


def fabric_rdma_report(reads, host, rails, mtu) -> dict:
    """Whether NCCL can use RoCE on `host`'s rails, and if not, why: {usable, lines, warnings}.

    reads: {host: the probe's `rdma` reading} of the hosts of this run (the newest: read again after a change);
    rails: [{interface, ip, primary}], the fabric port first. lines: one per RDMA port behind a rail (state, active
    MTU, RoCE v2 GID); warnings: each cause found, with its fix and what NCCL does instead (its socket transport
    where no rail is usable, the other rails otherwise), and a RoCE port that has its link but is no rail.
    """
    rdma = (reads or {}).get(host) or {}
    rails = _rails(rails)
    usable = fabric_rdma_usable(rdma, rails)
    primary = rails[0].get("interface") if rails else ""
    if usable["hcas"]:
        consequence = (f"NCCL runs RDMA on {', '.join(usable['hcas'])} only, a part of the link's bandwidth; the group "
                       "forms on the rails that work")
    else:
        consequence = SOCKET_FALLBACK.format(interface=primary)
    lines, warnings = [], []
    for rail in rails:
        rail_lines, problems, notes = _rail_problems(rdma, rail, mtu)
        lines += rail_lines
        warnings += [f"{p}; {consequence}" for p in problems] + notes
        for device, port in _fabric_ports(rdma, rail.get("interface")):
            active = port.get("active_mtu")
            for peer, peer_rdma in sorted((reads or {}).items()):
                if peer == host:
                    continue
                theirs = [p.get("active_mtu") for d, p in _fabric_ports(peer_rdma, rail.get("interface"))
                          if p.get("active_mtu")]
                if active and theirs and theirs[0] != active:
                    warnings.append(f"{device['name']} port {port.get('port')} has active MTU {active}, {peer} has "
                                    f"{theirs[0]}: RDMA between them runs at {min(active, theirs[0])}; give both ports "
                                    f"the fabric MTU {mtu}")
    if usable["hcas"] and usable["gid_index"] is None:
        lines.append("RoCE v2 GID indexes differ between the devices ("
                     + ", ".join(f"{h} {i}" for h, i in usable["gid_indexes"].items())
                     + "): NCCL_IB_GID_INDEX is left unset and NCCL picks each device's RoCE v2 IPv4 GID itself")
    named = {r.get("interface") for r in rails}
    idle = [(f"{d['name']} port {p.get('port')} ({n})", n) for d in rdma.get("devices") or []
            for p in d.get("ports") or [] for n in d.get("netdevs") or [] if n not in named and p.get("state") == "ACTIVE"]
    if idle and usable["hcas"]:
        one = len(idle) == 1
        labels = ", ".join(label for label, _netdev in idle)
        warnings.append(f"{labels} {'has' if one else 'have'} a link but {'is' if one else 'are'} "
                        f"no rail: NCCL is given {', '.join(usable['hcas'])} only, about half of a DGX Spark's link. Fix: "
                        "add each to spark_fabric_extra_rails with a subnet of its own (e.g. {interface: "
                        + idle[0][1] + ", subnet: 192.168.101.0/24})")
    return {"usable": usable, "lines": lines, "warnings": warnings}


def fabric_pair_rounds(members, play_hosts) -> list:
    """Every pair of the group's members that this run can measure, in rounds of pairs that share no node.

    A round-robin schedule (one node fixed, the others turning around it): n - 1 rounds for an even n, n for an
    odd one, so the pairs of a round run at once and the proof's wall time grows with the rounds, not the pairs.
    Each pair is {from, to, index, owner}: `from` the lower-ranked end (the head for a group of two), `index` its
    place among all pairs (for a port of its own), `owner` the end in this run that starts both of its ends
    (`to` where it can: a worker re-provisioned alone under --limit is still measured from the head). A pair with
    neither end in this run is left out.
    """
    members = list(members or [])
    play = set(play_hosts or [])
    ring = members + ([None] if len(members) % 2 else [])
    rounds, index = [], 0
    for _turn in range(max(len(ring) - 1, 0)):
        pairs = []
        for i in range(len(ring) // 2):
            ends = [ring[i], ring[len(ring) - 1 - i]]
            if None in ends:
                continue
            ends.sort(key=members.index)
            owner = ends[1] if ends[1] in play else ends[0] if ends[0] in play else None
            if owner:
                pairs.append({"from": ends[0], "to": ends[1], "index": index, "owner": owner})
            index += 1
        rounds.append(sorted(pairs, key=lambda p: (members.index(p["from"]), members.index(p["to"]))))
        ring = ring[:1] + ring[-1:] + ring[1:-1]
    return rounds


def fabric_rdma_pairs(reads, rounds, interfaces, *, rail_ips, port, links=None) -> dict:
    """What the RDMA bandwidth proof measures: {pairs, unmeasured}.

    rounds: fabric_pair_rounds; interfaces: the rails' ports, the fabric port first; rail_ips: {host: [its address on
    each rail]}. pairs: one {round, from, to, owner, rail, address, from_hca, from_gid, to_hca, to_gid, port} per
    rail usable on both ends of a pair whose ends both read their RDMA devices in this run (on each rail the n-th
    usable device of each; each its own port from `port` up); unmeasured: [sentence] for a pair that has a usable
    rail but where ib_write_bw is missing on either end. A rail not usable on both ends is not measured: the
    proof's warning already names why. links: [[rail index at `from`, rail index at `to`]] to measure on every pair
    (a ring's cable joins the first port of one end to the second of the other); by default each rail to itself.
    """
    reads = reads or {}
    interfaces = [interfaces] if isinstance(interfaces, str) else list(interfaces or [])
    pairs, unmeasured = [], []

    def usable(read, host, i):
        ips = rail_ips.get(host) or []
        return fabric_rdma_usable(read, {"interface": interfaces[i], "ip": ips[i] if i < len(ips) else ""})

    for number, round_pairs in enumerate(rounds or []):
        for pair in round_pairs:
            source, target = pair["from"], pair["to"]
            if source not in reads or target not in reads:
                continue
            mine, theirs = reads[source] or {}, reads[target] or {}
            rails = []
            for i, j in links or [(i, i) for i in range(len(interfaces))]:
                a, b = usable(mine, source, i), usable(theirs, target, j)
                rails += [(j, interfaces[i], x, a["gid_indexes"][x], y, b["gid_indexes"][y])
                          for x, y in zip(a["hcas"], b["hcas"], strict=False)]
            if not rails:
                continue
            missing = [h for h, r in ((source, mine), (target, theirs)) if not r.get("ib_write_bw")]
            if missing:
                unmeasured.append(f"{source} -> {target}: RDMA bandwidth not measured: ib_write_bw is not installed on "
                                  f"{' and '.join(missing)} (apt install perftest)")
                continue
            for i, interface, from_hca, from_gid, to_hca, to_gid in rails:
                pairs.append({"round": number, "from": source, "to": target, "owner": target, "rail": interface,
                              "address": rail_ips[target][i], "from_hca": from_hca, "from_gid": from_gid,
                              "to_hca": to_hca, "to_gid": to_gid, "port": int(port) + len(pairs)})
    return {"pairs": pairs, "unmeasured": unmeasured}


def fabric_write_bw_gbps(stdout):
    """ib_write_bw's average bandwidth (--report_gbits) from its result line, None where there is none."""
    for line in reversed(str(stdout or "").splitlines()):
        fields = line.split()
        if len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit():
            try:
                return float(fields[3])
            except ValueError:
                return None
    return None


def fabric_busbw_plan(reads, members, play_hosts, *, trust, unit) -> dict:
    """Whether the all-reduce proof can run across the group: {run, why_not}.

    reads: {host: the `name=path` / `unit=state` lines each member read (tasks/all_reduce.yml)}; members: the
    group in rank order; trust: whether the head's SSH trust to the workers is set up (mpirun launches over it).
    """
    outside = [m for m in members if m not in play_hosts]
    if outside:
        verb = "is" if len(outside) == 1 else "are"
        return {"run": False, "why_not": f"all-reduce bandwidth not measured: {', '.join(outside)} {verb} outside this "
                                         "run (--limit), and every rank takes part"}
    if not trust:
        return {"run": False, "why_not": "all-reduce bandwidth not measured: mpirun starts the workers' ranks over the "
                                         "head's fabric SSH trust, which fabric_ssh_trust turns off"}
    missing, busy = [], []
    for host in members:
        lines = dict(line.split("=", 1) for line in str((reads or {}).get(host) or "").splitlines() if "=" in line)
        missing += [f"{tool} on {host}" for tool, path in lines.items() if tool != "unit" and not path]
        if lines.get("unit") in ("active", "activating", "reloading"):
            busy.append(host)
    if busy:
        return {"run": False, "why_not": f"all-reduce bandwidth not measured: the ranks hold the GPUs ({unit} is "
                                         f"running on {', '.join(busy)}). Stop the group (playbooks/stop.yml) and run "
                                         "playbooks/fabric.yml -e fabric_busbw_always=true, then playbooks/restart.yml"}
    if missing:
        return {"run": False, "why_not": f"all-reduce bandwidth not measured: {', '.join(missing)} not found. Build "
                                         "nccl-tests with MPI=1 (make MPI=1 MPI_HOME=/usr/lib/aarch64-linux-gnu/openmpi) "
                                         "on every node and install openmpi-bin, or point fabric_busbw_all_reduce_perf "
                                         "and fabric_busbw_mpirun at them"}
    return {"run": True, "why_not": ""}


def fabric_all_reduce(stdout) -> dict:
    """What all_reduce_perf (NCCL_DEBUG=INFO) printed: {busbw, network, hosts}. busbw: the average bus bandwidth in
    GB/s (None where there is no result); network: `IB` or `Socket` as NCCL says it chose (None: not said);
    hosts: {host: the RDMA devices its NET/IB line lists, [] where it found none}."""
    busbw, networks, hosts = None, set(), {}
    for line in str(stdout or "").splitlines():
        if line.startswith("# Avg bus bandwidth"):
            try:
                busbw = float(line.split(":", 1)[1].split()[0])
            except (IndexError, ValueError):
                busbw = None
        elif " NCCL INFO Using network " in line:
            networks.add(line.rsplit(" ", 1)[1])
        elif " NCCL INFO NET/IB : " in line:
            host = line.split(":", 1)[0]
            said = line.split(" NCCL INFO NET/IB : ", 1)[1]
            hosts[host] = ([] if said.startswith("No device found")
                           else [w.split("]", 1)[1].split(":", 1)[0] for w in said.split(";")[0].split() if w.startswith("[")
                                 and "]" in w and ":" in w])
    network = "Socket" if "Socket" in networks else ("IB" if "IB" in networks else None)
    return {"busbw": busbw, "network": network, "hosts": hosts}


def _pair_ends(pair, members):
    """(from, from_hca, to, to_hca) of a recorded pair; a record written before every pair was measured named the
    head's device and the worker only (the head was always the measuring end)."""
    source = pair.get("from") or (list(members or [])[:1] or [""])[0]
    return (source, pair.get("from_hca") or pair.get("head_hca"), pair.get("to") or pair.get("worker"),
            pair.get("to_hca") or pair.get("worker_hca"))


def _iperf_gbps(result):
    try:
        return round(json.loads(result.get("stdout") or "")["end"]["sum_received"]["bits_per_second"] / 1e9, 2)
    except (KeyError, TypeError, ValueError):
        return None


def fabric_record(previous, *, time, members, rails, rdma_results=None, busbw=None, busbw_bytes="",
                  iperf_results=None) -> dict:
    """The proof's record on the head: the previous record with what this run measured put in its place.

    rdma_results: the ib_write_bw runs (each with the pair as `item`), None where none ran; iperf_results: the iperf3
    runs (each with its pair as `item`), None where none ran; busbw: the all_reduce_perf run, None where it did not
    run. Each figure keeps the time it was taken: a run that measured one keeps the others.
    """
    record = {**(previous or {}), "kind": "spark-llm-fabric-proof", "members": list(members or []),
              "rails": list(rails or [])}
    if rdma_results is not None:
        record["rdma_write"] = {"time": time, "pairs": [
            {"rail": r["item"].get("rail"), "from": r["item"]["from"], "from_hca": r["item"]["from_hca"],
             "to": r["item"]["to"], "to_hca": r["item"]["to_hca"],
             "gbits_per_second": fabric_write_bw_gbps(r.get("stdout")) if r.get("rc") == 0 else None}
            for r in rdma_results or [] if isinstance(r.get("item"), dict)]}
    if iperf_results is not None:
        record["tcp"] = {"time": time, "pairs": [
            {"from": r["item"]["from"], "to": r["item"]["to"],
             "gbits_per_second": _iperf_gbps(r) if r.get("rc") == 0 else None}
            for r in iperf_results or [] if isinstance(r.get("item"), dict)]}
    if busbw is not None:
        said = fabric_all_reduce(busbw.get("stdout"))
        record["all_reduce"] = {"time": time, "bytes": str(busbw_bytes), "network": said["network"],
                                "busbw_gbytes_per_second": said["busbw"] if busbw.get("rc") == 0 else None,
                                "devices": said["hosts"]}
    return record


def fabric_record_lines(record) -> list:
    """The record's figures as lines for a report, one per measured pair (and rail): [] where nothing was measured yet."""
    lines = []
    members = (record or {}).get("members") or []
    rdma = (record or {}).get("rdma_write") or {}
    for p in rdma.get("pairs") or []:
        source, source_hca, target, target_hca = _pair_ends(p, members)
        figure = "failed" if p.get("gbits_per_second") is None else f"{p['gbits_per_second']:.2f} Gbit/s"
        lines.append(f"fabric: RDMA write {source} {source_hca} -> {target} {target_hca} "
                     f"({p.get('rail')}): {figure} (measured {rdma.get('time')})")
    tcp = (record or {}).get("tcp") or {}
    for p in tcp.get("pairs") or []:
        figure = "failed" if p.get("gbits_per_second") is None else f"{p['gbits_per_second']:.2f} Gbit/s"
        lines.append(f"fabric: TCP (iperf3) {p.get('from')} -> {p.get('to')}: {figure} (measured {tcp.get('time')})")
    ar = (record or {}).get("all_reduce") or {}
    if ar:
        figure = ("failed" if ar.get("busbw_gbytes_per_second") is None
                  else f"{ar['busbw_gbytes_per_second']} GB/s bus bandwidth over NCCL's {ar.get('network')} transport")
        lines.append(f"fabric: all-reduce across {', '.join(members)} ({ar.get('bytes')} messages): "
                     f"{figure} (measured {ar.get('time')})")
    return lines


class FilterModule:
    def filters(self):
        return {
            "fabric_ipv4_error": fabric_ipv4_error,
            "fabric_network": fabric_network,
            "fabric_in_network": fabric_in_network,
            "fabric_off_subnet": fabric_off_subnet,
            "fabric_ifaces_in_network": fabric_ifaces_in_network,
            "fabric_rail_address": fabric_rail_address,
            "fabric_rails": fabric_rails,
            "fabric_rail_ips": fabric_rail_ips,
            "fabric_rails_errors": fabric_rails_errors,
            "fabric_rail_probes": fabric_rail_probes,
            "fabric_rails_drift": fabric_rails_drift,
            "fabric_ports_down": fabric_ports_down,
            "fabric_rails_settled": fabric_rails_settled,
            "fabric_rail_faults": fabric_rail_faults,
            "fabric_rails_report": fabric_rails_report,
            "fabric_known_host_lines": fabric_known_host_lines,
            "fabric_stale_keys": fabric_stale_keys,
            "fabric_stale_pins": fabric_stale_pins,
            "fabric_route_faults": fabric_route_faults,
            "fabric_ping_faults": fabric_ping_faults,
            "fabric_trust_gaps": fabric_trust_gaps,
            "fabric_nft_missing": fabric_nft_missing,
            "fabric_nft_missing_rails": fabric_nft_missing_rails,
            "fabric_nft_missing_forward": fabric_nft_missing_forward,
            "fabric_port": fabric_port,
            "fabric_peer_port": fabric_peer_port,
            "fabric_drift": fabric_drift,
            "fabric_port_cause": fabric_port_cause,
            "fabric_roce_mtu": fabric_roce_mtu,
            "fabric_rdma_usable": fabric_rdma_usable,
            "fabric_rdma_reads": fabric_rdma_reads,
            "fabric_rdma_group_usable": fabric_rdma_group_usable,
            "fabric_rdma_settled": fabric_rdma_settled,
            "fabric_rdma_report": fabric_rdma_report,
            "fabric_pair_rounds": fabric_pair_rounds,
            "fabric_rdma_pairs": fabric_rdma_pairs,
            "fabric_write_bw_gbps": fabric_write_bw_gbps,
            "fabric_busbw_plan": fabric_busbw_plan,
            "fabric_all_reduce": fabric_all_reduce,
            "fabric_record": fabric_record,
            "fabric_record_lines": fabric_record_lines,
            "fabric_ring_plan": fabric_ring.plan,
            "fabric_ring_rail_ips": fabric_ring.rail_ips,
            "fabric_ring_pair_rounds": fabric_ring.pair_rounds,
            "fabric_ring_errors": fabric_ring.input_errors,
            "fabric_ring_cabling_errors": fabric_ring.cabling_errors,
            "fabric_ring_readings": fabric_ring.readings,
        }

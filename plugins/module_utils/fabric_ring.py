"""A TP group of three or four DGX Sparks cabled in a ring, without a switch.

Each Spark has two QSFP ports. In a ring the first port of every node (`ports[0]`) is cabled to the second port of
the next node (`ports[1]`), the cross-connect the field's three- and four-node set-ups use, and the last node closes
the ring on the first. Every cable is a subnet of its own: the k-th /30 of the ring subnet joins the k-th node of the
group (its first port takes the first host address) to the next (its second port, the second). The node's own
address, the one every rank, the rendezvous and the checkpoint sync use (spark_fabric_ip), is a /32 on a device of its
own (a bridge without ports, the group's spark_fabric_interface) and is reached over host routes: a neighbour directly over the
cable between them, the node across a four-node ring through the neighbour that comes first in the group, the same
neighbour in both directions so that each flow comes back the way it went. The ranks' order is the group's order,
which must be the order around the ring: NCCL's ring then sends each rank's share to a node it is cabled to.
"""

from __future__ import annotations

import ipaddress
import json

RING_SIZES = (3, 4)
SUBNET_VAR = "fabric_ring_subnet (spark_fabric_ring_subnet)"
PORTS_VAR = "fabric_ring_ports (spark_fabric_ring_ports)"
CABLE_PREFIX = 30


def _network(subnet):
    try:
        return ipaddress.IPv4Network(str(subnet), strict=True)
    except ValueError:
        return None


def cables(members, ports, subnet) -> list:
    """The ring's cables in group order: [{index, subnet, a, a_port, a_ip, b, b_port, b_ip}], cable k joining
    members[k]'s first port to members[k + 1]'s second. `ports`: {host: [first port, second port]}."""
    members = list(members or [])
    net = _network(subnet)
    if net is None or len(members) not in RING_SIZES or net.prefixlen > CABLE_PREFIX:
        return []
    nets = list(net.subnets(new_prefix=CABLE_PREFIX))
    out = []
    for k, a in enumerate(members):
        b = members[(k + 1) % len(members)]
        cable = nets[k] if k < len(nets) else None
        if cable is None:
            return []
        out.append({"index": k, "subnet": str(cable), "a": a, "a_port": ports[a][0], "a_ip": str(cable[1]),
                    "b": b, "b_port": ports[b][1], "b_ip": str(cable[2])})
    return out


def neighbours(members, host) -> tuple:
    """(next, previous) of `host` around the ring of `members`."""
    members = list(members)
    k = members.index(host)
    return members[(k + 1) % len(members)], members[(k - 1) % len(members)]


def via(members, host, peer) -> str:
    """The neighbour of `host` that its traffic to `peer` goes through: the peer itself where it is a neighbour,
    else (across a ring of four) the common neighbour that comes first in the group - the same for both ends."""
    nxt, prev = neighbours(members, host)
    if peer in (nxt, prev):
        return peer
    common = [n for n in members if n in neighbours(members, host) and n in neighbours(members, peer)]
    return min(common, key=list(members).index)


def plan(members, ips, ports, subnet, interface) -> dict:
    """Every member's part of the ring: {host: {rails, routes, rail_peers, neighbours}}.

    ips: {host: node address}; ports: {host: [first port, second port]}; interface: the node address's device.
    rails: [{interface, ip, prefix, primary}] - the node address (/32) first, then the first and second port with
    their cable's address; routes: [{peer, to, via, interface, from}] one host route per peer; rail_peers: per rail
    the cable's other end (none for the node address); ingress: per port, the addresses that come in on it (the
    cable's other end and the node addresses routed over that cable: a host firewall's accept rules);
    neighbours: {port: the host at the cable's other end}. Empty where the ring cannot be laid out (the input
    checks name why)."""
    wires = cables(members, ports, subnet)
    if not wires:
        return {}
    out = {}
    for k, host in enumerate(members):
        ahead, behind = wires[k], wires[(k - 1) % len(members)]
        # Through each port: the neighbour at its other end, and that neighbour's address on the cable.
        far = {ahead["a_port"]: (ahead["b"], ahead["b_ip"]), behind["b_port"]: (behind["a"], behind["a_ip"])}
        port_of = {n: p for p, (n, _ip) in far.items()}
        routes = []
        for peer in members:
            if peer == host:
                continue
            port = port_of[via(members, host, peer)]
            routes.append({"peer": peer, "to": f"{ips[peer]}/32", "via": far[port][1], "interface": port,
                           "from": ips[host]})
        rails = [{"interface": interface, "ip": ips[host], "prefix": 32, "primary": True},
                 {"interface": ahead["a_port"], "ip": ahead["a_ip"], "prefix": CABLE_PREFIX, "primary": False},
                 {"interface": behind["b_port"], "ip": behind["b_ip"], "prefix": CABLE_PREFIX, "primary": False}]
        rail_peers = [{"interface": interface, "peers": []}] + [
            {"interface": port, "peers": [address]} for port, (_n, address) in far.items()]
        ingress = [{"interface": port, "peers": [address] + [ips[r["peer"]] for r in routes if r["interface"] == port]}
                   for port, (_n, address) in far.items()]
        out[host] = {"rails": rails, "routes": routes, "rail_peers": rail_peers, "ingress": ingress,
                     "neighbours": {port: n for port, (n, _ip) in far.items()}}
    return out


def rail_ips(plans) -> dict:
    """{host: [its address on each rail, the node address first]} of a ring plan."""
    return {h: [r["ip"] for r in p["rails"]] for h, p in (plans or {}).items()}


def pair_rounds(members, play_hosts) -> list:
    """The ring's cables as pairs to measure, in rounds of cables that share no node (two rounds for a ring of four,
    three for three), shaped as fabric_pair_rounds': {from, to, index, owner} (`from` the cable's first port's node)."""
    members = list(members or [])
    play = set(play_hosts or [])
    n = len(members)
    if n not in RING_SIZES:
        return []
    order = [[0, 2], [1, 3]] if n == 4 else [[0], [1], [2]]
    rounds = []
    for cable_indexes in order:
        pairs = []
        for k in cable_indexes:
            a, b = members[k], members[(k + 1) % n]
            owner = b if b in play else a if a in play else None
            if owner:
                pairs.append({"from": a, "to": b, "index": k, "owner": owner})
        rounds.append(pairs)
    return rounds


def input_errors(members, subnet, ports, *, interface, node_ip, node_prefix, netdevs=None) -> list:
    """Why this node's ring input cannot be laid out: [sentence with its fix], empty when it can. `ports`: this
    node's [first port, second port]; netdevs: its interfaces (None: not read)."""
    members = list(members or [])
    errors = []
    if len(members) not in RING_SIZES:
        errors.append(f"{SUBNET_VAR} is set, so the TP group is a ring, but it has {len(members)} node(s) "
                      f"({', '.join(members)}): a ring without a switch is three or four DGX Sparks, each with its two "
                      "ports cabled to its two neighbours. Fix: leave spark_fabric_ring_subnet empty for a pair (one "
                      "cable) or a switched fabric; more than four nodes need a switch.")
    net = _network(subnet)
    if net is None:
        errors.append(f"{SUBNET_VAR} is {subnet!r}, not an IPv4 network in CIDR form with its host bits zero. Fix: "
                      "e.g. 192.168.110.0/24 (one /30 of it per cable).")
    elif net.num_addresses < 4 * max(len(members), 1):
        errors.append(f"{SUBNET_VAR} {net} holds fewer than the {len(members)} /30s the ring's cables take. Fix: a "
                      "/28 or larger, e.g. 192.168.110.0/24.")
    else:
        try:
            own = ipaddress.IPv4Network(f"{node_ip}/{int(node_prefix)}", strict=False)
        except (TypeError, ValueError):
            own = None
        if own is not None and own.overlaps(net):
            errors.append(f"{SUBNET_VAR} {net} overlaps the nodes' own subnet {own} (spark_fabric_ip / "
                          "spark_fabric_prefix): the kernel would take a node address for one on a cable. Fix: a "
                          "subnet of its own for the cables, e.g. 192.168.110.0/24.")
    if not isinstance(ports, list) or len(ports) != 2 or not all(isinstance(p, str) and p for p in ports) \
            or ports[0] == ports[1]:
        errors.append(f"{PORTS_VAR} is {ports!r}: it must name the node's two QSFP ports, the one cabled to the next "
                      "node of the ring first. Fix: e.g. [enp1s0f0np0, enp1s0f1np1].")
        return errors
    if interface in ports:
        errors.append(f"spark_fabric_interface is {interface}, one of the ring's ports: in a ring it names the device "
                      "that holds the node's own address (a bridge without ports the fabric role creates), which both "
                      "cables reach. Fix: e.g. spark_fabric_interface: fabric0.")
    missing = [p for p in ports if netdevs is not None and p not in netdevs]
    if missing:
        errors.append(f"{PORTS_VAR} names {', '.join(missing)}, which this node does not have (it has "
                      f"{', '.join(sorted(netdevs))}). Fix: the netdevs of the two cabled QSFP ports (ibdev2netdev "
                      "lists them).")
    return errors


def _ring_order(start, links) -> list:
    """Follow first port to the next node's second port from `start`; the order if it closes over every node."""
    order, host = [start], start
    while True:
        step = links.get(host)
        if step is None:
            return []
        host = step
        if host == start:
            return order
        if host in order:
            return []
        order.append(host)


def readings(hosts, hostvars) -> dict:
    """{host: {links, neighbours}} from the fabric probe each of `hosts` ran in this run (its `ip -j addr show` and the
    link-local addresses that answered on its ports), for cabling_errors."""
    out = {}
    for host in hosts or []:
        probe = hostvars[host].get("__fabric_probe") or {}
        try:
            links = json.loads((probe.get("addrs") or {}).get("stdout") or "[]")
        except ValueError:
            links = []
        out[host] = {"links": links, "neighbours": probe.get("neighbours") or {}}
    return out


def cabling_errors(members, ports, readings) -> list:
    """Where the cables the nodes report differ from the ring the group's order lays out: [sentence with its fix].

    readings: {host: {"links": `ip -j addr show` of the node, "neighbours": {port: [link-local addresses that
    answered on it]}}} of the members read in this run. A port that heard nobody is not judged (its link is down
    before the fabric is configured; the proof names it). The fix names the order that the cables do close, where
    they close one."""
    members = list(members or [])
    owner = {}
    for host, reading in (readings or {}).items():
        for iface in reading.get("links") or []:
            if iface.get("ifname") not in (ports.get(host) or []):
                continue
            for a in iface.get("addr_info") or []:
                if a.get("family") == "inet6" and a.get("scope") == "link":
                    owner[str(a.get("local"))] = (host, iface["ifname"])
    seen, errors = {}, []
    for host in members:
        reading = (readings or {}).get(host)
        if not reading:
            continue
        for side, port in enumerate(ports.get(host) or []):
            # A node hears its own port answer the all-nodes group too.
            heard = sorted({owner[a] for a in (reading.get("neighbours") or {}).get(port) or []
                            if a in owner and owner[a][0] != host})
            if heard:
                seen[(host, side)] = heard
    wrong = []
    for (host, side), heard in sorted(seen.items(), key=lambda kv: (members.index(kv[0][0]), kv[0][1])):
        # Each cable once: from its first port's end, from the other where that end heard nobody.
        if side == 1 and any(side_ == 0 and h == heard[0][0] for (h, side_) in seen) and len(heard) == 1:
            continue
        nxt, prev = neighbours(members, host)
        want = (nxt, ports[nxt][1]) if side == 0 else (prev, ports[prev][0])
        if heard != [want]:
            got = ", ".join(f"{h}'s {p}" for h, p in heard)
            wrong.append(f"{host}'s {ports[host][side]} (cabled, by the group's order, to "
                         f"{want[0]}'s {want[1]}) reaches {got}")
    dark = []
    for host in members:
        for iface in ((readings or {}).get(host) or {}).get("links") or []:
            flags = iface.get("flags") or []
            if iface.get("ifname") in (ports.get(host) or []) and "UP" in flags and "NO-CARRIER" in flags:
                dark.append(f"{host}'s {iface['ifname']}")
    if dark:
        errors.append(f"the ring does not close: {', '.join(dark)} {'is' if len(dark) == 1 else 'are'} up without "
                      "carrier - no cable in the port, or the neighbour at its other end is off or has its port down. "
                      "Fix: cable each node's first port to the next node's second port (the last node's to the "
                      "first's), with every node of the group powered on.")
    if not wrong:
        return errors
    links = {host: heard[0][0] for (host, side), heard in seen.items()
             if side == 0 and len(heard) == 1 and heard[0][1] == ports[heard[0][0]][1]}
    order = _ring_order(members[0], links) if len(links) == len(members) else []
    if sorted(order) == sorted(members):
        fix = (f"the cables close the ring {' -> '.join(order + order[:1])}: list the group's hosts in that order "
               "(the head first; the ranks follow it), or recable each node's first port to the next node's second")
    else:
        fix = ("the cables do not close one ring over the group's nodes: cable each node's first port to the next "
               "node's second port, the last node's to the first's")
    errors.append("the ring's cabling is not the group's order: " + "; ".join(wrong) + f". Fix: {fix}.")
    return errors

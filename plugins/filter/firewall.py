"""Who may connect to the TP group: the firewall role's rule set, planned on the controller.

One computation serves the inventory check (before any node is contacted), the deployment (after
a read-only probe of the node) and the template: ``firewall_plan`` validates the input,
derives the default client range, builds the rules as data (each rule once, with its nft text),
and runs the controller's own packets - its SSH session to each node, and verify's request to
the head's HTTP port - through those same rules. A rule set that would drop either is refused
with the variable, the value, why and the fix; the template prints exactly the rules checked.

The table only drops what must be closed and lets every other packet continue to the other
tables of the ruleset (ufw's, iptables-nft's, the site's): an accept in one nftables table
cannot overrule another table's drop, and a drop in any base chain is final.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import inputs
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_reads import drift_of_paths_and_units

IFNAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
NAMES = {
    "allowed_clients": "firewall_allowed_clients",
    "http_extra_clients": "firewall_http_extra_clients",
    "http_port": "firewall_http_port",
    "dist_ports": "firewall_dist_ports",
    "fabric_interface": "firewall_fabric_interface",
    "fabric_ip": "spark_fabric_ip",
    "ssh_port": "ansible_port",
    "sync_ports": "firewall_fabric_sync_ports",
}


def _address(text):
    """An IP address (no zone), or None."""
    if not isinstance(text, str) or "%" in text:
        return None
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _host_prefix(address):
    return f"{address}/{address.max_prefixlen}"


def _networks(value, var, errors, empty="the head's management subnet"):
    """The allowed clients as ip_network objects; None when the value is unusable (errors say why)."""
    if value is None:
        value = []
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        errors.append(
            f"{var} = {inputs.shown(value)}: must be a list of networks (CIDR) or addresses. Fix: e.g. {var}: "
            f"['10.0.0.0/24', '10.0.5.7'], or [] for {empty}."
        )
        return None
    nets = []
    bad = False
    for i, item in enumerate(value):
        where = f"{var}[{i}] = {inputs.shown(item)}"
        text = item.strip() if isinstance(item, str) else ""
        if not text or "%" in text:
            errors.append(
                f"{where}: not a network. Fix: a CIDR string such as '10.0.0.0/24', or one address such as "
                "'10.0.0.5' (no interface zone)."
            )
            bad = True
            continue
        strict_error = None
        try:
            nets.append(ipaddress.ip_network(text, strict=True))
            continue
        except ValueError as err:
            strict_error = err
        try:
            loose = ipaddress.ip_network(text, strict=False)
        except ValueError:
            errors.append(
                f"{where}: does not parse as an IPv4 or IPv6 network ({strict_error}). Fix: a CIDR such as "
                "'10.0.0.0/24', or one address such as '10.0.0.5'."
            )
            bad = True
            continue
        host = text.split("/", 1)[0]
        errors.append(
            f"{where}: has host bits set, so it does not say whether the subnet or the one host is meant. Fix: "
            f"'{loose}' for the subnet, or '{host}/{loose.max_prefixlen}' for that host alone."
        )
        bad = True
    return None if bad else nets


def _route(answer):
    """(source address, gateway) of an `ip -j route get` answer (parsed or text); (None, None) if none."""
    if isinstance(answer, str):
        try:
            answer = json.loads(answer or "[]")
        except ValueError:
            return None, None
    if isinstance(answer, list) and answer and isinstance(answer[0], Mapping):
        return _address(answer[0].get("prefsrc")), answer[0].get("gateway")
    return None, None


def _ssh_connection(probe):
    """(client, server) addresses of the SSH session a probe ran in, as the node sees them."""
    words = str((probe or {}).get("ssh_connection") or "").split()
    if len(words) >= 3:
        return _address(words[0]), _address(words[2])
    return None, None


def _subnet_of(probe, address):
    """(network, interface) of the node's address `address` in the probe's `ip -j addr show`."""
    for iface in (probe or {}).get("addrs") or []:
        for info in iface.get("addr_info") or []:
            local = _address(info.get("local"))
            if local is not None and local == address and isinstance(info.get("prefixlen"), int):
                return ipaddress.ip_interface(f"{local}/{info['prefixlen']}").network, iface.get("ifname")
    return None, None


def _port_range(value):
    """[low, high] from `net.ipv4.ip_local_port_range` as read ("32768\t60999" or a pair), else None."""
    words = value.split() if isinstance(value, str) else list(value or [])
    ports = [inputs.port(w) for w in words]
    if len(ports) == 2 and None not in ports and ports[0] <= ports[1]:
        return ports
    return None


def _sync(ctx, fabric_ips, nodes, names, errors):
    """The site's other groups' fabric addresses and the ports they may reach here for the checkpoint's sync:
    {peers, ports, ranges}; none on a one-group site."""
    hosts = [h for h in ctx.get("sync_hosts") or [] if h not in nodes]
    peers = []
    for host in hosts:
        address = _address(str((ctx.get("sync_fabric_ips") or {}).get(host, fabric_ips.get(host))))
        if address is not None and address.version == 4 and str(address) not in peers:
            peers.append(str(address))
    ports, ranges = [], []
    var = names.get("sync_ports", "firewall_fabric_sync_ports")
    raw = ctx.get("sync_ports") or []
    for value in raw if isinstance(raw, (list, tuple)) else [raw]:
        words = str(value).split("-") if isinstance(value, str) and "-" in value else [value]
        bounds = [inputs.port(w) for w in words]
        if None in bounds or (len(bounds) == 2 and bounds[0] > bounds[1]):
            errors.append(f"{var} = {inputs.shown(raw)}: {inputs.shown(value)} is neither a TCP port nor a range "
                          "low-high of them. Fix: e.g. [22, \"28730-28737\"].")
        elif len(bounds) == 1:
            ports.append(bounds[0])
        else:
            ranges.append(bounds)
    return {"peers": peers, "ports": ports, "ranges": ranges}


def firewall_route_commands(addresses):
    """{address: shell command} reading the controller's route to each IP literal among `addresses`.

    Only addresses that parse become commands (no name is resolved, nothing is sent: the kernel's
    routing table answers), so a command holds nothing but the normalised address.
    """
    out = {}
    for text in addresses or []:
        address = _address(str(text))
        if address is not None:
            out[str(address)] = f"ip -j route get {address} 2>/dev/null || echo '[]'"
    return out


# --- the rules as data: one list, printed by the template and evaluated by the checks ---------------


def _rules(plan):
    """{chain: [rule]}; a rule is {match, verdict, comment, cause} in evaluation order."""
    names = plan["names"]
    chains = {"input": [{"match": {"iif": "lo"}, "verdict": "accept", "comment": "loopback: always allowed"}]}
    if plan["http"]:
        chains["input"].append({"match": {"dport": plan["http_port"]}, "verdict": "jump http_port"})
        chains["http_port"] = [
            {"match": {"saddr_set": "http_clients_ip"}, "verdict": "accept"},
            {"match": {"saddr_set": "http_clients_ip6"}, "verdict": "accept"},
            {"match": {}, "verdict": "drop", "comment": "server http: not an allowed client",
             "cause": f"the HTTP port ({names['http_port']} = {plan['http_port']}) admits only "
                      f"{plan['clients_source']}"},
        ]
    for svc in plan.get("services", []):
        chain = svc["chain"]
        chains["input"].append({"match": {"dport": svc["port"]}, "verdict": f"jump {chain}"})
        chains[chain] = [
            {"match": {"saddr_set": f"{chain}_ip"}, "verdict": "accept"},
            {"match": {"saddr_set": f"{chain}_ip6"}, "verdict": "accept"},
            {"match": {}, "verdict": "drop", "comment": f"{svc['name']}: not an allowed client",
             "cause": f"the {svc['name']} port ({svc['var']} = {svc['port']}) admits only {svc['source']}"},
        ]
    chains["input"].append(
        {"match": {"iifname": plan["fabric_interface"], "saddr_set": "fabric_peers"}, "verdict": "accept",
         "comment": "the TP group's peers on the fabric"})
    sync = plan.get("sync") or {}
    if sync.get("peers"):
        # Only the checkpoint's sync (its ssh and its rsync daemon's ports) from the site's other groups: their
        # ranks never reach this group's.
        if sync["ports"]:
            chains["input"].append(
                {"match": {"iifname": plan["fabric_interface"], "saddr_set": "fabric_sync_peers",
                           "dports": sync["ports"]}, "verdict": "accept",
                 "comment": "the checkpoint's sync from the site's other groups"})
        for low, high in sync["ranges"]:
            chains["input"].append(
                {"match": {"iifname": plan["fabric_interface"], "saddr_set": "fabric_sync_peers",
                           "dport_range": [low, high]}, "verdict": "accept",
                 "comment": "the checkpoint's sync from the site's other groups"})
        # This node's own sync connections to them (its ssh out as a source, its pull from their daemon): the
        # answers come back to the fabric address, which is closed to all but the group's peers.
        chains["input"].append(
            {"match": {"iifname": plan["fabric_interface"], "saddr_set": "fabric_sync_peers",
                       "ct": "established,related"}, "verdict": "accept",
             "comment": "answers to this node's sync connections to the site's other groups"})
    chains["input"].append({"match": {}, "verdict": "jump rank_ports"})
    chains["rank_ports"] = []
    ports = plan["dist_ports"]
    if ports:
        chains["rank_ports"].append(
            {"match": {"dports": plan["dist_ports"]}, "verdict": "drop",
             "comment": "dist-init (TCPStore): fabric peers only",
             "cause": f"{names['dist_ports']} = {inputs.shown(ports if len(ports) > 1 else ports[0])} "
                      "(the TCPStore, listening on every address) "
                      "is closed to all but the TP group's peers on the fabric"})
    if plan["local_ports"]:
        low, high = plan["local_ports"]
        chains["rank_ports"].append(
            {"match": {"dport_range": [low, high], "ct": "new"}, "verdict": "drop",
             "comment": "rank 0 listeners on random ports: fabric peers only",
             "cause": f"the node's ephemeral ports {low}-{high} (where rank 0 listens on every address at random ports, "
                      "e.g. its broadcast queue) take new connections from the TP group's peers on the fabric only"})
    chains["rank_ports"].append(
        {"match": {"daddr": plan["fabric_ip"]}, "verdict": "drop",
         "comment": "NCCL/Gloo on the fabric address: fabric peers only",
         "cause": f"the fabric address {plan['fabric_ip']} ({names['fabric_ip']}) is closed to all but the TP group's "
                  "peers on the fabric"})
    return chains


def _sets(plan):
    sets = {"fabric_peers": {"type": "ipv4_addr", "interval": False, "elements": plan["peers"]}}
    if (plan.get("sync") or {}).get("peers"):
        sets["fabric_sync_peers"] = {"type": "ipv4_addr", "interval": False, "elements": plan["sync"]["peers"]}
    if plan["http"]:
        sets["http_clients_ip"] = {"type": "ipv4_addr", "interval": True, "elements": plan["clients"]["ip"]}
        sets["http_clients_ip6"] = {"type": "ipv6_addr", "interval": True, "elements": plan["clients"]["ip6"]}
    for svc in plan.get("services", []):
        sets[f"{svc['chain']}_ip"] = {"type": "ipv4_addr", "interval": True, "elements": svc["ip"]}
        sets[f"{svc['chain']}_ip6"] = {"type": "ipv6_addr", "interval": True, "elements": svc["ip6"]}
    return sets


def _nft(rule, sets):
    match = rule["match"]
    words = []
    if match.get("iif"):
        words.append(f'iif "{match["iif"]}"')
    if isinstance(match.get("iifname"), list):
        words.append("iifname { " + ", ".join(f'"{name}"' for name in match["iifname"]) + " }")
    elif "iifname" in match:
        words.append(f'iifname "{match["iifname"]}"')
    if "saddr_set" in match:
        family = "ip" if sets[match["saddr_set"]]["type"] == "ipv4_addr" else "ip6"
        words.append(f"{family} saddr @{match['saddr_set']}")
    if "daddr" in match:
        words.append(f"ip daddr {match['daddr']}")
    if "dport" in match:
        words.append(f"tcp dport {match['dport']}")
    if "dports" in match:
        words.append("tcp dport { " + ", ".join(str(p) for p in match["dports"]) + " }")
    if "dport_range" in match:
        words.append("tcp dport {}-{}".format(*match["dport_range"]))
    if match.get("ct"):
        words.append(f"ct state {match['ct']}")
    if rule["verdict"] == "drop":
        words.append("counter")
    words.append(rule["verdict"])
    if rule.get("comment"):
        words.append(f'comment "{rule["comment"]}"')
    return " ".join(words)


def _in_set(address, spec):
    family = 4 if spec["type"] == "ipv4_addr" else 6
    if address.version != family:
        return False
    return any(address in ipaddress.ip_network(element) for element in spec["elements"])


def _matches(match, packet, sets):
    if match.get("iif") and packet["iif"] != match["iif"]:
        return False
    names = match.get("iifname")
    if names is not None and packet["iif"] not in (names if isinstance(names, list) else [names]):
        return False
    if "saddr_set" in match and not _in_set(packet["saddr"], sets[match["saddr_set"]]):
        return False
    if "daddr" in match and (packet["daddr"].version != 4 or str(packet["daddr"]) != match["daddr"]):
        return False
    if "dport" in match and packet["dport"] != match["dport"]:
        return False
    if "dport_range" in match and not match["dport_range"][0] <= packet["dport"] <= match["dport_range"][1]:
        return False
    if match.get("ct") and packet.get("ct", "new") not in match["ct"].split(","):
        return False
    return not ("dports" in match and packet["dport"] not in match["dports"])


def firewall_verdict(plan, packet, chain="input"):
    """(verdict, rule) for the first TCP packet of a connection {saddr, daddr, dport, iif} in `plan`'s
    table (or one of conntrack state `ct`, e.g. "established"); (None, None) when the table lets it continue
    to the rest of the ruleset (the base chain's policy is accept)."""
    packet = dict(packet, saddr=ipaddress.ip_address(str(packet["saddr"])),
                  daddr=ipaddress.ip_address(str(packet["daddr"])), dport=int(packet["dport"]))
    for rule in plan["chains"][chain]:
        if not _matches(rule["match"], packet, plan["sets"]):
            continue
        if rule["verdict"].startswith("jump "):
            verdict, found = firewall_verdict(plan, packet, rule["verdict"][5:])
            if verdict:
                return verdict, found
            continue
        return rule["verdict"], rule
    return None, None


# --- the plan ---------------------------------------------------------------------------------------


def _controller(ctx, probe, route_answer, target):
    """(address, how it was found) of the controller as `target`'s node sees it; ('local', ...) when the
    controller is that node; (None, why) when nothing tells."""
    if str(ctx.get("connection") or "ssh") == "local":
        return "local", "the controller is the node itself (ansible_connection local)"
    client, _server = _ssh_connection(probe)
    if client is not None:
        return client, "the address the node sees the controller's SSH session come from"
    source, gateway = _route(route_answer)
    if source is not None:
        via = f" via the gateway {gateway}" if gateway else ""
        return source, f"the source address of the controller's route to {target}{via}"
    return None, ""


def firewall_plan(ctx, hostvars=None):
    """Validate, derive and check the firewall of one host (``ctx['host']``).

    ``ctx``: host, head, nodes, allowed_clients, http_port, dist_ports, fabric_interface,
    ssh_port, connection, must_reach, routes ({address: `ip -j route get` answer} read on the
    controller), probe (this node's firewall_probe result; None before any contact),
    head_probe (the head's), names (operator-facing variable names for the messages),
    http_hosts_only (the HTTP port admits only http_client_hosts and http_extra_clients, while
    allowed_clients, the endpoint's clients, go to the services that serve them: the model gateway's port),
    sync_hosts and sync_ports (the site's other groups' nodes, whose fabric addresses may reach these ports on
    the fabric interface: the checkpoint's sync between groups).
    ``hostvars`` gives every node's spark_fabric_ip and ansible_host (tests may put
    ``fabric_ips``, ``sync_fabric_ips`` and ``management`` mappings into ``ctx`` instead).

    Returns {errors, chains, sets, rules (nft text per chain), clients, clients_source, peers, ...}.
    """
    ctx = dict(ctx)
    names = {**NAMES, **(ctx.get("names") or {})}
    errors = []
    host, head = ctx.get("host"), ctx.get("head")
    nodes = list(ctx.get("nodes") or [])
    # Hosts admitted by name (the monitoring host: to the exporter's port and the HTTP port's /metrics).
    named = list(ctx.get("http_client_hosts") or []) + [
        h for svc in ctx.get("service_ports") or [] if isinstance(svc, Mapping) for h in svc.get("client_hosts") or []]
    if hostvars is not None:
        ctx["fabric_ips"] = {n: hostvars[n].get("spark_fabric_ip") for n in nodes if n in hostvars}
        ctx["sync_fabric_ips"] = {n: hostvars[n].get("spark_fabric_ip") for n in ctx.get("sync_hosts") or []
                                  if n in hostvars}
        ctx["management"] = {n: hostvars[n].get("ansible_host", n) for n in [*nodes, *named] if n in hostvars}
        ctx["probes"] = {n: hostvars[n].get("__firewall_probe") for n in named if n in hostvars}
    fabric_ips = ctx.get("fabric_ips") or {}
    management = ctx.get("management") or {}
    routes = ctx.get("routes") or {}
    probe = ctx.get("probe") or None
    head_probe = ctx.get("head_probe") or (probe if host == head else None)
    is_head = host == head

    http_port = inputs.port(ctx.get("http_port"))
    if http_port is None:
        errors.append(f"{names['http_port']} = {inputs.shown(ctx.get('http_port'))}: the head's HTTP port must be a TCP port "
                      "number. Fix: a whole number between 1 and 65535.")
    raw_dist = ctx.get("dist_ports")
    dist_ports = []
    if isinstance(raw_dist, (str, int)) and not isinstance(raw_dist, bool):
        raw_dist = [raw_dist]
    for value in raw_dist if isinstance(raw_dist, (list, tuple)) else [raw_dist]:
        port = inputs.port(value)
        if port is None:
            errors.append(f"{names['dist_ports']} = {inputs.shown(ctx.get('dist_ports'))}: {inputs.shown(value)} is not a "
                          "TCP port. "
                          "Fix: whole numbers between 1 and 65535.")
        elif port not in dist_ports:
            dist_ports.append(port)
    interface = ctx.get("fabric_interface")
    if not isinstance(interface, str) or not IFNAME.match(interface):
        errors.append(f"{names['fabric_interface']} = {inputs.shown(interface)}: the ranks' ports are opened to the peers on "
                      "the fabric interface, which needs its name. Fix: set spark_fabric_interface (e.g. enp1s0f1np1).")
    # A ring's peers come in over the node's two ports (the node address is on a device of its own).
    ring_ports = ctx.get("fabric_ports") or []
    if not isinstance(ring_ports, list) or not all(isinstance(p, str) and IFNAME.match(p) for p in ring_ports):
        errors.append(f"firewall_fabric_ports = {inputs.shown(ring_ports)}: the ports a ring's peers come in on must be "
                      "interface names. Fix: set spark_fabric_ring_ports (e.g. [enp1s0f0np0, enp1s0f1np1]).")
        ring_ports = []
    fabric_ip = _address(str(fabric_ips.get(host)))
    if fabric_ip is None or fabric_ip.version != 4:
        errors.append(f"hostvars[{host!r}].spark_fabric_ip = {inputs.shown(fabric_ips.get(host))}: the ranks' ports on the "
                      "fabric are closed to all but the peers, which needs this node's IPv4 fabric address. Fix: set "
                      f"spark_fabric_ip for {host} in the inventory.")
    peers = []
    for node in nodes:
        if node == host:
            continue
        address = _address(str(fabric_ips.get(node)))
        if address is not None and address.version == 4:
            peers.append(str(address))
    sync = _sync(ctx, fabric_ips, nodes, names, errors)
    # Where rank 0's listeners on random ports are (the kernel's ephemeral range, read on the node;
    # Linux's default before any contact).
    local_ports = _port_range((probe or {}).get("local_ports")) or [32768, 60999]
    must_reach = ctx.get("must_reach")
    if not isinstance(must_reach, bool):
        errors.append(f"firewall_controller_must_reach = {inputs.shown(must_reach)}: must be true or false. Fix: a "
                      "YAML boolean.")
        must_reach = True

    hosts_only = ctx.get("http_hosts_only", False)
    if not isinstance(hosts_only, bool):
        errors.append(f"firewall_http_hosts_only = {inputs.shown(hosts_only)}: must be true or false. Fix: a YAML "
                      "boolean.")
        hosts_only = False
    direct = None  # the networks named for direct use, while hosts_only

    allowed_var = names["allowed_clients"]
    raw_allowed = ctx.get("allowed_clients")
    nets = _networks(raw_allowed, allowed_var, errors)
    head_address = _address(str(management.get(head, "")))
    if head_address is None:
        head_address = _ssh_connection(head_probe)[1]
    clients_source, default_subnet, known = "", None, True
    if nets is not None and not nets:
        # The default: the head's management subnet, read from the head (its address's prefix).
        default_subnet, ifname = _subnet_of(head_probe, head_address) if head_address else (None, None)
        if default_subnet is not None:
            nets = [default_subnet]
            clients_source = f"the head's management subnet {default_subnet} ({head}'s {ifname}, the default)"
        elif is_head and probe is not None:
            errors.append(
                f"{allowed_var} = [] (the default, the head's management subnet): no interface of {head} holds its "
                f"management address {inputs.shown(management.get(head))} (ansible_host), so its subnet is unknown. Fix: set "
                f"{allowed_var} to the networks that may use the endpoint, e.g. ['10.0.0.0/24']."
            )
            known = False
        else:
            known = False  # before any contact: the head's prefix is not known yet
    elif nets:
        clients_source = f"{allowed_var} {inputs.shown([str(n) for n in nets])}"

    def named_address(name, var):
        """The management address of an inventory host the firewall admits by name; None while unknown."""
        address = _address(str(management.get(name, "")))
        if address is None:
            address = _ssh_connection((ctx.get("probes") or {}).get(name))[1]
        if address is None and probe is not None and (ctx.get("probes") or {}).get(name) is None:
            errors.append(
                f"{var} names {name!r}, whose address the firewall cannot tell: its ansible_host "
                f"{inputs.shown(management.get(name))} is not an IP address and it is not part of this run. Fix: give {name} "
                "its management IP address as ansible_host.")
        return address

    # The clients themselves, before the hosts named: a service that serves them (the model gateway) admits these.
    client_nets = list(nets or [])
    client_source = clients_source
    # The HTTP port admits the hosts named too (the monitoring host scrapes /metrics there).
    http_hosts = list(ctx.get("http_client_hosts") or [])
    http_addresses = [named_address(h, "spark_monitor") for h in http_hosts]
    extra = [a for a in http_addresses if a]
    if hosts_only:
        # Behind the model gateway the heads serve the gateway (and the monitoring host), not the clients: their
        # port admits those hosts and the networks named for direct use, and nothing by default.
        extra_var = names["http_extra_clients"]
        direct = _networks(ctx.get("http_extra_clients"), extra_var, errors, empty="nobody")
        nets = list(direct or [])
        nets += [ipaddress.ip_network(_host_prefix(a)) for a in dict.fromkeys(extra) if not any(a in n for n in nets)]
        clients_source = "only " + ", ".join(f"{h} ({a})" if a else h for h, a in zip(http_hosts, http_addresses, strict=True)) \
            + (f" and {extra_var} {inputs.shown([str(n) for n in direct])}" if direct else "") \
            + " (the model gateway fronts the heads)"
        if not http_hosts and not direct:
            clients_source = "nobody but loopback (the model gateway fronts the heads)"
        default_subnet, known = None, direct is not None and all(http_addresses)
    elif nets is not None and extra and is_head:
        nets = nets + [ipaddress.ip_network(_host_prefix(a)) for a in extra if not any(a in n for n in nets)]
        clients_source += " and the monitoring host " + ", ".join(str(a) for a in extra)

    services = []
    taken = {http_port: names["http_port"], inputs.port(ctx.get("ssh_port") or 22): names["ssh_port"],
             **{p: names["dist_ports"] for p in dist_ports}}
    raw_services = ctx.get("service_ports") or []
    for i, given in enumerate(raw_services if isinstance(raw_services, (list, tuple)) else []):
        svc = given if isinstance(given, Mapping) else {}
        var = svc.get("var") or f"firewall_service_ports[{i}]"
        port = inputs.port(svc.get("port"))
        if port is None:
            errors.append(f"{var} = {inputs.shown(svc.get('port'))}: not a TCP port. Fix: a whole number between 1 and 65535.")
            continue
        if port in taken:
            errors.append(f"{var} = {port}: {taken[port]} uses that port too. Fix: choose another port for the "
                          f"{svc.get('name', 'service')}.")
            continue
        taken[port] = var
        if svc.get("clients_as_http"):
            # The endpoint's clients, as the HTTP port would admit them (the default: the head's subnet).
            svc_nets = list(client_nets)
        else:
            svc_nets = _networks(svc.get("clients"), svc.get("clients_var") or var, errors, empty="nobody") or []
        hosts = [a for a in (named_address(h, "spark_monitor") for h in svc.get("client_hosts") or []) if a]
        svc_nets += [ipaddress.ip_network(_host_prefix(a)) for a in hosts]
        who = [str(n) for n in svc_nets]
        if svc.get("clients_as_http") and client_source:
            who = [client_source] + [str(ipaddress.ip_network(_host_prefix(a))) for a in hosts]
        services.append({
            "name": str(svc.get("name") or f"port {port}"), "port": port, "var": var, "chain": f"port_{port}",
            "ip": [str(n) for n in svc_nets if n.version == 4], "ip6": [str(n) for n in svc_nets if n.version == 6],
            "source": ", ".join(who) + " (and loopback)" if who else "loopback (nobody else)",
        })

    plan = {
        "errors": errors, "host": host, "http": is_head, "http_port": http_port,
        "dist_ports": dist_ports if is_head else [],
        "fabric_interface": [interface, *[p for p in ring_ports if p != interface]] if ring_ports else interface,
        "local_ports": local_ports if is_head else [],
        "fabric_ip": str(fabric_ip) if fabric_ip else "", "peers": peers, "names": names,
        "clients": {"ip": [str(n) for n in nets or [] if n.version == 4],
                    "ip6": [str(n) for n in nets or [] if n.version == 6]},
        "clients_source": clients_source or "no client yet (the head's subnet is read on the head)",
        "clients_known": known and nets is not None, "default_subnet": str(default_subnet or ""),
        "head_address": str(head_address or ""), "controller": {}, "services": services, "sync": sync,
    }
    if errors:
        return plan
    plan["chains"] = _rules(plan)
    plan["sets"] = _sets(plan)
    plan["rules"] = {chain: [_nft(rule, plan["sets"]) for rule in rules] for chain, rules in plan["chains"].items()}

    # The controller's own packets through these rules.
    own = _address(str(management.get(host, "")))
    if own is None:
        own = _ssh_connection(probe)[1]
    controller, how = _controller(ctx, probe, routes.get(str(own)) if own else None, f"{host} ({own})")
    plan["controller"] = {"address": str(controller) if controller else "", "how": how}
    ssh_port = inputs.port(ctx.get("ssh_port") if ctx.get("ssh_port") not in (None, "") else 22)
    if controller not in (None, "local") and own is not None and ssh_port is not None:
        packet = {"saddr": controller, "daddr": own, "dport": ssh_port, "iif": "(management)"}
        verdict, rule = firewall_verdict(plan, packet)
        # Before the head's subnet is known the HTTP set is still empty: SSH on the HTTP port is refused anyway.
        if verdict == "drop":
            if rule["match"].get("daddr"):
                fix = f"connect to {host} by its management address (ansible_host), not by its fabric address"
            elif "dports" in rule["match"]:
                fix = f"choose a {names['dist_ports']} other than the SSH port {ssh_port}"
            elif "dport_range" in rule["match"]:
                fix = (f"run sshd on a port outside the node's ephemeral range (net.ipv4.ip_local_port_range), "
                       f"not {ssh_port}")
            else:
                fix = (f"SSH and SGLang's HTTP server cannot share port {ssh_port}: choose another {names['http_port']}, "
                       f"or add {_host_prefix(controller)} to {allowed_var}")
            errors.append(
                f"{names['ssh_port']} = {ssh_port}: the controller's SSH to {host} ({own} port {ssh_port}, from "
                f"{controller}: {how}) would be dropped by the firewall, cutting this run off the node: "
                f"{rule['cause']}. Fix: {fix}."
            )
    if is_head and must_reach and plan["clients_known"] and head_address is not None:
        head_controller, head_how = controller, how
        if head_address != own:
            head_controller, head_how = _controller(ctx, head_probe, routes.get(str(head_address)),
                                                    f"{head} ({head_address})")
        if head_controller not in (None, "local") and http_port is not None:
            packet = {"saddr": head_controller, "daddr": head_address, "dport": http_port, "iif": "(management)"}
            verdict, rule = firewall_verdict(plan, packet)
            if verdict == "drop" and hosts_only:
                extra_var = names["http_extra_clients"]
                given = [str(n) for n in direct or []]
                errors.append(
                    f"verify_run_on = controller: the head's HTTP port admits {clients_source}, not the controller "
                    f"({head_controller}: {head_how}), which would ask http://{head_address}:{http_port} in "
                    f"playbooks/verify.yml; the firewall would drop it. Fix: verify from the head itself (verify_run_on: "
                    f"auto or head), or open the heads to the controller, e.g. {extra_var}: "
                    f"{inputs.shown(given + [_host_prefix(head_controller)])}."
                )
            elif verdict == "drop":
                shown = (f"[] (the default: {clients_source})" if default_subnet is not None else
                         inputs.shown(raw_allowed))
                wanted = [str(n) for n in nets] + [_host_prefix(head_controller)]
                errors.append(
                    f"{allowed_var} = {shown}: excludes the controller ({head_controller}: {head_how}), which asks the "
                    f"endpoint http://{head_address}:{http_port} in playbooks/verify.yml; the firewall would drop it. "
                    f"Fix: add the controller, e.g. {allowed_var}: {inputs.shown(wanted)}, or verify from the head itself "
                    "(verify_run_on: head)."
                )
    return plan


# --- Drift: what the node holds against what the role would install -----------------------------------


def firewall_drift(probe, want):
    """What differs between the node (the firewall_probe module's answer) and `want`, one line each.

    `want`: {paths: [{path, owner, group, mode, checksum}], units: [name], table: bool} - a file absent, of
    another owner, group, mode or content, a unit not active or not enabled, the table not loaded. Empty: the
    node holds and runs what the role would install, so it has nothing to do.
    """
    probe = probe or {}
    want = want or {}
    drift = []
    if not probe.get("nft"):
        drift.append("nft not installed")
    drift += drift_of_paths_and_units(probe, want)
    if want.get("table") and not probe.get("table_loaded"):
        drift.append("the table is not loaded")
    return drift


class FilterModule:
    def filters(self):
        return {
            "firewall_plan": firewall_plan,
            "firewall_route_commands": firewall_route_commands,
            "firewall_verdict": firewall_verdict,
            "firewall_drift": firewall_drift,
        }

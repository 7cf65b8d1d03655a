"""The TP groups of a site, from the inventory's groups.

A site is one TP group (the hosts of spark_head and spark_workers) or several: the child groups of
spark_tp_groups, each holding its head (its member in spark_head) and its workers (its members in
spark_workers, ranked in spark_workers' listed order). The derived variables (roles/spark/vars), the
inventory check's refusals and the plays' batches (one group each) all read this one computation.

`groups` carries no parent-child links, so the TP groups are the groups whose hosts all lie in
spark_tp_groups, apart from the site's named groups (a group that only renames a TP group's hosts, or spans
two, is then reported as a host in two groups, with the fix).
"""

from __future__ import annotations

import ipaddress

DEFAULT_NAMES = {
    "site_group": "spark",
    "tp_groups_group": "spark_tp_groups",
    "head_group": "spark_head",
    "workers_group": "spark_workers",
    "gateway_group": "spark_gateway",
    "monitor_group": "spark_monitor",
}


def _names(names):
    merged = dict(DEFAULT_NAMES)
    merged.update({k: v for k, v in (names or {}).items() if v})
    return merged


def _members(groups, name):
    return list(groups.get(name) or [])


def tp_group_names(groups, names=None):
    """The TP groups' names in inventory order ([] for a one-group site)."""
    n = _names(names)
    pool = set(_members(groups, n["tp_groups_group"]))
    if not pool:
        return []
    reserved = {"all", "ungrouped", *(n[k] for k in DEFAULT_NAMES)}
    return [g for g, hosts in groups.items()
            if g not in reserved and hosts and set(hosts) <= pool]


def _entry(name, members, heads, workers):
    head = heads[0] if heads else ""
    ranked = [w for w in workers if w in members and w != head]
    return {"name": name, "head": head, "workers": ranked, "nodes": ([head] if head else []) + ranked}


def site_groups(groups, names=None):
    """Every TP group of the site in inventory order: a list of {name, head, workers, nodes}."""
    n = _names(names)
    heads = _members(groups, n["head_group"])
    workers = _members(groups, n["workers_group"])
    tp_names = tp_group_names(groups, n)
    if not tp_names:
        # Today's shape: the whole inventory's head and workers are the one group.
        return [_entry(n["site_group"], set(heads) | set(workers), heads[:1], workers)]
    entries = []
    for name in tp_names:
        members = _members(groups, name)
        entries.append(_entry(name, set(members), [h for h in heads if h in members], workers))
    return entries


def group_of(entries, host):
    """The entry holding host; the first group for a host outside every group (the controller, a gateway host)."""
    for entry in entries:
        if host in entry["nodes"]:
            return entry
    return entries[0] if entries else {"name": "", "head": "", "workers": [], "nodes": []}


def batches(groups, play_hosts, names=None):
    """A play's hosts ordered group by group and its `serial` list: one batch per group (its hosts in the play).

    play_hosts is the play's hosts after --limit; a group none of whose hosts is in it has no batch. A host of
    the site in no group (refused by the inventory check) follows in its own batch so that no play drops it.
    """
    n = _names(names)
    selected = list(play_hosts or [])
    order = _members(groups, n["site_group"])
    hosts, sizes, placed = [], [], set()
    for entry in site_groups(groups, n):
        batch = [h for h in order if h in entry["nodes"] and h in selected and h not in placed]
        if batch:
            hosts += batch
            sizes.append(len(batch))
            placed.update(batch)
    rest = [h for h in order if h in selected and h not in placed]
    if rest:
        hosts += rest
        sizes.append(len(rest))
    return {"hosts": hosts, "sizes": sizes, "groups": len(sizes)}


def _ip(value):
    try:
        return str(ipaddress.IPv4Address(str(value)))
    except ValueError:
        return None


def site_errors(groups, hostvars, names=None, here=None):
    """What is wrong with the site's groups as a whole (each group's own shape is the server plan's).

    here: this host's ports as its roles resolve them ({host, gateway_port, ports: {variable: port}}), for the
    gateway's port against a head's on the gateway's host, and the site's fabric_prefix (for a node without one
    of its own); with here.whole false (every host of a play but the first), only the gateway's port: the rest is
    the same for every host and told once.
    """
    n = _names(names)
    here = here or {}
    entries = site_groups(groups, n)
    errors = _gateway_port(groups, entries, n, here)
    if not here.get("whole", True):
        return errors
    tp = n["tp_groups_group"]
    tp_names = tp_group_names(groups, n)
    heads = _members(groups, n["head_group"])
    if tp_names:
        where = {}
        for name in tp_names:
            for host in _members(groups, name):
                where.setdefault(host, []).append(name)
        for host, holders in where.items():
            if len(holders) > 1:
                errors.append(
                    f"inventory host {host!r} is in the TP groups {', '.join(holders)}: a host holds one rank of one "
                    f"group. Fix: keep {host} in one child group of {tp} and move any other group of these hosts "
                    f"out of {tp}.")
        for host in _members(groups, n["site_group"]):
            if host not in where:
                errors.append(
                    f"inventory host {host!r} is in {n['site_group']} but in no child group of {tp} "
                    f"({', '.join(tp_names)}), so it has no group and no rank. Fix: add it to one of them, or "
                    f"remove it from {n['site_group']}.")
        for name in tp_names:
            held = [h for h in heads if h in _members(groups, name)]
            if len(held) != 1:
                errors.append(
                    f"TP group {name}: holds {len(held)} host(s) of {n['head_group']} ({held}); a group needs exactly "
                    f"one head (rank 0, which serves HTTP and hosts the ranks' rendezvous). Fix: put exactly one host "
                    f"of {name} in {n['head_group']} and its others in {n['workers_group']}.")
        group_of_host = {h: hs[0] for h, hs in where.items()}
        owners = {}
        for host in group_of_host:
            ip = _ip((hostvars.get(host) or {}).get("spark_fabric_ip"))
            if ip:
                owners.setdefault(ip, []).append(host)
        for ip, holders in sorted(owners.items()):
            named = sorted({group_of_host[h] for h in holders})
            if len(named) > 1:
                errors.append(
                    f"spark_fabric_ip {ip} is held by {', '.join(holders)} in the TP groups {', '.join(named)}: two "
                    "nodes with one address answer for each other, and a group's ranks could rendezvous with "
                    "another group's node. Fix: give every host a distinct spark_fabric_ip.")
    errors += _fabric_on_management(groups, entries, hostvars)
    errors += _fabric_subnets(entries, hostvars, here.get("fabric_prefix", 24), bool(tp_names))
    gateway = _members(groups, n["gateway_group"])
    if len(gateway) > 1:
        errors.append(
            f"inventory group {n['gateway_group']} = {gateway}: at most one host runs the gateway. Fix: keep one "
            f"host in {n['gateway_group']}, or leave it empty for the first group's head.")
    return errors


def _fabric_on_management(groups, entries, hostvars):
    """A fabric address that is another group's or an outside host's management address (the server plan
    refuses it within a group): the fabric role would move that address onto a fabric port."""
    errors = []
    managed = {}
    for host in _members(groups, "all"):
        address = _ip((hostvars.get(host) or {}).get("ansible_host", host))
        if address:
            managed.setdefault(address, []).append(host)
    for entry in entries:
        for node in entry["nodes"]:
            ip = _ip((hostvars.get(node) or {}).get("spark_fabric_ip"))
            others = [h for h in managed.get(ip, []) if h not in entry["nodes"]] if ip else []
            for other in others:
                errors.append(
                    f"hostvars[{node!r}].spark_fabric_ip = {ip}: is the management address (ansible_host) of "
                    f"{other}, outside {node}'s group, so {node}'s ranks and the fabric role would take {other}'s "
                    f"address. Fix: give {node} its own address on the ConnectX-7 link (DGX default 192.168.100.x).")
    return errors


def _fabric_subnets(entries, hostvars, default_prefix, several):
    """A group whose fabric addresses are not one subnet: its ranks could not reach each other on the fabric port
    (a ring of one subnet per cable is not built yet). An address or prefix that is none has its own refusal."""
    errors = []
    for entry in entries:
        networks = {}
        for node in entry["nodes"]:
            values = hostvars.get(node) or {}
            ip = _ip(values.get("spark_fabric_ip"))
            try:
                network = ipaddress.IPv4Network(f"{ip}/{int(values.get('spark_fabric_prefix', default_prefix))}",
                                                strict=False)
            except (TypeError, ValueError):
                continue
            networks.setdefault(str(network), []).append(
                f"{node} ({ip}/{network.prefixlen})")
        if len(networks) > 1:
            where = f"TP group {entry['name']}" if several else "the TP group"
            shown = "; ".join(f"{network}: {', '.join(nodes)}" for network, nodes in networks.items())
            errors.append(
                f"{where}: its fabric addresses (spark_fabric_ip / spark_fabric_prefix) lie in {len(networks)} subnets "
                f"({shown}): a group's ranks reach each other over one subnet on the fabric port, and without it the "
                f"kernel sends their traffic elsewhere (or nowhere). Fix: put every fabric address of "
                f"{entry['name'] if several else 'the group'} in one subnet with one prefix, e.g. 192.168.100.10/24, "
                "192.168.100.11/24, ...")
    return errors


def _gateway_port(groups, entries, n, here):
    place = gateway(groups, entries, n)
    host = here.get("host")
    if not place["enabled"] or host != place["host"] or host not in [e["head"] for e in entries]:
        return []
    port = here.get("gateway_port")
    return [
        f"gateway_port = {port}: is {variable} of {host}, a head, which also runs the gateway; two listeners "
        f"cannot share a port. Fix: set gateway_port (or {variable}) to a free port."
        for variable, taken in sorted((here.get("ports") or {}).items()) if str(taken) == str(port)]


def gateway(groups, entries, names=None):
    """The gateway's host and whether the site has one: several groups, or a host in spark_gateway."""
    n = _names(names)
    named = _members(groups, n["gateway_group"])
    host = named[0] if named else (entries[0]["head"] if entries else "")
    return {"host": host, "enabled": len(entries) > 1 or bool(named)}


def _fabric_network(values, default_prefix):
    try:
        return str(ipaddress.IPv4Network(
            f"{_ip(values.get('spark_fabric_ip'))}/{int(values.get('spark_fabric_prefix', default_prefix))}",
            strict=False))
    except (TypeError, ValueError):
        return None


def checkpoint_sources(entries, holders, hostvars, run_hosts, default_prefix=24):
    """Where each host of the run takes the checkpoint from: {host: source host}.

    The hub is asked once per site, not once per group: a host that holds the verified checkpoint is its own
    source; another takes it from its group's head when that head holds it, else from the first node of the
    site (group by group, head first) that holds it and shares its fabric subnet, else from the first head of
    the run on that subnet, which fetches it from the hub for all of them. A node's subnet is its
    spark_fabric_ip / spark_fabric_prefix (default_prefix when hostvars gives none); nodes on another subnet
    cannot be reached over the fabric, so a group cabled apart fetches on its own head. A host whose group's
    head this run leaves out (--limit) and that finds no holder keeps that head as its source, which must hold
    it already.
    """
    held = set(holders or [])
    run = list(run_hosts or [])
    order = [node for entry in entries for node in entry["nodes"]]
    heads = [entry["head"] for entry in entries if entry["head"]]
    head_of = {node: entry["head"] for entry in entries for node in entry["nodes"]}
    networks = {node: _fabric_network(hostvars.get(node) or {}, default_prefix) for node in order}
    sources = {}
    for host in run:
        own_head = head_of.get(host, "")
        if host in held:
            sources[host] = host
            continue
        if own_head in held:
            sources[host] = own_head
            continue
        network = networks.get(host)
        near = [node for node in order if network is not None and networks.get(node) == network]
        holding = [node for node in near if node in held]
        fetching = [node for node in heads if node in near and node in run]
        if holding:
            sources[host] = holding[0]
        elif own_head in run and fetching:
            sources[host] = fetching[0]
        else:
            sources[host] = own_head
    return sources

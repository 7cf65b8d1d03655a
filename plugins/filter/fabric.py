"""Address arithmetic for the fabric role, on the controller.

Jinja has no IP arithmetic and ansible.utils (with netaddr) is not a
dependency of this project; Python's ipaddress module is always there.
"""

from __future__ import annotations

import ipaddress
import json


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
    if want not in port["addresses"]:
        drift.append(f"{interface} lacks its address {want} (has {', '.join(port['addresses']) or 'none'})")
    return drift


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


def fabric_port_cause(port, want, peers):
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
                          "which ConnectX-7 port has carrier; set spark_fabric_interface to it) or the cable is damaged")
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
    """Routes to peers (`ip -j route get` results with the peer as item) that do not leave through `interface`
    from `address`: [{peer, dev, prefsrc, local}], empty when all do."""
    out = []
    for result in routes or []:
        try:
            route = (json.loads(result.get("stdout") or "[]") or [{}])[0]
        except ValueError:
            route = {}
        local = route.get("type", "unicast") == "local"
        if local or route.get("dev") != interface or route.get("prefsrc", "") != address:
            out.append({"peer": result.get("item"), "dev": route.get("dev", "?"), "prefsrc": route.get("prefsrc", "?"),
                        "local": local})
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


def fabric_known_host_lines(host_keys, address) -> list:
    """known_hosts lines pinning a worker's host keys (the probe's {type, content}) for its fabric address."""
    out = []
    for key in host_keys or []:
        fields = str(key.get("content", "")).split()
        if len(fields) >= 2:
            out.append(f"{address} {fields[0]} {fields[1]}")
    return out


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


def fabric_rdma_usable(rdma, interface, address) -> dict:
    """What the ranks can give NCCL: {hcas, gid_index} - the RDMA devices behind the fabric port whose port is
    ACTIVE with a RoCE v2 GID for the node's fabric address, and that GID's index (the first device's, None
    where none is usable). The probe's `rdma` reading."""
    hcas, index = [], None
    for device, port in _fabric_ports(rdma, interface):
        v2 = [g["index"] for g in _address_gids(port, interface, address) if g.get("type") == "RoCE v2"]
        if port.get("state") == "ACTIVE" and v2:
            hcas.append(device["name"])
            index = v2[0] if index is None else index
    return {"hcas": sorted(set(hcas)), "gid_index": index}


def fabric_rdma_reads(hosts, hostvars) -> dict:
    """{host: its newest RDMA reading} of `hosts`: read again after a change (tasks/reread.yml), else by the probe."""
    out = {}
    for host in hosts or []:
        facts = hostvars[host]
        reread = facts.get("__fabric_reread") or {}
        probe = facts.get("__fabric_probe") or {}
        out[host] = (reread.get("rdma") if "rdma" in reread and not reread.get("skipped") else probe.get("rdma")) or {}
    return out


def fabric_rdma_report(reads, host, interface, address, mtu) -> dict:
    """Whether NCCL can use RoCE on `host`'s fabric port, and if not, why: {usable, lines, warnings}.

    reads: {host: the probe's `rdma` reading} of the hosts of this run (the newest: read again after a
    change). lines: one per RDMA port behind the fabric port (state, active MTU, RoCE v2 GID);
    warnings: each cause found, with its fix and what NCCL does instead.
    """
    rdma = (reads or {}).get(host) or {}
    usable = fabric_rdma_usable(rdma, interface, address)
    want_mtu = fabric_roce_mtu(mtu)
    lines, warnings = [], []
    fallback = SOCKET_FALLBACK.format(interface=interface)
    ports = _fabric_ports(rdma, interface)
    if not ports:
        found = [f"{d['name']} ({', '.join(d.get('netdevs') or []) or 'no netdev'})" for d in rdma.get("devices") or []]
        if found:
            cause = (f"no RDMA device behind {interface}: the RoCE devices here serve {', '.join(found)}. Fix: set "
                     "spark_fabric_interface to the cabled port that has one (rdma link show lists each device's netdev)")
        else:
            cause = ("no RDMA device at all (/sys/class/infiniband is empty or absent): the ConnectX-7 RDMA driver is not "
                     "loaded. Fix: modprobe mlx5_ib (DGX OS loads it at boot; check dmesg for why it did not)")
        warnings.append(f"{cause}; {fallback}")
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
                why = (f"{name} is {port.get('state') or 'not active'} because {interface} has no link "
                       f"(physical state {port.get('phys_state') or 'unknown'}): the fabric port check names the cause")
            else:
                why = (f"{name} is {port.get('state')} although {interface} has its link: the driver keeps the RDMA "
                       f"port down. Fix: rdma link show and dmesg say why; reloading mlx5_ib or a reboot brings it up")
            warnings.append(f"{why}; {fallback}")
        elif not v2:
            if mine:
                why = (f"{name} has {address} only in a GID of type {mine[0].get('type')} (index {mine[0]['index']}): NCCL uses "
                       "RoCE v2, which is off on this device. Fix: turn RoCE v2 on in its firmware configuration "
                       "(mlxconfig) and check the GID table with show_gids")
            else:
                why = (f"{name} has no GID for {address}: the address is not on {interface}, so RoCE cannot reach "
                       "the peers from it (ip addr show dev " + interface + ")")
            warnings.append(f"{why}; {fallback}")
        if devinfo.get("rc") not in (0, None):
            lines.append(f"{name}: active MTU not read: ibv_devinfo "
                         + ("is not installed (apt install ibverbs-utils)" if devinfo.get("rc") == 127
                            else f"failed ({devinfo.get('stderr') or devinfo.get('rc')})"))
        elif active and active < want_mtu:
            cap = port.get("max_mtu")
            cause = (f"the port's maximum is {cap}" if cap and cap < want_mtu
                     else f"{interface}'s MTU is below {mtu}")
            warnings.append(f"{name} runs RDMA at an active MTU of {active}, not the {want_mtu} that the fabric MTU "
                            f"{mtu} allows: {cause}. RDMA to the peers uses the smaller MTU: fewer bytes per packet")
        for peer, peer_rdma in sorted((reads or {}).items()):
            if peer == host:
                continue
            theirs = [p.get("active_mtu") for d, p in _fabric_ports(peer_rdma, interface) if p.get("active_mtu")]
            if active and theirs and theirs[0] != active:
                warnings.append(f"{name} has active MTU {active}, {peer} has {theirs[0]}: RDMA between them runs at "
                                f"{min(active, theirs[0])}; give both ports the fabric MTU {mtu}")
    return {"usable": usable, "lines": lines, "warnings": warnings}


def fabric_rdma_pairs(reads, head, workers, interface, *, ips, port) -> dict:
    """What the RDMA bandwidth proof measures: {pairs, unmeasured}.

    pairs: one {worker, address, head_hca, head_gid, worker_hca, worker_gid, port} per rail usable on both the
    head and a worker (the n-th usable device of each, by name; each pair its own port from `port` up);
    unmeasured: [sentence] for a worker that has a usable rail but where ib_write_bw is missing on either end.
    A worker without a usable rail is not measured: the proof's warning already names why.
    """
    reads = reads or {}
    head_read = reads.get(head) or {}
    mine = fabric_rdma_usable(head_read, interface, ips.get(head))
    pairs, unmeasured = [], []
    for worker in workers:
        read = reads.get(worker) or {}
        theirs = fabric_rdma_usable(read, interface, ips.get(worker))
        rails = list(zip(mine["hcas"], theirs["hcas"], strict=False))
        if not rails:
            continue
        missing = [h for h, r in ((head, head_read), (worker, read)) if not r.get("ib_write_bw")]
        if missing:
            unmeasured.append(f"{head} -> {worker}: RDMA bandwidth not measured: ib_write_bw is not installed on "
                              f"{' and '.join(missing)} (apt install perftest)")
            continue
        for head_hca, worker_hca in rails:
            pairs.append({"worker": worker, "address": ips.get(worker), "head_hca": head_hca,
                          "head_gid": mine["gid_index"], "worker_hca": worker_hca, "worker_gid": theirs["gid_index"],
                          "port": int(port) + len(pairs)})
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


class FilterModule:
    def filters(self):
        return {
            "fabric_ipv4_error": fabric_ipv4_error,
            "fabric_network": fabric_network,
            "fabric_in_network": fabric_in_network,
            "fabric_off_subnet": fabric_off_subnet,
            "fabric_ifaces_in_network": fabric_ifaces_in_network,
            "fabric_known_host_lines": fabric_known_host_lines,
            "fabric_route_faults": fabric_route_faults,
            "fabric_ping_faults": fabric_ping_faults,
            "fabric_trust_gaps": fabric_trust_gaps,
            "fabric_nft_missing": fabric_nft_missing,
            "fabric_port": fabric_port,
            "fabric_peer_port": fabric_peer_port,
            "fabric_drift": fabric_drift,
            "fabric_port_cause": fabric_port_cause,
            "fabric_roce_mtu": fabric_roce_mtu,
            "fabric_rdma_usable": fabric_rdma_usable,
            "fabric_rdma_reads": fabric_rdma_reads,
            "fabric_rdma_report": fabric_rdma_report,
            "fabric_rdma_pairs": fabric_rdma_pairs,
            "fabric_write_bw_gbps": fabric_write_bw_gbps,
        }

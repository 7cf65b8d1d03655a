#!/usr/bin/python
"""Read a node's fabric state (interfaces, firewall, addresses, routes, RDMA, SSH keys) in one round trip."""

# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402
from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabric_probe
short_description: Read a Spark node's fabric state in one round trip
description:
  - For the fabric role's internal use (its C(validate.yml)); options and return values may change with
    the role.
  - Reads, before the role changes anything, what its checks and proofs read (the node's network
    interfaces, whether ufw is active and otherwise the nftables ruleset, every interface's addresses,
    the kernel's route to each peer, full-size pings that may not fragment to each peer (where the
    fabric port is up with carrier), the RDMA devices and their ports (O(rdma)), the SSH host keys and
    C(authorized_keys) (of every node, where a worker holds its head's key and a former head's is stale) and the
    head's fabric key pair, and C(known_hosts) (of every node, where a head pins its workers and a former
    head's pins are stale), with
    the owner and mode of the SSH files the role manages).
  - The role reads it again after a change (netplan apply, firewall rules) for the proof.
  - Command results keep the shape of M(ansible.builtin.command)'s (C(rc), C(stdout), C(stderr)); a tool
    that is missing answers exit 127 (run through C(sh)), which is evidence, not an error.
version_added: "1.1.0"
author: LLM serving maintainers (@dgx-spark)
options:
  peers:
    description: The peers' fabric addresses, whose routes are read.
    type: list
    elements: str
    default: []
  firewall:
    description: Read ufw's status and, where ufw is not active, the nftables ruleset.
    type: bool
    default: false
  host_key_types:
    description: SSH host key types whose public keys are read from C(/etc/ssh) (a worker's).
    type: list
    elements: str
    default: []
  public_key_path:
    description: A public key to read if it exists (the head's fabric key); empty reads none.
    type: str
    default: ""
  known_hosts_path:
    description: A known_hosts file to read if it exists; empty reads none.
    type: str
    default: ""
  authorized_keys_path:
    description: An authorized_keys file to read if it exists (C(~user) is expanded); empty reads none.
    type: path
    default: ""
  stat_paths:
    description: Paths (C(~user) expanded) whose existence, mode, owner and group are returned.
    type: list
    elements: str
    default: []
  checksum_paths:
    description:
      - Paths of O(stat_paths) whose content's sha1 is returned too (the netplan file, compared with its render).
      - Only the paths named here are read, so that no key file among O(stat_paths) is hashed into the output.
    type: list
    elements: str
    default: []
  ping_interface:
    description:
      - The fabric port to ping each peer through; empty pings nobody.
      - Nobody is pinged either while the port is down or without carrier (no ping could pass).
    type: str
    default: ""
  ping_size:
    description: ICMP payload of the full-size pings (the MTU less 28); a peer that does not answer them gets small ones.
    type: int
    default: 0
  ping_from:
    description:
      - An address on O(ping_interface) to ping the peers from instead of through that port (C(ping -I <address>)),
        so that the kernel's routes choose the way out.
      - A ring's node address is on a device of its own and reaches its peers over either of the node's ports.
    type: str
    default: ""
    version_added: "1.8.0"
  neighbours:
    description:
      - Ports on which to ask who is at the cable's other end - the link-local addresses answering a ping to the
        all-nodes group C(ff02::1) - for the check that a ring's cabling matches the group's order.
      - A port without carrier is left out (nobody could answer).
    type: list
    elements: str
    default: []
    version_added: "1.8.0"
  rdma:
    description:
      - Read every RDMA device's ports (state, physical state, link layer, the GID table with each entry's type and
        netdev) from C(/sys/class/infiniband), and the active and maximum MTU of each port from C(ibv_devinfo)
        (rdma-core's C(ibverbs-utils)), for the proof that NCCL can use RoCE on the fabric port.
    type: bool
    default: false
    version_added: "1.6.0"
  record_path:
    description: A JSON file to read if it exists (the head's record of the proof's last figures); empty reads none.
    type: str
    default: ""
    version_added: "1.7.0"
  rails:
    description:
      - Further rails (ports besides O(ping_interface)) whose routes to the peers' addresses on them are read and
        through which those peers are pinged at O(ping_size), as for the fabric port.
    type: list
    elements: dict
    default: []
    version_added: "1.7.0"
    suboptions:
      interface:
        description: The rail's port.
        type: str
        required: true
      peers:
        description: The peers' addresses on the rail.
        type: list
        elements: str
        default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - dgx_spark.llm_serving.read_only
"""

EXAMPLES = r"""
# Inside the fabric role (tasks/validate.yml).
- name: Read the node's fabric state
  dgx_spark.llm_serving.fabric_probe:
    peers: [192.168.100.11]
    firewall: true
    host_key_types: [ed25519, ecdsa, rsa]
  register: __fabric_probe
"""

RETURN = r"""
netdevs:
  description: The names in C(/sys/class/net), sorted.
  returned: always
  type: list
  elements: str
ufw:
  description: C(ufw status) (empty when O(firewall) is false).
  returned: always
  type: dict
nft:
  description: C(nft -j list ruleset), read only where O(firewall) is set and ufw is not active (else empty).
  returned: always
  type: dict
addrs:
  description: C(ip -j addr show) (every interface).
  returned: always
  type: dict
routes:
  description: C(ip -j route get <peer>) per peer, in O(peers) order, each with the peer as C(item) (as a loop's results).
  returned: always
  type: list
  elements: dict
rdma:
  description:
    - Where O(rdma) is set, C({devices, devinfo}). C(devices) has one C({name, netdevs, ports}) per RDMA device;
      each port is C({port, state, phys_state, link_layer, gids, active_mtu, max_mtu}), the states as the kernel
      names them (C(ACTIVE), C(DOWN), C(LinkUp), ...), C(gids) the used entries of the GID table, each
      C({index, gid, type, ndev}) (C(type) C(RoCE v2) or C(IB/RoCE v1)), and the MTUs as C(ibv_devinfo) reports
      them in bytes (null where it could not be read).
    - C(devinfo) is C(ibv_devinfo)'s C({rc, stdout, stderr}) (127 when it is not installed; not run, and empty,
      where there is no RDMA device).
    - C(ib_write_bw) is the path of perftest's C(ib_write_bw), empty where it is not installed.
  returned: always
  type: dict
host_keys:
  description: The host public keys found, in O(host_key_types) order, each C({type, content}).
  returned: always
  type: list
  elements: dict
public_key:
  description: The text of O(public_key_path), empty when it does not exist.
  returned: always
  type: str
known_hosts:
  description: The lines of O(known_hosts_path), empty when it does not exist.
  returned: always
  type: list
  elements: str
authorized_keys:
  description: The lines of O(authorized_keys_path), empty when it does not exist.
  returned: always
  type: list
  elements: str
stats:
  description:
    - Per path of O(stat_paths) as given, C({exists, mode, owner, group, sha1}) (mode as 4 octal digits).
    - C(sha1) is the content's checksum where the path is in O(checksum_paths) and a regular file, else empty.
  returned: always
  type: dict
pings:
  description:
    - Per peer, in O(peers) order, C(ping -M do -s <ping_size>)'s result with the peer as C(item), and
      C(small), the result of a small ping where the full-size one failed (else null).
    - Empty where O(ping_interface) is empty, down or without carrier.
  returned: always
  type: list
  elements: dict
record:
  description: The JSON document in O(record_path), empty where there is none or it does not parse.
  returned: always
  type: dict
  version_added: "1.7.0"
neighbours:
  description:
    - Per port of O(neighbours) that has carrier, the sorted link-local addresses that answered on it (the node's own
      among them).
  returned: always
  type: dict
  version_added: "1.8.0"
rails:
  description: Per rail of O(rails), in order, C({interface, routes, pings}) shaped as RV(routes) and RV(pings).
  returned: always
  type: list
  elements: dict
  version_added: "1.7.0"
"""

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.node_reads import path_facts

NETDEVS = "/sys/class/net"
RDMA_DEVICES = "/sys/class/infiniband"
UFW_ACTIVE = re.compile(r"^Status: active", re.MULTILINE)
# ibv_devinfo's blocks: "hca_id:\t<device>", then per port "port:\t<n>" and its "active_mtu:\t\t4096 (5)".
DEVINFO_HCA = re.compile(r"^hca_id:\s*(\S+)")
DEVINFO_PORT = re.compile(r"^\s+port:\s*(\d+)")
DEVINFO_MTU = re.compile(r"^\s+(active_mtu|max_mtu):\s*(\d+)")
UNUSED_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# iputils ping's reply line for a link-local responder: "64 bytes from fe80::1%enp1s0f0np0: icmp_seq=1 ...".
LINK_LOCAL_REPLY = re.compile(r"from (fe80:[0-9a-f:]+)(?:%\S+)?:", re.IGNORECASE)


def _run(module, *argv):
    """A tool through sh, so that one not installed answers 127 like the role's command tasks did."""
    rc, out, err = module.run_command(["/bin/sh", "-c", 'exec "$0" "$@"', *argv])
    return {"rc": rc, "stdout": out.rstrip("\r\n"), "stderr": err.rstrip("\r\n")}


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _json(text):
    try:
        document = json.loads(text or "")
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def _stat(path, checksum=False):
    facts = path_facts(path, checksum=checksum)
    if facts is None:
        return {"exists": False, "mode": "", "owner": "", "group": "", "sha1": ""}
    return {"exists": True, "mode": facts["mode"], "owner": facts["owner"], "group": facts["group"],
            "sha1": facts.get("sha1", "")}


def _has_carrier(interface):
    """Up with carrier, as the kernel says (reading carrier of a port that is down fails: no carrier)."""
    flags = _read(f"{NETDEVS}/{interface}/flags")
    carrier = _read(f"{NETDEVS}/{interface}/carrier")
    try:
        return bool(int(flags or "0", 16) & 0x1) and (carrier or "").strip() == "1"
    except ValueError:
        return False


def _sysfs_value(path):
    """A sysfs attribute without its numeric prefix: "4: ACTIVE" -> "ACTIVE"; None where it cannot be read
    (the kernel answers EINVAL for the type of an unused GID entry)."""
    text = _read(path)
    if text is None:
        return None
    return text.strip().split(": ", 1)[-1]


def _devinfo_mtus(text):
    """{(device, port): {active_mtu, max_mtu}} from ibv_devinfo's output."""
    out, device, port = {}, None, None
    for line in text.splitlines():
        if m := DEVINFO_HCA.match(line):
            device, port = m.group(1), None
        elif m := DEVINFO_PORT.match(line):
            port = int(m.group(1))
            out[(device, port)] = {"active_mtu": None, "max_mtu": None}
        elif (m := DEVINFO_MTU.match(line)) and (device, port) in out:
            out[(device, port)][m.group(1)] = int(m.group(2))
    return out


def _rdma(module):
    """Every RDMA device's ports as the kernel and ibv_devinfo report them."""
    names = sorted(os.listdir(RDMA_DEVICES)) if os.path.isdir(RDMA_DEVICES) else []
    perftest = module.get_bin_path("ib_write_bw") or ""
    if not names:
        return {"devices": [], "devinfo": {}, "ib_write_bw": perftest}
    devinfo = _run(module, "ibv_devinfo")
    mtus = _devinfo_mtus(devinfo["stdout"]) if devinfo["rc"] == 0 else {}
    devices = []
    for name in names:
        base = f"{RDMA_DEVICES}/{name}"
        netdevs = sorted(os.listdir(f"{base}/device/net")) if os.path.isdir(f"{base}/device/net") else []
        ports = []
        for port in sorted(os.listdir(f"{base}/ports"), key=int) if os.path.isdir(f"{base}/ports") else []:
            pbase = f"{base}/ports/{port}"
            gids = []
            for index in sorted(os.listdir(f"{pbase}/gids"), key=int) if os.path.isdir(f"{pbase}/gids") else []:
                gid = (_read(f"{pbase}/gids/{index}") or "").strip()
                kind = _sysfs_value(f"{pbase}/gid_attrs/types/{index}")
                if gid and gid != UNUSED_GID and kind:
                    gids.append({"index": int(index), "gid": gid, "type": kind,
                                 "ndev": _sysfs_value(f"{pbase}/gid_attrs/ndevs/{index}") or ""})
            ports.append({"port": int(port), "state": _sysfs_value(f"{pbase}/state") or "",
                          "phys_state": _sysfs_value(f"{pbase}/phys_state") or "",
                          "link_layer": _sysfs_value(f"{pbase}/link_layer") or "", "gids": gids,
                          **mtus.get((name, int(port)), {"active_mtu": None, "max_mtu": None})})
        devices.append({"name": name, "netdevs": netdevs, "ports": ports})
    return {"devices": devices, "devinfo": devinfo, "ib_write_bw": perftest}


def _pings(module, interface, size, peers, source=""):
    """The role's full-size DF pings, and small ones where those failed (MTU trouble or no path at all): through
    `interface`, or from the address `source` on it where given (a ring's node address reaches its peers through
    the routes over either port)."""
    # A ring's node address is on a bridge without ports, which has no carrier of its own: its ports carry the pings.
    if not interface or not peers or not (source or _has_carrier(interface)):
        return []
    # Three pings prove the path and the frame size whatever their spacing; at ping's default for other users
    # (0.2 s, its minimum for them) they are most of the read's time in every run. root may space them closer.
    interval = "0.02" if os.geteuid() == 0 else "0.2"
    out = []
    for peer in peers:
        full = _run(module, "ping", "-c", "3", "-i", interval, "-W", "2", "-M", "do", "-s", str(size),
                    "-I", source or interface, peer)
        small = None
        if full["rc"] != 0:
            small = _run(module, "ping", "-c", "3", "-i", interval, "-W", "2", "-I", source or interface, peer)
        out.append({"item": peer, **full, "small": small})
    return out


def _neighbours(module, ports):
    """Per port with carrier, the link-local addresses that answer the all-nodes group on it: who is at the
    cable's other end (the node itself answers too). A port without carrier hears nobody and is left out."""
    out = {}
    for port in ports:
        if not _has_carrier(port):
            continue
        heard = _run(module, "ping", "-6", "-c", "2", "-i", "0.2", "-W", "1", "-I", port, "ff02::1")
        out[port] = sorted(set(LINK_LOCAL_REPLY.findall(heard["stdout"])))
    return out


def main():
    module = AnsibleModule(
        argument_spec={
            "peers": {"type": "list", "elements": "str", "default": []},
            "firewall": {"type": "bool", "default": False},
            "host_key_types": {"type": "list", "elements": "str", "default": [], "no_log": False},
            "public_key_path": {"type": "str", "default": "", "no_log": False},
            "known_hosts_path": {"type": "str", "default": ""},
            "authorized_keys_path": {"type": "path", "default": "", "no_log": False},
            "stat_paths": {"type": "list", "elements": "str", "default": []},
            "checksum_paths": {"type": "list", "elements": "str", "default": []},
            "ping_interface": {"type": "str", "default": ""},
            "ping_size": {"type": "int", "default": 0},
            "ping_from": {"type": "str", "default": ""},
            "neighbours": {"type": "list", "elements": "str", "default": []},
            "rdma": {"type": "bool", "default": False},
            "record_path": {"type": "str", "default": ""},
            "rails": {"type": "list", "elements": "dict", "default": [], "options": {
                "interface": {"type": "str", "required": True},
                "peers": {"type": "list", "elements": "str", "default": []},
            }},
        },
        supports_check_mode=True,
    )
    p = module.params
    ufw, nft = {}, {}
    if p["firewall"]:
        ufw = _run(module, "ufw", "status")
        # ufw keeps its own rules; a plain nftables ruleset matters only where ufw is not in charge.
        if not (ufw["rc"] == 0 and UFW_ACTIVE.search(ufw["stdout"])):
            nft = _run(module, "nft", "-j", "list", "ruleset")
    host_keys = []
    for key_type in p["host_key_types"]:
        text = _read(f"/etc/ssh/ssh_host_{key_type}_key.pub")
        if text is not None:
            host_keys.append({"type": key_type, "content": text})
    known = _read(p["known_hosts_path"]) if p["known_hosts_path"] else None
    authorized = _read(p["authorized_keys_path"]) if p["authorized_keys_path"] else None
    module.exit_json(
        changed=False,
        netdevs=sorted(os.listdir(NETDEVS)),
        ufw=ufw,
        nft=nft,
        addrs=_run(module, "ip", "-j", "addr", "show"),
        routes=[{"item": peer, **_run(module, "ip", "-j", "route", "get", peer)} for peer in p["peers"]],
        host_keys=host_keys,
        public_key=(_read(p["public_key_path"]) or "") if p["public_key_path"] else "",
        known_hosts=[line.strip() for line in (known or "").splitlines() if line.strip()],
        authorized_keys=[line.strip() for line in (authorized or "").splitlines() if line.strip()],
        stats={path: _stat(path, checksum=path in p["checksum_paths"]) for path in p["stat_paths"]},
        pings=_pings(module, p["ping_interface"], p["ping_size"], p["peers"], p["ping_from"]),
        neighbours=_neighbours(module, p["neighbours"]),
        rdma=_rdma(module) if p["rdma"] else {},
        record=_json(_read(p["record_path"])) if p["record_path"] else {},
        rails=[{"interface": rail["interface"],
                "routes": [{"item": peer, **_run(module, "ip", "-j", "route", "get", peer)} for peer in rail["peers"]],
                "pings": _pings(module, rail["interface"], p["ping_size"], rail["peers"])} for rail in p["rails"]],
    )


if __name__ == "__main__":
    main()

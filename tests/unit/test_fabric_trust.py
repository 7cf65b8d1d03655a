"""The fabric role's no-change decisions, without nodes: the SSH trust read as in place (or what it lacks),
the proof's route and ping faults from the probe's readings."""

from __future__ import annotations

import json

from tests.lib.roles import filter_plugin

fabric = filter_plugin("fabric")

KEY = "/root/.ssh/id_spark_fabric"
AUTH = "~root/.ssh/authorized_keys"
IPS = {"spark-0": "192.168.100.10", "spark-1": "192.168.100.11"}
PUB = "ssh-ed25519 AAAAC3head spark-fabric@spark-0\n"
HOST_KEYS = [{"type": "ed25519", "content": "ssh-ed25519 AAAAC3worker root@spark-1\n"},
             {"type": "rsa", "content": "ssh-rsa AAAAB3worker root@spark-1\n"}]


def ok(mode):
    return {"exists": True, "mode": mode, "owner": "root"}


def probes():
    head = {"stats": {"/root/.ssh": ok("0700"), KEY: ok("0600")}, "public_key": PUB,
            "known_hosts": ["192.168.100.11 ssh-ed25519 AAAAC3worker", "192.168.100.11 ssh-rsa AAAAB3worker",
                            "other.example ssh-ed25519 AAAAother"]}
    worker = {"stats": {"~root/.ssh": ok("0700"), AUTH: ok("0600")}, "host_keys": HOST_KEYS,
              "authorized_keys": ["ssh-ed25519 AAAAC3admin admin@laptop",
                                  'from="192.168.100.10",restrict ssh-ed25519 AAAAC3head spark-fabric@spark-0']}
    return {"spark-0": head, "spark-1": worker}


def gaps(p, workers=("spark-1",)):
    return fabric.fabric_trust_gaps(p, "spark-0", list(workers), ips=IPS, user="root", key_path=KEY, authorized_keys=AUTH)


def test_trust_in_place_on_both_ends_has_no_gap():
    assert gaps(probes()) == []
    # The head alone (--limit to the head): its key pair is all there is to have.
    assert gaps(probes(), workers=()) == []


def test_every_missing_or_altered_piece_is_a_gap():
    p = probes()
    p["spark-1"]["authorized_keys"] = p["spark-1"]["authorized_keys"][:1]
    assert gaps(p) == ["spark-1: the head's key is not in ~root/.ssh/authorized_keys"]
    p = probes()
    # The entry without its restriction to the head's fabric address is not the role's entry.
    p["spark-1"]["authorized_keys"][1] = "ssh-ed25519 AAAAC3head spark-fabric@spark-0"
    assert len(gaps(p)) == 1
    p = probes()
    p["spark-0"]["known_hosts"] = p["spark-0"]["known_hosts"][1:]
    assert gaps(p) == ["spark-1's host keys are not all pinned for 192.168.100.11 on the head"]
    p = probes()
    p["spark-0"]["public_key"] = ""
    assert "the head's public key /root/.ssh/id_spark_fabric.pub missing" in gaps(p)
    p = probes()
    p["spark-0"]["stats"][KEY] = {"exists": False, "mode": "", "owner": ""}
    assert gaps(p) == ["the head's key /root/.ssh/id_spark_fabric missing"]
    p = probes()
    p["spark-1"]["stats"][AUTH] = ok("0644")
    assert gaps(p) == ["spark-1: file ~root/.ssh/authorized_keys is root 0644, want root 0600"]
    p = probes()
    p["spark-0"]["stats"]["/root/.ssh"] = {"exists": True, "mode": "0755", "owner": "root"}
    assert gaps(p) == ["the head's key directory /root/.ssh is root 0755, want root 0700"]
    # A worker reinstalled since it was pinned: new host keys.
    p = probes()
    p["spark-1"]["host_keys"] = [{"type": "ed25519", "content": "ssh-ed25519 AAAAC3new root@spark-1"}]
    assert len(gaps(p)) == 1


def test_a_head_outside_the_run_is_never_in_place():
    p = probes()
    del p["spark-0"]
    assert gaps(p) == ["the head spark-0 is not in this run"]


def test_known_host_lines_pin_type_and_key_for_the_fabric_address():
    assert fabric.fabric_known_host_lines(HOST_KEYS, "192.168.100.11") == [
        "192.168.100.11 ssh-ed25519 AAAAC3worker", "192.168.100.11 ssh-rsa AAAAB3worker"]
    assert fabric.fabric_known_host_lines([{"type": "rsa", "content": "  \n"}], "x") == []


def test_a_fabric_key_other_than_the_workers_own_heads_is_stale():
    lines = ['from="192.168.100.10",restrict ssh-ed25519 AAAAC3zero spark-fabric@spark-0',
             'from="192.168.100.12",restrict ssh-ed25519 AAAAC3two spark-fabric@spark-2',
             'from="192.168.100.13",restrict ssh-ed25519 AAAAC3three spark-checkpoint@spark-3',
             "ssh-ed25519 AAAAC3op operator@laptop", "ssh-ed25519 AAAAC3sim spark-fabric@spark-20"]
    # A worker of spark-2 keeps its head's key; another head's is a leftover (spark-20 is not spark-2). A sync's
    # own grant and an operator's key are never the fabric role's.
    assert fabric.fabric_stale_keys(lines, "spark-2") == [lines[0], lines[4]]
    # A head lets in no fabric key.
    assert fabric.fabric_stale_keys(lines, "") == [lines[0], lines[1], lines[4]]
    assert fabric.fabric_stale_keys([""], "") == []


def test_a_former_heads_pins_of_site_nodes_other_than_its_workers_are_stale():
    site = ["192.168.100.10", "192.168.100.11", "192.168.100.12", "192.168.100.13"]
    lines = ["192.168.100.11 ssh-ed25519 AAAAC3one", "192.168.100.12 ssh-ed25519 AAAAC3two",
             "192.168.100.13,host-3 ssh-rsa AAAAB3three", "|1|hashedbyssh= ssh-ed25519 AAAAC3mine",
             "10.0.0.5 ssh-ed25519 AAAAC3elsewhere"]
    # A head keeps its workers' pins; another site node's fabric address is a former head's leftover. Hashed lines
    # (ssh's own, an operator's) and addresses outside the site are never the role's.
    assert fabric.fabric_stale_pins(lines, site, ["192.168.100.11"]) == lines[1:3]
    # A worker pins nobody's.
    assert fabric.fabric_stale_pins(lines, site, []) == lines[:3]
    assert fabric.fabric_stale_pins([], site, []) == []


def route(peer, **fields):
    return {"item": peer, "rc": 0, "stdout": json.dumps([fields])}


def test_route_faults_name_the_way_out_and_local_addresses():
    good = route("192.168.100.11", dst="192.168.100.11", dev="enp1s0f1np1", prefsrc="192.168.100.10")
    assert fabric.fabric_route_faults([good], "enp1s0f1np1", "192.168.100.10") == []
    wrong = route("192.168.100.11", dev="enP7s7", prefsrc="192.168.100.100")
    local = route("192.168.100.11", type="local", dev="lo", prefsrc="192.168.100.11")
    failed = {"item": "192.168.100.12", "rc": 2, "stdout": ""}
    faults = fabric.fabric_route_faults([wrong, local, failed], "enp1s0f1np1", "192.168.100.10")
    assert faults == [
        {"peer": "192.168.100.11", "dev": "enP7s7", "prefsrc": "192.168.100.100", "local": False, "want": "enp1s0f1np1"},
        {"peer": "192.168.100.11", "dev": "lo", "prefsrc": "192.168.100.11", "local": True, "want": "enp1s0f1np1"},
        {"peer": "192.168.100.12", "dev": "?", "prefsrc": "?", "local": False, "want": "enp1s0f1np1"},
    ]
    # A ring's routes each take the port the peer is reached through.
    ring = {"item": "192.168.100.12", "rc": 0, "stdout": '[{"dev": "enp1s0f0np0", "prefsrc": "192.168.100.10"}]'}
    assert fabric.fabric_route_faults([ring], {"192.168.100.12": "enp1s0f0np0"}, "192.168.100.10") == []
    assert fabric.fabric_route_faults([ring], {"192.168.100.12": "enp1s0f1np1"}, "192.168.100.10")[0]["want"] == \
        "enp1s0f1np1"


def test_ping_faults_tell_mtu_trouble_from_no_path_and_from_no_reading():
    pings = [{"item": "a", "rc": 0, "small": None}, {"item": "b", "rc": 1, "small": {"rc": 0}},
             {"item": "c", "rc": 1, "small": {"rc": 1}}]
    assert fabric.fabric_ping_faults(pings, ["a", "b", "c", "d"]) == [
        {"peer": "b", "small": True}, {"peer": "c", "small": False}, {"peer": "d", "small": None}]
    assert fabric.fabric_ping_faults([], []) == []

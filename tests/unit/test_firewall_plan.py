"""The firewall role's plan filter and probe: who may connect, and what would cut the controller off.

The rules are data that the template prints and the checks evaluate, so the packets run through
`firewall_verdict` here are the ones the nftables table on a node decides the same way
(tests/integration/test_firewall.py proves it there).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import subprocess
import sys

import pytest

from tests.lib.role_module import COLLECTIONS, REPO, run_module
from tests.lib.roles import filter_plugin, role_defaults

fw = filter_plugin("firewall")

HEAD, WORKER = "spark-0", "spark-1"
CONTROLLER = "10.0.0.1"
NAMES = {"allowed_clients": "server_allowed_clients", "http_port": "server_port",
         "dist_ports": "server_dist_init_port"}


def route(src, gateway=None):
    answer = {"dst": "x", "dev": "eth0", "prefsrc": src, "flags": [], "uid": 0, "cache": []}
    if gateway:
        answer["gateway"] = gateway
    return [answer]


def probe(addresses=(("enP7s7", "10.0.0.10", 24),), ssh=""):
    addrs = [{"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]}]
    addrs += [{"ifname": i, "addr_info": [{"family": "inet6" if ":" in a else "inet", "local": a, "prefixlen": p}]}
              for i, a, p in addresses]
    return {"addrs": addrs, "ssh_connection": ssh, "nft": "/usr/sbin/nft", "table_loaded": False}


def context(host=HEAD, **changes):
    ctx = {
        "host": host, "head": HEAD, "nodes": [HEAD, WORKER], "allowed_clients": [], "http_port": 30000,
        "dist_ports": [20000], "fabric_interface": "enp1s0f1np1", "ssh_port": 22, "connection": "ssh",
        "must_reach": True, "names": NAMES,
        "fabric_ips": {HEAD: "192.168.100.10", WORKER: "192.168.100.11"},
        "management": {HEAD: "10.0.0.10", WORKER: "10.0.0.11"},
        "routes": {"10.0.0.10": route(CONTROLLER), "10.0.0.11": route(CONTROLLER)},
        "probe": None, "head_probe": None,
    }
    ctx.update(changes)
    return ctx


def plan(**changes):
    return fw.firewall_plan(context(**changes))


def verdict(p, saddr, daddr, dport, iif="enP7s7"):
    return fw.firewall_verdict(p, {"saddr": saddr, "daddr": daddr, "dport": dport, "iif": iif})[0]


def test_defaults_match_the_wiring_fallbacks():
    defaults = role_defaults("firewall")
    server = role_defaults("server")
    assert defaults["firewall_allowed_clients"] == server["server_allowed_clients"] == []
    assert defaults["firewall_http_port"] == server["server_port"]
    assert defaults["firewall_dist_ports"] == [server["server_dist_init_port"]]


def test_the_default_range_is_the_heads_management_subnet_read_on_the_head():
    p = plan(probe=probe(), allowed_clients=[])
    assert p["errors"] == []
    assert p["clients"] == {"ip": ["10.0.0.0/24"], "ip6": []}
    assert "the head's management subnet 10.0.0.0/24 (spark-0's enP7s7" in p["clients_source"]
    assert verdict(p, CONTROLLER, "10.0.0.10", 30000) == "accept"
    assert verdict(p, "10.0.1.5", "10.0.0.10", 30000) == "drop"
    assert verdict(p, "fd00::5", "10.0.0.10", 30000) == "drop"


def test_before_contact_the_default_range_is_not_known_and_not_refused():
    p = plan(allowed_clients=[])
    assert p["errors"] == [] and not p["clients_known"]


def test_a_head_without_its_management_address_on_an_interface_is_refused():
    p = plan(probe=probe(addresses=(("enP7s7", "10.9.9.9", 24),)))
    assert any("no interface of spark-0 holds its management address '10.0.0.10'" in e and "Fix:" in e
               for e in p["errors"]), p["errors"]


@pytest.mark.parametrize(("value", "fragment"), [
    (["10.0.0.0/33"], "server_allowed_clients[0] = '10.0.0.0/33': does not parse as an IPv4 or IPv6 network"),
    (["not-a-cidr"], "server_allowed_clients[0] = 'not-a-cidr': does not parse"),
    (["10.0.0.7/24"], "has host bits set, so it does not say whether the subnet or the one host is meant. "
                      "Fix: '10.0.0.0/24' for the subnet, or '10.0.0.7/32' for that host alone."),
    (["fe80::1%eth0"], "(no interface zone)"),
    ([5], "server_allowed_clients[0] = 5: not a network"),
    ("10.0.0.0/24", "server_allowed_clients = '10.0.0.0/24': must be a list"),
    ({"a": 1}, "must be a list of networks"),
])
def test_unusable_client_ranges_are_refused(value, fragment):
    errors = plan(allowed_clients=value)["errors"]
    assert any(fragment in e and "Fix:" in e for e in errors), errors


def test_addresses_and_ipv6_networks_are_accepted():
    p = plan(allowed_clients=[CONTROLLER, "fd00::/64", "10.0.0.0/24"])
    assert p["errors"] == []
    assert p["clients"] == {"ip": ["10.0.0.1/32", "10.0.0.0/24"], "ip6": ["fd00::/64"]}
    assert verdict(p, "fd00::9", "10.0.0.10", 30000) == "accept"


def test_a_range_that_excludes_the_controller_is_refused_with_the_fix():
    errors = plan(allowed_clients=["10.0.0.128/25"],
                  routes={"10.0.0.10": route("192.168.5.7", gateway="10.0.0.254")})["errors"]
    assert len(errors) == 1, errors
    assert errors[0].startswith("server_allowed_clients = ['10.0.0.128/25']: excludes the controller "
                                "(192.168.5.7: the source address of the controller's route to spark-0 (10.0.0.10) "
                                "via the gateway 10.0.0.254)")
    assert "Fix: add the controller, e.g. server_allowed_clients: ['10.0.0.128/25', '192.168.5.7/32'], or " \
           "verify from the head itself (verify_run_on: head)." in errors[0]


def test_the_default_range_excluding_the_controller_is_refused_on_the_head():
    errors = plan(probe=probe(ssh="192.168.5.7 50000 10.0.0.10 22"))["errors"]
    assert any("server_allowed_clients = [] (the default: the head's management subnet 10.0.0.0/24" in e
               and "192.168.5.7: the address the node sees the controller's SSH session come from" in e
               and "['10.0.0.0/24', '192.168.5.7/32']" in e for e in errors), errors


def test_verify_from_the_head_lets_the_range_exclude_the_controller():
    assert plan(allowed_clients=["10.0.0.128/25"], must_reach=False)["errors"] == []
    # Only the head serves HTTP: a worker's plan has no such check, and no HTTP rule.
    worker = plan(host=WORKER, allowed_clients=["10.0.0.128/25"])
    assert worker["errors"] == [] and "http_port" not in worker["chains"] and worker["dist_ports"] == []


def test_the_node_sees_the_controller_over_ssh_rather_than_the_route():
    # NAT or another path: what the node sees wins over the controller's own source address.
    p = plan(allowed_clients=["10.0.0.0/24"], routes={"10.0.0.10": route("172.16.0.9")},
             probe=probe(ssh="10.0.0.99 50000 10.0.0.10 22"))
    assert p["errors"] == [] and p["controller"]["address"] == "10.0.0.99"


def test_a_local_controller_is_the_node_itself():
    assert plan(allowed_clients=["10.0.0.128/25"], connection="local")["errors"] == []


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"dist_ports": [22]}, "ansible_port = 22: the controller's SSH to spark-0 (10.0.0.10 port 22, from 10.0.0.1: "
                           "the source address of the controller's route to spark-0 (10.0.0.10)) would be dropped by "
                           "the firewall, cutting this run off the node: server_dist_init_port = 22 (the TCPStore"),
    ({"dist_ports": [2222], "ssh_port": 2222}, "Fix: choose a server_dist_init_port other than the SSH port 2222."),
    ({"ssh_port": 40022}, "Fix: run sshd on a port outside the node's ephemeral range (net.ipv4.ip_local_port_range), "
                          "not 40022."),
    ({"http_port": 22, "allowed_clients": ["10.0.0.128/25"], "must_reach": False},
     "SSH and SGLang's HTTP server cannot share port 22"),
    ({"management": {HEAD: "192.168.100.10", WORKER: "10.0.0.11"},
      "routes": {"192.168.100.10": route(CONTROLLER)}},
     "connect to spark-0 by its management address (ansible_host), not by its fabric address"),
])
def test_rules_that_would_cut_the_controllers_ssh_are_refused(changes, fragment):
    errors = plan(**changes)["errors"]
    assert any(fragment in e for e in errors), errors


def test_the_workers_ssh_is_checked_on_the_worker():
    errors = plan(host=WORKER, dist_ports=[22])["errors"]
    # The dist-init port is the head's only: a worker's SSH is not cut by it.
    assert errors == []
    errors = plan(host=WORKER, management={HEAD: "10.0.0.10", WORKER: "192.168.100.11"},
                  routes={"192.168.100.11": route(CONTROLLER), "10.0.0.10": route(CONTROLLER)})["errors"]
    assert any("the controller's SSH to spark-1 (192.168.100.11 port 22" in e for e in errors), errors


def test_verdicts_of_the_head_table():
    p = plan(allowed_clients=["10.0.0.0/24"])
    # Loopback always; the peer on the fabric reaches the rendezvous and the fabric address.
    assert verdict(p, "127.0.0.1", "127.0.0.1", 30000, iif="lo") == "accept"
    assert verdict(p, "10.5.5.5", "10.0.0.10", 20000, iif="lo") == "accept"
    assert verdict(p, "192.168.100.11", "192.168.100.10", 20000, iif="enp1s0f1np1") == "accept"
    assert verdict(p, "192.168.100.11", "192.168.100.10", 41234, iif="enp1s0f1np1") == "accept"
    # The same peer address from elsewhere, anyone on the management network, a stranger on the fabric: dropped.
    assert verdict(p, "192.168.100.11", "192.168.100.10", 20000) == "drop"
    assert verdict(p, "10.0.0.11", "10.0.0.10", 20000) == "drop"
    assert verdict(p, "192.168.100.99", "192.168.100.10", 41234, iif="enp1s0f1np1") == "drop"
    # The HTTP port: the allowed clients only, the peers on the fabric included.
    assert verdict(p, "10.0.0.50", "10.0.0.10", 30000) == "accept"
    assert verdict(p, "192.168.100.11", "192.168.100.10", 30000, iif="enp1s0f1np1") == "drop"
    # Rank 0's listeners on random ports (every address): new connections from the peers on the fabric only.
    assert verdict(p, "10.0.0.11", "10.0.0.10", 45123) == "drop"
    assert verdict(p, "192.168.100.11", "192.168.100.10", 45123, iif="enp1s0f1np1") == "accept"
    # Nothing else is this table's business: SSH and any other port continue to the rest of the ruleset.
    assert verdict(p, "203.0.113.9", "10.0.0.10", 22) is None
    assert verdict(p, "203.0.113.9", "10.0.0.10", 8080) is None
    # A worker has no HTTP port, rendezvous or rank 0 listeners: only its fabric address is closed to strangers.
    w = plan(host=WORKER)
    assert verdict(w, "10.0.0.10", "10.0.0.11", 20000) is None and verdict(w, "10.0.0.10", "10.0.0.11", 45123) is None
    assert verdict(w, "10.0.0.10", "192.168.100.11", 22) == "drop"


def test_the_rules_text_is_printed_from_the_rules_checked():
    p = plan(allowed_clients=["10.0.0.0/24", "fd00::/64"])
    assert p["rules"]["input"] == [
        'iif "lo" accept comment "loopback: always allowed"',
        "tcp dport 30000 jump http_port",
        'iifname "enp1s0f1np1" ip saddr @fabric_peers accept comment "the TP group\'s peers on the fabric"',
        "jump rank_ports",
    ]
    assert p["rules"]["http_port"] == ["ip saddr @http_clients_ip accept", "ip6 saddr @http_clients_ip6 accept",
                                       'counter drop comment "server http: not an allowed client"']
    assert p["rules"]["rank_ports"] == [
        'tcp dport { 20000 } counter drop comment "dist-init (TCPStore): fabric peers only"',
        'tcp dport 32768-60999 ct state new counter drop comment "rank 0 listeners on random ports: fabric peers only"',
        'ip daddr 192.168.100.10 counter drop comment "NCCL/Gloo on the fabric address: fabric peers only"',
    ]
    # On the node, the kernel's own ephemeral range.
    assert 'tcp dport 40000-50000 ct state new' in " ".join(
        plan(allowed_clients=["10.0.0.0/24"], probe={**probe(), "local_ports": "40000\t50000"})["rules"]["rank_ports"])
    # No drop in the base chain: the fabric role, which opens dropping input chains to the peers, leaves it be.
    assert not any(" drop" in rule for rule in p["rules"]["input"])
    assert p["sets"]["fabric_peers"]["elements"] == ["192.168.100.11"]


def test_other_settings_are_checked_too():
    errors = plan(http_port="abc", dist_ports=["x"], fabric_interface="bad name!", must_reach="yes",
                  fabric_ips={HEAD: "", WORKER: "192.168.100.11"})["errors"]
    text = "\n".join(errors)
    for fragment in ("server_port = 'abc'", "server_dist_init_port = ['x']", "= 'bad name!'",
                     "firewall_controller_must_reach = 'yes'", "hostvars['spark-0'].spark_fabric_ip = ''"):
        assert fragment in text, text


def test_route_commands_take_addresses_only():
    assert fw.firewall_route_commands(["10.0.0.10", "spark-0.lan", "10.0.0.10 ; rm -rf /", "fd00::0001"]) == {
        "10.0.0.10": "ip -j route get 10.0.0.10 2>/dev/null || echo '[]'",
        "fd00::1": "ip -j route get fd00::1 2>/dev/null || echo '[]'",
    }


PROBE = REPO / "plugins" / "modules" / "firewall_probe.py"


def run_probe(tmp_path, shell_env: dict, module_env: dict) -> dict:
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"table": "inet spark_llm_guard_unit_test"}}))
    # The module's parent (sh) has shell_env; the module itself module_env, as after sudo's reset.
    unset = " ".join(f"-u {k}" for k in shell_env if k not in module_env)
    set_ = " ".join(f"{k}={v!r}" for k, v in module_env.items())
    # The collection's module_utils import as Ansible ships them (tests/lib/role_module.py).
    command = f"env {unset} {set_} PYTHONPATH={COLLECTIONS} {sys.executable} {PROBE} {args}; true"
    proc = subprocess.run(["sh", "-c", command], env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **shell_env},
                          capture_output=True, text=True, timeout=60, check=False)
    return json.loads(proc.stdout)


def test_the_probe_reads_the_ssh_session_from_its_environment_or_an_ancestors(tmp_path):
    seen = "10.0.0.1 50000 10.0.0.10 22"
    assert run_probe(tmp_path, {"SSH_CONNECTION": seen}, {"SSH_CONNECTION": seen})["ssh_connection"] == seen
    # become (sudo) resets the environment: the login shell above still has it.
    result = run_probe(tmp_path, {"SSH_CONNECTION": seen}, {})
    assert result["ssh_connection"] == seen and result["changed"] is False
    assert isinstance(result["addrs"], list) and result["table_loaded"] is False
    assert len(result["local_ports"].split()) == 2
    assert run_probe(tmp_path, {}, {})["ssh_connection"] == ""


# --- the node against what the role would install (one probe, no task per file) ----------------------------

RULES_PATH = "/etc/nftables.d/spark_llm_guard.nft"
UNIT_PATH = "/etc/systemd/system/spark-llm-firewall.service"
WANT = {"paths": [{"path": RULES_PATH, "owner": "root", "group": "root", "mode": "0644", "checksum": "aa"},
                  {"path": UNIT_PATH, "owner": "root", "group": "root", "mode": "0644", "checksum": "bb"}],
        "units": ["spark-llm-firewall.service"], "table": True}


def node(**changes):
    """A probe's answer from a node that holds and runs what WANT installs."""
    answer = {"nft": "/usr/sbin/nft", "table_loaded": True,
              "paths": {RULES_PATH: {"type": "file", "owner": "root", "group": "root", "mode": "0644", "checksum": "aa"},
                        UNIT_PATH: {"type": "file", "owner": "root", "group": "root", "mode": "0644", "checksum": "bb"}},
              "units": {"spark-llm-firewall.service": {"active": "active", "enabled": "enabled"}}}
    answer.update(changes)
    return answer


def test_a_node_that_holds_and_runs_the_rules_has_nothing_to_install():
    assert fw.firewall_drift(node(), WANT) == []


@pytest.mark.parametrize(("changes", "found"), [
    ({"table_loaded": False}, "the table is not loaded"),
    ({"nft": ""}, "nft not installed"),
    ({"paths": {**node()["paths"], RULES_PATH: {"type": "absent"}}}, f"{RULES_PATH}: absent, not a file"),
    ({"paths": {**node()["paths"], RULES_PATH: {**node()["paths"][RULES_PATH], "checksum": "cc"}}},
     f"{RULES_PATH}: checksum differs"),
    ({"paths": {**node()["paths"], UNIT_PATH: {**node()["paths"][UNIT_PATH], "mode": "0600"}}},
     f"{UNIT_PATH}: mode 0600, not 0644"),
    ({"units": {"spark-llm-firewall.service": {"active": "inactive", "enabled": "enabled"}}},
     "spark-llm-firewall.service not active (inactive)"),
    ({"units": {"spark-llm-firewall.service": {"active": "active", "enabled": "disabled"}}},
     "spark-llm-firewall.service not enabled (disabled)"),
    ({"units": {}}, "spark-llm-firewall.service not active (unknown)"),
])
def test_any_difference_on_the_node_runs_the_installation(changes, found):
    assert found in fw.firewall_drift(node(**changes), WANT)


def test_the_probe_reads_the_files_it_is_given(tmp_path):
    rules = tmp_path / "rules.nft"
    rules.write_text("table inet x {}\n")
    rules.chmod(0o640)
    result = run_module("firewall_probe",
                             {"table": "inet sglang_probe_test", "paths": [str(rules), str(tmp_path / "gone")]}, tmp_path)
    assert result["changed"] is False
    seen = result["paths"][str(rules)]
    assert seen["type"] == "file" and seen["mode"] == "0640"
    assert seen["checksum"] == hashlib.sha1(rules.read_bytes()).hexdigest()  # noqa: S324 - as the template module
    assert seen["owner"] == pwd.getpwuid(os.getuid())[0]
    assert result["paths"][str(tmp_path / "gone")] == {"type": "absent"}
    assert result["units"] == {}


# Behind the model gateway (firewall_http_hosts_only, wired from spark_gateway_enabled): a head's port serves the
# gateway's host and the monitoring host; the endpoint's clients reach the gateway's port instead.
GATEWAY_HOST = "spark-2"
GATEWAY_PORT = {"name": "model gateway", "port": 30080, "var": "gateway_port", "clients_as_http": True, "client_hosts": []}


def behind_the_gateway(**changes):
    ctx = {"probe": probe(), "http_hosts_only": True, "must_reach": False, "http_client_hosts": [GATEWAY_HOST, HEAD],
           "service_ports": [GATEWAY_PORT],
           "management": {HEAD: "10.0.0.10", WORKER: "10.0.0.11", GATEWAY_HOST: "10.0.0.12"}}
    return plan(**{**ctx, **changes})


def test_behind_the_gateway_the_heads_port_admits_only_the_gateway_and_the_monitoring_host():
    p = behind_the_gateway()
    assert p["errors"] == []
    assert p["clients"] == {"ip": ["10.0.0.12/32", "10.0.0.10/32"], "ip6": []}
    assert p["clients_source"] == "only spark-2 (10.0.0.12), spark-0 (10.0.0.10) (the model gateway fronts the heads)"
    assert verdict(p, "10.0.0.12", "10.0.0.10", 30000) == "accept"
    assert verdict(p, "10.0.0.10", "10.0.0.10", 30000) == "accept"
    # The controller and the rest of the head's subnet: dropped at the head, admitted at the gateway's port.
    for client in (CONTROLLER, "10.0.0.50"):
        assert verdict(p, client, "10.0.0.10", 30000) == "drop"
        assert verdict(p, client, "10.0.0.10", 30080) == "accept"
    assert verdict(p, "10.0.1.5", "10.0.0.10", 30080) == "drop"
    # Without the switch the head's port admits its subnet, as before.
    assert verdict(behind_the_gateway(http_hosts_only=False), "10.0.0.50", "10.0.0.10", 30000) == "accept"


def test_behind_the_gateway_verify_from_the_controller_is_refused_with_the_fix():
    errors = behind_the_gateway(must_reach=True)["errors"]
    assert errors == [
        "verify_run_on = controller: the head's HTTP port admits only spark-2 (10.0.0.12), spark-0 (10.0.0.10) (the "
        "model gateway fronts the heads), not the controller (10.0.0.1: the source address of the controller's route "
        "to spark-0 (10.0.0.10)), which would ask http://10.0.0.10:30000 in playbooks/verify.yml; the firewall would "
        "drop it. Fix: verify from the head itself (verify_run_on: auto or head), or open the heads to the "
        "controller, e.g. firewall_http_extra_clients: ['10.0.0.1/32']."]


def test_behind_the_gateway_networks_named_for_direct_use_reach_the_heads():
    p = behind_the_gateway(must_reach=True, http_extra_clients=["10.0.0.1"])
    assert p["errors"] == []
    assert verdict(p, CONTROLLER, "10.0.0.10", 30000) == "accept"
    assert verdict(p, "10.0.0.50", "10.0.0.10", 30000) == "drop"
    assert "and firewall_http_extra_clients ['10.0.0.1/32']" in p["clients_source"]


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"http_extra_clients": "10.0.0.1"}, "firewall_http_extra_clients = '10.0.0.1': must be a list of networks (CIDR) "
                                         "or addresses. Fix: e.g. firewall_http_extra_clients: ['10.0.0.0/24', "
                                         "'10.0.5.7'], or [] for nobody."),
    ({"http_extra_clients": ["10.0.0.1/8"]}, "firewall_http_extra_clients[0] = '10.0.0.1/8': has host bits set"),
    ({"http_hosts_only": "yes"}, "firewall_http_hosts_only = 'yes': must be true or false"),
])
def test_behind_the_gateway_bad_settings_are_refused(changes, fragment):
    errors = behind_the_gateway(**changes)["errors"]
    assert any(fragment in e and "Fix:" in e for e in errors), errors


def test_the_site_s_other_groups_reach_the_checkpoint_sync_on_the_fabric_and_nothing_else():
    fabric = {HEAD: "192.168.100.10", WORKER: "192.168.100.11", "spark-2": "192.168.100.12", "spark-3": "192.168.100.13"}
    p = plan(allowed_clients=["10.0.0.0/24"], fabric_ips=fabric, sync_hosts=["spark-2", "spark-3", WORKER],
             sync_ports=[22, "28730-28733"])
    assert p["errors"] == [] and p["sets"]["fabric_sync_peers"]["elements"] == ["192.168.100.12", "192.168.100.13"]
    fab = "enp1s0f1np1"
    # The sync's ssh and its rsync daemon's ports, from another group's node on the fabric interface.
    assert verdict(p, "192.168.100.12", "192.168.100.10", 22, iif=fab) == "accept"
    assert verdict(p, "192.168.100.13", "192.168.100.10", 28733, iif=fab) == "accept"
    # Not the ranks' ports, not a port beside the range, not from elsewhere, not a stranger.
    assert verdict(p, "192.168.100.12", "192.168.100.10", 20000, iif=fab) == "drop"
    assert verdict(p, "192.168.100.12", "192.168.100.10", 45123, iif=fab) == "drop"
    assert verdict(p, "192.168.100.12", "192.168.100.10", 28734, iif=fab) == "drop"
    assert verdict(p, "192.168.100.12", "192.168.100.10", 22) == "drop"
    assert verdict(p, "192.168.100.99", "192.168.100.10", 22, iif=fab) == "drop"
    # The answers to this node's own connections to them (to their ssh, their rsync daemon) come back.
    answer = {"saddr": "192.168.100.12", "daddr": "192.168.100.10", "dport": 51234, "iif": fab}
    assert fw.firewall_verdict(p, {**answer, "ct": "established"})[0] == "accept"
    assert fw.firewall_verdict(p, answer)[0] == "drop"
    assert 'iifname "enp1s0f1np1" ip saddr @fabric_sync_peers tcp dport 28730-28733 accept' in " ".join(
        p["rules"]["input"])
    # A one-group site: no such set or rule, the table as before.
    alone = plan(allowed_clients=["10.0.0.0/24"])
    assert "fabric_sync_peers" not in alone["sets"] and alone["rules"] == plan(
        allowed_clients=["10.0.0.0/24"], sync_hosts=[WORKER], sync_ports=[22])["rules"]
    bad = plan(fabric_ips=fabric, sync_hosts=["spark-2"], sync_ports=["28733-28730"])
    assert bad["errors"] == ["firewall_fabric_sync_ports = ['28733-28730']: '28733-28730' is neither a TCP port nor a "
                             'range low-high of them. Fix: e.g. [22, "28730-28737"].'], bad["errors"]


def test_a_rings_peers_come_in_over_its_two_ports_and_nowhere_else():
    ports = ["enp1s0f0np0", "enp1s0f1np1"]
    p = plan(allowed_clients=["10.0.0.0/24"], fabric_interface="fabric0", fabric_ports=ports)
    assert p["errors"] == [] and p["fabric_interface"] == ["fabric0", *ports]
    for port in ports:
        assert verdict(p, "192.168.100.11", "192.168.100.10", 20000, iif=port) == "accept"
    assert verdict(p, "192.168.100.11", "192.168.100.10", 20000) == "drop"
    assert 'iifname { "fabric0", "enp1s0f0np0", "enp1s0f1np1" } ip saddr @fabric_peers accept' in "\n".join(
        fw._nft(rule, p["sets"]) for rule in p["chains"]["input"])
    # Without a ring the rule names the one fabric port, as before.
    assert plan(allowed_clients=["10.0.0.0/24"])["fabric_interface"] == "enp1s0f1np1"
    errors = plan(fabric_ports=["bad name!"])["errors"]
    assert any("firewall_fabric_ports = ['bad name!']" in e and "Fix:" in e for e in errors), errors

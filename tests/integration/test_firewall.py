"""Who may connect (issue 13): the firewall role's nftables table on a simulated pair.

One pair is deployed as a site is (fabric.yml, then server.yml), with a firewall of the site's own
already active on both nodes (a ufw-like iptables-nft table with a drop of its own), and answers
every question in a few playbook runs: the default range (the head's management subnet) lets the
controller and another client of that subnet in; the dist-init port and rank 0's broadcast queue
(the stand-in's TCPStore and queue listen on every address for the life of the group) are closed
on the management network and open between the ranks over the fabric, which still form a group and
serve; the site's own table is untouched; a narrowed range drops a client outside it (a second
address of this machine on the harness bridge) while that client still reaches SSH; a table
removed by another tool is loaded again; check mode shows the rules it would add and changes
nothing; a power cycle loads the rules at boot, before the rank, the group forms again under them,
and a second run changes nothing.
Bad input is refused before any node is contacted, through render.yml and site.yml (the hosts use
the `no_contact` connection, so a run that tried to reach a node would say so; one run of each with
every bad setting, since the plans report all of them at once), and on the node before any change
where the controller could not tell.

A dropped connection is a connect that times out (no answer at all), told apart from a closed port
(refused) and proven to be the firewall: the port listens, and the same client reaches SSH.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import shlex
from pathlib import Path

import pytest
import yaml

from tests.harness import cluster as sim
from tests.lib.playbook import REPO, SITE_CHECK, run_playbook
from tests.lib.reach import DROPPED, at_once, connect
from tests.lib.roles import filter_plugin
from tests.lib.supervised import REVISION, checkpoint_files, wait_for

pytestmark = pytest.mark.slow

TABLE = "inet spark_llm_guard"
UNIT = "spark-llm-firewall.service"
RANK = "spark-llm.service"
RULES = "/etc/nftables.d/spark_llm_guard.nft"
SERVER = "playbooks/server.yml"
VARS = {"checkpoint_revision": REVISION}
REFUSED = "Refuse a firewall that would shut out the controller or admit no valid client"
NO_CONTACT = {"ANSIBLE_CONNECTION_PLUGINS": str(REPO / "tests" / "lib" / "connection_plugins")}
# A site's own firewall as ufw leaves it on iptables-nft: a table of its own, a user chain, and a
# drop (so the fabric role would count it as active). Loaded at run time, as ufw loads it at boot.
SITE_TABLE = "ip filter"
SITE_FIREWALL = """table ip filter {
    chain ufw-user-input {
        tcp dport 22 counter accept
        tcp dport 30000 counter accept
    }
    chain INPUT {
        type filter hook input priority filter; policy accept;
        counter jump ufw-user-input
        tcp dport 9 counter drop
    }
}
"""


def sh(node, command: str, check: bool = True, timeout: float = 60) -> str:
    return sim.ssh(node, command, check=check, timeout=timeout)


def node_connect(node, host: str, port: int, source: str) -> str:
    """connect() run on a node, from its address `source` (the route picks the interface)."""
    program = (f"import socket; s = socket.socket(); s.settimeout(3); s.bind(({source!r}, 0))\n"
               f"try:\n    s.connect(({host!r}, {port})); print('open')\n"
               "except TimeoutError:\n    print('dropped')\nexcept ConnectionRefusedError:\n    print('refused')")
    return sh(node, f"python3 -c {shlex.quote(program)}").strip()


def api_key(cluster) -> str:
    """The key server.yml generated beside the inventory, when it generated one."""
    path = Path(cluster.inventory) / ".credentials" / "spark_llm_api_key"
    return path.read_text().strip() if path.exists() else ""


def ask(cluster, source: str | None = None) -> int | str:
    """A generation from this machine (from `source` when given), as a client of the endpoint asks it:
    the HTTP status, DROPPED when the connection gets no answer, "refused" when nothing listens."""
    body = json.dumps({"model": "/models/glm53", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "17 × 23 = ?"}]})
    headers = {"Content-Type": "application/json"}
    if api_key(cluster):
        headers["Authorization"] = f"Bearer {api_key(cluster)}"
    conn = http.client.HTTPConnection(cluster.nodes[0].mgmt_ip, 30000, timeout=3,
                                      source_address=(source, 0) if source else None)
    try:
        conn.connect()
        # Connected: from here a slow answer is a failure of the test, not a drop.
        conn.sock.settimeout(30)
        conn.request("POST", "/v1/chat/completions", body=body.encode(), headers=headers)
        response = conn.getresponse()
        payload = response.read()
        if response.status == 200:
            assert json.loads(payload)["choices"], payload
        return response.status
    except TimeoutError:
        if conn.sock is not None:
            raise
        return DROPPED
    except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected):
        return "refused"
    finally:
        conn.close()


def subnet(cluster) -> str:
    return str(ipaddress.ip_interface(f"{cluster.bridge_ip}/24").network)


def changed(result) -> set[tuple[str, str]]:
    return {(d["host"], d["task"]) for d in result.changed}


def failed_at(result) -> set[str]:
    return {d["task"] for d in result.failed}


def drops(node, chain: str, comment: str) -> int:
    """Packets the table's drop rule with `comment` in `chain` has dropped: proof that this rule, not
    something else on the way, kept them out."""
    listing = json.loads(sh(node, f"nft -j list chain {TABLE} {chain}"))
    rule = next(e["rule"] for e in listing["nftables"] if e.get("rule", {}).get("comment") == comment)
    return next(x["counter"]["packets"] for x in rule["expr"] if "counter" in x)


HTTP_DROP = ("http_port", "server http: not an allowed client")
DIST_DROP = ("rank_ports", "dist-init (TCPStore): fabric peers only")
FABRIC_DROP = ("rank_ports", "NCCL/Gloo on the fabric address: fabric peers only")
RANDOM_DROP = ("rank_ports", "rank 0 listeners on random ports: fabric peers only")


def rank0_random_ports(head) -> list[int]:
    """Ports rank 0 listens on at random, on every address (its broadcast queue)."""
    listening = sh(head, "ss -Hltnp")
    ports = {int(line.split()[3].rsplit(":", 1)[1]) for line in listening.splitlines()
             if "python3" in line and line.split()[3].startswith("0.0.0.0:")}
    return sorted(ports - {20000, 30000})


def rank_started(node) -> int:
    return int(sh(node, f"systemctl show {RANK} -p ExecMainStartTimestampMonotonic --value").strip() or 0)


@pytest.fixture(scope="module")
def site(sim_cluster):
    for n in sim_cluster.nodes:
        sh(n, checkpoint_files())
    fabric = run_playbook("playbooks/fabric.yml", sim_cluster.inventory)
    assert fabric.rc == 0, fabric.failure_messages() or fabric.stdout[-3000:]
    site_tables = {}
    for n in sim_cluster.nodes:
        sh(n, f"printf %s {shlex.quote(SITE_FIREWALL)} | nft -f -")
        site_tables[n.name] = sh(n, f"nft -s list table {SITE_TABLE}")
    deploy = run_playbook(SERVER, sim_cluster.inventory, extravars=VARS)
    assert deploy.rc == 0, deploy.failure_messages() or deploy.stdout[-4000:]
    sim_cluster.site_tables = site_tables
    sim_cluster.outside = sim.client_address(sim_cluster.instance)
    return sim_cluster


def test_the_default_admits_the_head_subnet_and_the_ranks_ports_only_the_fabric_peers(site):
    head, worker = site.nodes
    rules = sh(head, f"cat {RULES}")
    assert f"elements = {{ {subnet(site)} }}" in rules and "the head's management subnet" in rules, rules
    # The controller (the bridge's address) and another client of the head's subnet are served.
    assert ask(site) == 200
    assert ask(site, site.outside) == 200

    # The TCPStore listens on every address of the head for the life of the group ...
    listening = sh(head, "ss -Hltn 'sport = :20000'")
    assert "0.0.0.0:20000" in listening, listening
    # Rank 0's broadcast queue listens on every address at a random port: the same must hold for it.
    queue = rank0_random_ports(head)
    assert len(queue) == 1, sh(head, "ss -Hltnp")
    dist, random, fabric = drops(head, *DIST_DROP), drops(head, *RANDOM_DROP), drops(worker, *FABRIC_DROP)
    outcomes = at_once(
        # Only the peer on the fabric reaches the TCPStore: not this machine, not the worker over the management
        # network ...
        lambda: connect(head.mgmt_ip, 20000),
        lambda: connect(head.mgmt_ip, 20000, source=site.outside),
        lambda: node_connect(worker, head.fabric_ip, 20000, source=worker.fabric_ip),
        lambda: node_connect(worker, head.mgmt_ip, 20000, source=worker.mgmt_ip),
        # ... nor the broadcast queue ...
        lambda: connect(head.mgmt_ip, queue[0]),
        lambda: node_connect(worker, head.fabric_ip, queue[0], source=worker.fabric_ip),
        # ... and what NCCL and Gloo bind to, the node's fabric address, admits the peers' fabric addresses only:
        # the head reaches the worker's sshd there from its fabric address, not from its management one.
        lambda: node_connect(head, worker.fabric_ip, 22, source=head.fabric_ip),
        lambda: node_connect(head, worker.fabric_ip, 22, source=head.mgmt_ip))
    assert outcomes == [DROPPED, DROPPED, "open", DROPPED, DROPPED, "open", "open", DROPPED], outcomes
    assert drops(head, *DIST_DROP) >= dist + 3
    assert drops(head, *RANDOM_DROP) > random
    assert drops(worker, *FABRIC_DROP) > fabric
    # SSH stays reachable from everywhere it was.
    assert connect(head.mgmt_ip, 22) == "open" and connect(worker.mgmt_ip, 22, source=site.outside) == "open"

    for n in site.nodes:
        # Loaded at boot before the rank, which wants it.
        assert sh(n, f"systemctl is-enabled {UNIT}; systemctl is-active {UNIT}").split() == ["enabled", "active"]
        rank = sh(n, f"systemctl show {RANK} -p Wants -p After")
        assert rank.count(UNIT) == 2, rank
        # The site's own firewall is exactly as it was.
        assert sh(n, f"nft -s list table {SITE_TABLE}") == site.site_tables[n.name]
    # The fabric role (which opens dropping input chains to the peers) finds nothing to open in this
    # table, though it does in the site's: a second site.yml leaves both alone.
    fabric = filter_plugin("fabric")
    ruleset = json.loads(sh(head, "nft -j list ruleset"))
    wanted = fabric.fabric_nft_missing(ruleset, [worker.fabric_ip], sim.FABRIC_IFACE)
    assert {(w["family"], w["table"]) for w in wanted} == {("ip", "filter")}, wanted


def test_a_client_outside_the_allowed_range_cannot_connect(site):
    head, worker = site.nodes
    started = [rank_started(n) for n in site.nodes]
    # Another tool flushed the worker's table: the next run loads it again.
    sh(worker, f"nft delete table {TABLE}")
    result = run_playbook(SERVER, site.inventory,
                          extravars={**VARS, "server_allowed_clients": [f"{site.bridge_ip}/32"]})
    assert result.rc == 0, result.failure_messages() or result.stdout[-4000:]
    assert changed(result) == {("spark-0", "Install the rules"), ("spark-0", "Load the firewall rules"),
                               ("spark-1", "Load the rules again where the table is gone")}
    # A new rule set does not restart the ranks.
    assert [rank_started(n) for n in site.nodes] == started
    assert sh(worker, f"nft list table {TABLE} >/dev/null && echo loaded").strip() == "loaded"

    before = drops(head, *HTTP_DROP)
    assert ask(site) == 200
    assert ask(site, site.outside) == DROPPED
    assert drops(head, *HTTP_DROP) > before
    # The client's path to the head is there: only the HTTP port is closed to it.
    assert connect(head.mgmt_ip, 22, source=site.outside) == "open"


def test_check_mode_shows_the_rules_it_would_add_and_changes_nothing(site):
    head = site.nodes[0]
    outside_half = next(str(n) for n in ipaddress.ip_network(subnet(site)).subnets(new_prefix=25)
                        if ipaddress.ip_address(site.outside) in n)
    before = sh(head, f"sha256sum {RULES}; nft -s list table {TABLE}")
    result = run_playbook(SERVER, site.inventory, check=True, diff=True,
                          extravars={**VARS, "server_allowed_clients": [f"{site.bridge_ip}/32", outside_half]})
    assert result.rc == 0, result.failure_messages() or result.stdout[-4000:]
    diff = result.results("Install the rules")["spark-0"]["diff"]
    after = "".join(d.get("after", "") for d in (diff if isinstance(diff, list) else [diff]))
    assert f"elements = {{ {site.bridge_ip}/32, {outside_half} }}" in after, after
    assert ("spark-0", "Install the rules") in changed(result)
    # Nothing happened on the node: the same file, the same table, the client still dropped.
    assert sh(head, f"sha256sum {RULES}; nft -s list table {TABLE}") == before
    assert ask(site, site.outside) == DROPPED


def no_contact_inventory(tmp_path: Path, cluster, host_vars: dict | None = None) -> Path:
    """The pair's addresses, reached by nothing: a play that tried would fail with "no_contact".
    `host_vars`: more variables of a host, by its name."""
    def host(n):
        return {"ansible_host": n.mgmt_ip, "spark_fabric_ip": n.fabric_ip, "ansible_connection": "no_contact",
                **(host_vars or {}).get(n.name, {})}

    head, worker = cluster.nodes
    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"spark": {
        "vars": {"spark_fabric_interface": sim.FABRIC_IFACE},
        "children": {"spark_head": {"hosts": {head.name: host(head)}},
                     "spark_workers": {"hosts": {worker.name: host(worker)}}}}}))
    return inv


# (id, where the setting goes, the setting, what the refusal says); {bridge}, {head}, {subnet} and {upper}
# are the pair's. The plans report every bad setting of every host at once, so one run of each playbook holds
# all three: each where its check looks (the allowed clients are each host's own, the HTTP port and the
# dist-init port the head's) and where no other case's error ends that host's plan first (a range that does
# not parse ends it before the controller's checks): the range that does not parse on the worker, the range
# that excludes the controller on the head, the dist-init port for the whole run.
BAD = [
    ("cidr-does-not-parse", "worker", {"server_allowed_clients": ["{subnet}", "10.231.0.0/33"]},
     "server_allowed_clients[1] = '10.231.0.0/33': does not parse as an IPv4 or IPv6 network"),
    ("range-excludes-the-controller", "head", {"server_allowed_clients": ["{upper}"]},
     "server_allowed_clients = ['{upper}']: excludes the controller ({bridge}: the source address of the "
     "controller's route to spark-0"),
    ("rules-cut-the-controllers-ssh", "run", {"server_dist_init_port": 22},
     "ansible_port = 22: the controller's SSH to spark-0 ({head} port 22, from {bridge}: the source address of the "
     "controller's route"),
]


def pair_names(cluster) -> dict[str, str]:
    return {"bridge": cluster.bridge_ip, "head": cluster.nodes[0].mgmt_ip, "subnet": subnet(cluster),
            "upper": str(list(ipaddress.ip_network(subnet(cluster)).subnets(new_prefix=25))[1])}


def with_names(settings: dict, names: dict[str, str]) -> dict:
    text = json.dumps(settings)
    for name, value in names.items():
        text = text.replace("{" + name + "}", value)
    return json.loads(text)


@pytest.fixture(scope="module")
def refused(sim_cluster, tmp_path_factory):
    """playbook -> (its one run with every bad case of BAD, the render directory it was given), run on first use."""
    runs = {}

    def run(playbook):
        if playbook not in runs:
            names = pair_names(sim_cluster)
            head, worker = (n.name for n in sim_cluster.nodes)
            placed = {"head": {}, "worker": {}, "run": {}}
            for _id, where, settings, _fragment in BAD:
                placed[where].update(with_names(settings, names))
            tmp = tmp_path_factory.mktemp("refused")
            out = tmp / "rendered"
            inv = no_contact_inventory(tmp, sim_cluster, {head: placed["head"], worker: placed["worker"]})
            runs[playbook] = (run_playbook(playbook, inv, envvars=NO_CONTACT,
                                           extravars={"server_render_dir": str(out), **placed["run"]}), out)
        return runs[playbook]

    return run


@pytest.mark.parametrize("playbook", ["playbooks/render.yml", "site.yml"])
@pytest.mark.parametrize("fragment", [case[3] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_input_is_refused_before_any_contact(sim_cluster, refused, playbook, fragment):
    result, out = refused(playbook)
    assert result.rc != 0, result.stdout[-3000:]
    assert failed_at(result) == {SITE_CHECK}, result.stdout[-3000:]
    assert result.changed == []
    assert "no_contact" not in result.stdout, "a node was contacted before the refusal"
    message = result.failure_messages()
    assert fragment.format(**pair_names(sim_cluster)) in message and "Fix:" in message, message
    assert not out.exists()


def test_the_node_refuses_what_the_controller_could_not_check_before_any_change(site):
    # As with a management address that is a name: the controller reads no route before contact
    # (here: the route it would read is given as none), so the head checks the range against the
    # controller's SSH session as it sees it, before this role or the server changes anything.
    head = site.nodes[0]
    before = sh(head, f"sha256sum {RULES}; nft -s list table {TABLE}")
    upper = str(list(ipaddress.ip_network(subnet(site)).subnets(new_prefix=25))[1])
    result = run_playbook(SERVER, site.inventory, extravars={
        **VARS, "__firewall_routes": {}, "server_allowed_clients": [upper]})
    assert result.rc != 0
    assert failed_at(result) == {REFUSED}, result.stdout[-3000:]
    assert result.changed_before_first_failure() == []
    message = result.failure_messages()
    assert (f"excludes the controller ({site.bridge_ip}: the address the node sees the controller's SSH session "
            "come from)") in message and "Fix:" in message, message
    assert sh(head, f"sha256sum {RULES}; nft -s list table {TABLE}") == before


def test_the_rules_are_loaded_at_boot_before_the_rank_the_group_forms_and_a_run_changes_nothing(site):
    head = site.nodes[0]
    sim.power_cycle(site.instance, [head.name])
    # The power cycle took the runtime ruleset with it: what is there now, the boot loaded.
    wait_for(lambda: sh(head, f"systemctl is-active {RANK}", check=False).strip() == "active", "the head's rank", 120)
    assert sh(head, f"systemctl is-active {UNIT}").strip() == "active"
    loaded = sh(head, f"nft list table {TABLE}")
    assert f"elements = {{ {site.bridge_ip} }}" in loaded, loaded
    firewall_up = int(sh(head, f"systemctl show {UNIT} -p ActiveEnterTimestampMonotonic --value"))
    assert 0 < firewall_up <= rank_started(head)
    # The worker's rank lost its peer and rejoins the head's new one over the fabric, through the rules.
    wait_for(lambda: ask(site) == 200, "the pair to form and serve again", 300, every=0.5)
    assert at_once(lambda: ask(site, site.outside), lambda: connect(head.mgmt_ip, 20000)) == [DROPPED, DROPPED]
    # What the boot left is what the deployment installs: a second run with the same settings changes nothing.
    result = run_playbook(SERVER, site.inventory,
                          extravars={**VARS, "server_allowed_clients": [f"{site.bridge_ip}/32"]})
    assert result.rc == 0, result.failure_messages() or result.stdout[-4000:]
    assert changed(result) == set()

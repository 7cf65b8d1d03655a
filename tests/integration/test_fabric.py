"""The fabric role on the simulated nodes: refusals before any change, from scratch to a proven link, idempotence.

The nodes' fabric port starts at MTU 1500 without an address. Observations go
over SSH (the harness key, or testinfra with the inventory), never nsenter.

What a run costs is paid once where one run proves several tests' points: the refusals share runs
(the inventory check and the role's input check each report every problem of every host at once, so
one run carries several bad settings, each test asserting its own message in it), and the tests on a
configured pair converge only when no earlier test left the pair proven converged (a run with nothing
changed) - a test clears that before it changes a node by hand. The tests that break the link by hand
come last.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import testinfra

from tests.harness import cluster as sim
from tests.lib.fabric_runs import RDMA_BW_TASK
from tests.lib.playbook import SITE_CHECK, run_playbook

PLAYBOOK = "playbooks/fabric.yml"
IFACE = "enp1s0f1np1"
NETPLAN = "/etc/netplan/40-cx7.yaml"
KEY = "/root/.ssh/id_spark_fabric"
RECORD = "/var/lib/spark-llm-fabric/proof.json"
APPLY_TASK = "Apply the netplan configuration"
NETPLAN_TASK = "Write the fabric netplan file"
FACTS_TASK = "Publish the node's fabric facts for the server"
# Every bandwidth measurement is in it: a run that changes nothing skips it once.
MEASURE_INCLUDE = "Measure the link's bandwidth where this run changed it or the site asked"
BANDWIDTH_TASK = "Check the bandwidth against the minimum"
TRUST_INCLUDE = "Set up the head's SSH trust to every worker"
TRUST_PROOF_TASK = "Prove that the head reaches each worker over the fabric with the pinned key"
RDMA_TASK = "Show each rail and whether NCCL can use RoCE on it, and why not"

HCA = "rocep1s0f1"
# The second rail of the cabled QSFP cage, which the harness inventory names (spark_fabric_extra_rails).
RAIL2, HCA2 = sim.RAIL2_IFACE, sim.RAIL2_HCA
BUSBW_TASK = "Show the all-reduce bus bandwidth and the network NCCL used, and check it against the minimum"
# The RoCE stand-in's settings as a node boots (tests/standins/README.md).
ROCE_DEFAULTS = {"roce_v2": True, "port_state": "auto", "max_mtu": 4096}


def messages(result) -> str:
    """Every failure message, including those of individual loop items."""
    out = []
    for d in result.failed:
        res = d.get("res", {})
        out.append(str(res.get("msg", "")))
        out.extend(str(r["msg"]) for r in res.get("results", []) if r.get("msg"))
    return "\n".join(out)


def skipped(result, task) -> set[str]:
    """Hosts on which the task named `task` was skipped (a skipped include's result carries no flag of its own)."""
    return {e["event_data"]["host"] for e in result.task_events("runner_on_skipped") if e["event_data"].get("task") == task}


def reset_fabric(cluster) -> None:
    """Back to a node as delivered: no fabric file, no address, MTU 1500, no fabric key or pins."""
    for n in cluster.nodes:
        sim.ssh(n, f"rm -f {NETPLAN} {KEY} {KEY}.pub {RECORD} && netplan apply && ip addr flush dev {IFACE} "
                   f"&& ip link set {IFACE} mtu 1500 && ip addr flush dev {RAIL2} && ip link set {RAIL2} mtu 1500 "
                   "&& sed -i '/spark-fabric@/d' /root/.ssh/authorized_keys "
                   "&& rm -f /root/.ssh/known_hosts && (nft flush ruleset || true)")


# Set when the last fabric run left the pair converged (rc 0, nothing changed) and nothing was changed by hand
# since; cleared by a test before it changes a node. `configured` converges only when it is unset.
_pair = {"converged": False}


def proven_converged(result) -> None:
    """Record that `result` (a run whose rc and changes its test asserted) left the pair converged."""
    _pair["converged"] = result.rc == 0 and result.changed == []


def changing_by_hand() -> None:
    """A test is about to change a node's fabric state: the next `configured` converges again."""
    _pair["converged"] = False


@pytest.fixture(scope="module")
def delivered(sim_cluster):
    """Nodes without any fabric configuration (a freshly booted pair holds none; the reset makes sure)."""
    changing_by_hand()
    reset_fabric(sim_cluster)
    return sim_cluster


@pytest.fixture
def fresh(delivered):
    """Nodes without any fabric configuration: the refusals leave them so (each test checks it)."""
    return delivered


@pytest.fixture
def configured(sim_cluster, sim_inventory):
    """Nodes with the fabric configured: a converge unless an earlier test left them proven so."""
    if not _pair["converged"]:
        result = run_playbook(PLAYBOOK, sim_inventory)
        assert result.rc == 0, result.failure_messages()
        proven_converged(result)
    return sim_cluster


def rail2_ip(cluster, host: str) -> str:
    """`host`'s address on the second rail: the rail's subnet with its host number on the fabric."""
    n = next(n for n in cluster.nodes if n.name == host)
    host_number = int(ipaddress.ip_address(n.fabric_ip)) - int(ipaddress.ip_network(cluster.fabric_subnet).network_address)
    return str(ipaddress.ip_network(cluster.rail2_subnet).network_address + host_number)


def untouched(cluster) -> None:
    for n in cluster.nodes:
        assert sim.ssh(n, f"test -e {NETPLAN} && echo present || echo absent").strip() == "absent"
        assert "mtu 1500" in sim.ssh(n, f"ip link show {IFACE}")
        assert "inet " not in sim.ssh(n, f"ip -4 addr show dev {IFACE}")
        assert "inet " not in sim.ssh(n, f"ip -4 addr show dev {RAIL2}")


def inventory_variant(sim_cluster, tmp_path, edit) -> Path:
    """A copy of the harness inventory with `edit(inventory_dict)` applied."""
    inv = tmp_path / "inventory"
    inv.mkdir(parents=True)
    data = json.loads((sim_cluster.inventory / "hosts.json").read_text())
    edit(data["spark"])
    (inv / "hosts.json").write_text(json.dumps(data))
    (inv / "group_vars").symlink_to((sim_cluster.inventory / "group_vars").resolve())
    return inv


def assert_refused(result, cluster, *fragments, by="Check "):
    assert result.rc != 0
    assert result.failed, "the run did not fail"
    assert result.changed_before_first_failure() == [], "something changed before the refusal"
    assert result.changed == []
    assert all(d["task"].startswith(by) for d in result.failed), [d["task"] for d in result.failed]
    message = messages(result)
    for fragment in fragments + (("Fix:",) if by == "Check " else ()):
        assert fragment in message, f"{fragment!r} missing from:\n{message}"
    untouched(cluster)


def one_head_layout(heads):
    """An inventory edit that puts `heads` in spark_head and every other host in spark_workers."""
    def edit(spark):
        hosts = {**spark["children"]["spark_head"]["hosts"], **spark["children"]["spark_workers"]["hosts"]}
        spark["children"]["spark_head"]["hosts"] = {h: hosts[h] for h in heads}
        spark["children"]["spark_workers"]["hosts"] = {h: v for h, v in hosts.items() if h not in heads}

    return edit


def worker_off_subnet(spark):
    spark["children"]["spark_workers"]["hosts"]["spark-1"].update(spark_fabric_ip="10.233.77.11")


def bad_fabric_input(spark):
    """Every input the role's own check refuses, spread over the hosts: the check reports all of them at once."""
    head = spark["children"]["spark_head"]["hosts"]["spark-0"]
    worker = spark["children"]["spark_workers"]["hosts"]["spark-1"]
    head.update(spark_fabric_interface="enp1s0f0np0", fabric_mtu=9300)  # no such port; MTU too high
    # The role's own address (the site's spark_fabric_ip, whose subnets the inventory check judges first, wires it)
    # off the head's subnet; MTU too low.
    worker.update(fabric_ip="10.233.77.11", fabric_mtu=1000)
    # A rail in the fabric port's own subnet on the head, a rail subnet with host bits set on the worker.
    fabric_subnet = spark["vars"]["spark_fabric_extra_rails"][0]["subnet"].replace("10.233.", "10.232.")
    head.update(spark_fabric_extra_rails=[{"interface": RAIL2, "subnet": fabric_subnet}])
    worker.update(spark_fabric_extra_rails=[{"interface": RAIL2, "subnet": "10.234.0.7/24"}])


@pytest.fixture(scope="module")
def refusal(delivered, sim_inventory, tmp_path_factory):
    """`refusal(name)`: the run of fabric.yml that refuses `name`'s bad input, run once for every test it proves.

    - "no-head": the inventory check (the server role's plan) refuses all topology problems of all hosts at
      once: no head, and both hosts given one fabric address (`-e spark_fabric_ip`).
    - "two-heads": the other head layout it refuses (one inventory holds one layout).
    - "subnet": the inventory check refuses a group whose spark_fabric_ip are not one subnet.
    - "input": the role's input check, one message per host naming every bad setting of that host: the head
      with a port it does not have, MTU 9300 and a rail in the fabric's subnet, the worker off the common subnet with
      MTU 1000 and a rail subnet with host bits set.
    """
    runs = {}

    def run(name):
        if name not in runs:
            where = tmp_path_factory.mktemp(name)
            if name == "no-head":
                runs[name] = run_playbook(PLAYBOOK, inventory_variant(delivered, where, one_head_layout([])),
                                          extravars={"spark_fabric_ip": delivered.nodes[0].fabric_ip})
            elif name == "subnet":
                runs[name] = run_playbook(PLAYBOOK, inventory_variant(delivered, where, worker_off_subnet))
            elif name == "two-heads":
                runs[name] = run_playbook(PLAYBOOK, inventory_variant(delivered, where,
                                                                      one_head_layout(["spark-0", "spark-1"])))
            else:
                runs[name] = run_playbook(PLAYBOOK, inventory_variant(delivered, where, bad_fabric_input))
        return runs[name]

    return run


def test_refuses_duplicate_fabric_addresses(fresh, refusal):
    dup = fresh.nodes[0].fabric_ip
    result = refusal("no-head")  # with -e spark_fabric_ip={dup}
    assert_refused(result, fresh, f"spark_fabric_ip {dup} of spark-0 is also the address of spark-1", "Fix:", by=SITE_CHECK)


def test_refuses_address_off_the_common_subnet(fresh, refusal):
    result = refusal("input")  # spark-1's fabric_ip at 10.233.77.11
    assert_refused(result, fresh, "shares no subnet with its TP group's", "spark-1 (10.233.77.11/24)")


def test_the_inventory_check_refuses_a_group_off_one_subnet(fresh, refusal):
    result = refusal("subnet")  # spark-1's spark_fabric_ip at 10.233.77.11
    assert_refused(result, fresh, "the TP group: its fabric addresses (spark_fabric_ip / spark_fabric_prefix) lie in 2 "
                   "subnets", "spark-1 (10.233.77.11/24)", "Fix: put every fabric address of the group in one subnet",
                   by=SITE_CHECK)


@pytest.mark.parametrize("heads", [[], ["spark-0", "spark-1"]], ids=["no-head", "two-heads"])
def test_refuses_anything_but_one_head(fresh, refusal, heads):
    result = refusal("two-heads" if heads else "no-head")
    assert_refused(result, fresh, f"inventory group spark_head = {heads}: it must hold exactly one host", "Fix:", by=SITE_CHECK)


def test_refuses_missing_interface(fresh, refusal):
    result = refusal("input")  # spark-0's spark_fabric_interface is enp1s0f0np0
    assert_refused(result, fresh, "fabric_interface (spark_fabric_interface) is enp1s0f0np0",
                   f"it has {IFACE}, {RAIL2}, enP7s7, lo")


def test_refuses_a_rail_that_cannot_work(fresh, refusal):
    result = refusal("input")  # spark-0's rail in the fabric's subnet, spark-1's with host bits set
    said = " ".join(messages(result).split())
    assert_refused(result, fresh, "fabric_extra_rails (spark_fabric_extra_rails)[0].subnet")
    assert "spark-0: fabric_extra_rails (spark_fabric_extra_rails)[0].subnet 10.232." in said, said
    assert "overlaps the fabric port's subnet" in said and "Fix: give each rail a subnet of its own" in said, said
    assert "spark-1: fabric_extra_rails (spark_fabric_extra_rails)[0].subnet is '10.234.0.7/24'" in said, said
    assert "has host bits set" in said, said


@pytest.mark.parametrize("mtu", [9300, 1000])
def test_refuses_mtu_out_of_range(fresh, refusal, mtu):
    result = refusal("input")  # fabric_mtu 9300 on spark-0, 1000 on spark-1
    assert_refused(result, fresh, f"fabric_mtu is {mtu}", "1500 to 9216")


def test_refuses_mtu_that_is_no_number(fresh, sim_inventory):
    # The argument spec (type int) refuses it even earlier, before the role's first task.
    result = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_mtu": "jumbo"})
    assert_refused(result, fresh, "fabric_mtu", "jumbo", by="Validating arguments")


def test_configures_and_proves_the_link_from_scratch(fresh, sim_inventory):
    changing_by_hand()
    untouched(fresh)
    check = run_playbook(PLAYBOOK, sim_inventory, check=True, diff=True)
    assert check.rc == 0, check.failure_messages()
    assert {d["host"] for d in check.changed if d["task"] == NETPLAN_TASK} == {"spark-0", "spark-1"}
    untouched(fresh)

    first = run_playbook(PLAYBOOK, sim_inventory)
    assert first.rc == 0, first.failure_messages() or first.stdout[-4000:]
    applied = first.results(APPLY_TASK)
    assert set(applied) == {"spark-0", "spark-1"} and all(r.get("changed") for r in applied.values())
    # The bandwidth proof really ran (the test site sets a floor).
    assert first.results(BANDWIDTH_TASK)["spark-0"].get("skipped") is not True
    for host, res in first.results(FACTS_TASK).items():
        facts = res["ansible_facts"]
        ip = next(n.fabric_ip for n in fresh.nodes if n.name == host)
        assert facts["fabric_socket_ifname"] == IFACE
        assert facts["fabric_host_ip"] == ip
        # The RoCE device behind the port (the stand-in's), read again after netplan apply gave the port its
        # address and MTU: ACTIVE, RDMA at 4096, the RoCE v2 GID of the new address (index 3: after the link-local
        # v1 and v2 entries and the address's v1 one).
        # Both rails' devices, the fabric port's first; the bootstrap sockets stay on the fabric port.
        assert facts["fabric_ib_hcas"] == [HCA, HCA2]
        assert facts["fabric_ib_gid_index"] == "3"
        assert facts["fabric_env"] == {"NCCL_SOCKET_IFNAME": IFACE, "GLOO_SOCKET_IFNAME": IFACE,
                                       "TP_SOCKET_IFNAME": IFACE, "SGLANG_HOST_IP": ip,
                                       "NCCL_IB_HCA": f"{HCA},{HCA2}", "NCCL_IB_GID_INDEX": "3"}
        ip2 = rail2_ip(fresh, host)
        peer = next(rail2_ip(fresh, n.name) for n in fresh.nodes if n.name != host)
        said = " ".join(first.results(RDMA_TASK)[host]["msg"].split())
        assert said == (f"{host}: rail {RAIL2} ({ip2}/24, MTU 9000) reaches {peer} with full-size frames; "
                        f"{HCA} port 1 ({IFACE}): ACTIVE, active MTU 4096, RoCE v2 GID index 3 ({ip}); "
                        f"{HCA2} port 1 ({RAIL2}): ACTIVE, active MTU 4096, RoCE v2 GID index 3 ({ip2})."), said
    # RDMA moved data between the rails the ranks are given (the stand-in's figure; its exchange is real TCP
    # between the fabric addresses).
    measured = first.results(RDMA_BW_TASK)["spark-0"]["results"]
    assert [m["msg"] for m in measured] == [f"spark-0 {hca} -> spark-1 {hca}: RDMA write 97.50 Gbit/s "
                                            "(no minimum set: fabric_rdma_min_gbps)." for hca in (HCA, HCA2)], measured
    # Each rail's exchange went to the worker's address on that rail.
    assert [m["item"]["item"]["address"] for m in measured] == [fresh.nodes[1].fabric_ip, rail2_ip(fresh, "spark-1")]
    # All-reduce across the group over both rails (the stand-in's figure: 11.6 GB/s a rail, less a latency), launched
    # by mpirun over the SSH trust this very run set up.
    said = " ".join(first.results(BUSBW_TASK)["spark-0"]["msg"].split())
    assert said == (f"all-reduce across spark-0, spark-1 (1G messages): 23.19 GB/s bus bandwidth over NCCL's IB transport "
                    f"({HCA}, {HCA2}) (no minimum set: fabric_min_busbw_gbps)."), said
    # The figures are kept on the head for verify's report and the monitoring.
    record = json.loads(sim.ssh(fresh.nodes[0], f"cat {RECORD}"))
    assert [p["gbits_per_second"] for p in record["rdma_write"]["pairs"]] == [97.5, 97.5]
    assert (record["all_reduce"]["busbw_gbytes_per_second"], record["all_reduce"]["network"]) == (23.19, "IB")
    assert first.results(FACTS_TASK)["spark-0"]["ansible_facts"]["fabric_figures"] == record

    second = run_playbook(PLAYBOOK, sim_inventory)
    assert second.rc == 0, second.failure_messages()
    assert second.changed == []
    assert second.results(APPLY_TASK) == {}
    # Nothing changed: the netplan file found in place by the probe and not sent again, no bandwidth measured,
    # the trust read in place by the probes and not set up again.
    assert skipped(second, NETPLAN_TASK) == {"spark-0", "spark-1"}
    assert skipped(second, MEASURE_INCLUDE) == {"spark-0", "spark-1"}
    # Nothing measured: the head's record as its probe read it.
    assert second.results(FACTS_TASK)["spark-0"]["ansible_facts"]["fabric_figures"] == record
    assert second.results(BANDWIDTH_TASK) == {}
    assert skipped(second, TRUST_INCLUDE) == {"spark-0", "spark-1"}
    assert second.results(TRUST_PROOF_TASK) == {}
    # On request the bandwidth is measured on a run that changes nothing, and still changes nothing.
    asked = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_iperf_always": True})
    assert asked.rc == 0, asked.failure_messages()
    assert asked.changed == []
    assert asked.results(BANDWIDTH_TASK)["spark-0"].get("skipped") is not True
    # So is the RDMA bandwidth, and a floor above it fails the proof with the figure.
    floor = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_rdma_bw_always": True, "fabric_rdma_min_gbps": 150,
                                                             "fabric_iperf_min_gbps": 0})
    assert floor.rc != 0 and floor.changed == []
    said = " ".join(messages(floor).split())
    assert f"spark-0 {HCA} -> spark-1 {HCA} over {IFACE}: 97.50 Gbit/s, below fabric_rdma_min_gbps 150" in said, said
    assert f"spark-0 {HCA2} -> spark-1 {HCA2} over {RAIL2}: 97.50 Gbit/s, below fabric_rdma_min_gbps 150" in said, said

    again = run_playbook(PLAYBOOK, sim_inventory, check=True, diff=True)
    assert again.rc == 0, again.failure_messages()
    assert again.changed == []
    proven_converged(asked)


@pytest.fixture
def hosts(configured, sim_inventory):
    """testinfra hosts through the inventory (ansible backend)."""
    venv_bin = str(Path(sys.executable).parent)
    old_path = os.environ.get("PATH", "")
    if shutil.which("ansible-inventory") is None:
        os.environ["PATH"] = f"{venv_bin}:{old_path}"
    yield {n.name: testinfra.get_host(f"ansible://{n.name}?ansible_inventory={sim_inventory}") for n in configured.nodes}
    os.environ["PATH"] = old_path


def test_testinfra_netplan_file_mtu_and_address(configured, hosts):
    for n in configured.nodes:
        host = hosts[n.name]
        f = host.file(NETPLAN)
        assert f.exists and f.user == "root" and f.mode == 0o600
        assert f.content_string.startswith("#\n# Ansible managed")
        assert f"name: {IFACE}" in f.content_string
        assert f"- {n.fabric_ip}/24" in f.content_string
        assert "mtu: 9000" in f.content_string
        link = json.loads(host.check_output(f"ip -j addr show dev {IFACE}"))[0]
        assert link["mtu"] == 9000
        assert [(a["local"], a["prefixlen"]) for a in link["addr_info"] if a["family"] == "inet"] == [(n.fabric_ip, 24)]


def test_testinfra_ssh_trust_head_to_worker(configured, hosts):
    head, *workers = configured.nodes
    h = hosts[head.name]
    assert h.file(KEY).mode == 0o600
    for w in workers:
        out = h.run(f"ssh -i {KEY} -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes "
                    f"-o ConnectTimeout=5 root@{w.fabric_ip} 'echo $SSH_CONNECTION'")
        assert out.rc == 0, out.stderr
        # The session came in over the fabric, from the head's fabric address.
        assert out.stdout.split()[0] == head.fabric_ip and out.stdout.split()[2] == w.fabric_ip
        auth = hosts[w.name].file("/root/.ssh/authorized_keys").content_string
        line = next(x for x in auth.splitlines() if "spark-fabric@" in x)
        assert line.startswith(f'from="{head.fabric_ip}",restrict ssh-ed25519 ')
        # The key works only from the head's fabric address: the management address is turned away.
        # (ssh's own 255 would read as a transport error to testinfra: report it in the output instead.)
        out = h.run(f"ssh -i {KEY} -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=no "
                    f"-o UserKnownHostsFile=/dev/null -o ConnectTimeout=5 root@{w.mgmt_ip} true 2>&1; echo exit=$?")
        assert "Permission denied (publickey" in out.stdout and out.stdout.strip().endswith("exit=255"), out.stdout
        # Pinned, not trusted on first use: an unknown address is refused under strict checking.
        assert w.fabric_ip in h.file("/root/.ssh/known_hosts").content_string


def test_a_missing_piece_of_the_ssh_trust_is_put_back(configured, sim_inventory):
    """The probes read the trust on both ends: a worker's authorized_keys entry gone, then the head's pin of the
    worker's host key gone, are each found, put back and proven; the run after changes nothing."""
    head, worker = configured.nodes
    changing_by_hand()
    for damage, node, task in (
        ("sed -i '/spark-fabric@/d' /root/.ssh/authorized_keys", worker,
         "Accept the head's fabric key on the worker, from the head's fabric address only"),
        (f"sed -i '/^{worker.fabric_ip} ssh-ed25519 /d' /root/.ssh/known_hosts", head,
         "Pin each worker's host keys for its fabric address on the head"),
    ):
        sim.ssh(node, damage)
        result = run_playbook(PLAYBOOK, sim_inventory)
        assert result.rc == 0, messages(result) or result.stdout[-4000:]
        assert {d["task"] for d in result.changed} == {task}, [d["task"] for d in result.changed]
        assert all(r.get("rc") == 0 for r in result.results(TRUST_PROOF_TASK)[head.name]["results"])
        # Only the link's changes measure the bandwidth.
        assert result.results(BANDWIDTH_TASK) == {}
    again = run_playbook(PLAYBOOK, sim_inventory)
    assert again.rc == 0 and again.changed == []
    assert skipped(again, TRUST_INCLUDE) == {"spark-0", "spark-1"}
    proven_converged(again)


DRIFT_TASK = "Report the fabric port's drift from the configuration, and repair it"


def port(n, iface=IFACE) -> dict:
    link = json.loads(sim.ssh(n, f"ip -j addr show dev {iface}"))[0]
    return {"up": "UP" in link["flags"], "carrier": "NO-CARRIER" not in link["flags"], "mtu": link["mtu"],
            "addresses": [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"]}


# The drift test's last run, a no-change run on the converged pair: the next test reads it instead of making it again.
_no_change_run: dict = {}


def test_mtu_and_link_drift_are_repaired_and_reported(configured, sim_inventory):
    """The file is unchanged, the live port is not: the MTU set back by hand on one node, the link set down on the
    other (its peer loses the carrier, networkd drops the address). fabric.yml reports and repairs both."""
    head, worker = configured.nodes
    changing_by_hand()
    sim.ssh(worker, f"ip link set {IFACE} mtu 1500 && ip link set {RAIL2} mtu 1500")
    sim.ssh(head, f"ip link set {IFACE} down")
    result = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_iperf_min_gbps": 0})
    assert result.rc == 0, messages(result) or result.stdout[-4000:]
    drift = {h: r["msg"] for h, r in result.results(DRIFT_TASK).items() if not r.get("skipped")}
    assert f"{IFACE} is down (set down by hand" in drift[head.name] and f"ip link set {IFACE} up" in drift[head.name]
    assert f"{IFACE} has MTU 1500, configured 9000" in drift[worker.name]
    assert f"{RAIL2} has MTU 1500, configured 9000" in drift[worker.name]
    assert {d["host"] for d in result.changed if d["task"] == APPLY_TASK} == {head.name, worker.name}
    assert [d["host"] for d in result.changed if d["task"] == "Bring the fabric port and rails up"] == [head.name]
    for n in configured.nodes:
        assert port(n) == {"up": True, "carrier": True, "mtu": 9000, "addresses": [f"{n.fabric_ip}/24"]}, n.name
        assert port(n, RAIL2) == {"up": True, "carrier": True, "mtu": 9000,
                                  "addresses": [f"{rail2_ip(configured, n.name)}/24"]}, n.name
    again = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_iperf_min_gbps": 0})
    assert again.rc == 0 and again.changed == []
    proven_converged(again)
    _no_change_run["result"] = again


def test_no_active_firewall_is_left_alone(configured, sim_inventory):
    # The run the drift test just made on the converged pair is this very run (same inventory and variables, no
    # firewall on either node since): it is read here rather than made again.
    result = _no_change_run.pop("result", None) or run_playbook(PLAYBOOK, sim_inventory,
                                                                 extravars={"fabric_iperf_min_gbps": 0})
    assert result.rc == 0, result.failure_messages()
    assert result.changed == []
    # The probe read no dropping chain: the firewall's tasks are not even included.
    assert skipped(result, "Let the peers through an active host firewall") == {"spark-0", "spark-1"}
    assert result.results("Accept the peers' fabric addresses on the fabric interface in nftables") == {}
    for n in configured.nodes:
        assert sim.ssh(n, "nft list ruleset").strip() == ""


def test_active_nftables_firewall_opens_only_the_fabric_to_peers(configured, sim_inventory):
    ruleset = (
        "table inet filter { chain input { type filter hook input priority 0; policy drop; "
        "ct state established,related accept; iifname lo accept; iifname enP7s7 tcp dport 22 accept; }; }"
    )
    changing_by_hand()
    for n in configured.nodes:
        sim.ssh(n, f"nft '{ruleset}'")
    try:
        result = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_iperf_min_gbps": 0})
        assert result.rc == 0, result.failure_messages()
        for n in configured.nodes:
            other = next(p for p in configured.nodes if p is not n)
            peer, peer2 = other.fabric_ip, rail2_ip(configured, other.name)
            rules = sim.ssh(n, "nft list chain inet filter input")
            assert f'iifname "{IFACE}" ip saddr {peer} counter' in rules and f'comment "spark-fabric from {peer}"' in rules
            assert f'iifname "{RAIL2}" ip saddr {peer2} counter' in rules, rules
            assert rules.count("spark-fabric") == 2
        again = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_iperf_min_gbps": 0})
        assert again.rc == 0 and again.changed == []
    finally:
        for n in configured.nodes:
            sim.ssh(n, "nft flush ruleset")
    # The ruleset is empty again, as before the test: the fabric as converged, without a firewall to open.
    proven_converged(again)


def test_proof_names_the_same_subnet_on_two_interfaces(configured, sim_inventory):
    worker = configured.nodes[1]
    twin = configured.nodes[1].fabric_ip.rsplit(".", 1)[0] + ".100"  # .0/25 holds both nodes
    # A second, more specific route for the fabric subnet on the management port: the classic TP=2 hang.
    changing_by_hand()
    sim.ssh(worker, f"ip addr add {twin}/25 dev enP7s7")
    try:
        result = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_iperf_min_gbps": 0, "fabric_ssh_trust": False})
        assert result.rc != 0
        message = messages(result)
        assert "leaves via enP7s7" in message and "same subnet on two interfaces" in message, message
    finally:
        sim.ssh(worker, f"ip addr del {twin}/25 dev enP7s7")
    # The refused run changed nothing and the planted address is gone: still the converged pair.
    _pair["converged"] = result.changed == []


def roce(cluster, node, **knobs) -> None:
    """Set the node's RoCE stand-in knobs; its reload returns once its tree shows them (tests/standins/README.md)."""
    sim.set_knobs(cluster.instance, node.name, {"roce": knobs})
    sim.ssh(node, "systemctl reload spark-sim-roce")


def test_each_cause_that_keeps_nccl_off_rdma_is_named(configured, sim_inventory):
    """NCCL given no usable RoCE device serves over sockets without failing. The proof names each cause: a port
    the driver keeps down (spark-0), a device without RoCE v2 (spark-1), then a port whose MTU is capped; the
    ranks get no RDMA device they cannot use; with fabric_rdma_required the run fails on the same causes."""
    head, worker = configured.nodes
    try:
        roce(configured, head, port_state="DOWN")
        roce(configured, worker, roce_v2=False)
        result = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_iperf_min_gbps": 0})
        assert result.rc == 0 and result.changed == [], messages(result) or result.stdout[-4000:]
        said = {h: r["msg"] for h, r in result.results(RDMA_TASK).items()}
        assert f"{HCA} port 1 ({IFACE}): DOWN, active MTU 4096, RoCE v2 GID index 3" in said[head.name], said
        assert "although enp1s0f1np1 has its link: the driver keeps the RDMA port down" in said[head.name], said
        assert f"has {worker.fabric_ip} only in a GID of type IB/RoCE v1" in said[worker.name], said
        assert all("WARNING:" in m and "falls back to its socket transport" in m for m in said.values()), said
        for host, res in result.results(FACTS_TASK).items():
            facts = res["ansible_facts"]
            assert (facts["fabric_ib_hcas"], facts["fabric_ib_gid_index"]) == ([], ""), host
            assert "NCCL_IB_HCA" not in facts["fabric_env"] and "NCCL_IB_GID_INDEX" not in facts["fabric_env"], host

        # NCCL itself, asked: it falls back to sockets, a tenth of the figure, and a minimum fails the run on it.
        floor = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_iperf_min_gbps": 0, "fabric_busbw_always": True,
                                                                 "fabric_min_busbw_gbps": 10})
        assert floor.rc != 0 and floor.changed == [] and {d["task"] for d in floor.failed} == {BUSBW_TASK}
        said = " ".join(messages(floor).split())
        assert "1.9 GB/s over NCCL's socket transport, not RDMA: spark-0, spark-1 found no usable RoCE device" in said, said

        required = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_iperf_min_gbps": 0, "fabric_rdma_required": True})
        assert required.rc != 0 and required.changed == []
        assert {d["host"] for d in required.failed} == {head.name, worker.name}
        assert {d["task"] for d in required.failed} == {RDMA_TASK}
        message = messages(required)
        assert "the driver keeps the RDMA port down" in message and "only in a GID of type IB/RoCE v1" in message
        assert "fabric_rdma_required is true: the ranks would run without RDMA" in message

        roce(configured, head, port_state="auto")
        roce(configured, worker, roce_v2=True, max_mtu=1024)
        capped = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_iperf_min_gbps": 0, "fabric_rdma_required": True})
        assert capped.rc == 0 and capped.changed == [], messages(capped)
        said = {h: r["msg"] for h, r in capped.results(RDMA_TASK).items()}
        assert "runs RDMA at an active MTU of 1024, not the 4096 that the fabric MTU 9000 allows: the port's maximum " \
               "is 1024" in said[worker.name], said
        assert f"active MTU 4096, {worker.name} has 1024: RDMA between them runs at 1024" in said[head.name], said
        assert "falls back" not in said[head.name] + said[worker.name]
        # Still RDMA, at the smaller MTU: the ranks get the devices.
        assert all(r["ansible_facts"]["fabric_ib_hcas"] == [HCA, HCA2] for r in capped.results(FACTS_TASK).values())
    finally:
        for n in configured.nodes:
            roce(configured, n, **ROCE_DEFAULTS)


def test_a_rail_down_is_a_warning_with_its_cause_and_the_ranks_keep_the_other(configured, sim_inventory):
    """The worker's second rail loses its cable at the switch: no run can bring it back. Both nodes warn with the
    cause, nothing fails or changes, every rank is given the fabric port's device only (NCCL pairs the ranks' devices
    by order), and the RDMA bandwidth is measured on the rail that works. Plugged back, the ranks get both again."""
    head, worker = configured.nodes
    changing_by_hand()
    sim.unplug_rail(configured.instance, worker.name)
    try:
        result = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_iperf_min_gbps": 0, "fabric_rdma_bw_always": True,
                                                                  "fabric_rdma_required": True, "fabric_busbw_always": True})
        assert result.rc == 0 and result.changed == [], messages(result) or result.stdout[-4000:]
        rail = {h: " ".join(r["msg"].split()) for h, r in result.results(RDMA_TASK).items()}
        assert f"WARNING: rail {RAIL2} is up with NO CARRIER" in rail[worker.name], rail
        assert "the ranks run on the other rails until it is fixed" in rail[worker.name], rail
        assert f"does not answer: {worker.name}'s {RAIL2} has no carrier" in rail[head.name], rail
        rdma = {h: " ".join(r["msg"].split()) for h, r in result.results(RDMA_TASK).items()}
        assert f"{HCA2} port 1 is DOWN because {RAIL2} has no link" in rdma[worker.name], rdma
        assert f"NCCL runs RDMA on {HCA} only" in rdma[worker.name] and "socket" not in rdma[worker.name], rdma
        assert f"rail {RAIL2} is left out of NCCL_IB_HCA: {worker.name} cannot use it" in rdma[head.name], rdma
        for host, res in result.results(FACTS_TASK).items():
            assert res["ansible_facts"]["fabric_ib_hcas"] == [HCA], host
            assert res["ansible_facts"]["fabric_env"]["NCCL_IB_HCA"] == HCA, host
        measured = result.results(RDMA_BW_TASK)["spark-0"]["results"]
        assert [m["item"]["item"]["rail"] for m in measured] == [IFACE], measured
        # The group's all-reduce runs on the rail every rank has: about half the figure of both.
        said = " ".join(result.results(BUSBW_TASK)["spark-0"]["msg"].split())
        assert f"11.6 GB/s bus bandwidth over NCCL's IB transport ({HCA})" in said, said
    finally:
        sim.unplug_rail(configured.instance, worker.name, plugged=True)
    # networkd puts the rail's address back with the carrier; the run after it finds both rails as configured.
    sim.ssh(worker, f"timeout 20 sh -c 'until ip -4 addr show dev {RAIL2} | grep -q inet; do sleep 0.1; done'")
    back = run_playbook(PLAYBOOK, sim_inventory, extravars={"fabric_iperf_min_gbps": 0})
    assert back.rc == 0 and back.changed == [], messages(back)
    assert all(r["ansible_facts"]["fabric_ib_hcas"] == [HCA, HCA2] for r in back.results(FACTS_TASK).values())
    assert "WARNING" not in " ".join(r["msg"] for r in back.results(RDMA_TASK).values())
    proven_converged(back)


def test_what_a_run_cannot_repair_is_named_by_its_cause(configured, sim_inventory):
    """--limit leaves the worker out: its MTU, then its port set down, are the peer's faults, named as such."""
    head, worker = configured.nodes
    changing_by_hand()
    sim.ssh(worker, f"ip link set {IFACE} mtu 1500")
    try:
        result = run_playbook(PLAYBOOK, sim_inventory, limit=head.name, extravars={"fabric_iperf_min_gbps": 0})
        assert result.rc != 0 and result.changed == []
        message = messages(result)
        assert "answers small pings but not 8972-byte ones" in message, message
        assert f"Cause: peer MTU - {worker.name} (outside this run) runs a smaller MTU than 9000" in message
        sim.ssh(worker, f"ip link set {IFACE} down")
        result = run_playbook(PLAYBOOK, sim_inventory, limit=head.name, extravars={"fabric_iperf_min_gbps": 0})
        assert result.rc != 0
        message = messages(result)
        assert f"{head.name}: {IFACE} is up with NO CARRIER" in message, message
        assert f"no carrier: the peer {worker.name} (outside this run) is off, or its port is down" in message
        assert "another renderer" not in message and "CAP_NET_ADMIN" not in message
    finally:
        # Back together (networkd puts the addresses back with the carrier); a later `configured` converges.
        sim.ssh(worker, f"ip link set {IFACE} up mtu 9000")

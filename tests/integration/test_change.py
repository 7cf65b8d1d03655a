"""Changing safely on simulated nodes: rollback of a failed change, upgrade.yml, uninstall.yml.

One pair, deployed once by site.yml (the supervisor on, as a real site runs it), carries the
tests in file order, as one site's history: bad input refused before any change; a flag that
does not fit (the hybrid state cache), an image whose ranks cannot launch the TileLang kernels
and an image that answers wrongly (verify fails), each going back by itself to the last good
configuration, which then serves and verifies; an upgrade to a second tag, pulled everywhere
before any rank stops, and a second run that changes nothing; uninstall.yml in check mode and
for real, compared with the pair as it booted; site.yml again, serving without a byte from
the hub; and, last, the same site driven from outside the checkout: the built collection installed
into a clean virtualenv and used by a project of its own (tests/lib/outside_project.py), which
renders, runs the site playbook by its FQCN changing nothing, and calls a role by its FQCN. The
images are the docker stand-in's registry builds (tests/standins/README.md); the nodes are
observed over SSH, the hub through its counters.
"""

from __future__ import annotations

import hashlib
import json
import time

import pytest
import yaml

from tests.harness import cluster as sim
from tests.lib import node_state, outside_project
from tests.lib.checkpoint_site import hub_stats
from tests.lib.playbook import REPO, SITE_CHECK, run_playbook
from tests.lib.supervised import api_key_header, generate
from tests.standins.hub_emulator import build_checkpoint

pytestmark = pytest.mark.slow

UNIT = "spark-llm.service"
FILES = {"unit": f"/etc/systemd/system/{UNIT}", "env": "/etc/spark-llm/spark-llm.env", "args": "/etc/spark-llm/server-args.json"}
LAST_GOOD = "/etc/spark-llm/last-good"
IMAGE = "lmsysorg/sglang:glm-5.3-flash-arm64"
# Builds the stand-in registry serves: SGLang's default TileLang tile (too big for GB10's shared
# memory), one that answers 17 x 23 wrongly and breaks Korean text, and a plain second tag.
TILE, WRONG, V2 = f"{IMAGE}-tile", f"{IMAGE}-wrong", f"{IMAGE}-v2"
# The wrong build also breaks every Korean answer: the corruption gate fails it beside the seed's question.
BUILDS = {TILE: {"sglang": {"tilelang_tile": "default"}},
          WRONG: {"sglang": {"output_corruption": "wrong-answer", "corrupt_rate": 1.0, "corrupt_scripts": ["hangul"]}}}
LEGACY = yaml.safe_load((REPO / "roles/spark/vars/main.yml").read_text())["spark_legacy_names"]
# What each name of the collection's units and files is on a node: present or not, old name and new.
LAYOUT = ("for p in /etc/systemd/system/sglang.service /etc/systemd/system/spark-llm.service /etc/sglang /etc/spark-llm "
          "/etc/systemd/system/sglang-supervisor.service /etc/systemd/system/spark-llm-supervisor.service "
          "/var/lib/sglang-supervisor /var/lib/spark-llm-supervisor "
          "/etc/systemd/system/sglang-firewall.service /etc/systemd/system/spark-llm-firewall.service "
          "/etc/nftables.d/sglang_guard.nft /etc/nftables.d/spark_llm_guard.nft "
          "/etc/systemd/system/sglang-monitoring-collector.timer /etc/systemd/system/spark-llm-monitoring-collector.timer "
          "/var/lib/sglang-monitoring /var/lib/spark-llm-monitoring; do test -e $p && echo $p; done; "
          "nft list tables | grep -o 'sglang_guard\\|spark_llm_guard'")
LEGACY_ON_WORKER = ["/etc/systemd/system/sglang.service", "/etc/sglang", "/etc/systemd/system/sglang-firewall.service",
                    "/etc/nftables.d/sglang_guard.nft", "/etc/systemd/system/sglang-monitoring-collector.timer",
                    "/var/lib/sglang-monitoring", "sglang_guard"]
LEGACY_ON_HEAD = LEGACY_ON_WORKER[:2] + ["/etc/systemd/system/sglang-supervisor.service", "/var/lib/sglang-supervisor"] \
    + LEGACY_ON_WORKER[2:]
NEW_ON_WORKER = [p.replace("sglang_guard", "spark_llm_guard").replace("sglang", "spark-llm") for p in LEGACY_ON_WORKER]
NEW_ON_HEAD = [p.replace("sglang_guard", "spark_llm_guard").replace("sglang", "spark-llm") for p in LEGACY_ON_HEAD]
ROLLED_BACK = "The change failed and was rolled back: every rank runs its last good configuration again"


def sh(node, command: str) -> str:
    return sim.ssh(node, command, timeout=120)


def config(cluster) -> dict:
    """Every rank's installed unit, env file and server-args.json (digests) and the env file's mode."""
    return {n.name: sh(n, f"sha256sum {' '.join(FILES.values())}; stat -c %a {FILES['env']}") for n in cluster.nodes}


def last_good(cluster) -> dict:
    return {n.name: json.loads(sh(n, f"cat {LAST_GOOD}/config.json"))["image"] for n in cluster.nodes}


def running_image(node) -> str:
    return sh(node, "docker inspect --type container --format '{{.Image}}' spark-llm").strip()


def image_id(node, ref: str) -> str:
    return sh(node, f"docker image inspect --format '{{{{.Id}}}}' {ref}").strip()


def started(cluster) -> list[str]:
    return [sh(n, f"systemctl show {UNIT} -p ActiveEnterTimestampMonotonic --value").strip() for n in cluster.nodes]


def hub_bytes(cluster) -> int:
    return sum(hub_stats(cluster).values())


def events(node, since: float) -> list[dict]:
    out = sh(node, f"docker events --since {since} --until {time.time() + 1:.3f} --format '{{{{json .}}}}'")
    return [json.loads(line) for line in out.splitlines()]


def assert_back_on_the_last_good_configuration(site, result, before):
    assert result.rc != 0
    assert ROLLED_BACK in result.failure_messages(), result.failure_messages() or result.stdout[-3000:]
    # The unit files (and env file, 0600, and server-args.json) are the previous ones, byte for byte; the key file
    # stays (a rollback never restores an older key).
    assert config(site.cluster) == before
    assert sh(site.cluster.nodes[0], f"ls /etc/spark-llm; stat -c %a {LAST_GOOD}/spark-llm.env").split() == [
        "last-good", "server-args.json", "spark-llm.env", "spark-llm.key", "supervisor.json", "600"]
    kept = last_good(site.cluster)
    assert kept == site.kept
    assert [running_image(n) for n in site.cluster.nodes] == [kept[n.name]["image_id"] for n in site.cluster.nodes]
    assert generate(site.cluster)
    # The API key travels in the env file only: in no output of the run, the rollback's included.
    key = api_key_header(site.cluster)["Authorization"].split()[1]
    assert key not in result.stdout


class Site:
    def __init__(self, cluster, fresh, extravars):
        self.cluster, self.fresh, self.vars = cluster, fresh, extravars
        self.kept = {}

    def play(self, playbook, check=False, **extravars):
        return run_playbook(playbook, self.cluster.inventory, extravars={**self.vars, **extravars}, check=check)


@pytest.fixture(scope="module")
def site(sim_cluster, tmp_path_factory):
    reports = str(tmp_path_factory.mktemp("reports"))
    for n in sim_cluster.nodes:
        sim.set_knobs(sim_cluster.instance, n.name, {"docker": {"registry": BUILDS}, "sglang": {"load_seconds": 0.2}})
    # The pair as it booted: what uninstall.yml must give back.
    fresh = node_state.snapshot(sim_cluster)
    s = Site(sim_cluster, fresh, {
        "supervisor_enabled": True, "spark_monitoring": True,
        "verify_report_dir": reports, "doctor_bundle_dir": reports, "benchmark_report_dir": reports})
    # First as a site that 1.2.0 deployed: every unit and file under the name that said the engine. Extra
    # variables outrank the site role's vars, so the names before 1.3.0 can be given from outside.
    legacy = s.play("site.yml", **LEGACY)
    assert legacy.rc == 0, legacy.failure_messages() or legacy.stdout[-3000:]
    s.legacy_key = (sim_cluster.inventory / ".credentials" / LEGACY["spark_api_key_name"]).read_text()
    s.legacy_preview = run_playbook("site.yml", sim_cluster.inventory, check=True, diff=True, extravars=s.vars)
    s.legacy_layout = {n.name: sh(n, LAYOUT) for n in sim_cluster.nodes}
    # Then this version's site.yml, as an operator runs it after upgrading the collection.
    s.t0 = time.time()
    s.takeover = s.play("site.yml")
    assert s.takeover.rc == 0, s.takeover.failure_messages() or s.takeover.stdout[-3000:]
    s.kept = last_good(sim_cluster)
    assert {k["image_ref"] for k in s.kept.values()} == {IMAGE}
    s.reports = reports
    return s


def test_a_site_deployed_under_the_names_before_1_3_takes_the_new_ones_with_one_restart(site):
    cluster = site.cluster
    head, worker = cluster.nodes
    # The site in check mode showed the move and made none (preflight knew the running rank under its old unit as
    # the site's own): the legacy layout was untouched when the real run began.
    preview = site.legacy_preview
    assert preview.rc == 0, preview.failure_messages() or preview.stdout[-3000:]
    said = {host: res["msg"] for host, res in preview.results("Say what moved").items()}
    assert sorted(said) == ["spark-0", "spark-1"], said
    for msg in said.values():
        assert "this run would move:" in msg and "sglang.service -> spark-llm.service" in msg, msg
        assert "/etc/sglang -> /etc/spark-llm" in msg, msg
    assert "sglang-supervisor.service -> spark-llm-supervisor.service" in said["spark-0"]
    for n in cluster.nodes:
        assert site.legacy_layout[n.name].split() == (
            LEGACY_ON_HEAD if n is head else LEGACY_ON_WORKER), site.legacy_layout[n.name]
    # Each node said what moved, once, and the group serves under the new names.
    lines = [line for line in site.takeover.stdout.splitlines() if "was deployed under the names before 1.3.0" in line]
    assert sorted(line.split("[DEPRECATED] ")[1].split()[0] for line in lines) == ["spark-0", "spark-1"], lines
    for n in cluster.nodes:
        assert sh(n, LAYOUT).split() == (NEW_ON_HEAD if n is head else NEW_ON_WORKER), n.name
        assert sh(n, f"systemctl is-active {UNIT}").strip() == "active"
        assert sh(n, "nft list tables").split().count("spark_llm_guard") == 1, "one table guards the ports"
        # One restart: the old container stopped, the new one started once.
        seen = [e for e in events(n, site.t0) if e["Type"] == "container" and e["Action"] == "start"]
        assert [e["Actor"]["Attributes"].get("name") for e in seen] == ["spark-llm"], seen
    # The supervisor's state and the monitoring's record of how the exporter ran before it moved with them.
    assert sh(head, "systemctl is-active spark-llm-supervisor.service").strip() == "active"
    assert sh(head, "cat /var/lib/spark-llm-monitoring/units-before").split()[:3] == [
        "prometheus-node-exporter.service", "disabled", "inactive"]
    # The clients' key is the one they had.
    credentials = cluster.inventory / ".credentials"
    assert (credentials / "spark_llm_api_key").read_text() == site.legacy_key
    assert not (credentials / LEGACY["spark_api_key_name"]).exists()
    assert generate(cluster)
    # And a second run finds nothing left to move or change. Asked for the all-reduce bandwidth while the group
    # serves, it measures nothing (the ranks hold the GPUs) and says how to.
    again = site.play("site.yml", fabric_busbw_always=True)
    assert again.rc == 0, again.failure_messages() or again.stdout[-3000:]
    assert again.changed == [], again.changed
    assert "was deployed under the names before 1.3.0" not in again.stdout
    (why,) = again.results("Say why the all-reduce bandwidth was not measured").values()
    assert why["msg"].startswith("all-reduce bandwidth not measured: the ranks hold the GPUs (spark-llm.service is "
                                 "running on spark-0, spark-1). Stop the group (playbooks/stop.yml)"), why
    measured = [e for e in again.task_events("runner_on_ok") if e["event_data"].get("task")
                == "Measure the all-reduce bus bandwidth across the group (nccl-tests all_reduce_perf over mpirun)"]
    assert measured == [], measured


def test_earlyoom_guards_every_node_on_the_floor_and_the_ranks_come_last(site):
    """The guard role's earlyoom: running now and at boot on the collection's drop-in (the package's own settings
    no longer read), what it was before recorded once (the image has it installed and off); each rank's container
    asked for its oom_score_adj (docker's record: lowering it takes a capability this machine's root lacks); and
    apt's rule that autoremove never takes the NVIDIA platform."""
    for n in site.cluster.nodes:
        assert sh(n, "systemctl is-active earlyoom; systemctl is-enabled earlyoom").split() == ["active", "enabled"]
        argv = sh(n, "systemctl show earlyoom -p ExecStart --value").split(" ; ")[1]
        assert argv == ("argv[]=/usr/bin/earlyoom -m 4,2 -s 100,100 -r 3600 --avoid "
                        "^(systemd|systemd-.*|sshd|dockerd|containerd|containerd-shim.*|earlyoom)$"), argv
        assert json.loads(sh(n, "cat /var/lib/spark-llm-guard/earlyoom-before.json")) == {
            "installed": True, "enabled": "disabled"}
        assert sh(n, "docker inspect --format '{{.HostConfig.OomScoreAdj}}' spark-llm").strip() == "-500"
        # apt's own reading of its configuration: the guard's rule beside the distribution's for the kernels.
        rules = sh(n, "apt-config dump APT::NeverAutoRemove")
        for pattern in ("^nvidia-.*", "^libnvidia-.*", "^dgx-.*", "^cuda-.*", "^libcuda.*"):
            assert f'APT::NeverAutoRemove:: "{pattern}";' in rules, rules


def test_bad_input_is_refused_before_any_node_changes(site):
    before, files = started(site.cluster), config(site.cluster)
    upgrade = site.play("playbooks/upgrade.yml", server_image="lmsysorg/sglang:latest", upgrade_benchmark="maybe",
                        server_rollback="sometimes", guard_earlyoom_kill_percent=9)
    uninstall = site.play("playbooks/uninstall.yml", uninstall_images="perhaps", uninstall_checkpoint="later")
    for result in (upgrade, uninstall):
        assert result.rc != 0 and {d["task"] for d in result.failed} == {SITE_CHECK}, result.stdout[-3000:]
        assert result.changed == []
    messages = upgrade.failure_messages()
    assert "server_image = 'lmsysorg/sglang:latest': :latest, a tag that moves" in messages
    assert "upgrade_benchmark = 'maybe': must be true or false" in messages
    assert "server_rollback = 'sometimes': must be true or false" in messages
    assert "guard_earlyoom_kill_percent = 9: above guard_earlyoom_memory_percent (4)" in messages
    messages = uninstall.failure_messages()
    assert "uninstall_images = 'perhaps': must be true or false" in messages
    assert "uninstall_checkpoint = 'later': must be true or false" in messages
    assert started(site.cluster) == before and config(site.cluster) == files


def test_a_flag_that_does_not_fit_goes_back_to_the_last_good_configuration(site):
    before = config(site.cluster)
    result = site.play("playbooks/server.yml", server_flag_overrides={"max-running-requests": 8})
    assert_back_on_the_last_good_configuration(site, result, before)
    message = result.failure_messages()
    # The new configuration's cause: its ranks' journal lines and the doctor's remedy, from its own figures.
    assert "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. " \
           "max_mamba_cache_size=20, mamba_ratio=5, resulting max_num_reqs=4" in message
    assert "apply with: server_flag_overrides: {max-running-requests: 4}" in message
    for n in site.cluster.nodes:
        args = json.loads(sh(n, f"cat {FILES['args']}"))
        assert args[args.index("--max-running-requests") + 1] == "2"


def test_an_image_whose_ranks_cannot_start_goes_back_to_the_last_good_configuration(site):
    before = config(site.cluster)
    result = site.play("playbooks/upgrade.yml", server_image=TILE)
    assert_back_on_the_last_good_configuration(site, result, before)
    message = result.failure_messages()
    assert "Failed to set the allowed dynamic shared memory size to 169984" in message
    assert "Use the GB10 tile block_I=32, num_stages=1, threads=128" in message
    # It was pulled and started everywhere before it failed: not refused up front.
    assert all(image_id(n, TILE).startswith("sha256:") for n in site.cluster.nodes)


def test_an_image_that_fails_verify_goes_back_and_the_last_good_configuration_verifies(site):
    before = config(site.cluster)
    result = site.play("playbooks/upgrade.yml", server_image=WRONG)
    assert_back_on_the_last_good_configuration(site, result, before)
    assert "What failed: verify failed: Verification of " in result.failure_messages()
    # The corruption gate is a verify check like the others: crossing it rolls the change back.
    assert "failed: reasoning, gate" in result.failure_messages()

    verify = site.play("playbooks/verify.yml")
    assert verify.rc == 0, verify.failure_messages() or verify.stdout[-3000:]
    table = "\n".join(next(iter(verify.results("Show the verification table").values()))["msg"])
    assert table.count("PASS") == 6, table
    assert verify.changed == [], "nothing was pending: the last good configuration serves"


def test_an_upgrade_pulls_everywhere_before_any_rank_stops_and_serves_the_new_image(site):
    t0 = time.time()
    result = site.play("playbooks/upgrade.yml", server_image=V2, upgrade_benchmark=True,
                       benchmark_max_tokens=8, benchmark_min_requests=2, benchmark_rounds=1)
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    seen = {n.name: events(n, t0) for n in site.cluster.nodes}
    pulled = [min(e["timeNano"] for e in seen[name] if e["Action"] == "pull" and e["Actor"]["ID"] == V2) for name in seen]
    stopped = min(e["timeNano"] for name in seen for e in seen[name]
                  if e["Type"] == "container" and e["Action"] in ("kill", "stop", "die"))
    assert max(pulled) < stopped, seen
    # Served after, the new image ID recorded as every rank's last good one and shown per node.
    new_id = {image_id(n, V2) for n in site.cluster.nodes}
    assert len(new_id) == 1
    (new_id,) = new_id
    assert {k["image_id"] for k in last_good(site.cluster).values()} == {new_id}
    assert {running_image(n) for n in site.cluster.nodes} == {new_id}
    lines = {h: r["msg"] for h, r in result.results("Show one line per node").items()}
    assert all(f"image {V2} ({new_id[7:19]})" in line for line in lines.values()), lines
    assert "endpoint healthy" in lines["spark-0"]
    assert generate(site.cluster)
    # The single stream before and after, side by side.
    after = next(iter(result.results("Show the report").values()))["msg"]
    assert any("Compared with " in line and "-before.json" in line for line in after), after

    again_before = started(site.cluster)
    again = site.play("playbooks/upgrade.yml", server_image=V2)
    assert again.rc == 0, again.failure_messages() or again.stdout[-3000:]
    assert again.changed == []
    assert started(site.cluster) == again_before
    site.kept = last_good(site.cluster)


def test_a_derived_image_is_built_once_on_the_head_and_given_to_the_worker_over_the_fabric(site, tmp_path):
    """A kernel fix on top of the engine's image (the GB10 tile for a drafter's verify shapes): built on the head,
    loaded on the worker from the head's copy, both before any rank stops; one image ID, no registry."""
    context = tmp_path / "gb10-verify-tile"
    context.mkdir()
    (context / "Dockerfile").write_text(
        "ARG SPARK_BASE_IMAGE\nFROM ${SPARK_BASE_IMAGE}\nCOPY verify-tile.patch /opt/spark/verify-tile.patch\n"
        # What the patch's RUN step would change, told to the stand-in (tests/standins/README.md, docker).
        "LABEL org.spark-sim.sglang='{\"tilelang_verify_tile\": \"gb10\"}'\n")
    (context / "verify-tile.patch").write_text("block_I=32 num_stages=1 threads=128\n")
    pins = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in context.iterdir()}
    build = {"server_image": V2, "server_image_build_context": str(context), "server_image_build_sha256": pins}
    head, worker = site.cluster.nodes
    t0 = time.time()
    result = site.play("playbooks/upgrade.yml", **build)
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    tag = next(iter(result.results("Pull the base image on the head and name the derived image").values()))["tag"]
    assert tag.startswith("spark-llm/sglang-derived:"), tag
    seen = {n.name: events(n, t0) for n in site.cluster.nodes}
    stopped = min(e["timeNano"] for name in seen for e in seen[name]
                  if e["Type"] == "container" and e["Action"] in ("kill", "stop", "die"))
    built = [e["timeNano"] for e in seen[head.name] if e["Action"] == "tag" and e["Actor"]["Attributes"]["name"] == tag]
    loaded = [e["timeNano"] for e in seen[worker.name] if e["Action"] == "load"]
    assert built and loaded and max(built + loaded) < stopped, seen
    # Built once, on the head; the worker pulled nothing of it and built nothing.
    assert not [e for e in seen[worker.name] if e["Action"] == "tag" or (e["Action"] == "pull" and tag in e["Actor"]["ID"])]
    ids = {image_id(n, tag) for n in site.cluster.nodes}
    assert len(ids) == 1 and {running_image(n) for n in site.cluster.nodes} == ids
    assert {k["image_ref"] for k in last_good(site.cluster).values()} == {tag}
    labels = json.loads(sh(worker, f"docker image inspect --format '{{{{json .Config.Labels}}}}' {tag}"))
    assert labels["org.spark-sim.sglang"] == '{"tilelang_verify_tile": "gb10"}' and len(labels["org.spark-llm.build"]) == 64
    assert generate(site.cluster)

    # Nothing new: nothing built, sent or restarted.
    before = started(site.cluster)
    again = site.play("playbooks/server.yml", **build)
    assert again.rc == 0, again.failure_messages() or again.stdout[-3000:]
    assert again.changed == [] and started(site.cluster) == before
    site.kept = last_good(site.cluster)


def test_uninstall_in_check_mode_lists_what_would_go_and_changes_nothing(site):
    before = started(site.cluster)
    result = site.play("playbooks/uninstall.yml", check=True)
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    listed = [e["event_data"] for e in result.task_events("runner_on_ok")
              if e["event_data"].get("task", "").startswith("List what goes")]
    said = " ".join(d["res"]["msg"] for d in listed)
    head = " ".join(d["res"]["msg"] for d in listed if d["host"] == "spark-0")
    for item in ("would remove /etc/systemd/system/spark-llm-supervisor.service",
                 "/etc/systemd/system/spark-llm.service, /etc/spark-llm", "/etc/nftables.d/spark_llm_guard.nft",
                 "/opt/spark-checkpoint/venv", "/etc/netplan/40-cx7.yaml",
                 "/root/.ssh/id_spark_fabric", "keeping the checkpoint: /opt/models/glm53"):
        assert item in head, head
    assert "the head key in" in said
    assert started(site.cluster) == before
    assert all(sh(n, f"systemctl is-active {UNIT}").strip() == "active" for n in site.cluster.nodes)
    assert generate(site.cluster)


# What a node keeps after uninstall.yml that the collection did not install, or keeps on purpose.
KEPT = (
    "/opt/models",  # the checkpoint with its record, stamp and partial files (uninstall_checkpoint)
    "/var/lib/spark-sim",  # the docker stand-in's engine state: the pulled images (uninstall_images)
    "/etc/spark-sim",  # the stand-in knobs this module set
    "/root/.ansible_async",  # Ansible's own records of async jobs (the checkpoint fetch), like ~/.ansible
    "/usr/share/netplan/netplan_cli/__pycache__", "/usr/share/netplan/netplan_cli/cli/",  # netplan's bytecode
    "/var/lib/prometheus/",  # the image's Prometheus writes its own database
)
# Units the OS pulled in for the ranks' After=network-online.target; the MTU stays until the next boot.
KEPT_LIVE = ("units: + network-online.target ", "units: + systemd-networkd-wait-online.service ", "links: ")


def test_uninstall_leaves_the_nodes_as_they_booted_but_the_checkpoint_and_the_images(site):
    result = site.play("playbooks/uninstall.yml")
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    left = [line for line in node_state.changes(site.fresh, site.cluster)
            if not line.split(": ", 1)[1].startswith(KEPT) and not line.split(": ", 1)[1].startswith(KEPT_LIVE)]
    assert left == [], "\n".join(left)
    for n in site.cluster.nodes:
        assert sh(n, "ip -o -4 addr show dev enp1s0f1np1").strip() == "", "the fabric port has no address"
        assert sh(n, "ip -o -4 addr show dev enP2p1s0f1np1").strip() == "", "the second rail has no address"
        assert sh(n, "pgrep -af '[s]glang' || true").strip() == ""
        assert sh(n, f"test -e /opt/models/glm53.verified && docker image inspect --format ok {V2}").strip() == "ok"
    # A second run finds nothing left to take away, and says so.
    again = site.play("playbooks/uninstall.yml")
    assert again.rc == 0, again.failure_messages() or again.stdout[-3000:]
    assert again.changed == [], again.changed


def test_site_deploys_again_from_scratch_fetching_nothing_from_the_hub(site):
    before = hub_bytes(site.cluster)
    result = site.play("site.yml")
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    assert hub_bytes(site.cluster) == before
    table = "\n".join(next(iter(result.results("Show the verification table").values()))["msg"])
    assert table.count("PASS") == 6, table
    # The fabric was configured again from scratch and proven: its figures are in verify's table and report.
    assert ("fabric: all-reduce across spark-0, spark-1 (1G messages): 23.19 GB/s bus bandwidth over NCCL's IB transport"
            in table), table
    assert "fabric: RDMA write spark-0 roceP2p1s0f1 -> spark-1 roceP2p1s0f1 (enP2p1s0f1np1): 97.50 Gbit/s" in table, table
    assert generate(site.cluster)


def test_the_built_collection_runs_the_site_from_a_project_of_its_own_and_changes_nothing(site, tmp_path_factory):
    root = tmp_path_factory.mktemp("outside")
    project = outside_project.create(root, outside_project.build(root), site.cluster.inventory)
    head = site.cluster.nodes[0]
    # The site's own settings, as the suite's runs pass them; reports go where the project keeps them.
    settings = json.dumps({"supervisor_enabled": True, "spark_monitoring": True})

    render = project.run("ansible-playbook", "dgx_spark.llm_serving.render", "-i", "inventory", "-e", settings)
    assert render.returncode == 0, render.stdout[-3000:] + render.stderr[-2000:]
    # What render writes is what the head runs (its flags); the unit differs only where render cannot look at the
    # node (a render assumes the RoCE devices that these nodes lack).
    rendered = project.root / "rendered" / head.name
    assert (rendered / "server-args.json").read_text() == sh(head, f"cat {FILES['args']}")
    assert (rendered / UNIT).is_file()

    converge = project.run("ansible-playbook", "site.yml", "-i", "inventory", "-e", settings)
    assert converge.returncode == 0, converge.stdout[-3000:] + converge.stderr[-2000:]
    recap = outside_project.recap(converge.stdout)
    assert set(recap) >= {n.name for n in site.cluster.nodes}, converge.stdout[-2000:]
    assert all(r == {"changed": 0, "unreachable": 0, "failed": 0} for r in recap.values()), recap
    (report,) = (project.root / "reports").glob("verify-*.json")
    assert json.loads(report.read_text())["ok"] is True
    # Nothing of a run lands in the installed collection: it is shared, and may be read-only.
    assert not {"reports", "rendered"} & {p.name for p in project.installed.iterdir()}
    assert "[DEPRECATION WARNING]" not in converge.stdout + converge.stderr

    status = project.run("ansible", "spark", "-i", "inventory", "--become", "-m", "ansible.builtin.include_role",
                         "-a", "name=dgx_spark.llm_serving.server tasks_from=status")
    assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-2000:]
    assert status.stdout.count("unit active/running") == len(site.cluster.nodes), status.stdout[-3000:]


# Two more builds of the model on the hub emulator, as a site describes its own: one whose weights garble Korean
# text (the stand-in reads what a build's weights do from its standin-build.json), and one that serves well. Last
# in the module: the group ends on another build than the inventory's.
GARBLED = {"corrupt_rate": 1.0, "corrupt_scripts": ["hangul"]}


def site_build(info: dict, directory: str) -> dict:
    return {"repo_id": info["repo_id"], "revision": info["new"], "directory": directory, "bytes": 1 << 20,
            "shard_count": 120, "model_type": "glm5_next"}


def test_a_build_switch_fetches_beside_serves_and_a_build_that_garbles_goes_back(site):
    cluster = site.cluster
    root = sim.CACHE_ROOT / "hub"
    alt = build_checkpoint(root, repo_id="SparkSite/GLM-5.3-Flash-NVFP4-alt", seed=61)
    garbled = build_checkpoint(root, repo_id="SparkSite/GLM-5.3-Flash-NVFP4-garbled", seed=67,
                               extra={"standin-build.json": json.dumps(GARBLED).encode()})
    builds = {"alt": site_build(alt, "glm53-alt"), "garbled": site_build(garbled, "glm53-garbled")}

    def switch(name, **extra):
        # The harness's inventory pins the seed build's revision (checkpoint_revision): a site that names builds
        # leaves it out; here the extra variable gives the named build's own, which the build check accepts.
        return site.play("site.yml", spark_checkpoint_build=name, spark_checkpoint_site_builds=builds,
                         checkpoint_revision=builds[name]["revision"], **extra)

    def listing(node):
        return sh(node, "ls /opt/models").split()

    # A model directory pinned by the inventory holds the seed build: the switch is refused before any change.
    before, served = config(cluster), hub_bytes(cluster)
    site.kept = last_good(cluster)
    refused = switch("alt", spark_model_dir="/opt/models/glm53")
    assert refused.rc != 0 and refused.changed == [], refused.changed
    said = refused.failure_messages()
    assert ("/opt/models/glm53 holds LibertAIDAI/GLM-5.3-Flash-NVFP4 at " in said
            and "this run deploys SparkSite/GLM-5.3-Flash-NVFP4-alt there, over it" in said
            and "Give the build a directory of its own" in said), said
    assert config(cluster) == before and hub_bytes(cluster) == served

    # The garbled build: fetched once beside the seed's, verified, served, failed by the corruption gate, and the
    # group back on the seed build's directory, whose checkpoint nothing touched.
    seed_stamp = {n.name: sh(n, "stat -c %Y /opt/models/glm53.verified") for n in cluster.nodes}
    result = switch("garbled")
    assert_back_on_the_last_good_configuration(site, result, before)
    assert "failed: gate" in result.failure_messages(), result.failure_messages()
    for n in cluster.nodes:
        assert {"glm53", "glm53-garbled", "glm53-garbled.verified"} <= set(listing(n)), listing(n)
        assert sh(n, "stat -c %Y /opt/models/glm53.verified") == seed_stamp[n.name]
        assert '"/models/glm53"' in sh(n, f"cat {FILES['args']}")  # the container's path of the model directory
    assert hub_bytes(cluster) > served

    # The good build serves from a directory of its own; the seed build's stays for a way back.
    result = switch("alt")
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    for n in cluster.nodes:
        assert '"/models/glm53-alt"' in sh(n, f"cat {FILES['args']}"), n.name
        assert {"glm53", "glm53.verified", "glm53-alt", "glm53-alt.verified"} <= set(listing(n)), listing(n)
        # The new build's configuration is the one a later failed change goes back to.
        assert sh(n, f"grep -rl /opt/models/glm53-alt {LAST_GOOD} || true").strip(), n.name
    table = "\n".join(next(iter(result.results("Show the verification table").values()))["msg"])
    assert table.count("PASS") == 6, table
    assert generate(cluster)

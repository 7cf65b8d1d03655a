"""playbooks/inventory_check.yml: one validation, run first by every entry point.

Every bad inventory or setting is refused before any node is contacted and before anything
changes, through render.yml (the embedded default) and site.yml alike, with the variable, the
value, why and the fix. The hosts use the `no_contact` connection (tests/lib/connection_plugins):
a run that tried to reach a node would fail with "no_contact" instead of reaching an address.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.lib.playbook import REPO, SITE_CHECK, run_playbook

SETTINGS_CHECK = "Validating arguments against every role's arg spec - the site's settings for the ranks' roles"

NO_CONTACT = {"ANSIBLE_CONNECTION_PLUGINS": str(REPO / "tests" / "lib" / "connection_plugins")}
HEAD = {"spark-0": {"ansible_host": "10.0.0.10", "spark_fabric_ip": "192.168.100.10"}}
WORKERS = {"spark-1": {"ansible_host": "10.0.0.11", "spark_fabric_ip": "192.168.100.11"}}
THIRD = {"spark-2": {"ansible_host": "10.0.0.12", "spark_fabric_ip": "192.168.100.12"}}


def inventory(tmp_path: Path, head: dict, workers: dict) -> Path:
    def hosts(group):
        return {h: {**v, "ansible_connection": "no_contact"} for h, v in group.items()}

    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"spark": {"children": {
        "spark_head": {"hosts": hosts(head)}, "spark_workers": {"hosts": hosts(workers)}}}}))
    return inv


# (id, head, workers, extra vars, what the refusal must say)
BAD = [
    ("one-node", HEAD, {}, {}, "one node (spark-0) gives --tp-size 1: 181 GiB (spark_checkpoint_bytes) does not fit"),
    ("three-nodes", HEAD, {**WORKERS, **THIRD}, {}, "gives --tp-size 3, which does not divide the 64 attention heads"),
    ("same-fabric-ip", HEAD, {"spark-1": {**WORKERS["spark-1"], "spark_fabric_ip": "192.168.100.10"}}, {},
     "spark_fabric_ip 192.168.100.10 of spark-0 is also the address of spark-1"),
    ("fabric-ip-is-management", HEAD, {"spark-1": {**WORKERS["spark-1"], "spark_fabric_ip": "10.0.0.11"}}, {},
     "hostvars['spark-1'].spark_fabric_ip = '10.0.0.11': equals its ansible_host"),
    ("fabric-ip-is-another-management", HEAD, {"spark-1": {**WORKERS["spark-1"], "spark_fabric_ip": "10.0.0.10"}}, {},
     "hostvars['spark-1'].spark_fabric_ip = 10.0.0.10: is the management address (ansible_host) of spark-0"),
    ("image-latest", HEAD, WORKERS, {"server_image": "lmsysorg/sglang:latest"},
     "server_image = 'lmsysorg/sglang:latest': :latest, a tag that moves"),
    ("image-untagged", HEAD, WORKERS, {"server_image": "lmsysorg/sglang"},
     "server_image = 'lmsysorg/sglang': no tag means :latest"),
    ("model-dir-trailing-slash", HEAD, WORKERS, {"spark_model_dir": "/opt/models/glm53/"},
     "server_model_dir = '/opt/models/glm53/': ends in a slash"),
    ("port-not-a-number", HEAD, WORKERS, {"server_port": "abc"},
     "server_port = 'abc': the head's HTTP port must be a TCP port number"),
    # The key's value is never shown, only its length.
    ("api-key-short", HEAD, WORKERS, {"server_api_key": "sk-only-twenty-two-chr"},
     "server_api_key = <redacted, 22 characters>: shorter than 32 characters"),
    ("tls-pair-missing", HEAD, WORKERS, {"server_tls": True, "server_tls_cert": "/nonexistent/server.crt",
                                         "server_tls_key": "/nonexistent/server.key"},
     "server_tls_cert = '/nonexistent/server.crt': no such file on the controller"),
    ("tls-key-unreadable", HEAD, WORKERS, {"server_tls": True, "server_tls_cert": "/etc/ssl/certs",
                                           "server_tls_key": "/etc/hostname"},
     "server_tls_key = '/etc/hostname': not a PEM key"),
    # A checkpoint build this site does not know, and one whose repository the inventory contradicts.
    ("checkpoint-build-unknown", HEAD, WORKERS, {"spark_checkpoint_build": "glm53-other"},
     "spark_checkpoint_build='glm53-other' is not a build this site knows (the collection's: libertai-nvfp4"),
    ("checkpoint-build-contradicted", HEAD, WORKERS, {
        "spark_checkpoint_build": "alt", "checkpoint_repo_id": "LibertAIDAI/GLM-5.3-Flash-NVFP4",
        "spark_checkpoint_site_builds": {"alt": {
            "repo_id": "SparkSite/GLM-5.3-Flash-NVFP4-alt", "revision": "b" * 40, "directory": "glm53-alt",
            "bytes": 194347270144, "shard_count": 120, "model_type": "glm5_next"}}},
     "checkpoint_repo_id='LibertAIDAI/GLM-5.3-Flash-NVFP4' disagrees with spark_checkpoint_build='alt'"),
]


def assert_refused_before_contact(result, fragment: str):
    assert result.rc != 0, result.stdout[-3000:]
    assert {d["task"] for d in result.failed} == {SITE_CHECK}, result.stdout[-3000:]
    assert result.changed == []
    assert "no_contact" not in result.stdout, "a node was contacted before the refusal"
    message = result.failure_messages()
    assert fragment in message and "Fix:" in message, message
    # Ansible's own argument-spec dump never comes first: the project's message does.
    assert "Validating arguments" not in " ".join(d["task"] for d in result.failed)


# The plans report every problem of every host at once, each naming its variable and value: the cases
# share runs (one per topology, the settings of the other cases added as their extra vars), and each case
# is proven by its own message in its run's refusal. 5 runs per playbook instead of 12.
RUNS = {
    "one-node": ["one-node", "image-latest", "model-dir-trailing-slash", "tls-pair-missing"],
    "three-nodes": ["three-nodes", "image-untagged", "port-not-a-number", "tls-key-unreadable"],
    "same-fabric-ip": ["same-fabric-ip", "api-key-short", "checkpoint-build-unknown"],
    "fabric-ip-is-management": ["fabric-ip-is-management", "checkpoint-build-contradicted"],
    "fabric-ip-is-another-management": ["fabric-ip-is-another-management"],
}
CASES = {case[0]: case[1:] for case in BAD}


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """Each (playbook, run of RUNS), run once on first use: the run's result and its render directory."""
    assert sorted(c for cases in RUNS.values() for c in cases) == sorted(CASES)
    done: dict[tuple[str, str], tuple] = {}

    def run(playbook: str, name: str):
        if (playbook, name) not in done:
            head, workers, _, _ = CASES[name]
            extravars = {k: v for case in RUNS[name] for k, v in CASES[case][2].items()}
            tmp = tmp_path_factory.mktemp(name)
            out = tmp / "rendered"
            result = run_playbook(playbook, inventory(tmp, head, workers),
                                  extravars={"server_render_dir": str(out), **extravars}, envvars=NO_CONTACT)
            done[playbook, name] = result, out
        return done[playbook, name]

    return run


@pytest.mark.parametrize("playbook", ["playbooks/render.yml", "site.yml"])
@pytest.mark.parametrize("case", [case[0] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_input_is_refused_before_any_contact(refused, playbook, case):
    fragment = CASES[case][3]
    result, out = refused(playbook, next(name for name, cases in RUNS.items() if case in cases))
    assert_refused_before_contact(result, fragment)
    assert not out.exists()
    assert "sk-only-twenty-two-chr" not in result.stdout


def test_every_concerns_refusal_comes_in_one_run_each_under_its_header(tmp_path):
    """The check computes the server, firewall, supervisor and monitoring plans in one task per host: a run with
    a bad value of each refuses all of them at once, before any contact, each host's under each concern's header
    (the header the role's own plan task uses)."""
    out = tmp_path / "rendered"
    result = run_playbook("playbooks/render.yml", inventory(tmp_path, HEAD, WORKERS), envvars=NO_CONTACT, extravars={
        "server_render_dir": str(out), "server_port": "abc", "supervisor_enabled": True, "supervisor_interval": "x",
        "spark_monitoring": True, "monitoring_retention_time": "15 days"})
    assert_refused_before_contact(result, "server_port = 'abc': the head's HTTP port must be a TCP port number")
    assert not out.exists()
    messages = {d["host"]: d["res"]["msg"] for d in result.failed}
    assert sorted(messages) == ["spark-0", "spark-1"], messages
    for host, message in messages.items():
        headers = [f"Refusing to deploy SGLang on {host}:", f"Refusing the firewall of {host}:",
                   f"Refusing the group supervisor settings of {host}:", f"Refusing the monitoring settings of {host}:"]
        assert all(header + "\n- " in message for header in headers), message
        assert [message.index(header) for header in headers] == sorted(message.index(header) for header in headers)
        for fragment in ("supervisor_interval = 'x': must be a whole number", "monitoring_retention_time = '15 days'"):
            assert fragment in message, message


def test_a_setting_of_a_role_the_playbook_does_not_run_is_refused_by_type_before_any_contact(tmp_path):
    """After the plans, one task per rank judges every role option the settings give against the roles' argument
    specs (the plays skip each role's own): render.yml runs neither the fabric nor the benchmark role, and still
    refuses their settings of the wrong type, on every host, before any contact."""
    out = tmp_path / "rendered"
    result = run_playbook("playbooks/render.yml", inventory(tmp_path, HEAD, WORKERS), envvars=NO_CONTACT,
                          extravars={"server_render_dir": str(out), "fabric_mtu": "jumbo", "benchmark_rounds": "few",
                                     # 1.7.0's settings of the all-reduce proof and of the ranks' NCCL log
                                     "fabric_busbw_always": "perhaps", "fabric_min_busbw_gbps": "fast",
                                     "server_nccl_debug": "TRACE"})
    assert result.rc != 0, result.stdout[-3000:]
    assert {d["task"] for d in result.failed} == {SETTINGS_CHECK}, result.stdout[-3000:]
    assert sorted(d["host"] for d in result.failed) == ["spark-0", "spark-1"]
    assert result.changed == [] and not out.exists()
    assert "no_contact" not in result.stdout, "a node was contacted before the refusal"
    for d in result.failed:
        errors = " ".join(d["res"]["argument_errors"])
        assert "'fabric_mtu'" in errors and "jumbo" in errors and "'benchmark_rounds'" in errors, errors
        for option, value in (("fabric_busbw_always", "perhaps"), ("server_nccl_debug", "TRACE")):
            assert option in errors and value in errors, (option, errors)
        # Ansible's own text for a float names the option but not the value it could not convert.
        assert "'fabric_min_busbw_gbps' is of type str and we were unable to convert to float" in errors, errors


def test_one_node_renders_when_acknowledged(tmp_path):
    out = tmp_path / "rendered"
    result = run_playbook("playbooks/render.yml", inventory(tmp_path, HEAD, {}), envvars=NO_CONTACT,
                          extravars={"server_render_dir": str(out), "spark_acknowledge_single_node": True})
    assert result.rc == 0, result.stdout[-3000:]
    args = yaml.safe_load((out / "spark-0" / "server-args.json").read_text())
    assert args[args.index("--tp-size") + 1] == "1" and args[args.index("--nnodes") + 1] == "1"


def test_render_writes_exactly_the_inventory_hosts(tmp_path):
    out = tmp_path / "rendered"
    for stale in ("spark-9", "spark-00"):
        (out / stale).mkdir(parents=True)
        (out / stale / "server-args.json").write_text("[]\n")
    (out / "notes").mkdir()
    (out / "notes" / "keep.txt").write_text("not a render\n")
    result = run_playbook("playbooks/render.yml", inventory(tmp_path, HEAD, WORKERS), envvars=NO_CONTACT,
                          extravars={"server_render_dir": str(out)})
    assert result.rc == 0, result.stdout[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["notes", "spark-0", "spark-1"]
    assert (out / "notes" / "keep.txt").exists()


def ansible_playbook(*args, cwd=REPO):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_NOCOLOR="1", **NO_CONTACT)
    return subprocess.run([str(Path(os.sys.executable).parent / "ansible-playbook"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("playbook", ["site.yml", "playbooks/render.yml", "playbooks/status.yml"])
@pytest.mark.parametrize("inventory_args", [[], ["-i", "inventory/no-such-site"]], ids=["no -i", "mistyped -i"])
def test_no_inventory_contacts_no_host_and_fails(playbook, inventory_args, tmp_path):
    run = ansible_playbook(playbook, *inventory_args, "-e", f"server_render_dir={tmp_path / 'out'}")
    assert run.returncode != 0, run.stdout[-3000:]
    assert "yields no host in the group spark" in run.stdout and "Fix: pass your site's inventory" in run.stdout
    # Only the controller's check ran: no play reached a node, the example's included.
    assert "spark-0" not in run.stdout and "10.0.0." not in run.stdout
    assert not (tmp_path / "out").exists()


def test_deploy_with_arguments_but_no_inventory_refuses():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    run = subprocess.run([str(REPO / "scripts" / "deploy"), "-e", "x=y"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "refusing to run site.yml without an inventory" in run.stderr
    assert "Fix: scripts/deploy -i inventory/<yoursite> -e x=y" in run.stderr
    assert "PLAY [" not in run.stdout


def test_ansible_cfg_names_no_default_inventory():
    text = (REPO / "ansible.cfg").read_text()
    assert not any(line.strip().startswith("inventory") for line in text.splitlines()), textwrap.shorten(text, 300)

"""Secure by default, on simulated nodes: the generated API key, TLS through the distribution's real nginx
on the head, and verify proving both.

One pair: check mode on it fresh (it works and writes nothing), one TLS deployment (its first run at
-vvv, whose output must not hold the key), a second run that changes nothing. The tests then read and
ask, in file order: the key file; where the key is (and is not) on controller and nodes (the render
never sees a generated key: tests/integration/test_render.py checks a given one stays out of it); who
is served over TLS and plain HTTP; a stream token by token through the proxy; verify; status; the
doctor's bundle; the model gateway (the real smg) on the worker in front of the head. The last one turns TLS
off again. The client side runs here, on the controller, as an
operator's would (curl with the generated CA).
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import tarfile

import pytest

from tests.harness import cluster as sim
from tests.lib.playbook import run_playbook
from tests.lib.supervised import REVISION, UNIT, checkpoint_files

READINESS = 300
TLS = {"server_tls": True, "server_readiness_timeout": READINESS, "checkpoint_revision": REVISION}
NGINX_CONF = "/etc/nginx/conf.d/spark-llm.conf"


def sh(node, command, check=True, stdin=None):
    return sim.ssh(node, command, check=check, timeout=120, stdin=stdin)


def curl(url, *args, key=None):
    """curl on the controller; a key goes in through stdin (-H @-), never onto a command line."""
    header = f"Authorization: Bearer {key}\n" if key is not None else ""
    proc = subprocess.run(["curl", "-sS", "--max-time", "30", "-o", "/dev/stderr", "-w", "%{http_code}",
                           *(["-H", "@-"] if header else []), *args, url],
                          input=header, capture_output=True, text=True, timeout=60)
    return proc.stdout.strip(), proc.stderr


@pytest.fixture(scope="module")
def site(sim_cluster):
    for n in sim_cluster.nodes:
        # What checkpoint.yml and fabric.yml leave behind, in their smallest form (as tests/integration/test_day2.py).
        sh(n, checkpoint_files() + " && (ip -o addr show dev enp1s0f1np1 | grep -q ' "
              f"{n.fabric_ip}/' || ip addr add {n.fabric_ip}/24 dev enp1s0f1np1)")
    # Tokens a little apart, so a stream is many writes, as a real model's is.
    sim.set_knobs(sim_cluster.instance, sim_cluster.nodes[0].name, {"sglang": {"token_seconds": 0.05}})
    # Check mode on the fresh pair works and writes nothing, the controller's credentials included.
    preview = run_playbook("playbooks/server.yml", sim_cluster.inventory, extravars=TLS, check=True)
    assert preview.rc == 0, preview.stdout[-4000:]
    assert not (sim_cluster.inventory / ".credentials").exists()
    there = sh(sim_cluster.nodes[0], f"test -e {NGINX_CONF} || test -e /etc/spark-llm && echo there || echo none")
    assert there.strip() == "none"
    first = run_playbook("playbooks/server.yml", sim_cluster.inventory, extravars=TLS, envvars={"ANSIBLE_VERBOSITY": "3"})
    assert first.rc == 0, first.stdout[-4000:]
    credentials = sim_cluster.inventory / ".credentials"
    key = (credentials / "spark_llm_api_key").read_text().strip()
    second = run_playbook("playbooks/server.yml", sim_cluster.inventory, extravars=TLS)
    assert second.rc == 0, second.stdout[-4000:]
    head = sim_cluster.nodes[0]
    return {"cluster": sim_cluster, "head": head, "first": first, "second": second, "key": key,
            "credentials": credentials, "ca": str(credentials / "spark-llm-ca.crt"), "url": f"https://{head.mgmt_ip}:30000"}


def test_the_key_is_generated_once_beside_the_inventory_0600_and_ignored_by_git(site):
    credentials = site["credentials"]
    assert oct(credentials.stat().st_mode & 0o777) == "0o700"
    assert oct((credentials / "spark_llm_api_key").stat().st_mode & 0o777) == "0o600"
    assert oct((credentials / "spark-llm-ca.key").stat().st_mode & 0o777) == "0o600"
    assert oct((credentials / "spark-llm-ca.crt").stat().st_mode & 0o777) == "0o644"
    assert (credentials / ".gitignore").read_text().splitlines()[-1] == "*"
    key = site["key"]
    assert len(key) == 48 and key.isalnum()
    # Stable: the second run reused it and changed nothing anywhere.
    assert (credentials / "spark_llm_api_key").read_text().strip() == key
    assert [f"{d['host']}: {d['task']}" for d in site["second"].changed] == []
    said = site["second"].results("Say where the API key lives (never the key)")["spark-0"]["msg"]
    assert said.startswith(f"API key: {credentials / 'spark_llm_api_key'} on this controller (0600, reused)"), said
    first = site["first"].results("Say where the API key lives (never the key)")["spark-0"]["msg"]
    assert "(0600, generated now)" in first


def test_the_key_is_in_no_output_command_line_or_readable_file(site):
    key = site["key"]
    # -vvv output and every event of both runs.
    for run in (site["first"], site["second"]):
        assert key not in run.stdout and key not in json.dumps(run.events)
    assert "<<< caused by >>>" not in site["first"].stdout
    # On the controller only the key file holds it, 0600 in a 0700 directory.
    holders = [p for p in site["cluster"].inventory.rglob("*") if p.is_file() and key in p.read_text(errors="replace")]
    assert holders == [site["credentials"] / "spark_llm_api_key"]
    for node in site["cluster"].nodes:
        # Only the key file holds it, 0600: not the env file (docker records that in the container's configuration)
        # nor its copies kept for a rollback; no world-readable file under /etc, no Ansible async job file, and
        # no docker record of the stand-in's state (/var/lib/spark-sim).
        holders = sh(node, "grep -rlF -f /dev/stdin /etc /root/.ansible_async /tmp /var/tmp /var/lib/spark-sim "
                     "2>/dev/null || true", stdin=key + "\n").split()
        assert holders == ["/etc/spark-llm/spark-llm.key"], (node.name, holders)
        # What every member of the docker group may read: the container's recorded configuration.
        assert key not in sh(node, "docker inspect spark-llm"), node.name
        dirs = sorted({h.rsplit("/", 1)[0] for h in holders})
        assert sh(node, f"stat -c %a {' '.join(holders)}").split() == ["600"] * len(holders), (node.name, holders)
        assert sh(node, f"stat -c %a {' '.join(dirs)}").split() == ["700"] * len(dirs), (node.name, dirs)
        # Not on any process's command line (the launcher reads the mounted file) nor in the arguments file.
        argv = sh(node, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; cat /etc/spark-llm/server-args.json")
        assert "--api-key" not in argv.split() and key not in argv, node.name
    assert "python3 -c" in sh(site["head"], f"systemctl cat {UNIT}")


def test_tls_with_the_generated_ca_and_the_key_only(site):
    url, ca, key = site["url"] + "/v1/models", site["ca"], site["key"]
    status, body = curl(url, "--cacert", ca, key=key)
    assert status == "200" and json.loads(body)["data"][0]["id"] == "/models/glm53", body
    assert curl(url, "--cacert", ca) == ("401", '{"error": "Unauthorized"}')
    assert curl(url, "--cacert", ca, key="wrong-" + key)[0] == "401"
    # The chain is the generated CA's, not one the system trusts; plain HTTP gets nginx's refusal, not the API.
    status, err = curl(url, key=None)
    assert status == "000" and "SSL certificate problem" in err, err
    status, body = curl(url.replace("https://", "http://"))
    assert status == "400" and "plain HTTP request was sent to HTTPS port" in body
    # SGLang itself listens on the head's loopback only, and checks the key there too.
    head = site["head"]
    assert curl(f"http://{head.mgmt_ip}:30001/v1/models")[0] == "000"
    assert sh(head, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30001/v1/models") == "401"
    assert sh(head, "systemctl is-enabled nginx; systemctl is-active nginx").split() == ["enabled", "active"]
    assert sh(head, "test -e /etc/nginx/sites-enabled/default && echo there || echo gone").strip() == "gone"
    assert sh(head, "stat -c %a /etc/spark-llm/tls/server.key").strip() == "600"


def test_a_streamed_completion_arrives_token_by_token_through_the_proxy(site):
    head = site["head"]
    body = json.dumps({"model": "/models/glm53", "stream": True, "max_tokens": 512,
                       "messages": [{"role": "user", "content": "17 × 23 = ?"}]}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {head.mgmt_ip}:30000\r\n"
               f"Authorization: Bearer {site['key']}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    context = ssl.create_default_context(cafile=site["ca"])
    reads = []
    with socket.create_connection((head.mgmt_ip, 30000), timeout=60) as raw, \
            context.wrap_socket(raw, server_hostname=head.mgmt_ip) as tls:
        tls.sendall(request)
        while data := tls.recv(65536):
            reads.append(data)
    text = b"".join(reads).decode()
    assert text.startswith("HTTP/1.1 200") and "text/event-stream" in text
    events = [line for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) > 15
    # Token by token: the events came in many separate reads, each with only part of the stream,
    # not as one buffered answer at the end.
    with_events = [r for r in reads if b"data: " in r]
    assert len(with_events) >= 10, [len(r) for r in reads]
    deltas = [json.loads(e[6:])["choices"][0]["delta"] for e in events[:-1] if json.loads(e[6:])["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "391"


def test_verify_proves_the_key_and_the_tls_chain(site, tmp_path):
    report = tmp_path / "verify.json"
    result = run_playbook("playbooks/verify.yml", site["cluster"].inventory,
                          extravars={**TLS, "verify_report_path": str(report)})
    assert result.rc == 0, result.stdout[-3000:]
    checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    assert checks["auth"]["detail"] == "without a key: HTTP 401, wrong key: HTTP 401, the right key: HTTP 200"
    assert checks["tls"]["ok"] and f"chain verifies against {site['ca']}" in checks["tls"]["detail"]
    assert checks["tls"]["detail"].endswith("plain HTTP refused (HTTP 400)")
    assert site["key"] not in report.read_text() and site["key"] not in json.dumps(result.events)
    # Against a CA that did not sign the head's certificate (the system's store) the chain check fails.
    result = run_playbook("playbooks/verify.yml", site["cluster"].inventory, extravars={
        **TLS, "verify_report_path": str(report), "verify_tls_ca": "/etc/ssl/certs/ca-certificates.crt"})
    assert result.rc != 0
    tls = {c["name"]: c for c in json.loads(report.read_text())["checks"]}["tls"]
    assert not tls["ok"] and "CERTIFICATE_VERIFY_FAILED" in tls["detail"]


def test_status_asks_over_tls_with_the_key(site):
    result = run_playbook("playbooks/status.yml", site["cluster"].inventory, extravars=TLS)
    assert result.rc == 0, result.stdout[-3000:]
    line = result.results("Show one line per node")["spark-0"]["msg"]
    assert "endpoint healthy, serves /models/glm53" in line, line
    assert site["key"] not in result.stdout


def test_the_doctor_bundle_holds_no_key(site, tmp_path):
    result = run_playbook("playbooks/doctor.yml", site["cluster"].inventory,
                          extravars={**TLS, "doctor_bundle_dir": str(tmp_path)})
    assert result.rc == 0, result.stdout[-3000:]
    bundles = list(tmp_path.glob("*.tar.gz"))
    assert len(bundles) == 1
    with tarfile.open(bundles[0]) as tar:
        texts = [tar.extractfile(m).read().decode("utf-8", "replace") for m in tar.getmembers() if m.isfile()]
    assert texts and not [t for t in texts if site["key"] in t]
    assert site["key"] not in result.stdout


# The model gateway: the REAL smg (its pinned wheels fetched on this controller, installed on the node with no
# index) on the worker, in front of the head, with the head's key and the generated CA; the group spark_gateway
# names its host. Check mode on the fresh host first, then a run and a second run.
GATEWAY_HOST = "spark-1"


@pytest.fixture(scope="module")
def gateway(site):
    inventory = site["cluster"].inventory
    group = inventory / "gateway.yml"
    group.write_text(f"spark_gateway:\n  hosts:\n    {GATEWAY_HOST}:\n")
    try:
        preview = run_playbook("playbooks/gateway.yml", inventory, extravars=TLS, check=True, diff=True)
        assert preview.rc == 0, preview.stdout[-4000:]
        node = site["cluster"].nodes[1]
        assert sh(node, "test -e /etc/systemd/system/spark-llm-gateway.service && echo there || echo none").strip() == "none"
        first = run_playbook("playbooks/gateway.yml", inventory, extravars=TLS)
        assert first.rc == 0, first.stdout[-4000:]
        second = run_playbook("playbooks/gateway.yml", inventory, extravars=TLS)
        assert second.rc == 0, second.stdout[-4000:]
        yield {"node": node, "first": first, "second": second, "url": f"https://{node.mgmt_ip}:30080"}
    finally:
        group.unlink()


def head_requests(site):
    """The head's own count of the requests it served (SGLang's /metrics, asked behind the proxy)."""
    text = sh(site["head"], "curl -s http://127.0.0.1:30001/metrics")
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("sglang:num_requests_total")))


def test_the_gateway_forwards_to_the_head_with_the_key_over_tls_and_refuses_without_it(site, gateway):
    url, ca, key = gateway["url"], site["ca"], site["key"]
    body = json.dumps({"model": "/models/glm53", "max_tokens": 64, "messages": [{"role": "user", "content": "17 × 23 = ?"}]})
    before = head_requests(site)
    status, answer = curl(url + "/v1/chat/completions", "--cacert", ca, "-H", "Content-Type: application/json",
                          "-d", body, key=key)
    assert status == "200" and json.loads(answer)["choices"][0]["message"]["content"] == "391", answer
    assert head_requests(site) == before + 1
    # Without the key, or with a wrong one, the gateway answers itself and the head sees nothing. Over HTTP/1.1:
    # on HTTP/2 smg 1.13.0 resets the stream of a refused request that carries a body, and curl reports that
    # (error 92) instead of the 401 it was sent.
    status, answer = curl(url + "/v1/chat/completions", "--http1.1", "--cacert", ca, "-H",
                          "Content-Type: application/json", "-d", body)
    assert status == "401" and "invalid_api_key" in answer, answer
    assert curl(url + "/v1/chat/completions", "--http1.1", "--cacert", ca, "-d", body, key="wrong-" + key)[0] == "401"
    assert head_requests(site) == before + 1
    # Its certificate is the generated CA's, for the gateway host's address.
    status, err = curl(url + "/v1/models", key=key)
    assert status == "000" and "SSL certificate problem" in err, err
    said = next(iter(gateway["first"].results("Refuse bad gateway settings").values()))["msg"]
    assert said == f"gateway: {url} on {GATEWAY_HOST}, in front of https://{site["head"].mgmt_ip}:30000 (cache_aware)"


def test_the_gateway_metrics_reach_the_monitoring_host_only(site, gateway):
    node = gateway["node"]
    # The monitoring host is the head (no spark_monitor group): the metrics bind the gateway host's management
    # address, and the firewall admits the head there and drops this controller.
    metrics = sh(site["head"], f"curl -s --max-time 10 http://{node.mgmt_ip}:29000/metrics")
    assert "smg_" in metrics
    status, _ = curl(f"http://{node.mgmt_ip}:29000/metrics", "--connect-timeout", "3")
    assert status == "000"


def test_behind_the_gateway_verify_asks_the_head_from_itself_over_tls_and_the_gateway_from_here(site, gateway,
                                                                                                tmp_path):
    result = run_playbook("playbooks/verify.yml", site["cluster"].inventory,
                          extravars={**TLS, "verify_report_dir": str(tmp_path)})
    assert result.rc == 0, result.failure_messages() or result.stdout[-3000:]
    reports = {p.name.startswith("verify-gateway-"): json.loads(p.read_text()) for p in tmp_path.glob("verify-*.json")}
    head, through = reports[False], reports[True]
    # The head's port admits the gateway's host alone: the group is asked on the head's loopback, over TLS, its
    # chain checked against the generated CA (the controller's file, whose text went along).
    assert (head["asked_from"], head["endpoint"]) == ("spark-0", "https://127.0.0.1:30000")
    checks = {c["name"]: c for c in head["checks"]}
    assert checks["tls"]["ok"] and f"chain verifies against {site['ca']}" in checks["tls"]["detail"], checks["tls"]
    assert all(c["ok"] for c in head["checks"]), head["checks"]
    assert (through["asked_from"], through["endpoint"], through["ok"]) == ("localhost", gateway["url"], True)
    assert site["key"] not in json.dumps(result.events) and site["key"] not in json.dumps(reports)


def test_the_gateway_key_is_on_no_command_line_and_in_no_unit_or_settings_file(site, gateway):
    node, key = gateway["node"], site["key"]
    # Every process's command line and environment (the launcher's own, renamed smg::router by smg).
    seen = sh(node, "cat > /run/gateway-key-test; for p in /proc/[0-9]*; do "
                    "tr '\\0' '\\n' < $p/cmdline; tr '\\0' '\\n' < $p/environ; done 2>/dev/null "
                    "| grep -cF -f /run/gateway-key-test; rm -f /run/gateway-key-test", stdin=key + "\n", check=False)
    assert seen.strip() == "0"
    assert "smg::router" in sh(node, "ps -eo args")
    shown = sh(node, "systemctl show spark-llm-gateway; systemctl cat spark-llm-gateway; "
                     "cat /etc/spark-llm-gateway/gateway.json")
    assert key not in shown and "--api-key" not in shown and "LoadCredential=api-key:" in shown
    # Files: only the 0600 key files hold it, and systemd's copy for the running service.
    holders = sh(node, "grep -rlF -f /dev/stdin /etc /opt /root/.ansible_async /tmp /var/tmp 2>/dev/null || true",
                 stdin=key + "\n").split()
    assert sorted(holders) == ["/etc/spark-llm-gateway/api-key", "/etc/spark-llm/spark-llm.key"]
    assert sh(node, "stat -c %a /etc/spark-llm-gateway/api-key /etc/spark-llm-gateway").split() == ["600", "700"]
    assert sh(node, "journalctl -u spark-llm-gateway --no-pager -o cat | grep -cF -f /dev/stdin || true",
              stdin=key + "\n").strip() == "0"
    for run in (gateway["first"], gateway["second"]):
        assert key not in run.stdout and key not in json.dumps(run.events)


def test_a_second_gateway_run_changes_nothing(gateway):
    assert [f"{d['host']}: {d['task']}" for d in gateway["second"].changed] == []


def test_turning_tls_off_gives_the_port_back_to_sglang(site, gateway):
    head, key = site["head"], site["key"]
    result = run_playbook("playbooks/server.yml", site["cluster"].inventory,
                          extravars={**TLS, "server_tls": False})
    assert result.rc == 0, result.stdout[-4000:]
    assert sh(head, f"test -e {NGINX_CONF} && echo there || echo gone").strip() == "gone"
    # The run ended once the head listed the model on server_port again. Asked from the gateway's host: while the
    # gateway fronts the head, the head's port admits that host, not this controller.
    url = f"http://{head.mgmt_ip}:30000/v1/models"
    node = gateway["node"]

    def status(target, key=None):
        return sh(node, f"curl -s -o /dev/null --max-time 30 -w '%{{http_code}}' -H @- {target}",
                  check=False, stdin=f"Authorization: Bearer {key}\n" if key else "X-No-Key: 1\n")

    assert status(url, key) == "200"
    assert status(url) == "401"
    assert status(url.replace("http://", "https://")) == "000"
    assert curl(url, "--connect-timeout", "3", key=key)[0] == "000"

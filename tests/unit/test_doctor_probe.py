"""The doctor's one probe per node (plugins/modules/doctor_probe.py), run as Ansible runs it
against stand-in tools on PATH: its result has the shape the role's former probe tasks registered, so the
controller-side analysis (plugins/filter/doctor.py) reads it unchanged; it changes nothing, check mode or
not; the head alone reads the supervisor's files; a peer outside the run is unknown, not absent."""

from __future__ import annotations

import base64
import json
import stat

import pytest

from tests.lib.role_module import run_module
from tests.lib.roles import REPO, filter_plugin

doctor = filter_plugin("doctor")
UNIT = "spark-llm.service"
INV = "c" * 32
EXEC_START = ("{ path=/usr/bin/docker ; argv[]=/usr/bin/docker run --rm --name spark-llm --memory 96g img "
              "python3 -m sglang.launch_server --max-running-requests 2 ; ignore_errors=no ; start_time=[n/a] ; "
              "stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }")
JOURNAL = [{"__REALTIME_TIMESTAMP": "1800000000000000", "MESSAGE": f"Started {UNIT}.", "INVOCATION_ID": INV},
           {"__REALTIME_TIMESTAMP": "1800000001000000", "MESSAGE": "Init torch distributed begin.",
            "_SYSTEMD_INVOCATION_ID": INV}]
TOOLS = {
    "systemctl": f"""
case "$1" in
  show) printf '%s\\n' LoadState=loaded ActiveState=active SubState=running Result=success ExecMainStatus=0 \\
          InvocationID={INV} 'ExecStart={EXEC_START}' ;;
  cat) printf '# /etc/systemd/system/{UNIT}\\n[Service]\\nExecStart=/usr/bin/docker run img\\n' ;;
esac""",
    "journalctl": f"""
case " $* " in
  *" -u "*) printf '%s\\n' {" ".join(repr(json.dumps(e)) for e in JOURNAL)} ;;
  *" --list-boots "*) echo '  0 {"b" * 32} Mon 2027-01-11 08:00:00 UTC Mon 2027-01-11 15:00:00 UTC' ;;
esac""",
    "docker": """
case "$1" in
  ps) echo lmsysorg/sglang:glm-5.3-flash-arm64 ;;
  image) echo sha256:abc ;;
  *) exit 1 ;;
esac""",
    "nvidia-smi": """
case "$1" in
  --query-gpu=*) echo 'NVIDIA GB10, 12.1, 580.95.05, 1024 MiB, 122502 MiB' ;;
  *) echo '4242, python3, 1000 MiB' ;;
esac""",
    "ip": """
case "$3" in
  link) echo '[{"ifname": "enp1s0f1np1", "mtu": 9000, "flags": ["BROADCAST", "UP"], "operstate": "UP"}]' ;;
  *) echo '[{"dst": "'"$5"'", "dev": "enp1s0f1np1"}]' ;;
esac""",
}


@pytest.fixture
def node(tmp_path, monkeypatch):
    """Stand-in tools first on PATH and the rank's files under tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in TOOLS.items():
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    (tmp_path / "spark-llm.env").write_text("SGLANG_API_KEY=sk-PlantedProbeKey0123456789\nHF_HUB_OFFLINE=1\n")
    (tmp_path / "server-args.json").write_text('["--max-running-requests", "2"]')
    (tmp_path / "glm53").mkdir()
    (tmp_path / "glm53" / "config.json").write_text("{}")
    (tmp_path / "glm53.record.json").write_text('{"revision": "r1"}')
    (tmp_path / "sup").mkdir()
    (tmp_path / "sup" / "state.json").write_text('{"state": "watching"}')
    return tmp_path


def probe(tmp, check=False, **extra):
    args = {"unit": UNIT, "journal_lines": 2000, "container": "spark-llm", "env_file": str(tmp / "spark-llm.env"),
            "args_file": str(tmp / "server-args.json"), "model_dir": str(tmp / "glm53"),
            "fabric_interface": "enp1s0f1np1", "peers": ["192.168.100.11"], **extra}
    return run_module("doctor_probe", args, tmp, check=check)


def test_one_probe_reads_what_the_analysis_needs_in_the_shape_it_reads(node):
    res = probe(node)
    assert not res.get("failed") and res["changed"] is False, res
    assert res["unit"]["status"]["ExecStart"] == EXEC_START and res["unit"]["status"]["InvocationID"] == INV
    assert base64.b64decode(res["env"]["content"]).decode().startswith("SGLANG_API_KEY=")
    assert res["routes"]["results"][0]["cmd"][-1] == "192.168.100.11"
    assert res["supervisor"] == {"results": []}
    ev = doctor.evidence(res, "enp1s0f1np1", None)
    facts = ev["facts"]
    assert facts["unit"]["ActiveState"] == "active" and facts["current_invocation"] == INV
    assert [e["msg"] for e in ev["node"]["journal"]] == [f"Started {UNIT}.", "Init torch distributed begin."]
    assert facts["journal_boots"] == 1
    assert facts["gpu"] == ["NVIDIA GB10, 12.1, 580.95.05, 1024 MiB, 122502 MiB"]
    assert facts["gpu_processes"] == ["4242, python3, 1000 MiB"]
    assert facts["fabric"] == {"interface": "enp1s0f1np1", "mtu": 9000, "flags": ["BROADCAST", "UP"],
                               "operstate": "UP", "routes": {"192.168.100.11": "enp1s0f1np1"}}
    assert facts["image"] == "lmsysorg/sglang:glm-5.3-flash-arm64 sha256:abc"
    assert facts["checkpoint"][str(node / "glm53" / "config.json")] == "present"
    assert facts["checkpoint"][str(node / "glm53.verified")] == "missing"
    assert facts["checkpoint_revision"] == "r1" and facts["env_file"] == "present"
    assert facts["memory_bytes"]["MemTotal"] > 0
    assert ev["deployed"]["memory"] == "96g"
    assert doctor.probe_problems(ev["node"]["raw"], {"fabric_interface": "enp1s0f1np1", "expected_mtu": 9000}) == {}


def test_check_mode_reads_the_same_and_a_missing_file_or_tool_is_evidence(node, monkeypatch):
    (node / "spark-llm.env").unlink()
    (node / "bin" / "nvidia-smi").unlink()
    res = probe(node, check=True)
    assert not res.get("failed") and res["changed"] is False, res
    assert "content" not in res["env"]
    assert res["smi"]["rc"] == 127
    ev = doctor.evidence(res, "enp1s0f1np1", None)
    assert ev["facts"]["env_file"] == "missing"
    assert "gpu" in doctor.probe_problems(ev["node"]["raw"], {"fabric_interface": "enp1s0f1np1"})


def test_the_head_reads_the_supervisors_files_and_a_missing_one_has_no_content(node):
    res = probe(node, supervisor_dir=str(node / "sup"))
    reads = doctor.supervisor_reads(res["supervisor"])["results"]
    assert json.loads(base64.b64decode(reads[0]["content"])) == {"state": "watching"}
    assert reads[0]["item"] == "state.json" and "content" not in reads[1]
    assert doctor.supervisor_reads({}) == {"results": [{}, {}]}


def test_systemctl_shows_a_multi_line_exec_value_whole():
    text = ("ActiveState=failed\nExecStart={ path=/usr/bin/docker ; argv[]=/usr/bin/docker run\n  --rm img ; status=0/0 }"
            "\nNRestarts=3")
    module = (REPO / "plugins" / "modules" / "doctor_probe.py").read_text()
    namespace: dict = {}
    exec(compile(module.split("\ndef main():")[0], "probe", "exec"), namespace)  # noqa: S102 - the module's own parser
    assert namespace["parse_show"](text) == {
        "ActiveState": "failed", "NRestarts": "3",
        "ExecStart": "{ path=/usr/bin/docker ; argv[]=/usr/bin/docker run\n  --rm img ; status=0/0 }"}


def test_a_peer_outside_the_run_is_unknown_and_one_in_it_is_summarised():
    ev = {"facts": {"unit": {"ActiveState": "failed", "SubState": "failed"}}, "runs": [{"id": "x"}]}
    hostvars = {"spark-0": {}, "spark-1": {"__doctor_evidence": ev, "__doctor_own": []}}
    peers = doctor.peer_summaries(["spark-0", "spark-1"], hostvars, ["spark-0", "spark-1"])
    assert peers[0] == {"host": "?", "runs": None}
    assert peers[1] == {"host": "spark-1", "rank": 1, "runs": [{"id": "x"}], "why": "", "rendezvous": "",
                        "state": "failed/failed"}

"""A failed change goes back to the last good configuration: the server role's module and filters.

The module (plugins/modules/server_config.py) runs as Ansible runs it, against
files in a temporary root and the docker stand-in (SPARK_SIM_ROOT points its state there): what it
keeps, promotes and restores is read back from the files, never from its own answer. The stand-in's
image builds (its registry knob), `docker tag` and image events, which the rollback and the upgrade
rely on, are checked here too.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lib.role_module import run_module
from tests.lib.server_plan import FILTER, MODEL, ctx
from tests.lib.standin_docker import DOCKER, docker

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "tests" / "standins" / "lib" / "sglang_server.py"
OLD, NEW = "lmsysorg/sglang:glm-5.3-flash-arm64", "lmsysorg/sglang:glm-5.3-flash-arm64-rc2"
KEY = "k3y-that-must-never-be-shown-0123456789abcdef"
ANY = "0.0.0.0"  # noqa: S104 - a bind address written into a file, not bound



def image_id(root, ref):
    return docker(root, "image", "inspect", "--format", "{{.Id}}", ref)


def knobs(root, data):
    path = root / "etc" / "spark-sim" / "node.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


class Rank:
    """One rank's installed configuration under a temporary root, and the module pointed at it."""

    def __init__(self, root: Path, tmp: Path):
        self.root, self.tmp = root, tmp
        self.store = root / "etc" / "spark-llm"
        self.paths = {"unit": root / "etc" / "systemd" / "system" / "spark-llm.service",
                      "env": self.store / "spark-llm.env", "args": self.store / "server-args.json"}
        for path in self.paths.values():
            path.parent.mkdir(parents=True, exist_ok=True)
        self.store.chmod(0o700)
        self.container = None

    def install(self, image, context=65536):
        self.paths["unit"].write_text(f"[Service]\nExecStart=/usr/bin/docker run --name spark-llm {image} "
                                      f"--context-length {context}\n")
        self.paths["env"].write_text(f"NCCL_SOCKET_IFNAME=enp1s0f1np1\nSGLANG_API_KEY={KEY}\n")
        self.paths["env"].chmod(0o600)
        self.paths["args"].write_text(json.dumps(["--context-length", str(context), "--host", ANY, "--port", "30000",
                                                  "--model-path", "/models/glm53"]) + "\n")

    def files(self):
        return {kind: path.read_bytes() for kind, path in self.paths.items()}

    def run(self, image):
        """A container named spark-llm running `image`, as the rank's unit keeps one."""
        self.stop()
        self.container = subprocess.Popen(  # noqa: S603 - the docker stand-in, a script of this repository
            [sys.executable, str(DOCKER), "run", "--rm", "--name", "spark-llm", image, "sleep", "120"],
            env={**os.environ, "SPARK_SIM_ROOT": str(self.root)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if docker(self.root, "inspect", "--type", "container", "--format", "{{.State.Running}}", "spark-llm",
                      check=False) == "true":
                return
            time.sleep(0.1)
        raise AssertionError("the container did not start")

    def stop(self):
        if self.container is not None:
            docker(self.root, "stop", "--time", "1", "spark-llm", check=False)
            self.container.wait(30)
            self.container = None

    def module(self, state, check=False, **extra):
        args = {"state": state, "files": {k: str(v) for k, v in self.paths.items()}, "store": str(self.store),
                "container": "spark-llm", "docker": str(DOCKER), **extra}
        return run_module("server_config", args, self.tmp, check=check)


@pytest.fixture
def rank(tmp_path, monkeypatch):
    root = tmp_path / "node"
    knobs(root, {})
    monkeypatch.setenv("SPARK_SIM_ROOT", str(root))
    docker(root, "pull", OLD)
    r = Rank(root, tmp_path)
    r.install(OLD)
    r.run(OLD)
    yield r
    r.stop()


def kept(rank, name="last-good"):
    folder = rank.store / name
    return {kind: (folder / rank.paths[kind].name).read_bytes() for kind in rank.paths}, \
        json.loads((folder / "config.json").read_text())


def test_readiness_keeps_pending_verify_promotes_it_and_a_rerun_changes_nothing(rank):
    first = rank.module("pending")
    assert first["changed"] and first["pending"]["image_id"] == image_id(rank.root, OLD)
    assert first["last_good"] is None
    assert rank.module("pending")["changed"] is False, "the same configuration is pending already"
    files, manifest = kept(rank, "pending")
    assert files == rank.files() and manifest["image"] == {"image_ref": OLD, "image_id": image_id(rank.root, OLD)}

    committed = rank.module("commit")
    assert committed["changed"] and committed["pending"] is None
    assert not (rank.store / "pending").exists()
    files, manifest = kept(rank)
    assert files == rank.files() and manifest["image"]["image_id"] == image_id(rank.root, OLD)
    # Secrets: the env file is kept 0600 in a 0700 directory; no answer carries it.
    assert stat.S_IMODE((rank.store / "last-good" / "spark-llm.env").stat().st_mode) == 0o600
    assert stat.S_IMODE((rank.store / "last-good").stat().st_mode) == 0o700
    assert KEY not in json.dumps([first, committed])

    # The group runs its last good configuration: nothing pending, nothing to commit, nothing differs.
    assert rank.module("pending")["changed"] is False and not (rank.store / "pending").exists()
    assert rank.module("commit")["changed"] is False
    read = rank.module("read", image_ref=OLD)
    assert read["differs"] is False and read["last_good_args"][:2] == ["--context-length", "65536"]


def test_a_changed_configuration_goes_back_byte_for_byte(rank):
    rank.module("pending")
    rank.module("commit")
    before = rank.files()
    docker(rank.root, "pull", NEW)
    rank.install(NEW, context=131072)
    rank.run(NEW)
    assert rank.module("pending")["changed"]
    read = rank.module("read", image_ref=NEW)
    assert read["differs"] and read["differences"] == ["unit", "server-args.json", "image"]

    preview = rank.module("restore", check=True)
    assert preview["changed"] and rank.files() != before and (rank.store / "pending").exists()

    restored = rank.module("restore")
    assert restored["changed"] and restored["unit_changed"] and not restored["retagged"]
    assert rank.files() == before
    assert stat.S_IMODE(rank.paths["env"].stat().st_mode) == 0o600
    assert not (rank.store / "pending").exists()
    assert rank.module("read", image_ref=OLD)["differs"] is False
    assert KEY not in json.dumps([read, restored])


def test_a_tag_that_moved_is_pointed_at_the_kept_image_again(rank):
    rank.module("pending")
    rank.module("commit")
    kept_id = image_id(rank.root, OLD)
    # The same tag pulled again names another image now (a re-pushed tag); the old one stays, untagged.
    knobs(rank.root, {"docker": {"image_id": "sha256:" + "ee" * 32}})
    docker(rank.root, "pull", OLD)
    assert image_id(rank.root, OLD) != kept_id
    assert rank.module("read", image_ref=OLD)["differences"] == ["image"]
    restored = rank.module("restore")
    assert restored["retagged"] and restored["changed"] and not restored["unit_changed"]
    assert image_id(rank.root, OLD) == kept_id
    events = [json.loads(line) for line in docker(rank.root, "events", "--since", "0", "--until", str(time.time() + 1),
                                                    "--filter", "type=image", "--format", "{{json .}}").splitlines()]
    assert [(e["Action"], e["Actor"]["Attributes"]["name"]) for e in events][-1] == ("tag", OLD)


def test_a_kept_image_that_is_gone_cannot_go_back(rank):
    rank.module("pending")
    rank.module("commit")
    rank.stop()
    docker(rank.root, "image", "rm", image_id(rank.root, OLD))
    result = rank.module("restore")
    assert result.get("failed") and "no longer on this node" in result["msg"], result


def test_pending_refuses_a_rank_that_does_not_run(rank):
    rank.stop()
    result = rank.module("pending")
    assert result.get("failed") and "is not running" in result["msg"], result


# --- the filters --------------------------------------------------------------------------------

def read(item, *, last_good=True, differs=False, differences=(), image="sha256:" + "a" * 64, args=None):
    return {"item": item, "changed": False, "differs": differs, "differences": list(differences),
            "last_good": {"image_ref": OLD, "image_id": image, "kept": "2026-09-01T00:00:00Z"} if last_good else None,
            "last_good_args": args or ["--model-path", "/models/glm53", "--host", ANY, "--port", "30000"]}


@pytest.mark.parametrize(("results", "enabled", "why"), [
    ([read("spark-0", differs=True, differences=["unit"]), read("spark-1")], False, "server_rollback is false"),
    ([read("spark-0", last_good=False), read("spark-1", last_good=False)], True, "a first deployment"),
    ([read("spark-0", differs=True, differences=["unit"]), read("spark-1", last_good=False)], True,
     "spark-1 keeps no last good configuration"),
    ([read("spark-0", differs=True), read("spark-1", image="sha256:" + "b" * 64)], True, "different last good images"),
    ([read("spark-0"), read("spark-1")], True, "runs its last good configuration already"),
    ([{"item": "spark-0", "failed": True, "msg": "boom"}, read("spark-1")], True, "could not be read (boom)"),
])
def test_the_group_goes_back_only_as_one_and_only_after_a_change(results, enabled, why):
    plan = FILTER.server_rollback_plan(results, enabled, "spark-0")
    assert plan["do"] is False and why in plan["why"], plan


def test_the_group_goes_back_waiting_for_what_the_restored_head_serves():
    args = ["--model-path", "/models/glm-old", "--host", "127.0.0.1", "--port", "30001"]
    plan = FILTER.server_rollback_plan(
        [read("spark-0", differs=True, differences=["unit", "image"], args=args), read("spark-1")], "true", "spark-0")
    assert plan["do"] is True and plan["differences"] == {"spark-0": ["unit", "image"]}
    assert plan["model"] == "/models/glm-old" and plan["probe_url"] == "http://127.0.0.1:30001/v1/models"
    assert plan["image"]["image_ref"] == OLD
    # A switch of engine that failed goes back to the other engine's kept arguments: vLLM's model is positional.
    vllm = ["/models/glm-v", "--tensor-parallel-size", "2", "--host", "0.0.0.0", "--port", "30002"]  # noqa: S104
    plan = FILTER.server_rollback_plan(
        [read("spark-0", differs=True, differences=["unit"], args=vllm), read("spark-1")], "true", "spark-0")
    assert plan["model"] == "/models/glm-v" and plan["probe_url"] == "http://127.0.0.1:30002/v1/models"


def test_the_cause_quotes_each_failed_ranks_error_lines_once():
    final = {
        "spark-0": {"active": False, "ended": 2.0, "summary": "failed/failed (result exit-code, exit 1)", "journal": [
            "2026-09-01T00:00:01+0000 spark-0 docker[11]: Load weight begin.",
            "2026-09-01T00:00:02+0000 spark-0 docker[11]: RuntimeError: Hybrid state cache is too small.",
            "2026-09-01T00:00:03+0000 spark-0 systemd[1]: spark-llm.service: Failed with result 'exit-code'."]},
        "spark-1": {"active": False, "ended": 1.0, "summary": "failed/failed (result exit-code, exit 1)", "journal": [
            "2026-09-01T00:00:01+0000 spark-1 docker[12]: RuntimeError: Hybrid state cache is too small."]},
    }
    assert FILTER.server_failure_cause(final, ["spark-0", "spark-1"], "x", "Error", "spark-0", "vLLM").startswith(
        "vLLM did not come up (x).")
    text = FILTER.server_failure_cause(final, ["spark-0", "spark-1"], "a rank's unit is no longer active",
                                              "Error|Exception", "spark-0")
    assert text.startswith("SGLang did not come up (a rank's unit is no longer active). Every rank as one pass read it before "
                           "they were stopped: "
                           "spark-0 failed/failed (result exit-code, exit 1); spark-1 failed/failed")
    assert "first to end: spark-1." in text
    assert "spark-1's journal: RuntimeError: Hybrid state cache is too small." in text
    assert "spark-0's journal: the same as spark-1's." in text and "Load weight" not in text


def test_the_doctors_findings_are_named_once_per_kind():
    lines = FILTER.server_doctor_lines({
        "spark-0": {"findings": ["hybrid_state_cache"], "lines": ["spark-0: Hybrid", "  remedy:  lower   it"]},
        "spark-1": {"findings": ["hybrid_state_cache"], "lines": ["spark-1: Hybrid"]},
        "spark-2": {"findings": [], "lines": ["spark-2: no current finding"]},
    })
    assert lines == ["spark-0: Hybrid", "remedy: lower it", "spark-1: the same (hybrid_state_cache) as spark-0."]


def test_switches_that_are_not_booleans_are_refused_by_the_plan():
    switches = {"server_rollback": "sometimes", "server_uninstall_images": False,
                "upgrade_benchmark": "maybe", "uninstall_images": "true", "uninstall_checkpoint": 2}
    errors = FILTER.server_plan(ctx(switches=switches), MODEL)["errors"]
    assert len(errors) == 3, errors
    assert any(e.startswith("server_rollback = 'sometimes': must be true or false") for e in errors)
    assert any(e.startswith("upgrade_benchmark = 'maybe': must be true or false") and "-e upgrade_benchmark=true" in e
               for e in errors)
    assert any(e.startswith("uninstall_checkpoint = 2: must be true or false") for e in errors)


# --- the stand-ins the rollback and the upgrade rely on ---------------------------------------------

def test_the_registry_serves_an_image_of_its_own_build_whose_knobs_its_server_runs_with(tmp_path):
    root = tmp_path / "node"
    build = {"sglang": {"tilelang_tile": "default"}}
    knobs(root, {"docker": {"registry": {NEW: build}}, "sglang": {"tilelang_tile": "gb10", "load_seconds": 0.5}})
    docker(root, "pull", OLD)
    docker(root, "pull", NEW)
    old, new = (json.loads(docker(root, "image", "inspect", ref))[0] for ref in (OLD, NEW))
    assert old["Id"] != new["Id"] and new.get("SimSglang") == build["sglang"] and "SimSglang" not in old
    probe = (f"import importlib.util, json; s = importlib.util.spec_from_file_location('s', {str(SERVER)!r}); m = "
             "importlib.util.module_from_spec(s); s.loader.exec_module(m); print(json.dumps(m.knobs()))")
    seen = json.loads(subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "SPARK_SIM_ROOT": str(root), "SPARK_SIM_IMAGE_KNOBS": json.dumps(build["sglang"])}).stdout)
    assert seen["tilelang_tile"] == "default" and seen["load_seconds"] == 0.5
    events = [json.loads(line) for line in docker(root, "events", "--since", "0", "--until", str(time.time() + 1),
                                                  "--filter", "type=image", "--format", "{{json .}}").splitlines()]
    assert [(e["Action"], e["Actor"]["ID"]) for e in events] == [("pull", OLD), ("pull", NEW)]


def test_docker_tag_moves_a_tag_like_the_cli(tmp_path):
    root = tmp_path / "node"
    knobs(root, {})
    docker(root, "pull", OLD)
    docker(root, "pull", NEW)
    docker(root, "tag", NEW, OLD)
    assert image_id(root, OLD) == image_id(root, NEW)
    bad = subprocess.run([sys.executable, str(DOCKER), "tag", "nope:x", OLD], capture_output=True, text=True,
                         env={**os.environ, "SPARK_SIM_ROOT": str(root)}, timeout=60, check=False)
    assert bad.returncode == 1 and bad.stderr.strip() == "Error response from daemon: No such image: nope:x"

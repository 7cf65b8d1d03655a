"""A derived engine image (server_image_build_context): the plan's refusals of a context that is not the pinned
one, and the module that names, builds and hands on the image, run against the docker stand-in in a node root.

The hand-over to the workers (docker save into docker load over the fabric's SSH) needs two nodes: the
integration test of the change history does it (tests/integration/test_change.py).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.lib.role_module import module_utils, run_module
from tests.lib.server_plan import FILTER, MODEL, ctx
from tests.lib.standin_docker import DOCKER, docker, node_root

IMAGE = "lmsysorg/sglang:glm-5.3-flash-arm64"
DOCKERFILE = (
    "ARG SPARK_BASE_IMAGE\n"
    "FROM ${SPARK_BASE_IMAGE}\n"
    "COPY tile.patch /opt/spark/tile.patch\n"
    # What the patch's build step changes, for the SGLang stand-in (tests/standins/README.md, docker).
    "LABEL org.spark-sim.sglang='{\"tilelang_verify_tile\": \"gb10\"}'\n"
)
build = module_utils("image_build")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def context(tmp_path):
    root = tmp_path / "gb10-tile"
    root.mkdir()
    (root / "Dockerfile").write_text(DOCKERFILE)
    (root / "tile.patch").write_text("block_I=32 num_stages=1 threads=128\n")
    return root


def pins_of(root) -> dict:
    return {p.name: sha(p.read_text()) for p in root.iterdir()}


def errors(**changes):
    return FILTER.server_plan(ctx(**changes), MODEL)["errors"]


def test_a_pinned_context_that_builds_on_the_site_s_image_is_accepted(context):
    assert errors(server_image_build_context=str(context), server_image_build_sha256=pins_of(context)) == []


@pytest.mark.parametrize(("change", "fragments"), [
    ("unpinned", ["extra.txt has no sha256 pin", "Fix: review the context and pin exactly its files",
                  '"extra.txt": "']),
    ("edited", ["tile.patch has sha256 ", ", not the pinned "]),
    ("missing", ["gone.patch is pinned but not in the context"]),
    ("bad pin", ["tile.patch's pin is not 64 lowercase hex digits"]),
    ("symlink", ["link is a symlink or special file"]),
    ("other base", ["its first FROM is 'ubuntu:24.04', not the site's engine image",
                    "write ARG SPARK_BASE_IMAGE and FROM ${SPARK_BASE_IMAGE}"]),
    ("late arg", ["FROM ${SPARK_BASE_IMAGE} comes before ARG SPARK_BASE_IMAGE"]),
])
def test_a_context_that_is_not_the_pinned_one_is_refused_naming_the_file(context, change, fragments):
    pins = pins_of(context)
    if change == "unpinned":
        (context / "extra.txt").write_text("x")
    elif change == "edited":
        (context / "tile.patch").write_text("block_I=16\n")
    elif change == "missing":
        pins["gone.patch"] = "0" * 64
    elif change == "bad pin":
        pins["tile.patch"] = "SHA256:abc"
    elif change == "symlink":
        (context / "link").symlink_to("/etc/passwd")
    elif change == "other base":
        (context / "Dockerfile").write_text("FROM ubuntu:24.04\n")
        pins = pins_of(context)
    elif change == "late arg":
        (context / "Dockerfile").write_text("FROM ${SPARK_BASE_IMAGE}\nARG SPARK_BASE_IMAGE\n")
        pins = pins_of(context)
    found = errors(server_image_build_context=str(context), server_image_build_sha256=pins)
    assert len(found) == 1, found
    for fragment in fragments:
        assert fragment in found[0], (fragment, found[0])


def test_where_the_context_is_and_who_can_receive_it(context, tmp_path):
    pins = pins_of(context)
    relative = errors(server_image_build_context="builds/gb10", server_image_build_sha256=pins)
    assert relative == ["server_image_build_context = 'builds/gb10': must be an absolute directory on the controller. "
                        "Fix: give its absolute path (e.g. /srv/spark/builds/gb10-tile)."]
    absent = errors(server_image_build_context=str(tmp_path / "nope"), server_image_build_sha256=pins)
    assert "no such directory on the controller" in absent[0]
    assert "pins without a build context" in errors(server_image_build_sha256=pins)[0]
    (context / "Dockerfile").unlink()
    assert any("holds no Dockerfile" in e for e in errors(server_image_build_context=str(context),
                                                         server_image_build_sha256=pins_of(context)))
    (context / "Dockerfile").write_text(DOCKERFILE)
    untrusted = errors(server_image_build_context=str(context), server_image_build_sha256=pins_of(context),
                       peer_ssh=False, server_supervised=False)
    assert untrusted == [f"server_image_build_context = {str(context)!r}: the head gives the derived image to the "
                         "workers over the fabric's SSH trust, and fabric_ssh_trust is false. Fix: set fabric_ssh_trust: "
                         "true, or push the image to a registry yourself and name it in server_image."]


def test_the_build_s_identity_follows_the_base_and_every_pinned_file():
    pins = {"Dockerfile": "a" * 64, "tile.patch": "b" * 64}
    first = build.build_id("sha256:" + "1" * 64, pins)
    assert first == build.build_id("sha256:" + "1" * 64, dict(reversed(list(pins.items()))))
    assert first != build.build_id("sha256:" + "2" * 64, pins), "a new base digest"
    assert first != build.build_id("sha256:" + "1" * 64, {**pins, "tile.patch": "c" * 64}), "a changed file"
    assert build.derived_tag("sglang", first) == f"spark-llm/sglang-derived:{first[:16]}"


@pytest.fixture
def node(tmp_path, monkeypatch):
    return node_root(tmp_path, monkeypatch)


def test_the_head_names_builds_and_then_finds_the_derived_image(node, context, tmp_path):
    pins = pins_of(context)
    args = {"base_ref": IMAGE, "engine": "sglang", "sha256": pins, "docker": str(DOCKER)}
    dry = run_module("server_image_build", {**args, "state": "plan"}, tmp_path, check=True)
    assert dry["changed"] is False and dry["tag"] == "" and dry["base"]["rc"] != 0, "check mode pulls nothing"
    plan = run_module("server_image_build", {**args, "state": "plan"}, tmp_path)
    base_id = docker(node, "image", "inspect", "--format", "{{.Id}}", IMAGE)
    assert plan["changed"] is True and plan["base"]["Id"] == base_id
    assert plan["build_id"] == build.build_id(base_id, pins) and plan["present"] is False
    built = run_module("server_image_build", {**args, "state": "build", "context": str(context), "tag": plan["tag"],
                                              "build_id": plan["build_id"]}, tmp_path)
    assert built["changed"] is True and built["image_id"].startswith("sha256:"), built
    labels = json.loads(docker(node, "image", "inspect", "--format", "{{json .Config.Labels}}", plan["tag"]))
    assert labels["org.spark-llm.build"] == plan["build_id"]
    # Built here, from no registry: the image list shows no digest for it.
    assert f"{plan['tag']} <none>" in docker(node, "images", "--format", "{{.Repository}}:{{.Tag}} {{.Digest}}")
    again = run_module("server_image_build", {**args, "state": "plan"}, tmp_path)
    assert (again["changed"], again["present"], again["image_id"]) == (False, True, built["image_id"])
    # What the head builds is checked against the pins once more: a copy changed on the way is not built.
    (context / "tile.patch").write_text("block_I=16\n")
    refused = run_module("server_image_build", {**args, "state": "build", "context": str(context),
                                                "tag": plan["tag"], "build_id": plan["build_id"]}, tmp_path)
    assert refused.get("failed") and "tile.patch has sha256" in refused["msg"], refused


def test_a_build_that_fails_quotes_the_builder(node, context, tmp_path):
    (context / "Dockerfile").write_text(DOCKERFILE.replace("tile.patch", "missing.patch"))
    pins = pins_of(context)
    args = {"base_ref": IMAGE, "engine": "sglang", "sha256": pins, "docker": str(DOCKER)}
    plan = run_module("server_image_build", {**args, "state": "plan"}, tmp_path)
    failed = run_module("server_image_build", {**args, "state": "build", "context": str(context), "tag": plan["tag"],
                                               "build_id": plan["build_id"]}, tmp_path)
    assert failed.get("failed") and f"docker build of {plan['tag']} on top of {IMAGE} failed" in failed["msg"]
    assert '"/missing.patch": not found' in failed["msg"]

"""Whether the ranks outside a --limit run may restart with it (server filters).

The installed arguments are written out here as a rank would hold them, not
rebuilt through the same filter: a comparison of the plan with itself could
not fail.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from tests.lib.role_module import module_utils
from tests.lib.seed import DEFAULT_FLAGS
from tests.lib.server_plan import FILTER, MODEL, ctx

ARGS_FILE = "/etc/spark-llm/server-args.json"
IMAGE_ID = "sha256:" + "ab" * 32
REVISION = "7ce4007804ddbb1b33185febc1669f76f90fb53e"
MODEL_DIR = "/opt/models/glm53"
CHECKPOINT = {
    "revision": REVISION,
    "model_dir": MODEL_DIR,
    "stamp_path": MODEL_DIR + ".verified",
    "record_path": MODEL_DIR + ".record.json",
}
FILES = {"config.json": {"size": 2, "sha256": "c" * 64}}
RECORD = {"repo_id": "LibertAIDAI/GLM-5.3-Flash-NVFP4", "revision": REVISION, "files": FILES}
STAMP = {"repo_id": RECORD["repo_id"], "revision": REVISION, "model_dir": MODEL_DIR, "mode": "deep",
         "record_sha256": hashlib.sha256(json.dumps(FILES, sort_keys=True).encode()).hexdigest()}
# The checkpoint role owns the stamp: its stamp entry point tells the server role, per outside rank,
# what keeps the stamp from vouching (checkpoint_stamp_problems), with the server's variable names.
STAMP_CHECK = module_utils("checkpoint_common")


def head_args(**values):
    """What the head (rank 0 of 2) runs with the role defaults, as server-args.json holds it."""
    pairs = [("--model-path", "/models/glm53"), DEFAULT_FLAGS[0], ("--tp-size", "2"), *DEFAULT_FLAGS[1:]]
    pairs += [("--nnodes", "2"), ("--node-rank", "0"), ("--dist-init-addr", "192.168.100.10:20000"),
              ("--host", "0.0.0.0"), ("--port", "30000")]  # noqa: S104 - compared, not bound
    out = []
    for flag, default in pairs:
        value = values.get(flag, default)
        out += [flag] if value is None else [flag, value]
    return out


def slurped(data) -> dict:
    text = data if isinstance(data, str) else json.dumps(data, indent=2)
    return {"content": base64.b64encode(text.encode()).decode(), "encoding": "base64", "changed": False}


def missing(path) -> dict:
    return {"failed": True, "msg": f"file not found: {path}", "changed": False}


def stored(data):
    """A checkpoint file holding ``data``, as the checkpoint role reads it."""
    return STAMP_CHECK.decode_json(json.dumps(data, indent=1))


def absent():
    """A checkpoint file that does not exist, as the checkpoint role reads it."""
    return STAMP_CHECK.read_json("/nonexistent/checkpoint-file")


def reads(args=None, state=None, stamp=None, record=None, rank="spark-0"):
    def looped(result):
        return {"results": [dict(result, item=rank)]}

    checkpoint = STAMP_CHECK.stamp_problems(
        stored(STAMP) if stamp is None else stamp, stored(RECORD) if record is None else record, **CHECKPOINT,
        model_dir_variable="server_model_dir", revision_variable="server_checkpoint_revision")
    return {
        "args": looped(slurped(head_args()) if args is None else args),
        "state": looped({"stdout": f"{IMAGE_ID}\nactive" if state is None else state, "rc": 0}),
        "checkpoint": {rank: checkpoint},
    }


def rejoin(r, host="spark-1", **ctx_changes):
    expected = {"image_ref": "lmsysorg/sglang:glm-5.3-flash-arm64", "image_id": IMAGE_ID, "args_file": ARGS_FILE}
    return FILTER.server_rejoin_problems(r, ctx(host, **ctx_changes), MODEL, None, expected)


def test_an_outside_head_that_runs_the_inventory_may_rejoin():
    assert rejoin(reads()) == {}


def test_a_flag_the_inventory_changed_keeps_the_head_out():
    found = rejoin(reads(), server_flag_overrides={"max-running-requests": 1})
    assert found == {"spark-0": ["--max-running-requests is installed as '2', the inventory gives '1'"]}


def test_a_flag_only_installed_or_only_in_the_inventory_is_named():
    installed = head_args() + ["--enable-cache-report"]
    found = rejoin(reads(args=slurped(installed)), server_flag_overrides={"disable-radix-cache": True})
    assert found == {"spark-0": [
        "--disable-radix-cache is not installed (the inventory gives a switch)",
        "--enable-cache-report (a switch) is installed but not in the inventory",
    ]}


def test_the_same_flags_in_another_order_are_drift():
    args = head_args()
    i = args.index("--port")
    reordered = args[:2] + args[i:i + 2] + args[2:i]
    assert rejoin(reads(args=slurped(reordered))) == {
        "spark-0": ["the arguments are installed in another order than the role renders them"]}


@pytest.mark.parametrize(("args", "says"), [
    (missing(ARGS_FILE), f"{ARGS_FILE} is missing (file not found: {ARGS_FILE})"),
    (slurped("{not json"), f"{ARGS_FILE} is not valid JSON"),
    (slurped({"args": []}), f"{ARGS_FILE} is not a JSON list of arguments"),
], ids=["missing", "garbled", "not-a-list"])
def test_an_unreadable_args_file_keeps_the_rank_out(args, says):
    (problem,) = rejoin(reads(args=args))["spark-0"]
    assert problem.startswith(says), problem


@pytest.mark.parametrize(("state", "says"), [
    ("inactive", "is not present there"),
    ("sha256:" + "cd" * 32 + "\nactive", "is sha256:" + "cd" * 32 + " there"),
], ids=["no-image", "other-image"])
def test_another_image_keeps_the_rank_out(state, says):
    (problem,) = rejoin(reads(state=state))["spark-0"]
    assert says in problem and IMAGE_ID in problem, problem


def test_an_unverified_checkpoint_keeps_the_rank_out():
    (problem,) = rejoin(reads(stamp=absent()))["spark-0"]
    assert problem == f"the verified-stamp {CHECKPOINT['stamp_path']} does not exist"


def test_every_problem_of_a_rank_is_reported_together():
    found = rejoin(reads(state="inactive", stamp=absent()),
                   server_flag_overrides={"max-running-requests": 1})
    assert len(found["spark-0"]) == 3


def test_a_worker_outside_the_run_is_compared_with_its_own_rank():
    worker = head_args(**{"--node-rank": "1"})
    assert rejoin(reads(args=slurped(worker), rank="spark-1"), host="spark-0") == {}
    assert rejoin(reads(args=slurped(head_args()), rank="spark-1"), host="spark-0") == {
        "spark-1": ["--node-rank is installed as '0', the inventory gives '1'"]}


def test_check_mode_without_a_pulled_image_here_compares_no_image():
    expected = {"image_ref": "lmsysorg/sglang:glm-5.3-flash-arm64", "image_id": "", "args_file": ARGS_FILE}
    found = FILTER.server_rejoin_problems(reads(state="inactive"), ctx("spark-1"), MODEL, None, expected)
    assert found == {}

"""Checkpoint builds by name: the collection's table, a site's own, and what the inventory check refuses.

The table lives in roles/spark/vars/main.yml; the filter spark_checkpoint_build_errors judges a site's choice
(plugins/module_utils/checkpoint_builds.py); the server plan refuses a flag the named build cannot serve with.
"""

from __future__ import annotations

import pytest
import yaml

from tests.lib.playbook import REPO
from tests.lib.roles import filter_plugin, role_defaults, role_vars
from tests.lib.server_plan import FILTER as SERVER
from tests.lib.server_plan import MODEL, ctx

SPARK = filter_plugin("spark")
KNOWN = role_vars("spark")["spark_checkpoint_builds_known"]
SEED = "libertai-nvfp4"
ALT = {"repo_id": "SparkSite/GLM-5.3-Flash-NVFP4-alt", "revision": "b" * 40, "directory": "glm53-alt",
       "bytes": 1 << 30, "shard_count": 120, "model_type": "glm5_next"}
# The inventory check passes the checkpoint values the inventory sets, None for each it leaves to the role.
UNSET = {"checkpoint_repo_id": None, "checkpoint_revision": None, "checkpoint_shard_count": None,
         "checkpoint_model_type": None}


def errors(name, site=None, **settings):
    return SPARK.spark_checkpoint_build_errors(name, KNOWN, {} if site is None else site, {**UNSET, **settings})


def wired(build: dict) -> dict:
    """What the wiring sets for a named build (its revision only where it pins one)."""
    return {"checkpoint_repo_id": build["repo_id"], "checkpoint_shard_count": build["shard_count"],
            "checkpoint_model_type": build["model_type"], **({"checkpoint_revision": build["revision"]}
                                                             if build.get("revision") else {})}


def test_the_known_builds_are_builds_and_the_seed_build_is_what_the_roles_default_to():
    for name, entry in KNOWN.items():
        assert SPARK.spark_checkpoint_build_errors(name, KNOWN, {}, {**wired(entry), "checkpoint_revision": "a" * 40}) \
            == [], name
    seed = KNOWN[SEED]
    # Without a named build the checkpoint role's defaults fall back to the seed build's values.
    checkpoint = role_defaults("checkpoint")
    assert f"default('{seed['repo_id']}')" in checkpoint["checkpoint_repo_id"]
    assert f"default({seed['shard_count']})" in checkpoint["checkpoint_shard_count"]
    assert f"default('{seed['model_type']}')" in checkpoint["checkpoint_model_type"]
    # No named build: the site's directory and size are the seed build's, as before builds had names.
    spark = role_defaults("spark")
    assert "default('glm53')" in spark["spark_model_dir"] and seed["directory"] == "glm53"
    assert f"default({seed['bytes']})" in spark["spark_checkpoint_bytes"]
    assert role_defaults("preflight")["preflight_checkpoint_bytes"] == seed["bytes"]
    # The wiring's fallback for preflight's repository, where neither a build nor the inventory names one.
    wiring = yaml.safe_load((REPO / "playbooks" / "group_vars" / "all" / "spark.yml").read_text())
    assert f"default('{seed['repo_id']}')" in wiring["preflight_checkpoint_repo_id"]


def test_no_named_build_judges_nothing_and_a_pinned_seed_build_is_accepted():
    assert errors("") == []
    assert errors(SEED, checkpoint_revision="a" * 40) == []
    # A site pins the known build's revision in its own table; the wiring then gives it.
    assert errors(SEED, {SEED: {"revision": "c" * 40}}, checkpoint_revision="c" * 40) == []
    assert errors("alt", {"alt": ALT}, **wired(ALT)) == []


def test_a_name_no_table_knows_is_refused_with_the_names_there_are():
    [error] = errors("other", {"alt": ALT})
    assert error == ("spark_checkpoint_build='other' is not a build this site knows (the collection's: libertai-nvfp4; "
                     "the site's own: alt). Fix: name one of them, or describe the build in spark_checkpoint_site_builds.")


def test_a_known_build_without_a_pinned_revision_needs_the_site_s_pin():
    [error] = errors(SEED)
    assert error.startswith("spark_checkpoint_build='libertai-nvfp4' (LibertAIDAI/GLM-5.3-Flash-NVFP4) pins no revision")
    assert "Fix: set checkpoint_revision to the full 40-hex commit you deploy" in error


def test_an_inventory_value_that_disagrees_with_the_named_build_is_refused():
    found = errors("alt", {"alt": ALT}, **{**wired(ALT), "checkpoint_repo_id": "LibertAIDAI/GLM-5.3-Flash-NVFP4",
                                           "checkpoint_revision": "a" * 40})
    assert found == [
        "checkpoint_repo_id='LibertAIDAI/GLM-5.3-Flash-NVFP4' disagrees with spark_checkpoint_build='alt', whose "
        "repo_id is 'SparkSite/GLM-5.3-Flash-NVFP4-alt': the build names it, and the inventory's own value would win. "
        "Fix: remove checkpoint_repo_id from the inventory (or name the build that has it).",
        "checkpoint_revision='aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' disagrees with spark_checkpoint_build='alt', whose "
        "revision is 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb': the build names it, and the inventory's own value would "
        "win. Fix: remove checkpoint_revision from the inventory (or name the build that has it)."]


@pytest.mark.parametrize(("entry", "expected"), [
    ({**ALT, "revision": "main"}, "revision='main' is not the full 40-hex commit"),
    ({**ALT, "directory": "../glm53"}, "directory='../glm53' is not one directory name under spark_models_root"),
    ({**ALT, "directory": ".."}, "directory='..' is not one directory name"),
    ({**ALT, "bytes": 0}, "bytes=0 is not the checkpoint's size in bytes"),
    ({**ALT, "shard_count": "many"}, "shard_count='many' is not the number of safetensors weight shards"),
    ({**ALT, "repo_id": "glm53"}, "repo_id='glm53' is not owner/name of the hub repository"),
    ({**ALT, "refused_flags": {"enable-dp-attention": "no"}}, "refused_flags={'enable-dp-attention': 'no'} is not a "
                                                              "mapping of engine flags (--name)"),
    ({k: v for k, v in ALT.items() if k != "revision"}, "lacks revision"),
    ({**ALT, "shards": 120}, "has shards, which a build does not have"),
    ("glm53", "is str 'glm53', not a mapping"),
])
def test_a_site_build_that_is_not_one_is_refused_before_any_change(entry, expected):
    found = errors("", {"alt": entry})
    assert len(found) == 1 and expected in found[0] and "Fix:" in found[0], found
    assert found[0].startswith("spark_checkpoint_site_builds['alt']"), found


def test_a_site_entry_under_a_known_name_may_pin_its_revision_but_not_make_it_another_build():
    [error] = errors("", {SEED: {"repo_id": ALT["repo_id"], "revision": "c" * 40}})
    assert error.startswith("spark_checkpoint_site_builds['libertai-nvfp4'] changes the known build's repo_id")
    [error] = errors("", {SEED: {"revision": "c" * 7}})
    assert error.startswith("the build 'libertai-nvfp4': revision='ccccccc' is not the full 40-hex commit")
    # Not a mapping under a known name: refused, not ignored (it would leave the build's values as the table has them).
    [error] = errors(SEED, {SEED: "c" * 40}, checkpoint_revision="a" * 40)
    assert error.startswith("the build 'libertai-nvfp4' is str 'cccc") and "not a mapping" in error
    assert errors("", ["alt"]) == ["spark_checkpoint_site_builds is list, not a mapping of build names to builds. "
                                   "Fix: write it as one, or leave it out."]


def test_the_server_plan_refuses_a_flag_the_named_build_cannot_serve_with():
    refused = {"--speculative-algorithm": "this build carries no next-token heads (num_nextn_predict_layers 0)"}
    c = ctx(server_checkpoint_build="alt", server_checkpoint_refused_flags=refused, server_speculative_tile=True,
            server_flag_overrides={"speculative-algorithm": "EAGLE"})
    found = [e for e in SERVER.server_plan(c, MODEL)["errors"] if e.startswith("spark_checkpoint_build=")]
    assert found == ["spark_checkpoint_build='alt' cannot serve with --speculative-algorithm: this build carries no "
                     "next-token heads (num_nextn_predict_layers 0). Fix: remove --speculative-algorithm from "
                     "server_flag_overrides (or the profile), or name another build."]
    # The same build without the flag: nothing to refuse.
    assert not [e for e in SERVER.server_plan(ctx(server_checkpoint_build="alt", server_checkpoint_refused_flags=refused),
                                              MODEL)["errors"] if e.startswith("spark_checkpoint_build=")]

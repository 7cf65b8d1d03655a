"""Checkpoint builds by name: the collection's table (roles/spark/vars/main.yml) and a site's own, judged before
any change.

A build is a pinned choice of checkpoint: its repository, revision, size, shard count, model type, directory and
the engine flags it cannot serve with. Naming one sets the checkpoint role's values (playbooks/group_vars/all); a
value the inventory sets itself outranks that wiring, so one that disagrees with the named build is refused here
rather than silently winning.
"""

from __future__ import annotations

import re

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.checkpoint_common import REPO_ID_RE, REVISION_RE

# One path component that means nothing to a shell (the directory reaches rsync and ssh command lines).
DIRECTORY_RE = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9._+-]+$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
REQUIRED = ("repo_id", "revision", "directory", "bytes", "shard_count", "model_type")
KEYS = (*REQUIRED, "refused_flags", "notes")
# What makes a known build that build: a site may pin its revision or add notes, not change these.
IDENTITY = ("repo_id", "directory")


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0 or (
        isinstance(value, str) and value.isdigit() and int(value) > 0)


def entry_errors(name: str, entry, *, known: bool) -> list[str]:
    """What is wrong with one build's entry (the merged one for a known name a site pins)."""
    where = f"spark_checkpoint_site_builds[{name!r}]" if not known else f"the build {name!r}"
    if not isinstance(entry, dict):
        return [f"{where} is {type(entry).__name__} {entry!r}, not a mapping of {', '.join(KEYS)}. Fix: write it as "
                "one (the README's Checkpoint builds section has an example)."]
    errors = []
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        errors.append(f"{where} has {', '.join(unknown)}, which a build does not have (its keys: {', '.join(KEYS)}). "
                      "Fix: remove them or correct their spelling.")
    missing = [key for key in REQUIRED if key not in entry and not (known and key == "revision")]
    if missing:
        errors.append(f"{where} lacks {', '.join(missing)}. Fix: give every one of {', '.join(REQUIRED)}.")
    checks = (
        ("repo_id", lambda v: isinstance(v, str) and REPO_ID_RE.fullmatch(v), "owner/name of the hub repository"),
        ("revision", lambda v: isinstance(v, str) and (REVISION_RE.fullmatch(v) or (known and v == "")),
         "the full 40-hex commit (a branch or short hash can move, and the nodes could end up with different bytes)"),
        ("directory", lambda v: isinstance(v, str) and DIRECTORY_RE.fullmatch(v),
         "one directory name under spark_models_root (letters, digits and . _ + -; no slash)"),
        ("bytes", _positive_int, "the checkpoint's size in bytes, a positive whole number"),
        ("shard_count", _positive_int, "the number of safetensors weight shards, a positive whole number"),
        ("model_type", lambda v: isinstance(v, str) and v.strip() != "", "config.json's model_type"),
        ("refused_flags", lambda v: isinstance(v, dict) and all(
            isinstance(k, str) and k.startswith("--") and isinstance(r, str) and r.strip() for k, r in v.items()),
         "a mapping of engine flags (--name) to the reason the build cannot serve with each"),
        ("notes", lambda v: isinstance(v, str), "text"),
    )
    for key, ok, meaning in checks:
        if key in entry and not ok(entry[key]):
            errors.append(f"{where}: {key}={entry[key]!r} is not {meaning}. Fix: correct it.")
    return errors


def build_errors(name, known: dict, site, settings: dict) -> list[str]:
    """Every reason the named build (and the site's table) cannot be deployed, each with its fix.

    settings: the checkpoint_repo_id, checkpoint_revision, checkpoint_shard_count and checkpoint_model_type the
    inventory sets (None: not set). The checkpoint role's defaults take the named build's; an inventory's own value
    outranks them, so one that differs would silently deploy something else than the build names.
    """
    settings = {key: value for key, value in settings.items() if value is not None}
    if not isinstance(site, dict):
        return [f"spark_checkpoint_site_builds is {type(site).__name__}, not a mapping of build names to builds. "
                "Fix: write it as one, or leave it out."]
    errors = []
    # The table as the site's vars merge it (spark_checkpoint_builds): a site entry over a known one.
    builds = dict(known)
    for own, entry in site.items():
        pinned = own in known and isinstance(entry, dict)
        builds[own] = {**known[own], **entry} if pinned else entry
        if not isinstance(own, str) or not NAME_RE.fullmatch(own):
            errors.append(f"spark_checkpoint_site_builds names a build {own!r}: a name is letters, digits and . _ -. "
                          "Fix: rename it.")
            continue
        if own in known:
            changed = [key for key in IDENTITY if pinned and key in entry and entry[key] != known[own].get(key)]
            if changed:
                errors.append(
                    f"spark_checkpoint_site_builds[{own!r}] changes the known build's {', '.join(changed)}: a site may "
                    f"pin a known build's revision, but another repository or directory is another build. Fix: give it "
                    "a name of its own.")
                continue
            errors += entry_errors(own, builds[own], known=True)
        else:
            errors += entry_errors(own, entry, known=False)
    if name in ("", None):
        return errors
    if not isinstance(name, str) or name not in builds:
        names = ", ".join(sorted(known)) or "none"
        own = ", ".join(sorted(k for k in site if k not in known)) or "none"
        return [*errors, f"spark_checkpoint_build={name!r} is not a build this site knows (the collection's: {names}; "
                         f"the site's own: {own}). Fix: name one of them, or describe the build in "
                         "spark_checkpoint_site_builds."]
    build = builds[name]
    if not isinstance(build, dict) or errors:
        return errors
    wired = {"checkpoint_repo_id": build["repo_id"], "checkpoint_shard_count": build["shard_count"],
             "checkpoint_model_type": build["model_type"]}
    if build.get("revision"):
        wired["checkpoint_revision"] = build["revision"]
    for variable, value in wired.items():
        if variable in settings and str(settings[variable]) != str(value):
            errors.append(
                f"{variable}={settings[variable]!r} disagrees with spark_checkpoint_build={name!r}, whose "
                f"{variable.removeprefix('checkpoint_')} is {value!r}: the build names it, and the inventory's own "
                f"value would win. Fix: remove {variable} from the inventory (or name the build that has it).")
    if not build.get("revision") and not settings.get("checkpoint_revision"):
        errors.append(
            f"spark_checkpoint_build={name!r} ({build['repo_id']}) pins no revision in the collection's table, and "
            f"checkpoint_revision is empty. Fix: set checkpoint_revision to the full 40-hex commit you deploy, or pin "
            f"it in spark_checkpoint_site_builds: {{{name!r}: {{revision: <40 hex>}}}}.")
    return errors

"""Validation and argument rendering for the server flag model.

The data (defaults, kinds, ranges, guard rails, the model's shape, and how
messages name the engine) lives in the spark role's vars/main.yml as
``spark_flag_models``, one model per engine; ``spark_flag_model`` is the site's
engine's. This module only interprets a model, so the unit, server-args.json,
the inventory check every playbook runs first and the assert share one
computation, whichever engine it is.

Validation collects every problem instead of stopping at the first one: an
operator fixing one error per 20-minute model load would never finish.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import ipaddress
import json
import os
import posixpath
import re
from collections.abc import Mapping

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils import image_build, inputs
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.flag_models import speculative_flags

# Values end up unquoted in a systemd ExecStart line: whitespace, quotes, `$`,
# `%` (systemd specifiers), `\` and `;` would change what docker receives.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9._:/@+,=-]+$")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
FLAG_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
INT_TEXT = re.compile(r"^[+-]?[0-9]+$")
FLOAT_TEXT = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$")
DOCKER_SIZE = re.compile(r"^[0-9]+[bkmgBKMG]$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# An optional registry host (with its port) before the repository path, and an optional tag.
IMAGE_REF = re.compile(r"^([a-z0-9.-]+(:[0-9]+)?/)?[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?$")
UNIT_NAME = re.compile(r"^[A-Za-z0-9_.@-]+\.service$")
IFNAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
HCA = re.compile(r"^[A-Za-z0-9_]+(:[0-9]+)?$")

OVR = "server_flag_overrides"
PROFILE = "server_profile"
PROFILES = "server_profiles"
ACK = "server_acknowledge_backend_change"
ENGINE = "spark_engine"
# The derived flags the plan can compute, by the names the engines give them (a model naming another one is
# refused by its unit test, not here at run time).
DERIVED = frozenset({"model-path", "model", "tp-size", "tensor-parallel-size", "nnodes", "node-rank",
                     "dist-init-addr", "master-addr", "master-port", "headless", "host", "port"})


def _label(model):
    return model.get("label", "SGLang")


def _program(model):
    return model.get("program", "sglang.launch_server")


def _is_bool(value):
    return isinstance(value, bool)


def _as_float(value):
    if _is_bool(value):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and FLOAT_TEXT.match(value.strip()):
        return float(value.strip())
    return None


def _fmt_number(value):
    if isinstance(value, float):
        return repr(value).rstrip("0").rstrip(".") if "." in repr(value) else repr(value)
    return str(value)


def _index(model):
    flags = {}
    aliases = {}
    for spec in model["flags"]:
        flags[spec["name"]] = spec
        for alias in spec.get("aliases", []):
            aliases[alias] = spec["name"]
    return flags, aliases


def _vocabulary(model):
    flags, aliases = _index(model)
    return sorted(set(flags) | set(aliases) | set(model.get("known", [])) | set(model.get("secrets", {})))


def _check_override(name, value, spec, ack, errors, *, key=None):
    """Validate one override of a flag the model describes; return the normalised value.

    ``key`` is the name the override gives (an alias, e.g. a profile's SGLang name of a vLLM flag): the
    message names the setting as written and the flag it sets."""
    key = name if key is None else key
    where = f"{OVR}[{key!r}] = {inputs.shown(value)}"
    kind = spec["kind"]
    dropped = value is None or value is False
    default = spec.get("default")

    if spec.get("acknowledge") and not ack:
        changed = dropped or (kind != "switch" and str(value) != str(default)) or (kind == "switch" and value is not True)
        if changed:
            action = "drops" if dropped else "changes"
            errors.append(
                f"{where}: this {action} the load-bearing --{name} {'switch' if kind == 'switch' else inputs.shown(default)} "
                f"({spec.get('why', 'field-tested on sm_121')}); on GB10 (sm_121) the seed's backend set is load-bearing "
                f"and a change fails at start-up or misbehaves later. Fix: remove '{key}' from {OVR}, or set "
                f"{ACK}: true if you know why this change works on sm_121."
            )
            return None

    if dropped:
        if spec.get("keep") and kind == "switch":
            errors.append(
                f"{where}: drops --{name} ({' '.join(spec['keep'].split())}). Fix: remove '{key}' from {OVR} "
                "(the default sets it)."
            )
        elif spec.get("keep"):
            errors.append(
                f"{where}: drops --{name} ({' '.join(spec['keep'].split())}). Fix: give a value instead "
                f"(the seed uses {inputs.shown(default)}), or remove '{key}' from {OVR}."
            )
        return None

    refused = (spec.get("refuse") or {}).get(str(value))
    if refused is not None and not _is_bool(value):
        errors.append(f"{where}: {' '.join(refused.split())}. Fix: remove '{key}' from {OVR}.")
        return None

    if kind == "switch":
        if value is not True:
            errors.append(f"{where}: --{name} is a bare switch. Fix: use true to set it or false to drop it.")
        return True
    if kind in ("int", "float"):
        parse, wanted = (inputs.whole_number, "a whole number") if kind == "int" else (_as_float, "a number")
        article = "an integer" if kind == "int" else "a number"
        number = parse(value)
        if number is None:
            errors.append(
                f"{where}: --{name} takes {wanted}. Fix: give {article} between {spec['min']} and "
                f"{spec['max']}."
            )
            return None
        if not spec["min"] <= number <= spec["max"]:
            errors.append(
                f"{where}: --{name} must be between {spec['min']} and {spec['max']}. Fix: choose a value "
                "in that range."
            )
            return None
        return number
    # choice / string
    if _is_bool(value) or not isinstance(value, (str, int, float)):
        errors.append(
            f"{where}: --{name} takes a single word value. Fix: give a string such as {inputs.shown(default)}."
        )
        return None
    text = str(value)
    choices = spec.get("choices")
    if choices and text not in choices:
        errors.append(
            f"{where}: --{name} accepts only {', '.join(choices)}. Fix: pick one of those (the seed uses "
            f"{inputs.shown(default)})."
        )
        return None
    if not SAFE_VALUE.match(text):
        errors.append(
            f"{where}: the value contains characters that cannot go unquoted onto the unit's command "
            "line. Fix: use letters, digits and ._:/@+,=- only."
        )
        return None
    return text


def _check_extra(name, value, errors):
    """Validate an override of a flag outside the model (passed through as typed)."""
    where = f"{OVR}[{name!r}] = {inputs.shown(value)}"
    if value is None or value is False:
        return None
    if value is True:
        return True
    if isinstance(value, (int, float)):
        return _fmt_number(value)
    if isinstance(value, str) and SAFE_VALUE.match(value):
        return value
    if isinstance(value, str):
        errors.append(
            f"{where}: the value contains characters that cannot go unquoted onto the unit's command "
            "line. Fix: use letters, digits and ._:/@+,=- only."
        )
    else:
        errors.append(
            f"{where}: --{name} needs a single scalar value. Fix: give a string or number, true for a "
            "bare switch, false to drop it."
        )
    return None


def _check_overrides(model, overrides, ack, errors):
    """Return {name: value-or-None} for every flag in launch order plus extras."""
    flags, aliases = _index(model)
    secrets = model.get("secrets", {})
    known = set(model.get("known", []))
    vocabulary = _vocabulary(model)
    cutoff = float(model.get("typo_cutoff", 0.8))

    effective = {spec["name"]: spec.get("default") for spec in model["flags"] if spec["kind"] != "derived"}
    extras = {}
    program, label = _program(model), _label(model)
    # The key that set each flag: two names of one flag in one mapping leave which value is meant unknown.
    given = {}

    if overrides is None:
        overrides = {}
    if not isinstance(overrides, Mapping):
        errors.append(
            f"{OVR} = {inputs.shown(overrides)}: must be a mapping from flag name (without dashes) to value. "
            f"Fix: e.g. {OVR}: {{context-length: 32768}}."
        )
        return effective, extras

    for raw_name, value in overrides.items():
        name = str(raw_name)
        where = f"{OVR}[{name!r}] = {inputs.shown(value)}"
        if name.startswith("-"):
            errors.append(
                f"{where}: flag names are given without the leading dashes. Fix: use {name.lstrip('-')!r} "
                "as the key."
            )
            continue
        canonical = aliases.get(name, name)
        if canonical in flags and flags[canonical]["kind"] == "derived":
            errors.append(
                f"{where}: --{name} is a topology flag the role derives, never set by hand (a wrong rank, size or address "
                f"hangs or corrupts every rank). Fix: remove it from {OVR}; it comes from {flags[canonical]['from'].strip()}."
            )
            continue
        if canonical in flags:
            if canonical in given:
                errors.append(
                    f"{where}: sets --{canonical}, and so does {OVR}[{given[canonical]!r}] (two names of one "
                    f"{label} flag). Fix: keep one of the two keys."
                )
                continue
            given[canonical] = name
            effective[canonical] = _check_override(canonical, value, flags[canonical], ack, errors, key=name)
            continue
        if name in secrets:
            errors.append(
                f"{OVR}[{name!r}] = <redacted>: a secret on the command line is visible in ps, the unit file and "
                f"server-args.json. Fix: remove it from {OVR} and set {secrets[name]} (it goes to the 0600 env file)."
            )
            continue
        if name in known:
            extras[name] = _check_extra(name, value, errors)
            continue
        if not FLAG_NAME.match(name.replace("_", "-").lower()):
            errors.append(
                f"{where}: {name!r} is not a flag name. Fix: use the long option without dashes, e.g. "
                "'context-length'."
            )
            continue
        dashed = name.replace("_", "-")
        if dashed != name and dashed in vocabulary:
            errors.append(
                f"{where}: --{name} is not a {program} flag; did you mean '{dashed}'? Fix: "
                f"{label} flags use dashes, rename the key."
            )
            continue
        prefixed = [known_name for known_name in vocabulary if known_name.startswith(name)]
        if prefixed:
            errors.append(
                f"{where}: --{name} is not a {program} flag but argparse would silently take it as an "
                f"abbreviation of --{prefixed[0]}; did you mean '{prefixed[0]}'? Fix: use the full flag name."
            )
            continue
        close = difflib.get_close_matches(name, vocabulary, n=1, cutoff=cutoff)
        if close:
            errors.append(
                f"{where}: --{name} is not a {program} flag ({label} would refuse to start); "
                f"did you mean '{close[0]}'? Fix: rename the key to '{close[0]}'."
            )
            continue
        # A flag the model does not know may still exist in the per-model image.
        extras[name] = _check_extra(name, value, errors)

    return effective, extras


def _with_profile(ctx, model, ack, errors):
    """server_flag_overrides on top of the flags of the selected profile (built-in `default`: the seed)."""
    overrides = ctx.get(OVR)
    name = ctx.get(PROFILE)
    name = "default" if name in (None, "") else name
    profiles = ctx.get(PROFILES)
    profiles = {} if profiles is None else profiles
    if not isinstance(profiles, Mapping):
        errors.append(
            f"{PROFILES} = {inputs.shown(profiles)}: must be a mapping from profile name to flag overrides. Fix: e.g. "
            f"{PROFILES}: {{ctx131072-req2: {{context-length: 131072, max-running-requests: 2}}}} (playbooks/tune.yml "
            "writes such a file)."
        )
        return overrides
    if "default" in profiles:
        point = ", ".join(f"{spec['name']} {_fmt_number(spec['default'])}" for spec in model["flags"] if spec.get("capacity"))
        errors.append(
            f"{PROFILES}['default']: `default` is the built-in profile, the seed's point ({point}). Fix: give your "
            "profile another name."
        )
    if not isinstance(name, str) or (name != "default" and name not in profiles):
        errors.append(
            f"{PROFILE} = {inputs.shown(name)}: no such profile. Fix: choose one of "
            f"{', '.join(['default'] + sorted(map(str, profiles)))}, or add it to {PROFILES} (playbooks/tune.yml writes "
            "a file of them to keep in the inventory)."
        )
        return overrides
    if name == "default":
        return overrides
    flags = profiles[name]
    where = f"{PROFILES}[{name!r}]"
    if not isinstance(flags, Mapping):
        errors.append(f"{where} = {inputs.shown(flags)}: must be a mapping of flag overrides. "
                      "Fix: e.g. {context-length: 131072}.")
        return overrides
    # The profile's flags meet the same guard rails; a problem names the profile.
    found = []
    _check_overrides(model, flags, ack, found)
    errors += [message.replace(OVR, where) for message in found]
    if found or not isinstance(overrides, Mapping):
        return overrides
    # A profile names SGLang's capacity flags (the tune writes them); another engine's model takes them as
    # aliases, so one flag may be spelt differently in the profile and in the overrides.
    aliases = _index(model)[1]
    by_flag = {aliases.get(str(key), str(key)): key for key in overrides}
    merged = {}
    for flag, value in flags.items():
        key = by_flag.get(aliases.get(str(flag), str(flag)))
        if key is None:
            merged[flag] = value
        elif str(overrides[key]) != str(value):
            errors.append(
                f"{OVR}[{key!r}] = {inputs.shown(overrides[key])}, but {PROFILE} = {name!r} sets {flag} = "
                f"{inputs.shown(value)}: "
                f"two values for one flag. Fix: remove '{key}' from {OVR}, or choose another profile."
            )
    return {**merged, **overrides}


def _check_combinations(model, effective, errors):
    for spec in model["flags"]:
        name = spec["name"]
        if "require" not in spec:
            continue
        value = effective.get(name)
        if value == spec["require"]:
            continue
        messages = spec.get("messages", {})
        detail = messages.get(str(value), spec.get("why", "")).strip()
        if value is None:
            errors.append(
                f"{OVR}[{name!r}] drops --{name}: {spec['why'].strip()}. Fix: remove '{name}' from {OVR} "
                f"(the default is {spec['require']})."
            )
        else:
            errors.append(
                f"{OVR}[{name!r}] = {inputs.shown(value)}: {detail}. Fix: set '{name}' to {spec['require']!r} or remove it "
                f"from {OVR}."
            )

    # Driven by the model's attributes: a model without tilelang backends (vLLM's) never gets here.
    tilelang = [spec["name"] for spec in model["flags"]
                if spec.get("tilelang_backend") and effective.get(spec["name"]) == "tilelang"]
    for spec in model["flags"]:
        if not spec.get("bfloat16_with_tilelang") or not tilelang:
            continue
        value = effective.get(spec["name"])
        if value in ("bfloat16", "bf16"):
            continue
        shown = f"dropped ({_label(model)} then picks the dtype itself)" if value is None else f"= {inputs.shown(value)}"
        errors.append(
            f"{OVR}[{spec['name']!r}] {shown}: the tilelang DSA kernels ({', '.join('--' + n for n in tilelang)}) "
            f"need a bfloat16 KV cache on sm_121. Fix: keep kv-cache-dtype bfloat16 (remove it from {OVR})."
        )


def _check_model_dir(model_dir, errors):
    var = "server_model_dir"
    if not isinstance(model_dir, str) or not model_dir:
        errors.append(
            f"{var} = {inputs.shown(model_dir)}: must be the absolute path of the checkpoint directory on the "
            "nodes. Fix: e.g. /opt/models/glm53 (set spark_model_dir)."
        )
        return None
    if REPO_ID.match(model_dir) and not model_dir.startswith("."):
        errors.append(
            f"{var} = {inputs.shown(model_dir)}: this looks like a Hugging Face repo id, but the engine opens "
            f"os.path.join(model_path, 'processor_config.json') directly and fails with a file-missing error. "
            f"Fix: download it first (hf download {model_dir} --local-dir /opt/models/glm53) and set "
            "spark_model_dir to that absolute directory."
        )
        return None
    if not model_dir.startswith("/"):
        errors.append(
            f"{var} = {inputs.shown(model_dir)}: a relative path depends on the unit's working directory. Fix: "
            "give the absolute directory, e.g. /opt/models/glm53."
        )
        return None
    if not SAFE_PATH.match(model_dir):
        errors.append(
            f"{var} = {inputs.shown(model_dir)}: contains whitespace or shell/systemd metacharacters that would "
            "break the docker -v mount. Fix: use a path of letters, digits and ._/+- only."
        )
        return None
    normal = posixpath.normpath(model_dir)
    if model_dir != "/" and model_dir.endswith("/"):
        errors.append(
            f"{var} = {inputs.shown(model_dir)}: ends in a slash, so its last component (the served model name, and the "
            "name of the checkpoint record and stamp beside it) would be empty. Fix: drop the trailing slash, "
            f"e.g. {normal if normal != '/' else '/opt/models/glm53'} (set spark_model_dir)."
        )
        return None
    if normal != model_dir and ".." not in model_dir.split("/"):
        # The checkpoint role names its record and stamp after the path as written.
        errors.append(
            f"{var} = {inputs.shown(model_dir)}: not written in its normal form, so the roles would name the checkpoint's "
            f"record and stamp after different spellings. Fix: {normal} (set spark_model_dir)."
        )
        return None
    if normal == "/" or ".." in model_dir.split("/") or normal.count("/") < 2:
        errors.append(
            f"{var} = {inputs.shown(model_dir)}: must name the checkpoint directory itself, at least two levels deep (its "
            "record, stamp and partial files go beside it, in its parent). Fix: e.g. /opt/models/glm53."
        )
        return None
    return normal


def _check_topology(ctx, errors):
    """Return (nodes, head) from the inventory, or (None, None) when it is unusable."""
    head_group = list(ctx.get("head_group") or [])
    workers = list(ctx.get("worker_group") or [])
    head_name = ctx.get("head_group_name") or "spark_head"
    workers_name = ctx.get("worker_group_name") or "spark_workers"
    host = ctx.get("inventory_hostname")
    ok = True
    if len(head_group) != 1:
        errors.append(
            f"inventory group {head_name} = {head_group}: it must hold exactly one host (rank 0, which serves HTTP and "
            f"hosts the ranks' rendezvous). Fix: put exactly one host in {head_name} and the others in {workers_name}."
        )
        ok = False
    both = sorted(set(head_group) & set(workers))
    if both:
        errors.append(
            f"inventory groups {head_name} and {workers_name} both hold {both}: a host can hold one rank "
            "only. Fix: keep each host in one of the two groups."
        )
        ok = False
    if len(set(workers)) != len(workers):
        errors.append(
            f"inventory group {workers_name} = {workers}: lists a host twice. Fix: list each worker once."
        )
        ok = False
    nodes = head_group + [w for w in workers if w not in head_group]
    if host not in nodes:
        errors.append(
            f"inventory host {host!r} is in neither {head_name} nor {workers_name}, so it has no rank. Fix: "
            f"add it to {workers_name} or leave it out of the play."
        )
        ok = False
    fabric = ctx.get("fabric_ips") or {}
    managed = ctx.get("ansible_hosts") or {}
    managed_by = {}
    for node in nodes:
        managed_by.setdefault(str(managed.get(node, node)), []).append(node)
    owners = {}
    for node in nodes:
        ip = fabric.get(node)
        try:
            address = ipaddress.IPv4Address(str(ip))
        except ValueError:
            errors.append(
                f"hostvars[{node!r}].spark_fabric_ip = {inputs.shown(ip)}: every rank needs the IPv4 address of its "
                f"fabric link (NCCL binds to it, the head's is the ranks' rendezvous). Fix: set spark_fabric_ip for {node} "
                "in the inventory."
            )
            ok = False
            continue
        owners.setdefault(str(address), []).append(node)
        # Whose management address this is: another node's, or (below) its own.
        managed_here = managed_by.get(str(address), [])
        for other in managed_here:
            if other != node:
                errors.append(
                    f"hostvars[{node!r}].spark_fabric_ip = {address}: is the management address (ansible_host) "
                    f"of {other}, so the ranks would reach {other}'s management port for {node}. Fix: give "
                    f"{node} its own address on the ConnectX-7 link (DGX default 192.168.100.x).")
                ok = False
        if node in managed_here:
            errors.append(
                f"hostvars[{node!r}].spark_fabric_ip = {inputs.shown(ip)}: equals its ansible_host, the management address, so "
                "the ranks would rendezvous and exchange tensors over the management network (and the fabric role would "
                f"move that address onto the fabric port). Fix: give {node} its address on the direct ConnectX-7 link "
                "(DGX default 192.168.100.x) as spark_fabric_ip."
            )
            ok = False
    for address, holders in sorted(owners.items()):
        if len(holders) > 1:
            errors.append(
                f"spark_fabric_ip {address} of {holders[0]} is also the address of {', '.join(holders[1:])}: two nodes "
                "with one address answer for each other and the ranks cannot rendezvous. Fix: give every host a "
                "distinct spark_fabric_ip in the inventory."
            )
            ok = False
    if not ok:
        return None, None
    return nodes, head_group[0]


def _model_config(read):
    """config.json as a mapping: given as one, or as the result of slurping it on the node ({} when unreadable)."""
    if isinstance(read, Mapping) and "content" in read:
        try:
            read = json.loads(base64.b64decode(read["content"]))
        except (ValueError, binascii.Error, TypeError):
            return {}
    return read if isinstance(read, Mapping) else {}


def _check_shape(ctx, model, nodes, errors):
    """The group must be able to shard and hold the model: heads divisible by --tp-size, weights in memory."""
    gpus = inputs.whole_number(ctx.get("server_gpus_per_node"))
    if not nodes or gpus is None or gpus < 1:
        return
    shape = model.get("model") or {}
    tp = len(nodes) * gpus
    workers_name = ctx.get("worker_group_name") or "spark_workers"
    source = "the model's documented figures"
    heads = {"attention heads": shape.get("attention_heads"), "KV heads": shape.get("kv_heads")}
    read = _model_config(ctx.get("model_config"))
    if read.get("num_attention_heads"):
        source = "the checkpoint's config.json"
        heads = {"attention heads": read.get("num_attention_heads"),
                 "KV heads": read.get("num_key_value_heads") or read.get("num_attention_heads")}
    bad = {what: n for what, n in heads.items() if isinstance(n, int) and n % tp}
    if bad:
        counts = [n for n in heads.values() if isinstance(n, int) and n > 0]
        sizes = [str(size) for size in range(2, min(counts) // gpus + 1) if all(n % (size * gpus) == 0 for n in counts)]
        group = ctx.get("tp_group_name")
        where = f"inventory, TP group {group}" if group else "inventory"
        works = (f"{', '.join(sizes[:-1])} or {sizes[-1]}" if len(sizes) > 1 else sizes[0]) if sizes else ""
        fix = (f"give the group {works} nodes (the sizes that divide them at server_gpus_per_node {gpus}) in "
               f"{workers_name}" if works else
               f"no group of two or more nodes divides them at server_gpus_per_node {gpus}: lower server_gpus_per_node")
        errors.append(
            f"{where}: {len(nodes)} node(s) x server_gpus_per_node {gpus} gives --tp-size {tp}, which does not "
            f"divide {' and '.join(f'the {n} {what}' for what, n in bad.items())} ({source}): tensor parallelism splits "
            f"every layer's heads evenly across the ranks, and {_label(model)} refuses this split at start-up. Fix: "
            f"{fix}."
        )
    size = inputs.whole_number(ctx.get("checkpoint_bytes"))
    memory = inputs.whole_number(shape.get("gpu_memory_bytes"))
    if len(nodes) == 1 and ctx.get("acknowledge_single_node") is not True:
        fits = f"{size / 2**30:.0f} GiB" if size else "the checkpoint"
        errors.append(
            f"inventory: one node ({nodes[0]}) gives --tp-size {tp}: {fits} (spark_checkpoint_bytes) does not fit one GB10's "
            f"{(memory or 128e9) / 1e9:.0f} GB of unified memory; GLM-5.3-Flash-NVFP4 needs two DGX Sparks. Fix: add the "
            f"second node to {workers_name}, or set spark_acknowledge_single_node: true for a checkpoint that fits one node."
        )


def _check_supervision(ctx, nodes, errors):
    """The supervisor on the head reaches the workers over the fabric SSH trust; without it it could never restart them."""
    if ctx.get("server_supervised") is True and ctx.get("peer_ssh") is False and nodes and len(nodes) > 1:
        errors.append(
            "supervisor_enabled = true with fabric_ssh_trust = false: the group supervisor on the head reads and "
            "restarts the workers' ranks over the fabric SSH trust, so it would find them unreachable and hold the group "
            "stopped. Fix: keep fabric_ssh_trust true, or set supervisor_enabled: false (each rank then restarts "
            "itself, Restart=on-failure)."
        )


# Shorter keys can be guessed or brute-forced by anyone who reaches the port.
API_KEY_MIN = 32
PEM_MARKERS = {"certificate": ("-----BEGIN CERTIFICATE-----",), "key": ("-----BEGIN ", "PRIVATE KEY-----")}
SAN = re.compile(r"^(DNS:[A-Za-z0-9*][A-Za-z0-9.*-]*|IP:[0-9A-Fa-f:.]+)$")


def _check_pem(var, path, kind, errors):
    """A controller file nginx (or a client) will read: absolute, there, readable, PEM of the right kind."""
    fix = f"Fix: give the absolute controller path of a readable PEM {kind} file, or leave {var} empty"
    if not isinstance(path, str) or not path.startswith("/"):
        errors.append(f"{var} = {inputs.shown(path)}: not an absolute path on the controller (the role copies the file from "
                      f"the machine running Ansible). {fix}.")
        return
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16).decode("ascii", errors="replace")
    except FileNotFoundError:
        errors.append(f"{var} = {inputs.shown(path)}: no such file on the controller. {fix}.")
        return
    except OSError as err:
        errors.append(f"{var} = {inputs.shown(path)}: cannot be read on the controller ({err.strerror or err}). {fix}.")
        return
    if not all(marker in head for marker in PEM_MARKERS[kind]):
        errors.append(f"{var} = {inputs.shown(path)}: not a PEM {kind} (no {' ... '.join(PEM_MARKERS[kind])} line), so nginx "
                      f"would refuse to start. {fix}.")


def _check_access(ctx, model, port, dist, errors):
    """The API key and TLS settings: secure by default, and refused up front when they cannot work."""
    key = ctx.get("server_api_key")
    if isinstance(key, str) and key and not any(c in key for c in "\r\n\x00"):
        # The value is a secret: only its length is ever shown.
        if len(key) < API_KEY_MIN:
            errors.append(
                f"server_api_key = <redacted, {len(key)} characters>: shorter than {API_KEY_MIN} characters, "
                "so anyone who reaches the port could guess it. Fix: leave it empty (a 48-character key is generated "
                "on the controller beside the inventory and reused), or set at least 32 random characters "
                "(e.g. openssl rand -hex 24), vaulted."
            )
        elif any(c.isspace() for c in key):
            errors.append(
                f"server_api_key = <redacted, {len(key)} characters>: contains whitespace, which clients and the "
                "env file do not carry reliably in an Authorization header. Fix: use a key without spaces or tabs."
            )
    flags = {}
    for var in ("server_allow_unauthenticated", "server_tls"):
        value = ctx.get(var, False)
        # What Ansible's bool filter takes (-e server_tls=true arrives as a string).
        text = str(value).strip().lower()
        flags[var] = value if isinstance(value, bool) else text in ("true", "yes", "on", "1")
        if not isinstance(value, bool) and text not in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            errors.append(f"{var} = {inputs.shown(value)}: must be true or false. Fix: use a YAML boolean.")
    credentials = ctx.get("server_credentials_dir") or ""
    if not isinstance(credentials, str) or (credentials and not credentials.startswith("/")):
        errors.append(
            f"server_credentials_dir = {inputs.shown(credentials)}: the generated key and CA would land in a directory "
            "that depends on where each controller task runs. Fix: give an absolute controller path, or leave it empty "
            "for <inventory_dir>/.credentials."
        )
    if not flags["server_tls"]:
        return None
    backend = inputs.whole_number(ctx.get("server_tls_backend_port"))
    if backend is None or not 1 <= backend <= 65535:
        errors.append(
            f"server_tls_backend_port = {inputs.shown(ctx.get('server_tls_backend_port'))}: {_label(model)}'s own port "
            "behind nginx must be a TCP port number. Fix: give a whole number between 1 and 65535 (default 30001)."
        )
        backend = None
    elif backend in (port, dist):
        clash = "server_port (nginx listens there)" if backend == port else "server_dist_init_port"
        errors.append(
            f"server_tls_backend_port = {backend}: equals {clash}, and both listen on the head. Fix: choose "
            "another port (default 30001)."
        )
    cert, tls_key = ctx.get("server_tls_cert") or "", ctx.get("server_tls_key") or ""
    if bool(cert) != bool(tls_key):
        given, missing = ("server_tls_cert", "server_tls_key") if cert else \
            ("server_tls_key", "server_tls_cert")
        errors.append(
            f"{missing} = '': {given} is set, but nginx needs the certificate and its key as a pair. Fix: set "
            f"{missing} too, or leave both empty to have a CA and a certificate generated beside the inventory."
        )
    if cert:
        _check_pem("server_tls_cert", cert, "certificate", errors)
    if tls_key:
        _check_pem("server_tls_key", tls_key, "key", errors)
    if ctx.get("server_tls_ca"):
        _check_pem("server_tls_ca", ctx["server_tls_ca"], "certificate", errors)
    sans = ctx.get("server_tls_subject_alt_names")
    if sans is None:
        sans = []
    if isinstance(sans, str) or not isinstance(sans, (list, tuple)) or not all(isinstance(n, str) and SAN.match(n) for n in sans):
        errors.append(
            f"server_tls_subject_alt_names = {inputs.shown(sans)}: must be a list of DNS:name or IP:address entries. "
            "Fix: e.g. ['DNS:llm.example.org', 'IP:10.0.0.10'], or []."
        )
    return backend


def _repository_path(image):
    """An image reference's repository path: without the registry host (a first part with a dot, a port, or
    localhost) and without the tag."""
    parts = image.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    parts[-1] = parts[-1].split(":", 1)[0]
    return "/".join(parts)


def _check_image_engine(ctx, model, image, errors):
    """An image named after another engine cannot run this engine's command line."""
    if not isinstance(image, str) or not IMAGE_REF.match(image):
        return
    path = _repository_path(image)
    others = [e for e in ctx.get("spark_engines") or () if e != model.get("engine") and str(e) in path]
    if others:
        given = "server_image" if ctx.get("server_image") else f"{ENGINE}'s image"
        errors.append(
            f"server_image = {inputs.shown(image)}: its repository path names {others[0]}, another engine than "
            f"{ENGINE} = {model.get('engine')!r}, so it would not run {_program(model)} (the unit runs the "
            f"{_label(model)} command line). Fix: leave server_image empty for {_label(model)}'s {model.get('image')}, "
            f"or give an image of {_label(model)}'s, or set {ENGINE}: {others[0]} ({given} stays)."
        )


def _check_image_tag(model, image, digest, errors):
    """A moving tag lets two nodes (or two runs) pull different images."""
    if not isinstance(image, str) or not IMAGE_REF.match(image) or digest:
        return
    name = image.rsplit("/", 1)[-1]
    tag = name.split(":", 1)[1] if ":" in name else ""
    if tag in ("", "latest"):
        errors.append(
            f"server_image = {inputs.shown(image)}: {'no tag means :latest' if not tag else ':latest'}, a tag that "
            "moves, so nodes pulling at different times run different images, and the generic image lacks the "
            f"glm5_next model code. Fix: {_label(model)}'s image for this model, {model.get('image')} (leave "
            "server_image empty), or pin a digest with server_image_digest."
        )


def _check_scalars(ctx, model, errors):
    def need_int(var, low, high, why):
        value = ctx.get(var)
        number = inputs.whole_number(value)
        if number is None or not low <= number <= high:
            errors.append(
                f"{var} = {inputs.shown(value)}: {why}. Fix: give a whole number between {low} and {high}."
            )
            return None
        return number

    port = need_int("server_port", 1, 65535, "the head's HTTP port must be a TCP port number")
    dist = need_int("server_dist_init_port", 1, 65535, "the rendezvous port must be a TCP port number")
    if port is not None and port == dist:
        errors.append(
            f"server_dist_init_port = {dist}: equals server_port, and both listen on the "
            "head. Fix: choose another port for one of them."
        )
    need_int("server_gpus_per_node", 1, 8, "a DGX Spark has one GB10 GPU")
    need_int("server_readiness_timeout", 60, 86400, "the wait for the head's /v1/models is in seconds")
    need_int("server_stop_timeout", 1, 3600, "docker stop's grace period is in seconds")
    need_int("server_oom_score_adj", -1000, 1000,
             "the kernel's oom_score_adj range; the ranks' containers get it, so earlyoom and the kernel choose them last")

    for var in ("server_container_memory", "server_shm_size"):
        value = ctx.get(var)
        if not isinstance(value, str) or not DOCKER_SIZE.match(value):
            errors.append(
                f"{var} = {inputs.shown(value)}: docker expects a size such as 120g. Fix: a number followed by "
                "b, k, m or g."
            )

    # Empty (the default) is the engine's own image.
    image = ctx.get("server_image") or model.get("image")
    if not isinstance(image, str) or not IMAGE_REF.match(image):
        errors.append(
            f"server_image = {inputs.shown(image)}: not a docker image reference. Fix: e.g. "
            f"{model.get('image')}, or leave it empty for that one, {_label(model)}'s."
        )
    digest = ctx.get("server_image_digest")
    if digest and (not isinstance(digest, str) or not DIGEST.match(digest)):
        errors.append(
            f"server_image_digest = {inputs.shown(digest)}: a pin is 'sha256:' and 64 lowercase hex "
            "digits. Fix: copy the RepoDigest's sha256 part, or leave it empty."
        )
    _check_image_tag(model, image, digest, errors)
    _check_image_engine(ctx, model, image, errors)

    unit = ctx.get("spark_unit_name")
    if not isinstance(unit, str) or not UNIT_NAME.match(unit):
        errors.append(
            f"spark_unit_name = {inputs.shown(unit)}: must be a systemd service unit name. Fix: e.g. "
            "spark-llm.service."
        )

    host = ctx.get("server_host")
    try:
        ipaddress.ip_address(str(host))
    except ValueError:
        errors.append(
            f"server_host = {inputs.shown(host)}: the HTTP bind address must be an IP address. Fix: "
            "0.0.0.0, or the head's address."
        )

    ifname = ctx.get("server_fabric_interface")
    if not isinstance(ifname, str) or not IFNAME.match(ifname):
        errors.append(
            f"server_fabric_interface = {inputs.shown(ifname)}: NCCL/Gloo/TP need the fabric link's "
            "interface name. Fix: set spark_fabric_interface (e.g. enp1s0f1np1)."
        )

    hca = ctx.get("server_nccl_ib_hca")
    if hca is None:
        hca = []
    if isinstance(hca, str) or not isinstance(hca, (list, tuple)) or not all(isinstance(h, str) and HCA.match(h) for h in hca):
        errors.append(
            f"server_nccl_ib_hca = {inputs.shown(hca)}: must be a list of HCA names such as ['mlx5_0']. "
            "Fix: give a list, or [] to let NCCL choose."
        )

    gid_index = ctx.get("server_nccl_ib_gid_index")
    if gid_index not in (None, "") and not (str(gid_index).isdigit() and int(gid_index) <= 255):
        errors.append(
            f"server_nccl_ib_gid_index = {inputs.shown(gid_index)}: must be a GID table index from 0 to 255 "
            "(show_gids lists them), or empty. Fix: leave it to the fabric role, which reads the index of the RoCE v2 "
            "GID of the fabric address, or give that index."
        )

    key = ctx.get("server_api_key")
    if key is not None and (not isinstance(key, str) or any(c in key for c in "\r\n\x00")):
        # The value itself is a secret: never quote it.
        errors.append(
            "server_api_key = <redacted>: must be a single-line string (the ranks read their key file whole, and "
            "clients send it in one header line). Fix: remove line breaks from the key."
        )

    return port, dist


BOOL_TEXT = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
# What each switch does, for its refusal.
SWITCHES = {
    "server_rollback": "whether a change that fails readiness or verify goes back to the last good configuration",
    "server_uninstall_images": "whether the role's uninstall removes the images the group ran",
    "upgrade_benchmark": "whether playbooks/upgrade.yml measures the single-stream figures before and after",
    "uninstall_images": "whether playbooks/uninstall.yml removes the pulled images too",
    "uninstall_checkpoint": "whether playbooks/uninstall.yml removes the checkpoint too",
}


def _as_bool(value):
    """What Ansible's bool filter takes (-e x=true arrives as a string); None when it is no boolean."""
    if isinstance(value, bool):
        return value
    return BOOL_TEXT.get(str(value).strip().lower()) if isinstance(value, (str, int)) else None


def _check_switches(ctx, errors):
    for var, value in (ctx.get("switches") or {}).items():
        if _as_bool(value) is None:
            errors.append(f"{var} = {inputs.shown(value)}: must be true or false ({SWITCHES.get(var, 'a switch')}). "
                          "Fix: use a YAML boolean, e.g. -e " + var + "=true.")


def _check_build(ctx, nodes, errors):
    """A derived image's build context, as the controller holds it: refused before any change unless every file
    is the pinned one, the Dockerfile builds on the site's image, and the head can reach the workers to give it."""
    var, pins_var = "server_image_build_context", "server_image_build_sha256"
    context, pins = ctx.get(var), ctx.get(pins_var)
    if context in (None, ""):
        if pins:
            errors.append(f"{pins_var} = {inputs.shown(pins)}: pins without a build context. Fix: set {var} to the "
                          f"directory they pin, or remove {pins_var}.")
        return
    if not isinstance(context, str) or not context.startswith("/") or not SAFE_PATH.match(context):
        errors.append(f"{var} = {inputs.shown(context)}: must be an absolute directory on the controller. Fix: give "
                      "its absolute path (e.g. /srv/spark/builds/gb10-tile).")
        return
    if not os.path.isdir(context):
        errors.append(f"{var} = {context!r}: no such directory on the controller. Fix: create it with the Dockerfile "
                      f"and its files, or leave {var} empty to run server_image as pulled.")
        return
    if not isinstance(pins, Mapping):
        errors.append(f"{pins_var} = {inputs.shown(pins)}: must map each file of {var} to its sha256. Fix: e.g. "
                      f"{{Dockerfile: <sha256sum of it>}}.")
        return
    files, odd = image_build.context_files(context)
    if "Dockerfile" not in files:
        errors.append(f"{var} = {context!r}: holds no Dockerfile. Fix: put the build's Dockerfile at its top.")
    else:
        with open(os.path.join(context, "Dockerfile"), encoding="utf-8", errors="replace") as f:
            problem = image_build.base_problem(f.read())
        if problem:
            errors.append(f"{var} = {context!r}: its Dockerfile does not build on the site's image: {problem}.")
    problems = image_build.pin_problems(files, odd, pins)
    if problems:
        errors.append(
            f"{pins_var}: the build context {context} is not the pinned one ({'; '.join(problems)}), so nodes could "
            f"run an image nobody reviewed. Fix: review the context and pin exactly its files: "
            f"{pins_var}: {json.dumps(files, sort_keys=True)}.")
    if nodes and len(nodes) > 1 and _as_bool(ctx.get("peer_ssh")) is False:
        errors.append(
            f"{var} = {context!r}: the head gives the derived image to the workers over the fabric's SSH trust, and "
            "fabric_ssh_trust is false. Fix: set fabric_ssh_trust: true, or push the image to a registry yourself "
            "and name it in server_image.")


def _check_engine(ctx, model, errors):
    """The site's engine: one the collection has a model for, and deployed only where this version deploys it.
    False when the engine is unknown (nothing else can be judged then)."""
    engine = ctx.get(ENGINE, model.get("engine"))
    engines = [str(e) for e in ctx.get("spark_engines") or [model.get("engine")]]
    if engine not in engines:
        errors.append(
            f"{ENGINE} = {inputs.shown(engine)}: not an engine this collection has a flag model for, so no launch "
            f"arguments, image or unit could be chosen. Fix: set {ENGINE} to one of {', '.join(engines)} "
            "(the deployment facts' engine sglang, or vllm with the kernel fix of its recipe)."
        )
        return False
    # The inventory's own settings (a role default is in no host's hostvars): one group, one engine.
    others = {node: str(e) for node, e in (ctx.get("rank_engines") or {}).items() if e is not None and str(e) != engine}
    if others:
        errors.append(
            f"{ENGINE} = {engine!r} on {ctx.get('inventory_hostname')}, but "
            f"{', '.join(f'{e!r} on {node}' for node, e in sorted(others.items()))}: the ranks of one group run one "
            f"engine, and each would start another one's command line. Fix: set {ENGINE} once for the whole group "
            "(the inventory's group_vars of the group, or -e)."
        )
    render_only = _as_bool(ctx.get("server_render_only"))
    if render_only is None:
        errors.append(f"server_render_only = {inputs.shown(ctx.get('server_render_only'))}: must be true or false. "
                      "Fix: leave it to playbooks/render.yml, which sets it.")
    elif not model.get("deploys", True) and not render_only:
        errors.append(
            f"{ENGINE} = {engine!r}: this version renders {_label(model)}'s units (playbooks/render.yml) but does not "
            f"deploy them yet: {' '.join(str(model.get('render_only', '')).split())}. Fix: {ENGINE}: sglang to deploy, "
            f"or render with scripts/deploy playbooks/render.yml -i <inventory> -e {ENGINE}={engine}."
        )
    elif not render_only:
        _check_deployable(ctx, model, engine, errors)
    return True


def _check_deployable(ctx, model, engine, errors):
    """What the engine needs from a site before it can serve on GB10: refused before any change rather than
    minutes into a start."""
    label = _label(model)
    if model.get("needs_build") and not ctx.get("server_image_build_context") and not ctx.get("server_image"):
        errors.append(
            f"{ENGINE} = {engine!r} with server_image and server_image_build_context empty: "
            f"{' '.join(str(model['needs_build']).split())}. Fix: set server_image_build_context to a build context that "
            f"applies the fix from {label}'s recipe on top of {model.get('image')} (docs/changing-safely.md, a derived "
            "image), or server_image to an image of your own that carries it."
        )


def _check_metrics_served(ctx, model, flags, errors):
    """With the monitoring on, the flag that turns the engine's /metrics on or off (its model's
    monitoring.metrics_flag) must leave it serving: otherwise Prometheus scrapes an empty page and the engine's
    alerts watch nothing, so they never fire."""
    switch = (model.get("monitoring") or {}).get("metrics_flag")
    if not switch or not _as_bool(ctx.get("spark_monitoring")):
        return
    name, value = switch["name"], flags.get(switch["name"])
    if (value not in (None, False)) == bool(switch.get("serves")):
        return
    label = _label(model)
    fix = f"remove {name!r} from {OVR} and the profile" if switch.get("serves") is False else (
        f"set {OVR}[{name!r}]: true (or remove the override)")
    errors.append(
        f"{OVR}[{name!r}] = {inputs.shown(value)} with spark_monitoring = {inputs.shown(ctx.get('spark_monitoring'))}: "
        f"{label} then serves no metrics at /metrics, so the monitoring's {label} alerts (a group that stopped "
        f"generating, the time to first token, the queue) would never fire. Fix: {fix}, or set spark_monitoring: false."
    )


def _check_checkpoint_build(ctx, flags, errors):
    """A flag the named checkpoint build cannot serve with (its refused_flags), wherever the arguments got it."""
    refused = ctx.get("server_checkpoint_refused_flags") or {}
    if not isinstance(refused, dict):
        return
    given = {name: value for name, value in flags.items() if value not in (None, False)}
    for flag in sorted(refused):
        if str(flag).removeprefix("--") in given:
            errors.append(f"spark_checkpoint_build={ctx.get('server_checkpoint_build')!r} cannot serve with {flag}: "
                          f"{refused[flag]}. Fix: remove {flag} from {OVR} (or the profile), or name another build.")


def _check_speculative(ctx, model, extras, errors):
    """A speculative-decoding setting (the flag model's `speculative` section): refused before any change where it
    could not start on GB10 or would run other settings than it names."""
    spec = model.get("speculative") or {}
    flags = speculative_flags(model)
    algo_flag, settings = flags["algorithm"], flags["settings"]
    given = {name: value for name, value in extras.items() if value is not None
             and (name in (algo_flag, flags["draft"], *settings) or not spec and name.startswith("speculative"))}
    if not given:
        return
    profile = ctx.get(PROFILE) or "default"
    where = f"{PROFILES}[{profile!r}] with {OVR}" if profile != "default" else OVR
    label = _label(model)
    if not spec:
        errors.append(f"{where} sets {', '.join('--' + n for n in sorted(given))}: speculative decoding on {label} is "
                      "not modelled by this version (no guard rails, no measurement). Fix: remove those keys.")
        return
    algorithm = given.get(algo_flag)
    if algorithm is None:
        errors.append(f"{where} sets {', '.join('--' + n for n in sorted(given))} without --{algo_flag}: they shape a "
                      f"drafter that does not run. Fix: add {algo_flag} ({' or '.join(spec['algorithms'])}), or remove "
                      "them.")
        return
    algorithm = str(algorithm)
    if algorithm in spec.get("refused", {}):
        errors.append(f"{where}: --{algo_flag} {algorithm} is not offered: {spec['refused'][algorithm]}. Fix: use "
                      f"{' or '.join(spec['algorithms'])} (the model's own next-token heads draft).")
        return
    if algorithm not in spec["algorithms"]:
        errors.append(f"{where}: --{algo_flag} {algorithm!r} is not one of {', '.join(spec['algorithms'])}. Fix: "
                      f"use one of those ({label} matches the name exactly).")
        return
    if spec.get("draft_flag") in given:
        errors.append(f"{where}: --{spec['draft_flag']} {given[spec['draft_flag']]}: {algorithm} here drafts with the "
                      "model's own next-token heads; a separate drafter would need its own local directory in the "
                      "container, which this version does not mount. Fix: remove the key.")
    numbers = {}
    for name in settings:
        if name in given:
            number = inputs.whole_number(given[name], signed=False)
            if number is None or number < 1:
                errors.append(f"{where}: --{name} {given[name]}: must be a whole number of at least 1. Fix: e.g. 3.")
            else:
                numbers[name] = number
    steps_flag, topk_flag, draft_flag = settings
    steps, topk, draft = (numbers.get(n) for n in settings)
    if topk == 1 and draft is not None and steps is not None and draft != steps + 1:
        errors.append(f"{where}: --{draft_flag} {draft} with --{topk_flag} 1 and --{steps_flag} {steps}: {label} sets "
                      f"it to {steps_flag} + 1 ({steps + 1}) whenever {topk_flag} is 1, so the profile would run and be "
                      f"measured with settings other than those it names. Fix: set {draft_flag}: {steps + 1}, or raise "
                      f"{topk_flag}.")
    tile_var = spec.get("tile_variable")
    tile = _as_bool(ctx.get(tile_var)) if tile_var else True
    if tile is not True:
        errors.append(f"{where}: --{algo_flag} {algorithm} with {tile_var} = {inputs.shown(ctx.get(tile_var))}: the "
                      "drafter's verify shapes hit GB10's shared-memory limit (101376 bytes per block) like the main "
                      "kernels and need the same TileLang tile, block_I=32, num_stages=1, threads=128; without it every "
                      "rank fails at its draft cuda graph capture. Fix: build a derived image whose TileLang kernels "
                      f"use that tile for the verify shapes too (server_image_build_context) and set {tile_var}: true.")
    heads_key = spec.get("heads_key")
    config = _model_config(ctx.get("model_config"))
    if heads_key and config and not inputs.whole_number(config.get(heads_key)):
        errors.append(f"{where}: --{algo_flag} {algorithm} drafts with the model's own next-token heads, and the "
                      f"checkpoint in {ctx.get('server_model_dir')} has none (its config.json "
                      + (f"{heads_key} = {inputs.shown(config[heads_key])}" if heads_key in config
                         else f"names no {heads_key}")
                      + "). Fix: serve a build that carries them, or choose a "
                      "profile without speculative decoding.")


def server_plan(ctx, model, hostvars=None):
    """Validate everything and compute the launch arguments for one host.

    ``hostvars`` supplies each rank's spark_fabric_ip; tests may instead put a
    ``fabric_ips`` mapping into ``ctx``.

    Returns a dict with ``errors`` (list of messages, empty when valid) and,
    when valid, ``args`` (the engine's arguments in launch order: a positional
    value first, then the flags), ``rank``, ``nodes``, ``head``,
    ``container_model_dir``, ``headless`` (the rank serves no HTTP).

    ``model`` is the site's engine's flag model (spark_flag_model); an engine
    without one is refused before anything else is judged by a model that is
    not its own.
    """
    errors = []
    ctx = dict(ctx)
    if hostvars is not None:
        names = list(ctx.get("head_group") or []) + list(ctx.get("worker_group") or [])
        ctx["fabric_ips"] = {n: hostvars[n].get("spark_fabric_ip") for n in names if n in hostvars}
        ctx["ansible_hosts"] = {n: hostvars[n].get("ansible_host", n) for n in names if n in hostvars}
        ctx["rank_engines"] = {n: hostvars[n].get(ENGINE) for n in names if n in hostvars}
    if not _check_engine(ctx, model, errors):
        return {"errors": errors, "args": [], "rank": None, "nodes": [], "head": None}
    ack = ctx.get(ACK)
    if not isinstance(ack, bool):
        errors.append(f"{ACK} = {inputs.shown(ack)}: must be true or false. Fix: use a YAML boolean.")
        ack = False
    effective, extras = _check_overrides(model, _with_profile(ctx, model, ack, errors), ack, errors)
    _check_combinations(model, effective, errors)
    _check_metrics_served(ctx, model, {**extras, **effective}, errors)
    _check_speculative(ctx, model, extras, errors)
    _check_checkpoint_build(ctx, {**extras, **effective}, errors)
    model_dir = _check_model_dir(ctx.get("server_model_dir"), errors)
    nodes, head = _check_topology(ctx, errors)
    port, dist = _check_scalars(ctx, model, errors)
    _check_shape(ctx, model, nodes, errors)
    _check_supervision(ctx, nodes, errors)
    backend = _check_access(ctx, model, port, dist, errors)
    _check_switches(ctx, errors)
    _check_build(ctx, nodes, errors)

    plan = {"errors": errors, "args": [], "rank": None, "nodes": nodes or [], "head": head}
    if errors:
        return plan

    gpus = inputs.whole_number(ctx["server_gpus_per_node"])
    container_dir = posixpath.join(ctx.get("container_model_root", "/models"), posixpath.basename(model_dir))
    rank = nodes.index(ctx["inventory_hostname"])
    tp_size = len(nodes) * gpus
    head_ip = ctx["fabric_ips"][head]
    # By the names the engines give them (DERIVED): one computation, whichever model asks.
    derived = {
        "model-path": container_dir,
        "model": container_dir,
        "tp-size": tp_size,
        "tensor-parallel-size": tp_size,
        "nnodes": len(nodes),
        "node-rank": rank,
        "dist-init-addr": f"{head_ip}:{dist}",
        "master-addr": head_ip,
        "master-port": dist,
        # vLLM's ranks after the head run its engine without the API server.
        "headless": rank > 0,
        # Behind nginx (TLS) the engine listens on the head's loopback only.
        "host": "127.0.0.1" if backend else str(ctx["server_host"]),
        "port": backend or port,
    }

    positional, args = [], []

    def emit(name, value):
        if value is None or value is False:
            return
        args.append(f"--{name}")
        if value is not True:
            args.append(_fmt_number(value) if isinstance(value, (int, float)) else str(value))

    for spec in model["flags"]:
        name = spec["name"]
        if spec.get("head_only") and rank > 0:
            continue
        value = derived[name] if spec["kind"] == "derived" else effective.get(name)
        if spec.get("positional"):
            positional.append(str(value))
            continue
        emit(name, value)
    for name in sorted(extras):
        emit(name, extras[name])
    args = positional + args

    # One unit line per flag; built from `args`, never separately.
    arg_lines = []
    for token in args:
        if token.startswith("--") or not arg_lines:
            arg_lines.append(token)
        else:
            arg_lines[-1] += " " + token

    plan.update(
        args=args,
        arg_lines=arg_lines,
        rank=rank,
        container_model_dir=container_dir,
        model_dir=model_dir,
        tp_size=tp_size,
        dist_init_addr=derived["dist-init-addr"],
        headless=any(spec["name"] == "headless" for spec in model["flags"]) and rank > 0,
    )
    return plan


def _decode_slurp(result):
    """(data, None) from an ansible.builtin.slurp result holding JSON, else (None, (kind, reason))
    with kind "unread" (the slurp's message) or "json" (the decoding error)."""
    result = result or {}
    if result.get("failed") or "content" not in result:
        return None, ("unread", str(result.get("msg") or "not read").strip())
    try:
        return json.loads(base64.b64decode(result["content"]).decode("utf-8")), None
    except (binascii.Error, UnicodeDecodeError, ValueError) as err:
        return None, ("json", str(err))


def _flag_map(args):
    """``--flag value`` tokens as an ordered flag -> value mapping (True for a switch)."""
    flags = {}
    name = None
    for token in map(str, args):
        if token.startswith("--"):
            name = token
            flags[name] = True
        elif name is not None:
            flags[name] = token if flags[name] is True else f"{flags[name]} {token}"
    return flags


def _args_drift(args_result, expected_args, path):
    """How a rank's installed server-args.json differs from what the inventory renders for it.

    ``args_result`` is an ansible.builtin.slurp result of ``path``;
    ``expected_args`` the plan's ``args`` for that rank. Returns one sentence
    per differing flag, empty when the rank runs exactly what the inventory says.
    """
    installed, problem = _decode_slurp(args_result)
    if problem:
        kind, reason = problem
        if kind == "json":
            return [f"{path} is not valid JSON ({reason})"]
        return [f"{path} is missing ({reason}): the rank was never deployed by this role, or by a version that "
                "did not record its arguments"]
    if not isinstance(installed, list):
        return [f"{path} is not a JSON list of arguments"]
    have, want = _flag_map(installed), _flag_map(expected_args)

    def show(value):
        return "a switch" if value is True else inputs.shown(value)

    drift = []
    for flag, value in want.items():
        if flag not in have:
            drift.append(f"{flag} is not installed (the inventory gives {show(value)})")
        elif have[flag] != value:
            drift.append(f"{flag} is installed as {show(have[flag])}, the inventory gives {show(value)}")
    drift += [f"{flag} ({show(have[flag])}) is installed but not in the inventory" for flag in have if flag not in want]
    if not drift and [str(a) for a in installed] != [str(a) for a in expected_args]:
        drift.append("the arguments are installed in another order than the role renders them")
    return drift


def server_rejoin_problems(reads, ctx, model, hostvars, expected):
    """What keeps each rank outside a --limit run from restarting with the ranks in it.

    ``reads`` maps ``args`` and ``state`` to the looped results (one per
    outside rank, ``item`` = the rank) of slurping server-args.json and of
    printing the image ID and unit state, and ``checkpoint`` to what the
    checkpoint role's stamp entry point found on each rank ({rank:
    [problems]}, checkpoint_stamp_problems): that role owns the stamp.
    ``expected`` holds ``image_ref``, ``image_id`` (this run's) and
    ``args_file``. Returns {rank: [problems]} for the ranks that may not rejoin.
    """
    by_rank = {}
    for key in ("args", "state"):
        for result in (reads.get(key) or {}).get("results", []):
            by_rank.setdefault(result.get("item"), {})[key] = result
    checkpoint = reads.get("checkpoint") or {}
    for rank in checkpoint:
        by_rank.setdefault(rank, {})
    found = {}
    for rank, got in by_rank.items():
        plan = server_plan(dict(ctx, inventory_hostname=rank), model, hostvars)
        if plan["errors"]:
            found[rank] = plan["errors"]
            continue
        problems = _args_drift(got.get("args"), plan["args"], expected["args_file"])
        lines = str((got.get("state") or {}).get("stdout", "")).splitlines()
        image_id = next((line.strip() for line in lines if line.startswith("sha256:")), "")
        # No ID here means check mode on a node that has not pulled yet: nothing to compare.
        if expected["image_id"] and image_id != expected["image_id"]:
            problems.append(
                f"image {expected['image_ref']} is {image_id or 'not present'} there, {expected['image_id']} on the "
                "ranks of this run"
            )
        problems += list(checkpoint.get(rank) or [])
        if problems:
            found[rank] = problems
    return found


def _arg(args, flag):
    """The value after `flag` in a launch argument list, '' when absent."""
    args = [str(a) for a in args or []]
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else ""


def _served_model(args):
    """The model a launch argument list serves: SGLang's --model-path, or vLLM's positional first argument (a
    kept configuration may be another engine's than the site's now, after a switch)."""
    args = [str(a) for a in args or []]
    return _arg(args, "--model-path") or (args[0] if args and not args[0].startswith("-") else "")


def server_rollback_plan(results, enabled, head):
    """Whether the TP group goes back to its last good configuration, why not, and what it waits for then.

    ``results`` are the looped results (``item``: the rank) of the server_config module's
    ``state=read`` on every rank, ``head`` the rank that serves. A group rolls back only as one: every
    rank must keep a last good configuration of one image, and some rank must run something else
    (otherwise the failure is not a change's and going back would change nothing). The readiness probe
    then waits for the model and the address the restored head's server-args.json names (a change may
    have moved them). Returns {do, why, image, differences: {rank: [what]}, model, probe_url}.
    """
    out = {"do": False, "why": "", "image": {}, "differences": {}, "model": "", "probe_url": ""}
    if not _as_bool(enabled):
        out["why"] = "server_rollback is false: a failed change stops every rank"
        return out
    reads = {str(r.get("item")): r for r in results or []}
    failed = [rank for rank, r in reads.items() if r.get("failed")]
    if failed:
        out["why"] = (f"the last good configuration of {', '.join(failed)} could not be read ("
                      + "; ".join(str(reads[r].get("msg", "?")) for r in failed) + ")")
        return out
    kept = [rank for rank, r in reads.items() if r.get("last_good")]
    if not kept:
        out["why"] = "no rank keeps a last good configuration yet (a first deployment, or none has passed verify)"
        return out
    if len(kept) < len(reads):
        missing = [rank for rank in reads if rank not in kept]
        out["why"] = (f"{', '.join(missing)} keep{'s' if len(missing) == 1 else ''} no last good configuration "
                      "(re-provisioned since the last verified deployment?): the group can only go back as one")
        return out
    ids = sorted({reads[rank]["last_good"].get("image_id", "") for rank in kept})
    if len(ids) > 1:
        out["why"] = f"the ranks keep different last good images ({', '.join(ids)}): they would not form one group"
        return out
    out["differences"] = {rank: list(r.get("differences") or []) for rank, r in reads.items() if r.get("differs")}
    if not out["differences"]:
        out["why"] = ("every rank runs its last good configuration already: the failure is not a change's, and going "
                      "back would change nothing")
        return out
    args = (reads.get(str(head)) or {}).get("last_good_args") or []
    host, port = _arg(args, "--host"), _arg(args, "--port")
    if not host or host in ("0.0.0.0", "::"):  # noqa: S104 - a bind address read, not bound
        host = "127.0.0.1"
    out.update(do=True, image=reads[kept[0]]["last_good"], model=_served_model(args),
               probe_url=f"http://{'[' + host + ']' if ':' in host else host}:{port or 30000}/v1/models")
    return out


JOURNAL_PREFIX = re.compile(r"^\S+ \S+ (\S+\[[0-9]+\]: )?")
# Error lines of each rank that the failure quotes.
SHOWN_LINES = 4


def server_failure_cause(final, nodes, failure, error_lines, head, label="SGLang"):  # noqa: PLR0917 - a Jinja filter's arguments
    """What a failed start is failed with: the one pass's summary of every rank, then the error lines of the
    ranks that went down (the head's when every rank stayed up: a timeout), a rank whose lines repeat an
    earlier rank's named as the same.

    ``final`` maps each rank to what readiness_failed.yml read of it ({active, ended, summary, journal}),
    ``nodes`` is the rank order, ``error_lines`` a regular expression of the journal lines that name a cause,
    ``label`` the engine's name.
    """
    final = final or {}
    down = sorted((h for h in nodes if h in final and not final[h].get("active")),
                  key=lambda h: float(final[h].get("ended") or 0))
    text = (f"{label} did not come up ({' '.join(str(failure).split())}). Every rank as one pass read it before they "
            "were stopped: " + "; ".join(f"{h} {final[h].get('summary', '?')}" for h in nodes if h in final))
    if down:
        text += f"; first to end: {down[0]}"
    text += "."
    pattern = re.compile(error_lines)
    seen = {}
    for host in down or [head]:
        journal = [JOURNAL_PREFIX.sub("", line) for line in (final.get(host) or {}).get("journal") or []]
        lines = ([line for line in journal if pattern.search(line)] or journal)[-SHOWN_LINES:]
        if not lines:
            continue
        key = "\n".join(lines)
        if key in seen:
            text += f" {host}'s journal: the same as {seen[key]}'s."
            continue
        seen[key] = host
        text += f" {host}'s journal: " + " | ".join(line.rstrip(".") for line in lines) + "."
    return text


def server_doctor_lines(results):
    """The doctor's findings on the failed start, one host's lines each, a host whose findings repeat an
    earlier host's named as the same. ``results`` maps each host to its doctor_result ({findings, lines})."""
    out, seen = [], {}
    for host, result in (results or {}).items():
        ids = tuple((result or {}).get("findings") or [])
        if not ids:
            continue
        if ids in seen:
            out.append(f"{host}: the same ({', '.join(ids)}) as {seen[ids]}.")
            continue
        seen[ids] = host
        out += [" ".join(str(line).split()) for line in (result or {}).get("lines") or []]
    return out


def server_install_drift(probe, expected):
    """What the install step would change on this rank, from the one probe (library/server_state.py).

    `expected`: {"files": {kind: {"sha1", "mode"} or {"absent": true}}, "dir_mode", "owner", "group", "enabled"}
    as the install tasks would write them (absent: a file they remove). [] means every file, mode, owner and the
    boot switch are in place, so the install tasks would report no change and are skipped; anything else runs
    them all.
    """
    files = (probe or {}).get("files") or {}
    owner, group = expected.get("owner", "root"), expected.get("group", "root")
    out = []
    folder = files.get("dir") or {}
    if not folder.get("isdir") or (folder.get("mode"), folder.get("owner"), folder.get("group")) != (
            expected.get("dir_mode"), owner, group):
        out.append("configuration directory")
    for kind, want in (expected.get("files") or {}).items():
        got = files.get(kind) or {}
        if want.get("absent"):
            if got.get("exists"):
                out.append(f"{kind} present")
        elif not got.get("exists") or got.get("isdir"):
            out.append(f"{kind} missing")
        elif got.get("sha1") != want.get("sha1"):
            out.append(f"{kind} content")
        elif (got.get("mode"), got.get("owner"), got.get("group")) != (want.get("mode"), owner, group):
            out.append(f"{kind} mode or owner")
    state = ((probe or {}).get("unit") or {}).get("UnitFileState") or ""
    if state != ("enabled" if _as_bool(expected.get("enabled")) else "disabled"):
        out.append(f"start at boot ({state or 'unknown'})")
    return out


def server_restart_reasons(hosts, hostvars):
    """Per rank of `hosts` that has one, why the group must restart: a newer image pulled, a changed env
    file, API key or unit (the install step's results), a unit that is not active. {} when none has a reason."""
    out = {}
    for host in hosts or []:
        facts = hostvars[host]
        probe = facts.get("__server_probe") or {}
        reasons = ["a newer image was pulled"] if probe.get("changed") else []
        for key, what in (("__server_env_result", "env file changed"),
                          ("__server_key_result", "API key changed"),
                          ("__server_unit_result", "unit changed")):
            result = facts.get(key)
            if isinstance(result, Mapping) and result.get("changed"):
                reasons.append(what)
        active = ((probe.get("unit") or {}).get("ActiveState")) or "inactive"
        if active != "active":
            reasons.append(f"unit {active}")
        if reasons:
            out[host] = reasons
    return out


class FilterModule:
    def filters(self):
        return {
            "server_plan": server_plan,
            "server_rejoin_problems": server_rejoin_problems,
            "server_rollback_plan": server_rollback_plan,
            "server_failure_cause": server_failure_cause,
            "server_doctor_lines": server_doctor_lines,
            "server_install_drift": server_install_drift,
            "server_restart_reasons": server_restart_reasons,
        }

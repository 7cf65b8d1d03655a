"""Diagnosis of a rank as it is deployed now: its current start, its history, drift, and redaction.

The catalogue (patterns, causes, remedies) is data in the role's
vars/main.yml; this module interprets it, so the unit tests and the playbook
read the same catalogue. What it diagnoses is what the node holds: the journal
of the unit's current invocation (the start that runs now, or the last one),
the arguments and container limits of the loaded unit, the docker daemon's
record of how the container ended. Earlier starts are history, listed without
remedies; inventory values that differ from the node are drift, reported and
never used. Remedies are computed from the deployed values and the error's own
figures, and come with the inventory change that applies them.
"""

from __future__ import annotations

import base64
import json
import math
import re
import shlex
import time

from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.flag_models import capacity_flag, launch_flags

# Environment variables whose values are secrets, by name (the values are then redacted everywhere).
SECRET_ENV_NAME = re.compile(r"(?:^|_)(?:API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE)$", re.IGNORECASE)
# What secrets look like where the doctor does not know the value. Names are matched exactly as
# the tools spell them (api_key, SGLANG_API_KEY, HF_TOKEN, --api-key...): never the bare word
# "token", which diagnostic figures carry (max_total_tokens=, tokenizer_path=, KV cache tokens=).
_VALUE = r"(?!None\b|null\b)(?P<secret>[^\s'\",;)}\]]+)"
SECRET_PATTERNS = [
    # ServerArgs(api_key='x'), {"admin-api-key": "x"}, SGLANG_API_KEY=x, server_api_key: x.
    re.compile(r"(?P<keep>\b[\w-]*api[_-]key['\"]?\s*[=:]\s*['\"]?)" + _VALUE, re.IGNORECASE),
    # SGLANG_API_KEY=x, HF_TOKEN=x, HUGGING_FACE_HUB_TOKEN: x, *_SECRET, *_PASSWORD (env files, docker inspect).
    re.compile(r"(?P<keep>\b[A-Z][A-Z0-9_]*(?:API_KEY|_TOKEN|_SECRET|_PASSWORD|_PASSWD)['\"]?\s*[=:]\s*['\"]?)" + _VALUE),
    # --api-key x, --admin-api-key=x, and the JSON list of server-args.json: "--api-key", "x".
    re.compile(r"(?P<keep>--(?:admin-)?api-key(?:[ =]|['\"]\s*,\s*['\"]))(?P<secret>[^\s'\",\]]+)"),
    re.compile(r"(?P<keep>\bBearer\s+)(?P<secret>[A-Za-z0-9._~+/=-]+)", re.IGNORECASE),
    re.compile(r"(?P<keep>)(?P<secret>\bhf_[A-Za-z0-9]{16,})"),
    re.compile(r"(?P<keep>)(?P<secret>\bsk-[A-Za-z0-9_-]{16,})"),
    re.compile(r"(?P<keep>-----BEGIN [A-Z ]*PRIVATE KEY-----)(?P<secret>.*?)(?=-----END [A-Z ]*PRIVATE KEY-----)",
               re.DOTALL),
]
# Long mixed-case alphanumerics look like generated keys; hex digests and (GPU) UUIDs do not match.
TOKENISH = re.compile(r"\b(?=[A-Za-z0-9_]*[A-Z])(?=[A-Za-z0-9_]*[a-z])(?=[A-Za-z0-9_]*[0-9])[A-Za-z0-9_]{24,}\b")
# ...but CamelCase names (Glm5NextForConditionalGeneration) are code, not secrets.
IDENTIFIER = re.compile(r"^(?:[A-Z][a-z]{2,}|[a-z]{2,}|[0-9]{1,2}|_)+$")
REDACTED = "<redacted>"
# The unit's properties the doctor reads and the bundle shows, of all that `systemctl show` lists.
UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainCode", "NRestarts",
                   "ActiveEnterTimestamp", "ExecMainStartTimestamp", "ExecMainExitTimestamp", "InvocationID",
                   "FragmentPath", "ExecStart", "NeedDaemonReload")
# systemd's lines about the unit's main process and result (PID 1 logs them with the invocation's ID).
MAIN_EXIT = re.compile(r"Main process exited, code=(?P<code>\w+), status=(?P<status>\d+)(?:/(?P<name>\S+))?")
RESULT = re.compile(r"Failed with result '(?P<result>[\w-]+)'")
START_LIMIT = "Start request repeated too quickly"
# vLLM's KV cache error's own figures (vllm/v1/core/kv_cache_utils.py).
KV_FIGURES = re.compile(r"max seq len \((?P<length>\d+)\) is larger than the maximum number of tokens that can be "
                        r"stored in KV cache \((?P<tokens>\d+)\)")
# The hybrid state cache error's own figures.
HYBRID_FIGURES = re.compile(r"max_mamba_cache_size=(?P<size>\d+), mamba_ratio=(?P<ratio>\d+), "
                            r"resulting max_num_reqs=(?P<reqs>\d+)")
# docker run options that take a value (between `run` and the image).
DOCKER_VALUED = {"--name", "--gpus", "--network", "--net", "--ipc", "--shm-size", "--ulimit", "--cap-add", "--device",
                 "--memory", "-m", "--memory-swap", "--volume", "-v", "--env-file", "--env", "-e", "--runtime",
                 "--entrypoint", "--user", "-u", "--workdir", "-w", "--label", "-l", "--cpus", "--pids-limit",
                 "--restart", "--mount", "--platform", "--hostname", "-h", "--add-host", "--security-opt"}
# How much a size's suffix multiplies (docker's RAMInBytes: binary units).
SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
GIB = 1 << 30


# --- redaction --------------------------------------------------------------------------------


def redact(text, secrets=None):
    """Remove known secret values and anything shaped like a secret from text."""
    if text is None:
        return ""
    if not isinstance(text, str):
        text = json.dumps(text, indent=2, sort_keys=True, default=str)
    for secret in sorted({s for s in (secrets or []) if isinstance(s, str) and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    for pattern in SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group("keep") + REDACTED, text)
    return TOKENISH.sub(lambda m: m.group(0) if IDENTIFIER.match(m.group(0)) else REDACTED, text)


def env_secrets(env_text):
    """Values of secret-named variables in an env file, so they are redacted everywhere else too."""
    found = []
    for name, text in parse_env(env_text).items():
        value = text.strip("'\"")
        if SECRET_ENV_NAME.search(name) and len(value) >= 4 and not value.isdigit():
            found.append(value)
    return found


def parse_env(env_text):
    env = {}
    for line in (env_text or "").splitlines():
        name, sep, value = line.partition("=")
        if sep and not name.lstrip().startswith("#"):
            env[name.strip()] = value.strip()
    return env


# --- reading what the node holds ----------------------------------------------------------------


def journal_entries(json_lines):
    """journalctl -o json output -> [{t: seconds, msg: str, inv: invocation ID or ''}] (MESSAGE may be bytes)."""
    entries = []
    for line in (json_lines or "").splitlines() if isinstance(json_lines, str) else json_lines or []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        message = record.get("MESSAGE", "")
        if isinstance(message, list):
            message = bytes(b & 0xFF for b in message if isinstance(b, int)).decode("utf-8", errors="replace")
        try:
            stamp = int(record.get("__REALTIME_TIMESTAMP", 0)) / 1e6
        except (TypeError, ValueError):
            stamp = 0.0
        inv = record.get("_SYSTEMD_INVOCATION_ID") or record.get("INVOCATION_ID") or ""
        entries.append({"t": stamp, "msg": str(message), "inv": str(inv)})
    return entries


def docker_events(lines):
    """`docker events --format '{{json .}}'` lines -> [{t, action, exit_code, signal, name}]."""
    out = []
    for line in lines or []:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if not isinstance(ev, dict):
            continue
        attrs = (ev.get("Actor") or {}).get("Attributes") or {}
        try:
            stamp = int(ev.get("timeNano")) / 1e9 if ev.get("timeNano") else float(ev.get("time") or 0)
        except (TypeError, ValueError):
            stamp = 0.0
        out.append({"t": stamp, "action": str(ev.get("Action") or ev.get("status") or ""),
                    "exit_code": attrs.get("exitCode"), "signal": attrs.get("signal"), "name": attrs.get("name")})
    return out


def unit_args(exec_start, flag_model=None):
    """The engine's arguments from `systemctl show -p ExecStart` (or a plain command line), as server-args.json
    records them: from SGLang's --model-path on, or from vLLM's positional model directory on (the word before
    the first long option after the image, whatever launcher - `serve` or the key file's reader - precedes it)."""
    tokens = _exec_tokens(exec_start)
    if not _positional(flag_model):
        for start, word in enumerate(tokens):
            if word == "--model-path" or word.startswith("--model-path="):
                return tokens[start:]
        return []
    image_at = _image_index(tokens)
    if image_at is None:
        return []
    first = next((i for i in range(image_at + 1, len(tokens)) if tokens[i].startswith("--")), None)
    if first is None:
        return []
    return tokens[first - 1:] if first - 1 > image_at else tokens[first:]


def _positional(flag_model):
    """The flag given without a name, first on the command line (vLLM's model directory), or None."""
    return next((s["name"] for s in (flag_model or {}).get("flags", []) if s.get("positional")), None)


def _image_index(tokens):
    """Where the image stands in a `docker run` command line (None without one)."""
    if "run" not in tokens:
        return None
    i = tokens.index("run") + 1
    while i < len(tokens):
        name, eq, dummy = tokens[i].partition("=")
        if not tokens[i].startswith("-"):
            return i
        i += 2 if not eq and name in DOCKER_VALUED else 1
    return None


def flag_named(flag_model, name):
    """The flag model's flag called `name` or taking it as an alias (a profile names SGLang's flags), or None."""
    return next((s for s in (flag_model or {}).get("flags", [])
                 if s["name"] == name or name in (s.get("aliases") or [])), None)


def engine_terms(flag_model):
    """How the engine of `flag_model` names what the catalogue's texts speak of: its label, the variable of the
    node's fabric address, its memory share, context and concurrency flags, its rendezvous flag."""
    model = flag_model or {}
    # The memory share has no mark of its own: vLLM's takes SGLang's name as an alias.
    memory = flag_named(model, "mem-fraction-static")
    rendezvous = next((s for s in model.get("flags", []) if s.get("rendezvous")), {})
    return {"engine": model.get("engine", "sglang"), "label": model.get("label", "SGLang"),
            "host_ip_env": model.get("host_ip_env", "SGLANG_HOST_IP"),
            "memory_flag": memory["name"] if memory else "mem-fraction-static",
            "context_flag": capacity_flag(model, "context")["name"] if model else "context-length",
            "concurrency_flag": capacity_flag(model, "concurrency")["name"] if model else "max-running-requests",
            "rendezvous_flag": rendezvous.get("name", ""), "rendezvous_form": rendezvous.get("rendezvous", "")}


def catalogue_for(catalogue, engine):
    """The catalogue's entries that apply to `engine` (an entry without `engines` applies to every engine)."""
    return [e for e in catalogue or [] if engine in (e.get("engines") or [engine])]


def _exec_tokens(exec_start):
    text = exec_start or ""
    match = re.search(r"argv\[\]=(.*?) ;", text)
    line = match.group(1) if match else text
    try:
        return shlex.split(line)
    except ValueError:
        return line.split()


def docker_run_options(exec_start):
    """The container options of the unit's `docker run` (name -> last value) and the image it runs."""
    tokens = _exec_tokens(exec_start)
    if "run" not in tokens:
        return {}, ""
    opts, i = {}, tokens.index("run") + 1
    while i < len(tokens):
        word = tokens[i]
        if not word.startswith("-"):
            return opts, word
        name, eq, inline = word.partition("=")
        if eq:
            opts[name] = inline
        elif name in DOCKER_VALUED and i + 1 < len(tokens):
            opts[name] = tokens[i + 1]
            i += 1
        else:
            opts[name] = True
        i += 1
    return opts, ""


def size_bytes(text):
    """docker's sizes (120g, 512m, bytes) -> bytes; None when it is not one."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)i?b?\s*$", str(text or ""), re.IGNORECASE)
    if not match:
        return None
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2).lower()])


def _model_defaults(flag_model):
    """{flag: (kind, default)} of the flags an inventory may set (derived topology flags left out)."""
    return {s["name"]: (s.get("kind"), s.get("default")) for s in (flag_model or {}).get("flags", [])
            if s.get("kind") != "derived"}


def _typed(kind, value):
    """A deployed flag's text as the inventory would write it (an int for an int flag...)."""
    if value is True or kind == "switch":
        return value is True or str(value).lower() == "true"
    try:
        if kind == "int":
            return int(str(value))
        if kind == "float":
            return float(str(value))
    except ValueError:
        return value
    return value


def _same(kind, a, b):
    if a is None or b is None:
        return a is None and b is None
    return str(_typed(kind, a)).lower() == str(_typed(kind, b)).lower()


def deployed_values(unit, args_file_text, flag_model):
    """What the node runs: the loaded unit's flags and container limits ({} parts when not installed).

    Returns {installed, flags, overrides (the deployed flags that differ from the flag model, as the
    inventory would write them), memory, memory_bytes, image, args_file (the recorded list or None),
    hand_edited: [what the unit runs that server-args.json does not record]}.
    """
    exec_start = (unit or {}).get("ExecStart", "")
    args = unit_args(exec_start, flag_model)
    opts, image = docker_run_options(exec_start)
    flags = _named_values(args, flag_model)
    model = _model_defaults(flag_model)
    derived = {s["name"] for s in (flag_model or {}).get("flags", []) if s.get("kind") == "derived"}
    overrides = {}
    for name, (kind, default) in model.items():
        if name not in flags:
            if default not in (None, False):
                overrides[name] = False
        elif not _same(kind, flags[name], default):
            overrides[name] = _typed(kind, flags[name])
    for name, value in flags.items():
        if name not in model and name not in derived and name not in ("api-key", "admin-api-key"):
            overrides[name] = value
    try:
        recorded = json.loads(args_file_text) if args_file_text else None
    except ValueError:
        recorded = None
    hand = []
    if isinstance(recorded, list) and args:
        rec = _named_values(recorded, flag_model)
        hand = [f"--{k}" for k in flags if k not in rec or str(rec[k]) != str(flags[k])]
        hand += [f"--{k} (recorded, not in the unit)" for k in rec if k not in flags]
    memory = opts.get("--memory") or opts.get("-m") or ""
    terms = engine_terms(flag_model)
    return {
        "installed": bool(args),
        "flags": flags,
        "rendezvous": str(flags.get(terms["rendezvous_flag"]) or "") if terms["rendezvous_flag"] else "",
        "refused": refused_values(flags, flag_model),
        "overrides": overrides,
        "memory": memory if isinstance(memory, str) else "",
        "memory_bytes": size_bytes(memory) if isinstance(memory, str) else None,
        "image": image,
        "args_file": recorded if isinstance(recorded, list) else None,
        "hand_edited": hand,
    }


def _named_values(args, flag_model):
    """launch_flags, and the positional flag (vLLM's model directory) under its name."""
    values = launch_flags(args)
    positional = _positional(flag_model)
    if positional and args and not str(args[0]).startswith("--"):
        values[positional] = str(args[0])
    return values


def refused_values(flags, flag_model):
    """The deployed flags whose value the flag model refuses (a unit edited by hand, or written before a rule):
    [{flag, value, why}], the why in the flag model's own words."""
    out = []
    for spec in (flag_model or {}).get("flags", []):
        value = flags.get(spec["name"])
        if value is None or value is True:
            continue
        text = str(value)
        why = (spec.get("refuse") or {}).get(text)
        if why is None and spec.get("require") is not None and text != str(spec["require"]):
            why = (spec.get("messages") or {}).get(text) or f"{spec['require']} is required: {spec.get('why', '')}"
        if why is not None:
            out.append({"flag": spec["name"], "value": text, "why": " ".join(str(why).split())})
    return out


def drift(deployed, flag_model, inventory_overrides, inventory_memory, inventory_image):
    """Inventory values that differ from what the node runs: [{what, inventory, node}] (reported, never used)."""
    if not (deployed or {}).get("installed"):
        return []
    out = []
    model = _model_defaults(flag_model)
    planned = {name: default for name, (kind, default) in model.items() if default not in (None, False)}
    for name, value in (inventory_overrides or {}).items():
        if value in (None, False):
            planned.pop(str(name), None)
        else:
            planned[str(name)] = value
    flags = deployed["flags"]
    # Topology is derived per node and secrets never go on a command line: neither is set as a flag in the
    # inventory. Any other flag the node runs and the inventory does not set (a hand-edited --speculative-*)
    # is drift.
    unplanned = {s["name"] for s in (flag_model or {}).get("flags", []) if s.get("kind") == "derived"}
    unplanned |= set((flag_model or {}).get("secrets") or {})
    for name in list(planned) + [f for f in flags if f not in planned]:
        kind = model.get(name, ("string", None))[0]
        if name not in planned and name in unplanned:
            continue
        want, have = planned.get(name), flags.get(name)
        if not _same(kind, want, have):
            out.append({"what": f"flag {name}", "inventory": _show(want), "node": _show(have)})
    if inventory_memory and deployed.get("memory") and size_bytes(inventory_memory) != deployed.get("memory_bytes"):
        out.append({"what": "container memory (server_container_memory)", "inventory": str(inventory_memory),
                    "node": deployed["memory"]})
    if inventory_image and deployed.get("image") and inventory_image != deployed["image"]:
        out.append({"what": "image (server_image)", "inventory": inventory_image, "node": deployed["image"]})
    return out


def _show(value):
    if value is None:
        return "unset"
    if value is True:
        return "a switch"
    if value is False:
        return "dropped"
    return str(value)


# --- invocations --------------------------------------------------------------------------------


def invocations(entries, current_id=""):
    """The unit's journal split by invocation: (current, [earlier ones, most recent first]).

    Each: {id, start, end, entries, outcome}. PID 1's lines carry INVOCATION_ID, the rank's own
    lines _SYSTEMD_INVOCATION_ID; a line without either belongs to the invocation around it. The
    current one is the unit's InvocationID when the journal holds it, else the last one started
    (a unit stopped while waiting to restart forgets its InvocationID, its journal does not).
    """
    order, groups, last = [], {}, ""
    for e in sorted(entries or [], key=lambda x: x["t"]):
        inv = e.get("inv") or last
        if not inv:
            continue
        if inv not in groups:
            groups[inv] = []
            order.append(inv)
        groups[inv].append(e)
        last = inv
    runs = [_invocation(inv, groups[inv]) for inv in order]
    current = next((r for r in runs if current_id and r["id"] == current_id), runs[-1] if runs else None)
    history = [r for r in reversed(runs) if r is not current]
    return current, history


def _invocation(inv, entries):
    outcome = {"exit": None, "code": None, "result": None, "start_limit": False, "stopped": False}
    ended = None
    for e in entries:
        m = MAIN_EXIT.search(e["msg"])
        if m:
            outcome["code"], outcome["exit"] = m.group("code"), int(m.group("status"))
            ended = ended or e["t"]
        m = RESULT.search(e["msg"])
        if m:
            outcome["result"] = m.group("result")
        if START_LIMIT in e["msg"]:
            outcome["start_limit"] = True
        if e["msg"].startswith("Stopped ") or e["msg"].endswith(": Deactivated successfully."):
            outcome["stopped"] = True
    # When the main process ended, not when systemd last spoke of it (a later stop, a refused start).
    end = ended or entries[-1]["t"]
    # The rank's own last line before that: when it died. Its container's teardown before the main process (the
    # docker client) exits can take seconds on a busy node, and a peer's collective fails at the death.
    said = [e["t"] for e in entries[1:] if e["t"] <= end and not MAIN_EXIT.search(e["msg"])]
    return {"id": inv, "start": entries[0]["t"], "end": end, "last_output": said[-1] if said else end,
            "entries": entries, "outcome": outcome}


def _window(items, start, end):
    return [i for i in items or [] if start - 1 <= i["t"] <= end + 5]


def kill_cause(outcome, events, container, kernel):
    """How the current invocation's main process ended when it was killed: 'oom', 'signal' or None.

    docker run returns 137 for a container killed by SIGKILL, whether by the kernel's OOM killer or
    by someone's kill -9: the daemon's `oom` event (or State.OOMKilled of a container that is still
    there, or the kernel's OOM line) tells the two apart. A docker client killed by a signal is
    code=killed in systemd's line.
    """
    if not outcome:
        return None
    if outcome.get("code") == "killed":
        return "signal"
    if outcome.get("exit") != 137:
        return None
    if any(e["action"] == "oom" for e in events or []) or (container or {}).get("OOMKilled") is True:
        return "oom"
    if any(re.search(r"(?i)out of memory|oom-kill|killed process", k["msg"]) for k in kernel or []):
        return "oom"
    return "signal"


# --- remedies -----------------------------------------------------------------------------------


def _override_yaml(overrides):
    def show(v):
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, str):
            return json.dumps(v)
        return str(v)

    return "server_flag_overrides: {" + ", ".join(f"{k}: {show(v)}" for k, v in overrides.items()) + "}"


def _as_int(value, fallback):
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return fallback


def _as_float(value, fallback):
    try:
        return float(str(value))
    except (TypeError, ValueError):
        return fallback


def hybrid_remedy(evidence_text, flags, overrides, ctx):
    """The largest max-running-requests, then context-length, that the error's own figures allow, in one step.

    The error says the state pool holds max_mamba_cache_size slots at the deployed context-length,
    a request needs mamba_ratio of them, so it backs max_num_reqs requests. A request's state grows
    with its context, so at 1 request the pool backs context-length x slots / ratio tokens.
    Returns (changes, text, apply) with every other deployed override kept.
    """
    running = _as_int(flags.get("max-running-requests"), 0)
    context = _as_int(flags.get("context-length"), 0)
    m = HYBRID_FIGURES.search(evidence_text or "")
    if not m or not running or not context:
        return {}, ("the error's figures (max_mamba_cache_size, mamba_ratio, resulting max_num_reqs) or the deployed "
                    "max-running-requests/context-length are missing: lower max-running-requests first, then "
                    "context-length"), {}
    size, ratio, reqs = int(m.group("size")), max(1, int(m.group("ratio"))), int(m.group("reqs"))
    figures = (f"the pool holds max_mamba_cache_size={size} state slots at context-length {context}, a request needs "
               f"mamba_ratio={ratio}")
    if reqs >= 1:
        change = {"max-running-requests": min(reqs, max(1, running - 1))}
        text = (f"{figures}: {size} // {ratio} = {reqs} request(s) fit, so lower max-running-requests "
                f"{running} -> {change['max-running-requests']} and keep context-length {context}")
    else:
        tokens = context * size // ratio
        new_context = max(1024, (tokens // 1024) * 1024) if size else max(1024, (context // ratio // 1024) * 1024)
        change = {"max-running-requests": 1} if running != 1 else {}
        change["context-length"] = min(new_context, context)
        bound = (f"one request at {context} tokens needs {ratio} slots, so the pool holds {context} x {size} / {ratio}"
                 f" = {tokens} tokens of state" if size else
                 f"not one slot: less than {context} / {ratio} = {context // ratio} tokens of state (an upper bound; a "
                 "start at it that still fails prints the exact figures)")
        text = (f"{figures}: {size} // {ratio} = 0 requests fit at this context; {bound}, so "
                + (f"lower max-running-requests {running} -> 1 and " if running != 1 else "max-running-requests is 1; ")
                + f"lower context-length {context} -> {change['context-length']} (a multiple of 1024)")
    merged = {**(overrides or {}), **change}
    return change, text, {"server_flag_overrides": merged}


def kv_cache_remedy(evidence_text, flags, overrides, ctx):
    """vLLM's KV cache cannot hold --max-model-len: concurrency first, then context (the seed's remedy order).

    The cache is what --gpu-memory-utilization leaves after the weights, the profile's peak and the per-sequence
    linear-attention state, so fewer sequences leave it more tokens: halve --max-num-seqs, keeping the context,
    while more than one runs; at one sequence the error's own figure is what the cache holds, and --max-model-len
    goes down to it (a multiple of 1024). Returns (changes, text, apply) with every other deployed override kept.
    """
    concurrency = ctx.get("concurrency_flag") or "max-num-seqs"
    context_flag = ctx.get("context_flag") or "max-model-len"
    running = _as_int(flags.get(concurrency), 0)
    m = KV_FIGURES.search(evidence_text or "")
    context = int(m.group("length")) if m else _as_int(flags.get(context_flag), 0)
    if not running:
        return {}, (f"the deployed {concurrency} is unknown: lower {concurrency} first, then {context_flag}"), {}
    if running > 1:
        change = {concurrency: max(1, running // 2)}
        text = (f"{running} sequences each keep their linear-attention state in the memory the KV cache is cut from: "
                f"lower {concurrency} {running} -> {change[concurrency]} and keep {context_flag} {context or '?'}; a "
                "start that still fails prints the new figures")
    elif m and int(m.group("tokens")) >= 1024:
        tokens = int(m.group("tokens"))
        change = {context_flag: (tokens // 1024) * 1024}
        text = (f"{concurrency} is 1 and the cache holds {tokens} tokens: lower {context_flag} {context} -> "
                f"{change[context_flag]} (a multiple of 1024 at or below the error's figure)")
    else:
        return {}, (f"{concurrency} is 1 and the cache holds no full request: less memory for the weights is not "
                    f"possible here, so raise the memory share or free the GPU's memory"), {}
    merged = {**(overrides or {}), **change}
    return change, text, {"server_flag_overrides": merged}


def memory_remedy(flags, overrides, deployed, ctx):
    """OOM kill of the container: what a rank holds against the deployed --memory, with the arithmetic.

    A rank holds mem-fraction-static of the GPU's memory plus the runtime's own; the container's
    --memory caps it. Raise the cap to cover it (primary: the field-tested fraction stays), or lower
    the fraction to fit the cap (if it stays at or above the flag model's minimum).
    """
    share = ctx.get("memory_flag") or "mem-fraction-static"
    fraction = _as_float(flags.get(share), _as_float(ctx.get("default_mem_fraction"), 0.84))
    total = _as_float(ctx.get("gpu_memory_gib"), 119.7)
    overhead = _as_float(ctx.get("runtime_overhead_gib"), 4.0)
    margin = _as_float(ctx.get("memory_margin_gib"), 1.0)
    floor = _as_float(ctx.get("min_mem_fraction"), 0.5)
    cap_bytes = (deployed or {}).get("memory_bytes")
    cap = (deployed or {}).get("memory") or "no --memory"
    need = fraction * total + overhead
    text = (f"a rank holds about {share} {fraction:g} x {total:g} GiB (GB10 memory as the GPU sees it) + "
            f"{overhead:g} GiB runtime overhead = {need:.1f} GiB")
    apply, alternative = {}, {}
    if cap_bytes:
        cap_gib = cap_bytes / GIB
        text += f", above the container's --memory {cap} ({cap_gib:.1f} GiB) deployed on this node"
        raise_to = math.ceil(need + margin)
        lower = math.floor((cap_gib - overhead - margin) / total * 100) / 100
        options = []
        # GB10's memory is unified: a cap above it only hands the kill to the kernel's global OOM killer.
        if need + margin <= total:
            apply = {"server_container_memory": f"{raise_to}g"}
            options.append(f"raise server_container_memory {cap} -> {raise_to}g ({need:.1f} + {margin:g} GiB "
                           f"margin, rounded up), keeping {share} {fraction:g}")
        if lower >= floor:
            alt = {"server_flag_overrides": {**(overrides or {}), share: lower}}
            if apply:
                alternative = alt
            else:
                apply = alt
            options.append(f"or lower {share} {fraction:g} -> {lower:g} (({cap_gib:.1f} - {overhead:g} - "
                           f"{margin:g}) / {total:g}, rounded down) to fit {cap}")
        if not options:
            options.append(f"{share} cannot go below {floor:g} and the GPU has {total:g} GiB: free the "
                           "node's memory")
        text += "; " + "; ".join(options)
    else:
        text += "; the unit sets no --memory: the kernel killed it for the node's memory (free it, check swap)"
    return text, apply, alternative


def _apply_text(apply):
    if not apply:
        return ""
    parts = []
    for key, value in apply.items():
        parts.append(_override_yaml(value) if key == "server_flag_overrides" else f"{key}: {value}")
    return "; ".join(parts)


# --- findings -----------------------------------------------------------------------------------


def props(text):
    """`systemctl show -p ...` output -> dict."""
    out = {}
    for line in (text or "").splitlines():
        name, sep, value = line.partition("=")
        if sep:
            out[name] = value
    return out


def probe_problems(raw, ctx):
    """Problems the probes show without any log line: {probe name: evidence text}, empty when fine."""
    problems = deployed_problems(ctx)
    if not raw:
        return problems
    if raw.get("load_state") == "not-found":
        problems["unit_missing"] = f"{ctx.get('unit')} is not installed (LoadState=not-found)"
    if raw.get("smi_rc") not in (None, 0, "0"):
        problems["gpu"] = f"nvidia-smi exit {raw.get('smi_rc')}: {str(raw.get('smi_out', '')).strip()[:200]}"
    mtu = raw.get("mtu")
    expected = ctx.get("expected_mtu")
    flags = raw.get("link_flags") or []
    if raw.get("link_rc") not in (None, 0, "0"):
        detail = str(raw.get("link_out", "")).strip()[:200]
        problems["fabric_link"] = f"interface {ctx.get('fabric_interface')} not found: {detail}"
    elif flags and "UP" not in flags:
        problems["fabric_down"] = f"{ctx.get('fabric_interface')} is administratively down (flags {','.join(flags)})"
    elif "NO-CARRIER" in flags and not ctx.get("fabric_ports"):
        problems["fabric_carrier"] = f"{ctx.get('fabric_interface')} has no carrier (flags {','.join(flags)})"
    if raw.get("link_rc") in (None, 0, "0") and mtu and expected and str(mtu) != str(expected):
        problems["fabric_mtu"] = f"{ctx.get('fabric_interface')} MTU {mtu}, expected {expected}"
    # A ring's routes to the peers leave through either of its ports.
    ways_out = ctx.get("fabric_ports") or [ctx.get("fabric_interface")]
    bad_routes = [f"{peer} via {dev or 'no route'}" for peer, dev in (raw.get("routes") or {}).items()
                  if dev not in ways_out]
    if bad_routes:
        problems["fabric_route"] = "route to peer fabric address " + ", ".join(bad_routes) + \
            f" (expected dev {' or '.join(ways_out)})"
    env = parse_env(raw.get("env_text")) if raw.get("env_rc") in (0, "0") else None
    if env is not None:
        name = ctx.get("host_ip_env") or "SGLANG_HOST_IP"
        if env.get(name) and ctx.get("fabric_ip") and env[name] != ctx["fabric_ip"]:
            problems["env_host_ip"] = f"{name}={env[name]} but spark_fabric_ip is {ctx['fabric_ip']}"
        ifnames = {k: v for k, v in env.items()
                   if k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") and v != ctx.get("fabric_interface")}
        if ifnames:
            problems["env_ifname"] = ", ".join(f"{k}={v}" for k, v in ifnames.items()) + \
                f" but the fabric interface is {ctx.get('fabric_interface')}"
        if env.get("HF_HUB_OFFLINE") != "1":
            problems["env_offline"] = f"HF_HUB_OFFLINE={env.get('HF_HUB_OFFLINE', '<unset>')} in the env file"
    return problems


def deployed_problems(ctx):
    """What the loaded unit runs that cannot work: a rendezvous address other than the head's fabric address,
    a flag value the flag model refuses."""
    problems = {}
    deployed = ctx.get("deployed") or {}
    where, head = str(deployed.get("rendezvous") or ""), str(ctx.get("head_fabric_ip") or "")
    if where and head and head != "unset":
        host = where.rpartition(":")[0] if ctx.get("rendezvous_form") == "address_port" else where
        if host.strip("[]") != head:
            loopback = host.startswith("127.") or host in ("localhost", "::1", "[::1]")
            problems["rendezvous_address"] = (
                f"--{ctx.get('rendezvous_flag')} {where} in the unit: rank 0 (the head) listens on its fabric address "
                f"{head}" + ("; a loopback address points this rank at its own node" if loopback else ""))
    refused = deployed.get("refused") or []
    if refused:
        problems["flag_refused"] = "; ".join(f"--{r['flag']} {r['value']}: {r['why']}" for r in refused)
    return problems


# Findings of the probes (what the node is like now), as opposed to what the start itself showed.
PROBE_IDS = {"unit_missing", "gpu_unavailable", "fabric_link", "fabric_down", "fabric_carrier", "fabric_mtu",
             "fabric_route", "env_host_ip", "env_ifname", "env_offline", "rendezvous_address", "flag_refused"}
FABRIC_PROBES = ("fabric_link", "fabric_down", "fabric_carrier", "fabric_mtu", "fabric_route", "env_host_ip",
                 "env_ifname", "rendezvous_address")


def _matches(entry, entries):
    hits = []
    for pattern in entry.get("patterns", []):
        rx = re.compile(pattern)
        hits.extend(e for e in entries if rx.search(e["msg"]))
    return sorted(hits, key=lambda e: e["t"])


def _stalled(entry, entries, now, stall_seconds, active):
    stall = entry.get("stall")
    if not stall or not active or not entries:
        return None
    begin = [e for e in entries if re.search(stall["begin"], e["msg"])]
    if not begin:
        return None
    last_begin = begin[-1]
    progress = [e for e in entries if e["t"] >= last_begin["t"] and any(re.search(p, e["msg"]) for p in stall["progress"])]
    if progress or now - entries[-1]["t"] < stall_seconds:
        return None
    return last_begin


def _stamp(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) if t else "-"


# Seconds a peer's last journal line may come after this rank's failure and still be the death that took this rank
# down: docker relays a container's output to the unit's journal, which stamps a line when it gets it.
PEER_LINES_LAG = 5.0


def _peer_story(node, peers, at=0.0):
    """For a rank whose rendezvous or collective failed (at `at`, its error line): the peers not there, and why.

    A peer was there when one of its starts had begun by then and was still running, or ended
    within 2 s before (a TP group dies together: that peer died first when its last line came at most
    PEER_LINES_LAG seconds after this rank's failure; the two nodes' clocks are a second apart at most).
    Returns (absent: [text], died: [text], unknown: [host]).
    """
    current = node.get("current") or {}
    fail_at = at or current.get("end") or node.get("now") or 0
    start_at = current.get("start") or fail_at
    absent, died, unknown = [], [], []
    for peer in peers or []:
        name = f"{peer.get('host', '?')} (rank {peer.get('rank', '?')})"
        why = peer.get("why") or ""
        if peer.get("runs") is None:
            unknown.append(peer.get("host", "?"))
            continue
        # Oldest first, so that [-1] is the latest start: the peer's runs come as its doctor lists them (the current
        # one first). A start stopped just before this one began (the previous deployment, a test's previous case)
        # can end within the window too; the run that was there is the one that started last.
        runs = sorted(peer["runs"], key=lambda r: r["start"])
        there = [r for r in runs if r["start"] <= fail_at + 1 and (r.get("running") or r["end"] >= fail_at - 2)]
        if there:
            last = there[-1]
            # Judged on its last line, not its unit's end (see _invocation), and with the seconds journald may take
            # to get a rank's lines through docker's relay on a busy node: a line's time is when the journal got it.
            if not last.get("running") and last.get("failed") and \
                    last.get("last_output", last["end"]) <= fail_at + PEER_LINES_LAG:
                died.append(f"{name} ended at {_stamp(last['end'])}, as this rank failed" + (f": {why}" if why else ""))
            continue
        overlapping = [r for r in runs if r["start"] <= fail_at + 1 and r["end"] >= start_at - 1]
        if overlapping and overlapping[-1].get("failed"):
            absent.append(f"{name}: its start at {_stamp(overlapping[-1]['start'])} failed at "
                          f"{_stamp(overlapping[-1]['end'])}, before this rank gave up" + (f" ({why})" if why else ""))
        elif runs:
            absent.append(f"{name}: its rank was not running between {_stamp(start_at)} and {_stamp(fail_at)} "
                          f"(its unit is {peer.get('state', '?')} now)" + (f"; {why}" if why else ""))
        else:
            absent.append(f"{name}: its rank was never started (its unit is {peer.get('state', '?')})")
    return absent, died, unknown


def _values(ctx, flags):
    # A context without the engine's names (a caller of an earlier version) speaks of SGLang's.
    values = _Defaulting({**engine_terms(None), **(ctx or {})})
    values.update({f.replace("-", "_"): v for f, v in (flags or {}).items()})
    return values


class _Defaulting(dict):
    def __missing__(self, key):
        return "?"


def _finding(entry, values, evidence, **extra):
    return {
        "id": entry["id"],
        "title": entry["title"],
        "cause": " ".join(entry["cause"].format_map(values).split()),
        "remedy": " ".join(entry["remedy"].format_map(values).split()),
        "evidence": evidence["msg"][:400],
        "last_seen": evidence["t"],
        **extra,
    }


def _without_superseded(found, catalogue):
    """The findings less those another one supersedes (an engine's own entry names a line's cause better than an
    engine-neutral one that matches the same line)."""
    by_id = {c["id"]: c for c in catalogue or []}
    superseded = {name for f in found for name in by_id.get(f["id"], {}).get("supersedes") or []}
    return [f for f in found if f["id"] not in superseded]


def findings(node, catalogue, ctx):
    """Findings for the current invocation of one rank: [{id, title, cause, remedy, evidence, last_seen, apply}].

    node: {journal: current invocation's [{t, msg}], kernel, events (docker), container (its State or {}),
           unit: {systemctl show props}, outcome: how the current invocation ended, now, raw: probe facts,
           peers: [{host, rank, state, runs, why}] for rendezvous findings}
    ctx:  deployed flags and overrides, deployed container memory, variables and probe facts the texts name.
    """
    entries = list(node.get("journal") or [])
    kernel = list(node.get("kernel") or [])
    unit = node.get("unit") or {}
    outcome = node.get("outcome") or {}
    probes = dict(node.get("probes") or {})
    probes.update(probe_problems(node.get("raw") or {}, ctx))
    flags = ctx.get("flags") or {}
    overrides = ctx.get("overrides") or {}
    # A rank waiting to be restarted (Restart=on-failure) is "activating" but its last exit is what failed.
    active = unit.get("ActiveState") in ("active", "activating", "reloading") and unit.get("SubState") != "auto-restart"
    ended = outcome.get("exit") is not None or outcome.get("code") == "killed"
    kill = kill_cause(outcome, node.get("events"), node.get("container"), kernel)
    found = []
    for entry in catalogue:
        evidence = None
        hits = _matches(entry, entries)
        if hits:
            evidence = hits[-1]
        if evidence is None and entry.get("exit_kill") and kill == entry["exit_kill"]:
            line = next((e for e in reversed(entries) if MAIN_EXIT.search(e["msg"])), None)
            oom = next((e for e in node.get("events") or [] if e["action"] == "oom"), None)
            text = (line or {}).get("msg") or f"main process exited, status {outcome.get('exit')}"
            if kill == "oom":
                text += "; docker: container OOM-killed" + (f" at {_stamp(oom['t'])}" if oom else " (State.OOMKilled)")
            else:
                text += "; docker: not OOM-killed (no oom event, State.OOMKilled false)"
            evidence = {"t": (line or {}).get("t", 0.0), "msg": text}
        if evidence is None and entry.get("exit_status") and not active and ended and \
                outcome.get("exit") in entry["exit_status"]:
            evidence = {"t": 0.0, "msg": f"{ctx.get('unit', 'unit')}: main process exited with status {outcome['exit']}"}
        if evidence is None and entry.get("stall"):
            evidence = _stalled(entry, entries, float(node.get("now") or 0), float(ctx.get("stall_seconds", 900)), active)
        if evidence is None and entry.get("probe") and probes.get(entry["probe"]):
            evidence = {"t": 0.0, "msg": str(probes[entry["probe"]])}
        if evidence is None:
            continue
        values = _values(ctx, flags)
        values["variant"] = " ".join(
            v["text"].strip() for v in entry.get("variants", [])
            if any(re.search(p, e["msg"]) for e in entries for p in v.get("when_any", []))
            or any(flags.get(f) for f in v.get("when_flag", []))
            or any(probes.get(p) for p in v.get("when_probe", []))
            or (v.get("when_no_probe") and not any(probes.get(p) for p in v["when_no_probe"])))
        if entry.get("evidence_value"):
            m = re.search(entry["evidence_value"], evidence["msg"])
            values["evidence_value"] = m.group(1) if m else "?"
        extra = {"apply": {}}
        suggest = entry.get("suggest")
        if suggest == "hybrid_from_figures":
            change, text, apply = hybrid_remedy(evidence["msg"], flags, overrides, ctx)
            values["next_step"] = text + (f"; apply with: {_apply_text(apply)}" if apply else "")
            extra.update(apply=apply, override=change)
        elif suggest == "kv_cache_from_figures":
            change, text, apply = kv_cache_remedy(evidence["msg"], flags, overrides, ctx)
            values["next_step"] = text + (f"; apply with: {_apply_text(apply)}" if apply else "")
            extra.update(apply=apply, override=change)
        elif suggest == "memory_from_figures":
            text, apply, alternative = memory_remedy(flags, overrides, ctx.get("deployed"), ctx)
            values["next_step"] = text + (f"; apply with: {_apply_text(apply)}" if apply else "")
            values["alternative"] = f" (or: {_apply_text(alternative)})" if alternative else ""
            extra.update(apply=apply, alternative=alternative)
        if entry.get("peer"):
            absent, died, unknown = _peer_story(node, node.get("peers"), evidence.get("t") or 0.0)
            own_fabric = [probes[p] for p in FABRIC_PROBES if probes.get(p)]
            values["peers"] = ("; ".join(absent + died) if absent or died
                               else "the state of " + ", ".join(unknown) + " is unknown (outside this run)" if unknown
                               else "every peer's rank was running then")
            values["own_fabric"] = "; ".join(own_fabric) or "none on this node (link, MTU, route, env file)"
            values["rank_error"] = evidence["msg"][:200]
            values["peer_rendezvous"] = "; ".join(
                f"{p.get('host', '?')} (rank {p.get('rank', '?')}) joins at {p.get('rendezvous') or 'unknown'}"
                for p in node.get("peers") or [] if p.get("runs") is not None) or "unknown"
            if (absent or died) and not own_fabric:
                target = "peer_absent" if absent else "peer_exited"
                found.append(_finding(next(c for c in catalogue if c["id"] == target), values, evidence, apply={}))
                continue
        found.append(_finding(entry, values, evidence, **extra))
    if ended and _failed(outcome) and not any(f["id"] not in PROBE_IDS for f in found):
        generic = next((c for c in catalogue if c["id"] == "exit_unknown"), None)
        line = next((e for e in reversed(entries) if MAIN_EXIT.search(e["msg"])), None)
        if generic is not None:
            values = _values(ctx, flags)
            values["exit"] = outcome.get("exit") if outcome.get("exit") is not None else "?"
            found.append(_finding(generic, values, line or {"t": 0.0, "msg": f"exit {values['exit']}"}, apply={}))
    found = _without_superseded(found, catalogue)
    found.sort(key=lambda f: f["last_seen"], reverse=True)
    unique = {}
    for f in found:
        unique.setdefault(f["id"], f)
    return list(unique.values())


def history(runs, catalogue, events, kernel, limit=10):
    """Earlier starts of the rank, most recent first: what ended each one (catalogue titles), no remedies."""
    out = []
    for run in (runs or [])[:limit]:
        evs = _window(events, run["start"], run["end"])
        kern = _window(kernel, run["start"], run["end"])
        kill = kill_cause(run["outcome"], evs, None, kern)
        seen = []
        for entry in catalogue:
            if entry.get("probe") or entry.get("stall"):
                continue
            hits = _matches(entry, run["entries"])
            if hits:
                seen.append({"id": entry["id"], "title": entry["title"], "evidence": hits[-1]["msg"][:300]})
            elif entry.get("exit_kill") and entry["exit_kill"] == kill:
                seen.append({"id": entry["id"], "title": entry["title"],
                             "evidence": f"exit {run['outcome'].get('exit')}, {kill}"})
        seen = _without_superseded(seen, catalogue)
        o = run["outcome"]
        failed = _failed(o)
        how = ("refused: start limit" if o["start_limit"] else
               "stopped" if not failed and (o["stopped"] or o["exit"] in (0, 143)) else
               f"exit {o['exit']}" + (f" ({o['result']})" if o["result"] else "") if o["exit"] is not None else
               f"failed ({o['result']})" if failed else "ended")
        out.append({"invocation": run["id"], "started": _stamp(run["start"]), "ended": _stamp(run["end"]),
                    "how": how, "failed": failed, "findings": seen})
    return out


# --- the node's evidence --------------------------------------------------------------------------


def sections(text):
    """Output split at '--- name' markers -> {name: [lines]}."""
    out = {}
    current = None
    for line in (text or "").splitlines():
        if line.startswith("--- "):
            current = line[4:].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return out


def _rc(result):
    return (result or {}).get("rc")


def _slurped(result):
    """A slurp result's text, or None when the file could not be read."""
    content = (result or {}).get("content")
    return base64.b64decode(content).decode("utf-8", errors="replace") if content is not None else None


def evidence(results, fabric_interface="", flag_model=None):
    """Registered probe results of one node -> {node, facts, deployed, runs, history_runs}.

    unit: systemd_service's result (its status: `systemctl show`); logs: the unit's journal, the
    kernel's OOM lines, docker's events and the container's state, in '--- name' sections; env,
    args and record: slurp results; the others: command results.
    """
    status = (results.get("unit") or {}).get("status") or {}
    unit = {k: str(status[k]) for k in UNIT_PROPERTIES if k in status}
    logs = sections((results.get("journal") or {}).get("stdout", ""))
    host = sections((results.get("host") or {}).get("stdout", ""))
    smi = results.get("smi") or {}
    smi_parts = sections("--- gpu\n" + smi.get("stdout", ""))
    link = results.get("link") or {}
    mtu, link_flags, operstate = None, [], None
    try:
        first = json.loads(link.get("stdout") or "[]")[0]
        mtu, link_flags, operstate = first.get("mtu"), list(first.get("flags") or []), first.get("operstate")
    except (ValueError, IndexError, AttributeError):
        pass
    routes = {}
    for item in (results.get("routes") or {}).get("results", []):
        if item.get("skipped"):
            continue
        try:
            dev = json.loads(item.get("stdout") or "[]")[0].get("dev")
        except (ValueError, IndexError, AttributeError):
            dev = None
        routes[str((item.get("cmd") or ["?"])[-1])] = dev
    meminfo = {}
    for line in host.get("meminfo", []):
        name, dummy, value = line.partition(":")
        meminfo[name] = _as_int(value.strip().split(" ")[0], 0) * 1024
    checkpoint = {line.split(" ", 1)[1]: line.split(" ", 1)[0] for line in host.get("checkpoint", []) if " " in line}
    try:
        record = json.loads(_slurped(results.get("record")) or "{}")
    except ValueError:
        record = {}
    revision = (record.get("revision") if isinstance(record, dict) else None) or "unknown"
    env_text = _slurped(results.get("env"))
    args_text = _slurped(results.get("args"))
    image = (results.get("image") or {})
    now = _as_int("".join(logs.get("now", []) or host.get("now", [])).strip(), 0)
    entries = journal_entries(logs.get("journal", []))
    current, earlier = invocations(entries, unit.get("InvocationID", ""))
    kernel = journal_entries(logs.get("kernel", []))
    events = docker_events(logs.get("events", []))
    try:
        container = json.loads("\n".join(logs.get("container", [])) or "{}")
    except ValueError:
        container = {}
    active = unit.get("ActiveState") in ("active", "activating", "reloading") and unit.get("SubState") != "auto-restart"
    window = (current["start"], current["end"] if not active else float(now or current["end"])) if current else (0, 0)
    raw = {
        "load_state": unit.get("LoadState"),
        "smi_rc": _rc(smi),
        "smi_out": smi.get("stdout", "") + smi.get("stderr", "") + smi.get("msg", ""),
        "link_rc": _rc(link),
        "link_out": link.get("stderr", "") or link.get("msg", ""),
        "link_flags": link_flags,
        "mtu": mtu,
        "routes": routes,
        "env_rc": 0 if env_text is not None else 1,
        "env_text": env_text or "",
    }
    deployed = deployed_values(unit, args_text, flag_model)
    facts = {
        "unit": {k: unit.get(k, "") for k in (
            "LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus", "NRestarts", "ActiveEnterTimestamp",
            "FragmentPath", "InvocationID")},
        "gpu": smi_parts.get("gpu", []) if _rc(smi) == 0 else [raw["smi_out"].strip()[:300]],
        "gpu_processes": smi_parts.get("compute apps", []),
        "memory_bytes": meminfo,
        "disk": host.get("df", []),
        "checkpoint": checkpoint,
        "checkpoint_revision": revision,
        "fabric": {"interface": fabric_interface, "mtu": mtu, "flags": link_flags, "operstate": operstate,
                   "routes": routes},
        "image": image.get("stdout", "").strip() if _rc(image) == 0 else "",
        "env_file": "present" if env_text is not None else "missing",
        "route": ", ".join(f"{ip} via {dev or 'no route'}" for ip, dev in routes.items()) or "no peer",
        "checkpoint_state": next((v for k, v in checkpoint.items() if k.endswith(".verified")), "missing"),
        "now": now,
        "current_start": _stamp(current["start"]) if current else "-",
        "current_invocation": current["id"] if current else "",
        # Boots whose journal the node keeps (journalctl reads them all): with a persistent journal (the
        # monitoring role's) the earlier starts include the previous boot's; a volatile one keeps only this boot.
        "journal_boots": len([line for line in logs.get("boots", []) if line.strip()]),
    }
    node = {
        "journal": current["entries"] if current else [],
        "kernel": _window(kernel, *window) if current else [],
        "events": _window(events, *window) if current else [],
        "container": container.get("State", container) if isinstance(container, dict) else {},
        "unit": unit,
        "outcome": current["outcome"] if current else {},
        "current": {k: current[k] for k in ("id", "start", "end")} if current else {},
        "now": now,
        "raw": raw,
    }
    runs = [{"id": r["id"], "start": r["start"], "end": r["end"], "last_output": r["last_output"],
             "failed": _failed(r["outcome"]), "running": r is current and active}
            for r in ([current] if current else []) + earlier]
    return {"node": node, "facts": facts, "deployed": deployed, "args": deployed["args_file"] or [],
            "runs": runs, "earlier": earlier, "all_events": events, "all_kernel": kernel}


def _failed(outcome):
    return bool(outcome.get("start_limit") or outcome.get("code") == "killed"
                or (outcome.get("exit") is not None and outcome.get("exit") not in (0, 143))
                or outcome.get("result") not in (None, "success"))


def peer_summary(ev, host, rank, own_findings):
    """What another rank's diagnosis needs to know of this one: its starts and why its current one failed."""
    # The cause first: the start limit only says that a cause repeated.
    ranked = sorted(own_findings or [], key=lambda f: f["id"] == "start_limit")
    titles = [f"{f['title']}: {f['evidence'][:160].rstrip('.')}" for f in ranked
              if f["id"] not in ("fabric_mtu", "fabric_route", "env_offline", "gpu_unavailable")]
    state = ev["facts"]["unit"]
    return {"host": host, "rank": rank, "runs": ev["runs"], "why": titles[0] if titles else "",
            "rendezvous": (ev.get("deployed") or {}).get("rendezvous") or "",
            "state": f"{state.get('ActiveState') or '?'}/{state.get('SubState') or '?'}"}


def peer_summaries(peers, hostvars, nodes):
    """peer_summary of each of `peers` from its own facts (its evidence and its own findings); a peer outside
    the run (--limit) is unknown, not absent."""
    out = []
    for host in peers:
        facts = hostvars[host] if host in hostvars else {}
        ev, own = facts.get("__doctor_evidence"), facts.get("__doctor_own")
        if ev is None or own is None:
            out.append({"host": "?", "runs": None})
        else:
            out.append(peer_summary(ev, host, nodes.index(host) if host in nodes else "?", own))
    return out


def bundle_files(ev, host, unit_file, env_text, found, current, secrets=None, extra=None):  # noqa: PLR0917 - a Jinja filter's arguments
    """The bundle's files of one node, every one redacted: [{path, content}]."""
    extra = extra or {}

    def lines(entries):
        return "\n".join(f"{_stamp(e['t'])} {e['msg']}" for e in entries)

    earlier = ev.get("earlier") or []
    files = {
        "journal.log": lines(ev["node"]["journal"]),
        "journal-history.log": "\n\n".join(f"--- invocation {r['id']} ({_stamp(r['start'])} - {_stamp(r['end'])})\n"
                                           + lines(r["entries"]) for r in earlier),
        "kernel-oom.log": lines(ev.get("all_kernel") or []),
        "docker-events.log": "\n".join(json.dumps(e, sort_keys=True) for e in ev.get("all_events") or []),
        "unit.service": unit_file or "(unit not installed)",
        "unit.env": env_text or "(env file not found)",
        "server-args.json": extra.get("args_text") or "(server-args.json not found)",
        "flags.json": json.dumps(current, indent=2, sort_keys=True, default=str),
        "facts.json": json.dumps({"unit": ev["node"]["unit"], **ev["facts"]}, indent=2, sort_keys=True, default=str),
        "findings.json": json.dumps(found, indent=2, default=str),
        "history.json": json.dumps(extra.get("history") or [], indent=2, default=str),
        "drift.json": json.dumps(extra.get("drift") or [], indent=2, default=str),
    }
    return [{"path": f"{host}/{name}", "content": redact(content, secrets) + "\n"} for name, content in files.items()]


def supervisor_reads(result):
    """The supervisor's state.json and gave-up.json reads -> {results: [state, gave-up]}, each a dict with
    `content` (base64) when the file was read: from the head's probe, or a looped slurp on the head."""
    by_item = {r.get("item"): r for r in (result or {}).get("results") or [] if isinstance(r, dict)}
    return {"results": [by_item.get("state.json") or {}, by_item.get("gave-up.json") or {}]}


def report_lines(host, items, secrets=None, past=None, drifted=None):
    lines = [f"{host}: no current finding (the current start shows no known failure)"] if not items else []
    for item in items or []:
        lines += [
            f"{host}: {item['title']}",
            f"  seen:   {redact(item['evidence'], secrets)}",
            f"  cause:  {item['cause']}",
            f"  remedy: {item['remedy']}",
        ]
    failed_before = [h for h in past or [] if h.get("failed") or h.get("findings")]
    if failed_before:
        lines.append(f"{host} history (earlier starts, already over; no remedy):")
        for h in failed_before:
            what = "; ".join(f["title"] for f in h.get("findings") or []) or "no known fingerprint"
            lines.append(f"  {h['started']} - {h['ended']}: {h['how']}: {what}")
    if drifted:
        lines.append(f"{host} drift (the inventory differs from the node; the diagnosis uses the node's values):")
        lines += [f"  {d['what']}: inventory {d['inventory']}, node {d['node']}" for d in drifted]
    return lines


def report_text(host, hostvars, secrets=None):
    """report_lines of a host of the play, as the text of the bundle's summary."""
    facts = hostvars[host]
    lines = report_lines(host, facts.get("__doctor_findings"), secrets, facts.get("__doctor_history"),
                         facts.get("__doctor_drift"))
    return "\n".join(lines) + "\n"


class FilterModule:
    def filters(self):
        return {
            "doctor_findings": findings,
            "doctor_history": history,
            "doctor_redact": redact,
            "doctor_env_secrets": env_secrets,
            "doctor_parse_env": parse_env,
            "doctor_journal": journal_entries,
            "doctor_unit_args": unit_args,
            "doctor_deployed": deployed_values,
            "doctor_drift": drift,
            "doctor_report_lines": report_lines,
            "doctor_report_text": report_text,
            "doctor_props": props,
            "doctor_evidence": evidence,
            "doctor_peer_summary": peer_summary,
            "doctor_peer_summaries": peer_summaries,
            "doctor_bundle_files": bundle_files,
            "doctor_supervisor_reads": supervisor_reads,
            "doctor_engine_terms": engine_terms,
            "doctor_catalogue": catalogue_for,
        }

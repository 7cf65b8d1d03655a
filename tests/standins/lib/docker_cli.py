"""Test stand-in for the docker CLI on a DGX Spark node, installed by the harness (run as /usr/bin/docker:
tests/standins/bin/docker imports this module and calls main).

There is no container engine in the simulated nodes: this answers the commands
the roles and the server unit use, with the real CLI's output shapes and failure
messages, and runs "containers" as plain child processes. For the SGLang image,
`python3 -m sglang.launch_server ARGS` (or the keyed `python3 -c ...` launcher)
runs the stand-in server /usr/lib/spark-sim/sglang_server.py; for the vLLM image
(ENTRYPOINT `vllm serve`), `IMAGE MODEL_DIR ARGS`, `--entrypoint vllm IMAGE serve ...`
or a `python3 -c` launcher running vllm.entrypoints.cli.main runs
/usr/lib/spark-sim/vllm_server.py. Container paths of -v mounts are translated to
host paths (no mount namespace here).

`--memory` is the container's memory cgroup: the stand-in SGLang server charges
what it holds to it, and over the limit it is killed like the kernel's OOM killer
does (docker run exits 137, `docker inspect` shows State.OOMKilled true).

`docker build` reads a context's Dockerfile as far as the stand-in can act on it: FROM (with ARG and
--build-arg), COPY/ADD sources (a missing one fails like BuildKit), LABEL; the image's ID follows from its base,
its context's files and its build arguments and labels, so one build gives one ID wherever it runs. A label
`org.spark-sim.sglang='{...}'` stands for what the build's own steps change (a GB10 tile, say): the SGLang
stand-in's knobs of the new image, over its base's. `docker save` writes a tar stream (manifest.json and each
image's record) that `docker load` on another node turns back into the same image, ID and tags.

The daemon's events (`docker events`): create, start, kill, oom, die, stop and
destroy of each container, kept like dockerd keeps them, in memory (a file under
/run: gone with a reboot), the last 256.

Knobs: section "docker" of /etc/spark-sim/node.json:
  running       (true)   false: the daemon is unreachable
  architecture  ("arm64") architecture recorded for pulled images
  image_id      (null)   force this image ID (e.g. to make nodes disagree)
  nvidia_runtime (true)  false: no nvidia runtime, `--gpus` fails
  registry      ({})     what the registry serves under a reference: {"repo:tag": {"sglang": {...}}}, the
                         SGLang stand-in's knobs that image's build carries (its TileLang tile, say), or
                         {"repo:tag": {"vllm": {...}}}: a vLLM image (whatever its name) and its build's
                         knobs for the vLLM stand-in (its sparse-MLA kernels for sm_121, say)
Section "gpu", key "present" (false) makes `--gpus` fail like a missing driver.
SPARK_SIM_ROOT (tests on a workstation) prefixes /etc, /var/lib, /usr/lib and /dev paths.
"""

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.environ.get("SPARK_SIM_ROOT", "")
KNOBS = ROOT + "/etc/spark-sim/node.json"
STATE = ROOT + "/var/lib/spark-sim/docker"
LIB = ROOT + "/usr/lib/spark-sim"
SOCKET = "unix:///var/run/docker.sock"
NO_DAEMON = f"Cannot connect to the Docker daemon at {SOCKET}. Is the docker daemon running?"
VERSION = "28.5.1"
API = "1.51"
SGLANG_MARKER = "lmsysorg/sglang"
VLLM_MARKER = "vllm/vllm-openai"
# The vLLM image's ENTRYPOINT (vllm/vllm-openai's Dockerfile): `docker run IMAGE MODEL --flags` serves.
VLLM_ENTRYPOINT = ["vllm", "serve"]


def knobs():
    try:
        with open(KNOBS) as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {}
    docker = {"running": True, "architecture": "arm64", "image_id": None, "nvidia_runtime": True, "registry": {}}
    docker.update(data.get("docker", {}))
    docker["gpu_present"] = data.get("gpu", {}).get("present", True)
    return docker


def die(message, code=1):
    sys.stderr.write(message.rstrip("\n") + "\n")
    sys.exit(code)


def need_daemon(k):
    if not k["running"]:
        die(NO_DAEMON)


def load(name):
    try:
        with open(os.path.join(STATE, name)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def save(name, data):
    # Root only, like /var/lib/docker: container records hold their environment (API keys included).
    os.makedirs(STATE, mode=0o700, exist_ok=True)
    tmp = os.path.join(STATE, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(STATE, name))


# --- references ---------------------------------------------------------


def normalize(ref):
    """Return (repository, tag, digest) the way the daemon resolves a reference."""
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
    tag = None
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        ref, tag = ref.rsplit(":", 1)
    if tag is None and digest is None:
        tag = "latest"
    if ref.startswith("docker.io/"):
        ref = ref[len("docker.io/"):]
    return ref, tag, digest


def find_image(ref):
    images = load("images.json")
    if ref.startswith("sha256:") or re.fullmatch(r"[0-9a-f]{12,64}", ref):
        wanted = ref if ref.startswith("sha256:") else "sha256:" + ref
        for image in images.values():
            if image["Id"].startswith(wanted):
                return image
        return None
    repo, tag, digest = normalize(ref)
    for image in images.values():
        if tag and f"{repo}:{tag}" in image["RepoTags"] and not digest:
            return image
        if digest and f"{repo}@{digest}" in image["RepoDigests"]:
            return image
    return None


# --- a Go-template subset for --format ---------------------------------


def go_value(data, path):
    value = data
    for part in [p for p in path.split(".") if p]:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def go_text(value):
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + " ".join(go_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_text(v)}" for k, v in sorted(value.items())) + "]"
    return str(value)


def print_rows(rows, quiet, fmt, header, line):
    """A listing as the CLI prints it: the IDs alone (-q), each row through --format, or the table."""
    if quiet:
        for row in rows:
            print(row["ID"])
    elif fmt:
        for row in rows:
            print(go_format(fmt, row))
    else:
        print(header)
        for row in rows:
            print(line(row))


def go_format(template, data):
    """{{.A.B}}, {{json .A}}, {{json .}}, {{index .A 0}}, {{.A}} with literal text around them."""
    template = template.replace("\\t", "\t").replace("\\n", "\n")

    def repl(match):
        expr = match.group(1).strip()
        if expr.startswith("json "):
            target = expr[5:].strip()
            value = data if target == "." else go_value(data, target)
            return json.dumps(value, separators=(",", ":"))
        if expr.startswith("index "):
            _, target, index = expr.split()
            value = go_value(data, target)
            try:
                return go_text(value[int(index)])
            except (IndexError, TypeError):
                die(f"template: :1:{match.start() + 2}: executing \"\" at <{expr}>: "
                    f"error calling index: index out of range: {index}")
        if expr == ".":
            return go_text(data)
        if expr.startswith("."):
            return go_text(go_value(data, expr))
        die(f'template parsing error: template: :1: function "{expr.split()[0]}" not defined')
        return ""

    return re.sub(r"\{\{(.*?)\}\}", repl, template)


# --- the daemon's events ---------------------------------------------------

EVENTS = ROOT + "/run/spark-sim/docker-events.jsonl"
# dockerd keeps this many events in memory for `docker events --since`.
EVENTS_LIMIT = 256


def emit(action, cid, c, **attributes):
    """Record a container event as the daemon publishes it (moby's events.Message)."""
    attrs = {"image": c.get("Image", ""), "name": c.get("Name", ""), **{k: str(v) for k, v in attributes.items()}}
    publish({"status": action, "id": cid, "from": c.get("Image", ""), "Type": "container", "Action": action,
             "Actor": {"ID": cid, "Attributes": attrs}})


def emit_image(action, actor, name):
    """Record an image event: `pull` (actor: the reference pulled), `tag` (actor: the image ID, name: the new tag)."""
    publish({"status": action, "id": actor, "Type": "image", "Action": action,
             "Actor": {"ID": actor, "Attributes": {"name": name}}})


def publish(event):
    now = time.time_ns()
    event = {**event, "scope": "local", "time": now // 10**9, "timeNano": now}
    os.makedirs(os.path.dirname(EVENTS), exist_ok=True)
    with open(EVENTS, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        kept = f.readlines()[-(EVENTS_LIMIT - 1):]
        f.seek(0)
        f.truncate()
        f.writelines([*kept, json.dumps(event) + "\n"])


def event_time(text, now):
    """--since/--until: a Unix timestamp (fractions allowed), RFC 3339, or a Go duration back from now."""
    text = str(text).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", text)
    if parts and "".join(a + b for a, b in parts) == text:
        return now - sum(float(a) * units[b] for a, b in parts)
    seconds = iso_seconds(text)
    if seconds is None:
        die(f'invalid value for "since": failed to parse value as time or duration: "{text}"')
    return float(seconds)


def event_line(event):
    """The CLI's default line: time, type, action, ID and the attributes, sorted."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(event["timeNano"] / 1e9))
    attrs = ", ".join(f"{k}={v}" for k, v in sorted(event["Actor"]["Attributes"].items()))
    return (f"{stamp}.{event['timeNano'] % 10**9:09d}Z {event['Type']} {event['Action']} {event['Actor']['ID']} "
            f"({attrs})")


def cmd_events(args, k):
    """docker events: the kept events from --since, then new ones, until --until (or forever)."""
    need_daemon(k)
    now = time.time()
    since, until = option(args, "--since"), option(args, "--until")
    since = event_time(since, now) if since else now
    until = event_time(until, now) if until else None
    fmt = option(args, "--format")
    filters = {}
    for spec in options(args, "--filter", "-f"):
        key, _, value = spec.partition("=")
        filters.setdefault(key, []).append(value)

    def wanted(ev):
        # Values of one filter key are alternatives; a container is named by its name or (a prefix of) its ID.
        cid, name = ev["Actor"]["ID"], ev["Actor"]["Attributes"].get("name")
        return ((not filters.get("container") or any(v in (name, cid) or cid.startswith(v) for v in filters["container"]))
                and (not filters.get("event") or ev["Action"] in filters["event"])
                and (not filters.get("type") or ev["Type"] in filters["type"]))

    seen = 0
    while True:
        try:
            with open(EVENTS) as f:
                lines = f.readlines()
        except FileNotFoundError:
            lines = []
        for line in lines[seen:]:
            ev = json.loads(line)
            t = ev["timeNano"] / 1e9
            if t < since or (until is not None and t > until) or not wanted(ev):
                continue
            print(go_format(fmt, ev) if fmt else event_line(ev), flush=True)
        seen = len(lines)
        if until is not None and time.time() >= until:
            return 0
        time.sleep(0.2)


# --- commands -------------------------------------------------------------


def cmd_version(args, k):
    fmt = option(args, "--format", "-f")
    client = {"Version": VERSION, "ApiVersion": API, "Os": "linux", "Arch": "arm64", "GoVersion": "go1.24.8"}
    server = {"Version": VERSION, "ApiVersion": API, "MinAPIVersion": "1.24", "Os": "linux", "Arch": "arm64",
              "GoVersion": "go1.24.8", "KernelVersion": "6.11.0-1016-nvidia"}
    if fmt:
        if not k["running"]:
            if "Server" in fmt:
                die(NO_DAEMON)
        print(go_format(fmt, {"Client": client, "Server": server if k["running"] else None}))
        return 0
    print(f"Client: Docker Engine - Community\n Version:           {VERSION}\n API version:       {API}\n"
          " Go version:        go1.24.8\n OS/Arch:           linux/arm64\n")
    need_daemon(k)
    print(f"Server: Docker Engine - Community\n Engine:\n  Version:          {VERSION}\n"
          f"  API version:      {API} (minimum version 1.24)\n  OS/Arch:          linux/arm64")
    return 0


def info_data(k):
    runtimes = {"io.containerd.runc.v2": {"path": "runc", "status": {}}, "runc": {"path": "runc", "status": {}}}
    if k["nvidia_runtime"]:
        runtimes["nvidia"] = {"path": "nvidia-container-runtime", "status": {}}
    containers = live_containers()
    return {
        "ID": "SPRK:SIM0:0000", "Containers": len(containers), "ContainersRunning": len(containers),
        "Images": len(load("images.json")), "Driver": "overlay2", "CgroupDriver": "systemd", "CgroupVersion": "2",
        "Runtimes": runtimes, "DefaultRuntime": "runc", "ServerVersion": VERSION, "OSType": "linux",
        "Architecture": "aarch64", "OperatingSystem": "Ubuntu 24.04.3 LTS", "NCPU": 20,
        "MemTotal": 128 * 1024**3, "DockerRootDir": "/var/lib/docker",
    }


def cmd_info(args, k):
    fmt = option(args, "--format", "-f")
    if not k["running"]:
        if fmt:
            die(f"{NO_DAEMON}")
        print("Client: Docker Engine - Community\n Version:    " + VERSION + "\n\nServer:")
        die(f"ERROR: {NO_DAEMON}\nerrors pretty printing info")
    data = info_data(k)
    if fmt:
        print(go_format(fmt, data))
        return 0
    print(f"Server:\n Containers: {data['Containers']}\n Images: {data['Images']}\n Server Version: {VERSION}\n"
          f" Runtimes: {' '.join(sorted(data['Runtimes']))}\n Default Runtime: runc\n Architecture: aarch64")
    return 0


def image_record(ref, k):
    repo, tag, digest = normalize(ref)
    arch = k["architecture"]
    # What the registry serves under this reference: a build of its own (the SGLang stand-in's knobs it carries).
    build = (k.get("registry") or {}).get(f"{repo}:{tag}") or {}
    sglang = dict(build.get("sglang") or {})
    vllm = build.get("vllm")
    content = f"|{json.dumps(sglang, sort_keys=True)}" if sglang else ""
    if vllm is not None:
        content += f"|vllm{json.dumps(vllm, sort_keys=True)}"
    is_vllm = vllm is not None or VLLM_MARKER in repo
    # Stable across nodes: derived from the name and content, so two nodes agree unless a knob says otherwise.
    image_id = k["image_id"] or "sha256:" + hashlib.sha256(f"{repo}:{tag or ''}|{arch}{content}".encode()).hexdigest()
    repo_digest = digest or "sha256:" + hashlib.sha256(f"manifest|{repo}:{tag}".encode()).hexdigest()
    return {
        "Id": image_id,
        "RepoTags": [f"{repo}:{tag}"] if tag else [],
        "RepoDigests": [f"{repo}@{repo_digest}"],
        "Architecture": arch,
        "Os": "linux",
        "Created": "2026-09-02T08:14:51.000000000Z",
        "Size": 31_457_280_000,
        "Config": {"Cmd": None if is_vllm else ["/bin/bash"], "Entrypoint": list(VLLM_ENTRYPOINT) if is_vllm else None,
                   "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
        # Not in the daemon's JSON: what the SGLang or vLLM stand-in run from this image is built with.
        **({"SimSglang": sglang} if sglang else {}),
        **({"SimVllm": dict(vllm)} if vllm is not None else {}),
    }


def cmd_pull(args, k):
    need_daemon(k)
    quiet = "-q" in args or "--quiet" in args
    platform = option(args, "--platform")
    positional = [a for a in strip_options(args, {"--platform"}) if not a.startswith("-")]
    if len(positional) != 1:
        die('"docker pull" requires exactly 1 argument.\nSee \'docker pull --help\'.', 1)
    ref = positional[0]
    record = image_record(ref, k)
    if platform and platform != f"linux/{record['Architecture']}":
        die(f"Error response from daemon: no matching manifest for {platform} in the manifest list entries")
    repo, tag, digest = normalize(ref)
    images = load("images.json")
    existing = images.get(record["Id"])
    up_to_date = existing is not None and (not tag or f"{repo}:{tag}" in existing["RepoTags"]) and (
        not digest or f"{repo}@{digest}" in existing["RepoDigests"])
    # A tag moves to the newly pulled image: drop it from any other image.
    for other in images.values():
        if other["Id"] != record["Id"] and tag:
            other["RepoTags"] = [t for t in other["RepoTags"] if t != f"{repo}:{tag}"]
    if existing:
        existing["RepoTags"] = sorted(set(existing["RepoTags"]) | set(record["RepoTags"]))
        existing["RepoDigests"] = sorted(set(existing["RepoDigests"]) | set(record["RepoDigests"]))
    else:
        images[record["Id"]] = record
    save("images.json", images)
    # dockerd publishes a pull event for every pull, up to date or not.
    emit_image("pull", f"{repo}:{tag}" if tag else f"{repo}@{digest}", repo)
    shown = f"docker.io/{repo}" + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
    if quiet:
        print(shown)
        return 0
    print(f"{tag or digest}: Pulling from {repo}")
    if not up_to_date:
        for layer in ("4f4fb700ef54", "a1d0c7532777", "9c0abc9c5bd3"):
            print(f"{layer}: Pull complete")
    print(f"Digest: {record['RepoDigests'][0].split('@')[1]}")
    status = "Image is up to date for" if up_to_date else "Downloaded newer image for"
    print(f"Status: {status} {repo}" + (f":{tag}" if tag else f"@{digest}"))
    print(shown)
    return 0


def cmd_image(args, k):
    if not args:
        die("Usage:  docker image COMMAND")
    sub, rest = args[0], args[1:]
    if sub == "inspect":
        return cmd_inspect_images(rest, k)
    if sub in ("ls", "list"):
        return cmd_images(rest, k)
    if sub == "pull":
        return cmd_pull(rest, k)
    if sub == "rm":
        return cmd_rmi(rest, k)
    if sub == "tag":
        return cmd_tag(rest, k)
    die(f"docker: unknown command: docker image {sub}\n\nRun 'docker image --help' for more information")
    return 1


def cmd_inspect_images(args, k):
    need_daemon(k)
    fmt = option(args, "--format", "-f")
    refs = [a for a in strip_options(args, {"--format", "-f", "--type", "--platform"}) if not a.startswith("-")]
    found, rc = [], 0
    for ref in refs:
        image = find_image(ref)
        if image is None:
            sys.stderr.write(f"Error response from daemon: No such image: {ref}\n")
            rc = 1
            continue
        found.append(image)
    if fmt:
        for image in found:
            print(go_format(fmt, image))
    elif found or rc == 0:
        print(json.dumps(found, indent=4))
    else:
        print("[]")
    return rc


ZERO_TIME = "0001-01-01T00:00:00Z"


def now_iso():
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e9):09d}Z"


def iso_seconds(stamp):
    try:
        # UTC seconds, as calendar.timegm gives them: no import of calendar at every start of the CLI (7 ms).
        return int(datetime.datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")
                   .replace(tzinfo=datetime.UTC).timestamp())
    except (TypeError, ValueError):
        return None


def human(seconds):
    """The daemon's units.HumanDuration."""
    seconds = max(0, int(seconds))
    if seconds < 1:
        return "Less than a second"
    if seconds == 1:
        return "1 second"
    if seconds < 60:
        return f"{seconds} seconds"
    minutes = seconds // 60
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = round(seconds / 3600)
    return "About an hour" if hours == 1 else f"{hours} hours"


def container_state(c):
    """(running, exit code) of a container record, reaping one whose process is gone."""
    running = c["State"] == "running" and pid_alive(c["Pid"])
    return running, 0 if running else c.get("ExitCode", 0)


def container_json(cid, c):
    """The shape of `docker container inspect`, as far as a GB10 rank's container has it."""
    running, code = container_state(c)
    opts = c.get("Options", {})
    image = find_image(c["ImageID"]) or {}
    gpus = (opts.get("--gpus") or [None])[-1]
    binds, mounts = [], []
    for spec in opts.get("-v", []) + opts.get("--volume", []):
        parts = spec.split(":")
        mode = parts[2] if len(parts) > 2 else ""
        binds.append(spec)
        mounts.append({"Type": "bind", "Source": parts[0], "Destination": parts[1], "Mode": mode,
                       "RW": "ro" not in mode.split(","), "Propagation": "rprivate"})
    return {
        "Id": cid,
        "Created": c.get("Created", ZERO_TIME),
        "Path": ((c.get("Entrypoint") or []) + (c.get("Cmd") or []) or [""])[0],
        "Args": ((c.get("Entrypoint") or []) + (c.get("Cmd") or []))[1:],
        "State": {
            "Status": "running" if running else "exited",
            "Running": running,
            "Paused": False,
            "Restarting": False,
            "OOMKilled": bool(c.get("OOMKilled")) and not running,
            "Dead": False,
            "Pid": c["Pid"] if running else 0,
            "ExitCode": code,
            "Error": "",
            "StartedAt": c.get("StartedAt", ZERO_TIME),
            "FinishedAt": ZERO_TIME if running else c.get("FinishedAt", ZERO_TIME),
        },
        "Image": c["ImageID"],
        "Name": "/" + c["Name"],
        "RestartCount": 0,
        "Driver": "overlay2",
        "Platform": "linux",
        "HostConfig": {
            "Binds": binds,
            "NetworkMode": (opts.get("--network") or opts.get("--net") or ["bridge"])[-1],
            "IpcMode": (opts.get("--ipc") or ["private"])[-1],
            "AutoRemove": "--rm" in opts,
            "Memory": c.get("MemoryBytes") or 0,
            "OomScoreAdj": c.get("OomScoreAdj") or 0,
            "MemorySwap": c.get("MemorySwapBytes") or 0,
            "ShmSize": parse_size((opts.get("--shm-size") or ["64m"])[-1]) or 67108864,
            "CapAdd": opts.get("--cap-add") or None,
            "Runtime": (opts.get("--runtime") or ["runc"])[-1],
            "DeviceRequests": [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]],
                                "Options": {}}] if gpus else None,
        },
        "Mounts": mounts,
        "Config": {
            "Hostname": os.uname().nodename,
            "Env": list((image.get("Config") or {}).get("Env") or []) + list(c.get("Env") or []),
            "Cmd": c.get("Cmd") or [],
            "Image": c["Image"],
            "Entrypoint": c.get("Entrypoint") or None,
            "Labels": {},
        },
    }


def cmd_inspect(args, k, kind=None, daemon_errors=False):
    """docker inspect: an object name is a container first, then an image; --type narrows it."""
    need_daemon(k)
    fmt = option(args, "--format", "-f")
    kind = option(args, "--type") or kind
    if kind not in (None, "container", "image"):
        die(f'"{kind}" is not a valid value for --type')
    refs = [a for a in strip_options(args, {"--format", "-f", "--type"}) if not a.startswith("-")]
    found, rc = [], 0
    for ref in refs:
        obj = None
        if kind in (None, "container"):
            cid, c = find_container(ref)
            obj = container_json(cid, c) if c else None
        if obj is None and kind in (None, "image"):
            obj = find_image(ref)
        if obj is None:
            prefix = "Error response from daemon" if daemon_errors else "Error"
            sys.stderr.write(f"{prefix}: No such {kind or 'object'}: {ref}\n")
            rc = 1
            continue
        found.append(obj)
    if fmt:
        for obj in found:
            print(go_format(fmt, obj))
    else:
        print(json.dumps(found, indent=4))
    return rc


def cmd_container(args, k):
    if not args:
        die("Usage:  docker container COMMAND")
    sub, rest = args[0], args[1:]
    if sub == "inspect":
        return cmd_inspect(rest, k, kind="container", daemon_errors=True)
    handler = {"ls": cmd_ps, "list": cmd_ps, "ps": cmd_ps, "rm": cmd_rm, "stop": cmd_stop, "kill": cmd_kill,
               "logs": cmd_logs, "run": cmd_run}.get(sub)
    if handler is None:
        die(f"docker: unknown command: docker container {sub}\n\nRun 'docker container --help' for more information")
    return handler(rest, k)


SIZE = re.compile(r"^(\d+(?:\.\d+)?) ?([kKmMgGtTpP])?[iI]?[bB]?$")


def parse_size(text):
    """docker's RAMInBytes: 120g, 512m, 1.5G, bytes; None when it is not a size."""
    match = SIZE.match(str(text or "").strip())
    if not match:
        return None
    power = " kmgtp".index((match.group(2) or " ").lower())
    return int(float(match.group(1)) * 1024 ** power)


def cmd_images(args, k):
    need_daemon(k)
    fmt = option(args, "--format")
    quiet = "-q" in args or "--quiet" in args
    rows = []
    for image in load("images.json").values():
        for tag in image["RepoTags"] or ["<none>:<none>"]:
            repo, _, t = tag.rpartition(":")
            # A built or loaded image has no registry digest: the CLI shows <none>.
            digest = image["RepoDigests"][0].split("@")[1] if image["RepoDigests"] else "<none>"
            rows.append({"Repository": repo, "Tag": t, "ID": image["Id"][7:19], "CreatedSince": "2 months ago",
                         "Size": "31.5GB", "Digest": digest})
    print_rows(rows, quiet, fmt, f"{'REPOSITORY':<40}{'TAG':<25}{'IMAGE ID':<15}{'CREATED':<15}SIZE",
               lambda row: f"{row['Repository']:<40}{row['Tag']:<25}{row['ID']:<15}{row['CreatedSince']:<15}{row['Size']}")
    return 0


def cmd_tag(args, k):
    """docker tag SOURCE TARGET: TARGET (repo:tag) names SOURCE's image from now on, taken from any other image."""
    need_daemon(k)
    refs = [a for a in args if not a.startswith("-")]
    if len(refs) != 2:
        die('"docker tag" requires exactly 2 arguments.\nSee \'docker tag --help\'.', 1)
    image = find_image(refs[0])
    if image is None:
        die(f"Error response from daemon: No such image: {refs[0]}")
    repo, tag, digest = normalize(refs[1])
    if digest:
        die(f'Error parsing reference: "{refs[1]}" is not a valid repository/tag: refusing to create a tag with a digest '
            "reference")
    target = f"{repo}:{tag}"
    images = load("images.json")
    for other in images.values():
        other["RepoTags"] = [t for t in other["RepoTags"] if t != target]
    images[image["Id"]]["RepoTags"] = sorted(set(images[image["Id"]]["RepoTags"]) | {target})
    save("images.json", images)
    emit_image("tag", image["Id"], target)
    return 0


# --- build, save, load ---------------------------------------------------

# What a build context's Dockerfile can tell the stand-in about what it changes (the real build's RUN and COPY
# steps patch kernels the stand-in cannot run): LABEL org.spark-sim.sglang='{"tilelang_verify_tile": "gb10"}'
# merges into the SGLang stand-in's knobs of the image, over the base image's own.
SIM_LABEL = "org.spark-sim."
BUILD_LINE = re.compile(r"^\s*([A-Za-z]+)\s+(.*)$")


def dockerfile_lines(text):
    """(instruction, rest) per logical line, as the daemon's parser splits them: a backslash at a line's end
    continues it, comment lines are skipped."""
    logical = re.sub(r"\\[ \t]*\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [(m.group(1).upper(), m.group(2).strip()) for m in map(BUILD_LINE.match, logical.splitlines()) if m]


def substitute(text, values):
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: values.get(m.group(1), ""), text)


def label_pairs(rest):
    pairs = {}
    for key, value in re.findall(r"""([A-Za-z0-9_.\-]+)=("(?:[^"\\]|\\.)*"|'[^']*'|\S+)""", rest):
        pairs[key] = value[1:-1].replace('\\"', '"') if value[:1] in "\"'" else value
    return pairs


def context_digest(context):
    """Every file of the context, by path and content: what the daemon's build cache keys on."""
    h = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(context)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            h.update(os.path.relpath(path, context).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def cmd_build(args, k):
    """docker build [-t TAG] [-f FILE] [--build-arg K=V] [--label K=V] [-q] CONTEXT, the classic builder's
    output. FROM (with ARG substitution), COPY/ADD sources and LABEL are read; the image's ID comes from its
    base, its context and its build arguments, so the same build gives the same ID on any node."""
    need_daemon(k)
    valued = {"-t", "--tag", "-f", "--file", "--build-arg", "--label", "--platform"}
    context = [a for a in strip_options(args, valued) if not a.startswith("-")]
    if len(context) != 1:
        die('ERROR: "docker buildx build" requires exactly 1 argument.\nSee \'docker buildx build --help\'.', 1)
    context = context[0]
    if not os.path.isdir(context):
        die(f'ERROR: unable to prepare context: path "{context}" not found', 1)
    dockerfile = option(args, "-f", "--file") or os.path.join(context, "Dockerfile")
    try:
        with open(dockerfile) as f:
            lines = dockerfile_lines(f.read())
    except FileNotFoundError:
        die(f"ERROR: failed to solve: failed to read dockerfile: open {os.path.basename(dockerfile)}: "
            "no such file or directory", 1)
    given = dict(a.split("=", 1) for a in options(args, "--build-arg") if "=" in a)
    declared, base, labels = {}, None, {}
    for word, rest in lines:
        if word == "ARG":
            name, _, default = rest.partition("=")
            declared[name.strip()] = given.get(name.strip(), default.strip())
        elif word == "FROM" and base is None:
            ref = substitute(rest.split()[0], declared)
            base = find_image(ref) if ref else None
            if base is None:
                die(f"ERROR: failed to solve: {ref or rest}: failed to resolve source metadata for "
                    f"docker.io/{ref or rest}: pull access denied, repository does not exist or may require "
                    "authorization", 1)
        elif word in ("COPY", "ADD") and base is not None:
            sources = [w for w in rest.split() if not w.startswith("--")][:-1]
            for source in sources:
                if not os.path.exists(os.path.join(context, source)):
                    die(f'ERROR: failed to solve: failed to compute cache key: failed to calculate checksum of ref: '
                        f'"/{source}": not found', 1)
        elif word == "LABEL":
            labels.update(label_pairs(substitute(rest, declared)))
    if base is None:
        die("ERROR: failed to solve: the Dockerfile (Dockerfile) cannot be empty", 1)
    labels.update(dict(a.split("=", 1) for a in options(args, "--label") if "=" in a))
    image_id = "sha256:" + hashlib.sha256(
        f"build|{base['Id']}|{context_digest(context)}|{json.dumps(given, sort_keys=True)}|"
        f"{json.dumps(labels, sort_keys=True)}".encode()).hexdigest()
    record = {**base, "Id": image_id, "RepoTags": [], "RepoDigests": [], "Created": now_iso(),
              "Config": {**base.get("Config", {}), "Labels": labels}}
    # A derived image runs what its base runs, whatever it is named, with the knobs its label declares over the
    # base's own.
    for engine, field, marker in (("sglang", "SimSglang", SGLANG_MARKER), ("vllm", "SimVllm", VLLM_MARKER)):
        knobs_of_build = dict(base.get(field) or {})
        if labels.get(SIM_LABEL + engine):
            knobs_of_build.update(json.loads(labels[SIM_LABEL + engine]))
        record.pop(field, None)
        if knobs_of_build:
            record[field] = knobs_of_build
        if field in base or image_is(base["RepoTags"][0] if base["RepoTags"] else "", base, marker):
            record["SimEngine"] = marker
    images = load("images.json")
    tags = [f"{r}:{t}" for r, t, _d in (normalize(ref) for ref in options(args, "-t", "--tag"))]
    for other in images.values():
        other["RepoTags"] = [t for t in other["RepoTags"] if t not in tags]
    if image_id in images:
        record["RepoTags"] = images[image_id]["RepoTags"]
    record["RepoTags"] = sorted(set(record["RepoTags"]) | set(tags))
    images[image_id] = record
    save("images.json", images)
    for tag in tags:
        emit_image("tag", image_id, tag)
    if "-q" in args or "--quiet" in args:
        print(image_id)
        return 0
    print(f"#0 building with \"default\" instance using docker driver\n#1 [internal] load build definition from "
          f"{os.path.basename(dockerfile)}\n#2 [1/1] FROM {base['RepoTags'][0] if base['RepoTags'] else base['Id']}\n"
          f"#3 exporting to image\n#3 writing image {image_id} done")
    for tag in tags:
        print(f"#3 naming to docker.io/{tag} done")
    return 0


def cmd_save(args, k):
    """docker save [-o FILE] IMAGE...: a tar stream (manifest.json and each image's config) on stdout."""
    need_daemon(k)
    import io  # noqa: PLC0415 - only save and load need them: not at every start of the CLI
    import tarfile  # noqa: PLC0415
    refs = [a for a in strip_options(args, {"-o", "--output"}) if not a.startswith("-")]
    if not refs:
        die('"docker save" requires at least 1 argument.\nSee \'docker save --help\'.', 1)
    manifest, members = [], []
    for ref in refs:
        image = find_image(ref)
        if image is None:
            die(f"Error response from daemon: reference does not exist: {ref}")
        config = image["Id"].split(":", 1)[1] + ".json"
        manifest.append({"Config": config, "RepoTags": [t for t in image["RepoTags"] if ref in (t, t.rsplit(":", 1)[0])]
                         or image["RepoTags"], "Layers": []})
        members.append((config, json.dumps(image, sort_keys=True).encode()))
    members.append(("manifest.json", json.dumps(manifest).encode()))
    out = option(args, "-o", "--output")
    if sys.stdout.isatty() and not out:
        die("cowardly refusing to save to a terminal. Use the -o flag or redirect", 1)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    if out:
        with open(out, "wb") as f:
            f.write(buffer.getvalue())
    else:
        sys.stdout.buffer.write(buffer.getvalue())
        sys.stdout.buffer.flush()
    return 0


def cmd_load(args, k):
    """docker load [-i FILE] [-q]: the images of a `docker save` stream, under their tags and IDs."""
    need_daemon(k)
    import io  # noqa: PLC0415 - only save and load need them: not at every start of the CLI
    import tarfile  # noqa: PLC0415
    source = option(args, "-i", "--input")
    data = open(source, "rb").read() if source else sys.stdin.buffer.read()  # noqa: SIM115 - read whole at once
    if not data:
        die("requested load from stdin, but stdin is empty", 1)
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))
            loaded = [(json.load(tar.extractfile(entry["Config"])), entry.get("RepoTags") or []) for entry in manifest]
    except (tarfile.TarError, KeyError, ValueError):
        die("Error response from daemon: unexpected EOF", 1)
    images = load("images.json")
    for image, tags in loaded:
        for other in images.values():
            other["RepoTags"] = [t for t in other["RepoTags"] if t not in tags or other["Id"] == image["Id"]]
        if image["Id"] in images:
            image["RepoTags"] = sorted(set(images[image["Id"]]["RepoTags"]) | set(tags))
        images[image["Id"]] = image
    save("images.json", images)
    for image, tags in loaded:
        emit_image("load", image["Id"], tags[0] if tags else image["Id"])
        for tag in tags:
            print(f"Loaded image: {tag}")
        if not tags:
            print(f"Loaded image ID: {image['Id']}")
    return 0


def cmd_rmi(args, k):
    need_daemon(k)
    images = load("images.json")
    rc = 0
    for ref in [a for a in args if not a.startswith("-")]:
        image = find_image(ref)
        if image is None:
            sys.stderr.write(f"Error response from daemon: No such image: {ref}\n")
            rc = 1
            continue
        images.pop(image["Id"], None)
        print(f"Untagged: {ref}\nDeleted: {image['Id']}")
    save("images.json", images)
    return rc


# --- containers -----------------------------------------------------------


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        if f.read().split(")")[-1].split()[0] == "Z":
            return False
    return True


def live_containers():
    containers = load("containers.json")
    for c in containers.values():
        if c["State"] == "running" and not pid_alive(c["Pid"]):
            c["State"] = "exited"
    return {cid: c for cid, c in containers.items() if c["State"] == "running"}


def forget(cid):
    """What the daemon deletes with a container: its log and its cgroup."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(STATE, "logs", cid + ".log"))
    shutil.rmtree(os.path.join(STATE, "cgroups", cid), ignore_errors=True)


def find_container(name):
    for cid, c in load("containers.json").items():
        if name in (c["Name"], cid, cid[:12]):
            if c["State"] == "running" and not pid_alive(c["Pid"]):
                c["State"] = "exited"
            return cid, c
    return None, None


def cmd_ps(args, k):
    need_daemon(k)
    show_all = "-a" in args or "--all" in args
    quiet = "-q" in args or "--quiet" in args
    fmt = option(args, "--format")
    name_filter = None
    for f in options(args, "--filter", "-f"):
        if f.startswith("name="):
            name_filter = f[5:]
    rows = []
    now = time.time()
    for cid, c in load("containers.json").items():
        running, code = container_state(c)
        if not running and not show_all:
            continue
        # Like the daemon, the name filter matches the name with and without its leading slash.
        if name_filter and not (re.search(name_filter, c["Name"]) or re.search(name_filter, "/" + c["Name"])):
            continue
        started, finished = iso_seconds(c.get("StartedAt")), iso_seconds(c.get("FinishedAt"))
        created = iso_seconds(c.get("Created")) or now
        if running:
            status = f"Up {human(now - (started or now))}"
        else:
            status = f"Exited ({code}) {human(now - (finished or now))} ago"
        command = c["Command"] if len(c["Command"]) <= 20 else c["Command"][:19] + "\u2026"
        rows.append({"ID": cid[:12], "Image": c["Image"], "Command": f'"{command}"', "Names": c["Name"],
                     "CreatedAt": time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(created)),
                     "RunningFor": f"{human(now - created)} ago", "Ports": "", "Status": status,
                     "State": "running" if running else "exited", "Size": "0B", "Labels": "", "Mounts": "",
                     "Networks": "host"})
    print_rows(rows, quiet, fmt,
               f"{'CONTAINER ID':<15}{'IMAGE':<40}{'COMMAND':<24}{'CREATED':<20}{'STATUS':<28}{'PORTS':<7}NAMES",
               lambda row: f"{row['ID']:<15}{row['Image']:<40}{row['Command']:<24}{row['RunningFor']:<20}"
                           f"{row['Status']:<28}{'':<7}{row['Names']}")
    return 0


def signal_container(c, sig):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(c["Pid"], sig)


def stop_one(name, grace):
    cid, c = find_container(name)
    if c is None:
        sys.stderr.write(f"Error response from daemon: No such container: {name}\n")
        return 1
    if c["State"] == "running":
        emit("kill", cid, c, signal=int(signal.SIGTERM))
        signal_container(c, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pid_alive(c["Pid"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(c["Pid"]):
            emit("kill", cid, c, signal=int(signal.SIGKILL))
            signal_container(c, signal.SIGKILL)
            while pid_alive(c["Pid"]):
                time.sleep(0.05)
        emit("stop", cid, c)
    print(name)
    return 0


def cmd_stop(args, k):
    need_daemon(k)
    grace = int(option(args, "--time", "-t") or 10)
    names = [a for a in strip_options(args, {"--time", "-t", "--signal", "-s"}) if not a.startswith("-")]
    return max([stop_one(n, grace) for n in names] or [0])


def cmd_kill(args, k):
    need_daemon(k)
    sig = option(args, "--signal", "-s") or "KILL"
    signum = getattr(signal, "SIG" + sig.upper().removeprefix("SIG"), None) if not sig.isdigit() else int(sig)
    rc = 0
    for name in [a for a in strip_options(args, {"--signal", "-s"}) if not a.startswith("-")]:
        _, c = find_container(name)
        if c is None:
            sys.stderr.write(f"Error response from daemon: No such container: {name}\n")
            rc = 1
        elif c["State"] != "running":
            sys.stderr.write(f"Error response from daemon: cannot kill container: {name}: container "
                             f"{c['Id'][:64]} is not running\n")
            rc = 1
        else:
            emit("kill", c["Id"], c, signal=signum)
            signal_container(c, signum)
            print(name)
    return rc


def cmd_rm(args, k):
    need_daemon(k)
    force = any(a in ("-f", "--force") for a in args)
    containers = load("containers.json")
    rc = 0
    for name in [a for a in args if not a.startswith("-")]:
        cid, c = find_container(name)
        if c is None:
            # `docker rm -f` of a missing container is not an error (moby >= 23).
            if not force:
                sys.stderr.write(f"Error response from daemon: No such container: {name}\n")
                rc = 1
            continue
        if c["State"] == "running":
            if not force:
                sys.stderr.write(f"Error response from daemon: cannot remove container \"/{c['Name']}\": container is "
                                 "running: stop the container before removing or force remove\n")
                rc = 1
                continue
            signal_container(c, signal.SIGKILL)
        containers.pop(cid, None)
        forget(cid)
        emit("destroy", cid, c)
        print(name)
    save("containers.json", containers)
    return rc


def cmd_logs(args, k):
    need_daemon(k)
    tail = option(args, "--tail", "-n")
    names = [a for a in strip_options(args, {"--tail", "-n", "--since", "--until"}) if not a.startswith("-")]
    if len(names) != 1:
        die('"docker logs" requires exactly 1 argument.')
    cid, c = find_container(names[0])
    if c is None:
        die(f"Error response from daemon: No such container: {names[0]}")
    try:
        with open(os.path.join(STATE, "logs", cid + ".log")) as f:
            lines = f.readlines()
    except FileNotFoundError:
        lines = []
    if tail and tail != "all":
        lines = lines[-int(tail):] if int(tail) else []
    sys.stdout.write("".join(lines))
    return 0


RUN_VALUE_OPTIONS = {
    "--name", "--gpus", "--network", "--net", "--ipc", "--shm-size", "--ulimit", "--cap-add", "--cap-drop",
    "--device", "--memory", "-m", "--memory-swap", "-v", "--volume", "--env-file", "-e", "--env", "--platform",
    "--entrypoint", "--runtime", "--user", "-u", "--workdir", "-w", "--label", "-l", "--restart", "--pid",
    "--stop-timeout", "--log-driver", "--log-opt", "--pull", "--hostname", "-h", "--security-opt",
    "--oom-score-adj",
}
RUN_SWITCHES = {"--rm", "-i", "-t", "-it", "--interactive", "--tty", "--init", "--privileged", "-d", "--detach"}


def oom_adjustment(value):
    """--oom-score-adj as the daemon checks it: an integer in [-1000, 1000] (None when not given)."""
    if value is None:
        return None
    try:
        adj = int(value)
    except ValueError:
        die(f'invalid argument "{value}" for "--oom-score-adj" flag: strconv.ParseInt: parsing "{value}": invalid syntax'
            "\nSee 'docker run --help'.", 125)
    if not -1000 <= adj <= 1000:
        die(f"docker: Error response from daemon: Invalid value {adj}, range for oom score adj is [-1000, 1000]."
            "\n\nRun 'docker run --help' for more information", 125)
    return adj


def set_oom_score_adj(adj):
    """What runc does for the container's first process, done here before it is started: it inherits the value
    (this client process keeps it too, which the real client does not; nothing reads the client's). Lowering it
    takes CAP_SYS_RESOURCE, which a sandbox may withhold even from root: then the processes keep their own, and
    the record (HostConfig.OomScoreAdj) still says what was asked."""
    if adj is not None:
        with contextlib.suppress(PermissionError), open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(adj))


def parse_run(args):
    opts, i = {}, 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-"):
            break
        name, value = (a.split("=", 1) + [None])[:2] if a.startswith("--") and "=" in a else (a, None)
        if name in RUN_SWITCHES:
            opts.setdefault(name, []).append(True)
            i += 1
            continue
        if name not in RUN_VALUE_OPTIONS:
            die(f"unknown flag: {name}\nSee 'docker run --help'.", 125)
        if value is None:
            i += 1
            if i >= len(args):
                die(f"flag needs an argument: '{name.lstrip('-')}' in {name}\nSee 'docker run --help'.", 125)
            value = args[i]
        opts.setdefault(name, []).append(value)
        i += 1
    if i >= len(args):
        die('"docker run" requires at least 1 argument.\nSee \'docker run --help\'.', 125)
    return opts, args[i], args[i + 1:]


def read_env_file(path):
    env = {}
    try:
        with open(path) as f:
            for raw in f:
                line = raw.rstrip("\n")
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                if "=" in line:
                    key, value = line.split("=", 1)
                    env[key.lstrip()] = value
                elif line.strip() in os.environ:
                    env[line.strip()] = os.environ[line.strip()]
    except FileNotFoundError:
        die(f"docker: open {path}: no such file or directory\n\nRun 'docker run --help' for more information", 125)
    except PermissionError:
        die(f"docker: open {path}: permission denied\n\nRun 'docker run --help' for more information", 125)
    return env


def python_shim():
    """The engines' entry modules, `sglang.launch_server` and `vllm.entrypoints.cli.main`, each running its
    stand-in server with the arguments it was given."""
    shim = os.path.join(STATE, "pyshim")
    for module, server in (("sglang.launch_server", "sglang_server.py"),
                           ("vllm.entrypoints.cli.main", "vllm_server.py")):
        parts = module.split(".")
        for depth in range(1, len(parts)):
            pkg = os.path.join(shim, *parts[:depth])
            os.makedirs(pkg, exist_ok=True)
            with open(os.path.join(pkg, "__init__.py"), "w") as f:
                f.write("")
        with open(os.path.join(shim, *parts[:-1], parts[-1] + ".py"), "w") as f:
            f.write(f"import runpy\nrunpy.run_path({os.path.join(LIB, server)!r}, run_name='__main__')\n")
    return shim


def image_is(image_ref, image, marker):
    """The engine's image by its name, or an image built on top of it (docker build keeps what its base runs)."""
    return (marker in image_ref or any(marker in t for t in image.get("RepoTags") or [])
            or image.get("SimEngine") == marker)


def entry_and_command(opts, image, command):
    """What the container runs, as the daemon puts it together: --entrypoint replaces the image's ENTRYPOINT
    and drops its CMD; arguments after the image replace the CMD."""
    config = image.get("Config") or {}
    if "--entrypoint" in opts:
        given = opts["--entrypoint"][-1]
        return ([given] if given else []), list(command)
    return list(config.get("Entrypoint") or []), list(command or config.get("Cmd") or [])


def translate(arg, mounts):
    for host, container in sorted(mounts, key=lambda m: -len(m[1])):
        if arg == container or arg.startswith(container.rstrip("/") + "/"):
            return host + arg[len(container.rstrip("/")):] if arg != container else host
    return arg


def cmd_run(args, k):
    need_daemon(k)
    opts, image_ref, command = parse_run(args)
    if "-d" in opts or "--detach" in opts:
        die("docker: the stand-in runs containers in the foreground only (the unit must not use -d)", 125)
    name = (opts.get("--name") or [None])[-1]
    if name is not None:
        cid, c = find_container(name)
        if c is not None:
            die(f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in use by '
                f'container "{cid}". You have to remove (or rename) that container to be able to reuse that name.\n\n'
                "Run 'docker run --help' for more information", 125)
    image = find_image(image_ref)
    if image is None:
        sys.stderr.write(f"Unable to find image '{image_ref}' locally\n")
        cmd_pull([image_ref], k)
        image = find_image(image_ref)
    if image["Architecture"] != "arm64":
        sys.stderr.write(f"WARNING: The requested image's platform (linux/{image['Architecture']}) does not match "
                         "the detected host platform (linux/arm64/v8) and no specific platform was requested\n")
        sys.stderr.write("exec /bin/bash: exec format error\n")
        return 255
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
           "HOSTNAME": os.uname().nodename}
    if opts.get("--gpus"):
        if not k["nvidia_runtime"]:
            die('docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].'
                "\n\nRun 'docker run --help' for more information", 125)
        if not k["gpu_present"]:
            die("docker: Error response from daemon: failed to create task for container: failed to create shim task: "
                "OCI runtime create failed: runc create failed: unable to start container process: error during "
                "container init: error running prestart hook #0: exit status 1, stdout: , stderr: Auto-detected mode "
                "as 'legacy'\nnvidia-container-cli: initialization error: nvml error: driver not loaded: unknown"
                "\n\nRun 'docker run --help' for more information", 125)
        env["NVIDIA_VISIBLE_DEVICES"] = "all"
    for device in opts.get("--device", []):
        host_dev = device.split(":", 1)[0]
        if not os.path.exists(ROOT + host_dev):
            die(f'docker: Error response from daemon: error gathering device information while adding custom device '
                f'"{host_dev}": no such file or directory.\n\nRun \'docker run --help\' for more information', 125)
    memory, swap = (opts.get("--memory") or opts.get("-m") or [None])[-1], (opts.get("--memory-swap") or [None])[-1]
    memory_bytes, swap_bytes = memory_limits(memory, swap)
    oom_score_adj = oom_adjustment((opts.get("--oom-score-adj") or [None])[-1])
    mounts = []
    for spec in opts.get("-v", []) + opts.get("--volume", []):
        parts = spec.split(":")
        if len(parts) < 2 or not parts[1].startswith("/"):
            die(f'docker: Error response from daemon: invalid volume specification: "{spec}"', 125)
        # Like the daemon: a missing bind source is created as a directory; a file is mounted as it is. A node
        # root on a workstation (SPARK_SIM_ROOT) gets nothing created outside it: the test forgot a file.
        if not os.path.exists(parts[0]):
            if ROOT and not os.path.realpath(parts[0]).startswith(os.path.realpath(ROOT) + os.sep):
                die(f"spark-sim: the bind source {parts[0]} is missing and outside the node root {ROOT}; the daemon "
                    "would create it as a directory on this machine", 125)
            os.makedirs(parts[0])
        mounts.append((parts[0], parts[1]))
    user_env = {}
    for path in opts.get("--env-file", []):
        user_env.update(read_env_file(path))
    for item in opts.get("-e", []) + opts.get("--env", []):
        key, _, value = item.partition("=")
        user_env[key] = value if "=" in item else os.environ.get(key, "")
    env.update(user_env)
    entrypoint, command = entry_and_command(opts, image, command)
    if not entrypoint + command:
        die("docker: Error response from daemon: no command specified\n\nRun 'docker run --help' for more information",
            125)

    cid = hashlib.sha256(f"{name}|{time.time_ns()}|{os.getpid()}".encode()).hexdigest()
    name = name or f"sim_{cid[:8]}"
    argv = [translate(a, mounts) for a in entrypoint + command]
    env["SPARK_SIM_MOUNTS"] = json.dumps(mounts)
    if ROOT:
        env["SPARK_SIM_ROOT"] = ROOT  # the node's knobs, for a node that is a directory on a workstation
    # The container's memory cgroup: what the processes hold is charged to it.
    cgroup = os.path.join(STATE, "cgroups", cid)
    os.makedirs(cgroup, exist_ok=True)
    for file, text in (("memory.max", str(memory_bytes) if memory_bytes else "max"), ("memory.current", "0"),
                       ("memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0")):
        with open(os.path.join(cgroup, file), "w") as f:
            f.write(text + "\n")
    env["SPARK_SIM_CGROUP"] = cgroup
    build = image.get("SimSglang") or image.get("SimVllm")
    if build:
        # The image's own build: the engine's stand-in reads these over the node's knobs.
        env["SPARK_SIM_IMAGE_KNOBS"] = json.dumps(build)
    vllm = "SimVllm" in image or image_is(image_ref, image, VLLM_MARKER)
    if vllm or image_is(image_ref, image, SGLANG_MARKER):
        if argv and argv[0] in ("python3", "python"):
            argv[0] = sys.executable
            env["PYTHONPATH"] = python_shim()
        elif vllm and argv and argv[0] == "vllm":
            # The image's `vllm` console script is vllm.entrypoints.cli.main's main().
            argv[:1] = [sys.executable, "-m", "vllm.entrypoints.cli.main"]
            env["PYTHONPATH"] = python_shim()
    log_dir = os.path.join(STATE, "logs")
    os.makedirs(log_dir, exist_ok=True)
    log = open(os.path.join(log_dir, cid + ".log"), "ab")  # noqa: SIM115 - lives as long as the container
    set_oom_score_adj(oom_score_adj)
    try:
        child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True, cwd="/")
    except FileNotFoundError:
        die(f'docker: Error response from daemon: failed to create task for container: failed to create shim task: '
            f'OCI runtime create failed: runc create failed: unable to start container process: error during '
            f'container init: exec: "{(entrypoint + command)[0]}": executable file not found in $PATH: unknown', 127)
    containers = load("containers.json")
    started = now_iso()
    containers[cid] = {"Id": cid, "Name": name, "Image": image_ref, "ImageID": image["Id"], "Pid": child.pid,
                       "State": "running", "Command": " ".join(entrypoint + command), "Cmd": command,
                       "Entrypoint": entrypoint, "Mounts": mounts,
                       "Memory": memory, "MemorySwap": swap, "MemoryBytes": memory_bytes, "MemorySwapBytes": swap_bytes,
                       "OomScoreAdj": oom_score_adj or 0,
                       "Env": [f"{key}={value}" for key, value in user_env.items()], "Options": opts,
                       "Created": started, "StartedAt": started}
    save("containers.json", containers)
    emit("create", cid, containers[cid])
    emit("start", cid, containers[cid])

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    for chunk in iter(child.stdout.readline, b""):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
        log.write(chunk)
        log.flush()
    code = child.wait()
    log.close()
    # Like docker run: a container killed by signal N reports 128+N.
    status = 128 - code if code < 0 else code
    oom_killed = code == -signal.SIGKILL and oom_kills(cgroup) > 0
    containers = load("containers.json")
    record = containers.get(cid) or {"Image": image_ref, "Name": name}
    if oom_killed:
        emit("oom", cid, record)
    started_at = iso_seconds(record.get("StartedAt", "")) or time.time()
    emit("die", cid, record, exitCode=status, execDuration=int(time.time() - started_at))
    if "--rm" in opts:
        emit("destroy", cid, record)
    if "--rm" in opts:
        containers.pop(cid, None)
        forget(cid)
    elif cid in containers:
        containers[cid].update(State="exited", ExitCode=status, FinishedAt=now_iso(), OOMKilled=oom_killed)
    save("containers.json", containers)
    return status


def oom_kills(cgroup):
    try:
        with open(os.path.join(cgroup, "memory.events")) as f:
            events = dict(line.split() for line in f if len(line.split()) == 2)
    except FileNotFoundError:
        return 0
    return int(events.get("oom_kill", 0))


def memory_limits(memory, swap):
    """--memory / --memory-swap in bytes, refused like the CLI and the daemon refuse them."""
    def size(text, flag):
        value = parse_size(text)
        if value is None:
            die(f'invalid argument "{text}" for "{flag}" flag: invalid size: \'{text}\'\nSee \'docker run --help\'.',
                125)
        return value

    memory_bytes = size(memory, "-m, --memory") if memory else None
    if swap and not memory:
        die("docker: Error response from daemon: You should always set the Memory limit when using Memoryswap "
            "limit, see usage.\n\nRun 'docker run --help' for more information", 125)
    if memory_bytes is not None and memory_bytes < 6 * 1024 * 1024:
        die("docker: Error response from daemon: Minimum memory limit allowed is 6MB.\n\n"
            "Run 'docker run --help' for more information", 125)
    swap_bytes = -1 if swap == "-1" else size(swap, "--memory-swap") if swap else None
    if swap_bytes not in (None, -1) and swap_bytes < memory_bytes:
        die("docker: Error response from daemon: Minimum memoryswap limit should be larger than memory limit, see "
            "usage.\n\nRun 'docker run --help' for more information", 125)
    return memory_bytes, swap_bytes


# --- argument helpers -------------------------------------------------------


def options(args, *names):
    out = []
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                out.append(args[i + 1])
            elif a.startswith(n + "="):
                out.append(a[len(n) + 1:])
    return out


def option(args, *names):
    found = options(args, *names)
    return found[-1] if found else None


def strip_options(args, valued):
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in valued:
            skip = True
            continue
        if any(a.startswith(v + "=") for v in valued):
            continue
        out.append(a)
    return out


COMMANDS = {
    "version": cmd_version, "info": cmd_info, "pull": cmd_pull, "image": cmd_image, "images": cmd_images,
    "inspect": cmd_inspect, "ps": cmd_ps, "run": cmd_run, "stop": cmd_stop, "rm": cmd_rm,
    "kill": cmd_kill, "logs": cmd_logs, "rmi": cmd_rmi, "container": cmd_container, "events": cmd_events,
    "tag": cmd_tag, "build": cmd_build, "save": cmd_save, "load": cmd_load,
}


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print("Usage:  docker [OPTIONS] COMMAND\n\nA self-sufficient runtime for containers (spark-sim stand-in)")
        return 0
    if argv[0] in ("-v", "--version"):
        print(f"Docker version {VERSION}, build f8215cc")
        return 0
    handler = COMMANDS.get(argv[0])
    if handler is None:
        die(f"docker: unknown command: docker {argv[0]}\n\nRun 'docker --help' for more information")
    return handler(argv[1:], knobs())


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main(sys.argv[1:]))

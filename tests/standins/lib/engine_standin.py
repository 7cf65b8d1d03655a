#!/usr/bin/python3
"""What the serving stand-ins share: the machinery of a tensor-parallel inference engine that is not one engine's.

sglang_server.py (SGLang) and vllm_server.py (vLLM) import it from beside themselves (on a node
/usr/lib/spark-sim/engine_standin.py, where the harness copies lib/*). Standard library only (nodes run
Debian trixie's python3). Here: the knobs file, container paths, the model directory and the hub, the
multi-node group over real sockets (TCPStore, Gloo, NCCL's bootstrap, the broadcast queue), start-up
collectives and serving collectives with NCCL's watchdog, the GPU held by a rank (and after it), memory
charged to the container's cgroup, continuous batching, Prometheus histograms, the chat model's answers and
the HTTP server with its streaming. What differs between the engines (log lines, flags, messages, routes,
parsers, metric names) is each engine's: it speaks through a Voice (log, fail) and answers HTTP through the
hooks of its Engine subclass.
"""

import collections
import fcntl
import hashlib
import json
import math
import os
import re
import select
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import roce_port  # noqa: E402,F401 - re-exported: the engines read NCCL's devices through it

ROOT = os.environ.get("SPARK_SIM_ROOT", "")
KNOBS = ROOT + "/etc/spark-sim/node.json"
# The GPU a rank holds open while it lives, as a CUDA context holds /dev/nvidia0: the nvidia-smi
# stand-in lists the processes that have it open (tests/standins/bin/nvidia-smi, GPU_DEVICE).
GPU_DEVICE = ROOT + "/var/lib/spark-sim/gpu/nvidia0"
# GB10 memory as torch sees it.
GPU_TOTAL_GIB = 119.7
GIB = 1024 ** 3
GLOO_PAIR = "[../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error"
HUB_LIB = "/usr/local/lib/python3.12/dist-packages"
REASONING = "17 × 23 = 17 × 20 + 17 × 3 = 340 + 51 = 391"
ANSWER = "391"
CORRUPTIONS = ("fffd", "wrong-answer", "bad-tool-args")
# The knobs every engine's stand-in has (tests/standins/README.md): its start, the GPU it holds, and how it
# serves (speed and faults, read at each request).
SERVING_DEFAULTS = {
    "rendezvous_timeout": None,
    "load_seconds": 1.0,
    "output_corruption": [],
    "hub_reachable": False,
    "watchdog_seconds": None,
    "hang": False,
    "gpu_release_seconds": 0,
    "resident_gib": None,
    "token_seconds": 0.0,
    "ttft_seconds": None,
    "prefill_tokens_per_second": 0,
    "concurrency_slowdown": 0.0,
    "error_every": 0,
    "error_status": 503,
    "cut_every": 0,
    "recall": False,
    # A build that breaks tokens now and then (the field report): this share of the answers that hold characters of
    # corrupt_scripts (hangul, han; empty: any non-ASCII) come out with each such character as U+FFFD, and this
    # share of the tool calls lose their arguments' closing brace. Counted per engine, so a rate is exact: 0.5 is
    # every second such answer.
    # A rank that slows down as it serves (a leak): each request makes a token take this share longer.
    "token_seconds_growth": 0.0,
    "corrupt_rate": 0.0,
    "corrupt_scripts": [],
    "bad_tool_call_rate": 0.0,
}
SCRIPTS = {"hangul": ((0xAC00, 0xD7A3), (0x1100, 0x11FF), (0x3130, 0x318F)),
           "han": ((0x4E00, 0x9FFF), (0x3400, 0x4DBF))}


class Voice:
    """How an engine speaks: its log lines, how an uncaught exception ends it, its source tree's paths."""

    # The GLM-5.3 model code's frame that opens processor_config.json, in the engine's tree.
    model_code = "models/glm5_next.py"
    # The environment variables get_ip() reads, and where its warning comes from.
    host_ip_env = ("HOST_IP",)
    get_ip_source = "utils.py:1"
    # What the lingering GPU holder's scope says it is.
    rank_name = "rank"

    def log(self, message, rank=None):
        raise NotImplementedError

    def fail(self, exc_line, rank=None, where=None):
        raise NotImplementedError


VOICE = Voice()


def speak_as(voice):
    """The engine whose voice the shared machinery speaks with (one per process)."""
    global VOICE  # noqa: PLW0603 - one engine per process
    VOICE = voice


def read_knobs(section, defaults):
    """Section `section` of the node's knobs over `defaults`, the image's own build over both."""
    try:
        with open(KNOBS) as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {}
    out = dict(defaults)
    out.update(data.get(section, {}))
    # The image's own build (the docker stand-in's registry knob): its tile, say, over the node's.
    out.update(json.loads(os.environ.get("SPARK_SIM_IMAGE_KNOBS") or "{}"))
    # The checkpoint's own build (its standin-build.json, read by check_model): what its weights do to the output.
    out.update(json.loads(os.environ.get(CHECKPOINT_KNOBS_ENV) or "{}"))
    out["compute_cap"] = str(data.get("gpu", {}).get("compute_cap", "12.1"))
    corruption = out.get("output_corruption") or []
    out["output_corruption"] = [corruption] if isinstance(corruption, str) else list(corruption)
    return out


def raw(text):
    sys.stdout.write(text.rstrip("\n") + "\n")
    sys.stdout.flush()


def c10d(level, source, message):
    """A line of torch's c10d logger: [W1129 10:03:05.123456789 socket.cpp:759] [c10d] ..."""
    now = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e9):09d}"
    raw(f"[{level}{stamp} {source}] [c10d] {message}")


def nccl_debug(level, message):
    """NCCL prints its INFO/WARN lines only when NCCL_DEBUG asks for them."""
    wanted = os.environ.get("NCCL_DEBUG", "").upper()
    if wanted == "INFO" or (wanted in ("WARN", "TRACE") and level == "WARN") or wanted == "TRACE":
        raw(f"{socket.gethostname()}:{os.getpid()}:{threading.get_native_id()} [0] {message}")



def container_path(path):
    """Undo the docker stand-in's mount translation for what the server reports.

    The real server only ever sees container paths; here docker hands over host
    paths plus SPARK_SIM_MOUNTS ([[host, container], ...]) to say where they came from.
    """
    try:
        mounts = json.loads(os.environ.get("SPARK_SIM_MOUNTS", "[]"))
    except ValueError:
        mounts = []
    for source, container in sorted(mounts, key=lambda m: -len(m[0])):
        host = source.rstrip("/")
        if path == host or path.startswith(host + "/"):
            return container.rstrip("/") + path[len(host):]
    return path


# --- the model path: a local directory, else the hub ------------------------------


def truthy(value):
    return str(value or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def processor_config_missing(path):
    raw("Traceback (most recent call last):\n"
        f'  File "{VOICE.model_code}", line 418, in load_processor_config\n'
        '    with open(os.path.join(model_path, "processor_config.json")) as f:')
    raw(f"FileNotFoundError: [Errno 2] No such file or directory: '{path}'")
    sys.exit(1)


CAUSE = "\nThe above exception was the direct cause of the following exception:\n"


def exception(frame, exc_line):
    """One link of a chained traceback."""
    raw(f"Traceback (most recent call last):\n{frame}")
    raw(exc_line)
    raw(CAUSE)


def hub_config(model_path, k):
    """The engine reads the model's config.json; a path that is not a directory goes to the hub."""
    repo = container_path(model_path)
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    offline_doc = "'https://huggingface.co/docs/transformers/installation#offline-mode'."
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", repo) or ".." in repo:
        exception(f'  File "{HUB_LIB}/huggingface_hub/utils/_validators.py", line 154, in validate_repo_id',
                  "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
                  f"'namespace/repo_name': '{repo}'. Use `repo_type` argument if needed.")
        VOICE.fail(f"OSError: Incorrect path_or_model_id: '{repo}'. Please provide either the path to a local folder or "
             "the repo_id of a model on the Hub.", where="launcher")
    if truthy(os.environ.get("HF_HUB_OFFLINE")) or truthy(os.environ.get("TRANSFORMERS_OFFLINE")):
        exception(f'  File "{HUB_LIB}/transformers/utils/hub.py", line 479, in cached_files\n    hf_hub_download(',
                  "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested files in the disk cache "
                  "and outgoing traffic has been disabled. To enable hf.co look-ups and downloads online, set "
                  "'local_files_only' to False.")
        VOICE.fail(f"OSError: We couldn't connect to '{endpoint}' to load the files, and couldn't find them in the cached "
             f"files.\nCheck your internet connection or see how to run the library in offline mode at {offline_doc}",
             where="launcher")
    if not k["hub_reachable"]:
        # The nodes have no network: the name does not even resolve.
        host = endpoint.split("://", 1)[-1].split("/", 1)[0]
        port = 443 if endpoint.startswith("https") else 80
        exception(f'  File "{HUB_LIB}/urllib3/connection.py", line 198, in _new_conn\n'
                  "    sock = connection.create_connection(",
                  "socket.gaierror: [Errno -3] Temporary failure in name resolution")
        exception(f'  File "{HUB_LIB}/huggingface_hub/file_download.py", line 1546, in _get_metadata_or_catch_error',
                  f"requests.exceptions.ConnectionError: (MaxRetryError(\"HTTPSConnectionPool(host='{host}', "
                  f"port={port}): Max retries exceeded with url: /{repo}/resolve/main/config.json (Caused by "
                  "NameResolutionError(\\\"<urllib3.connection.HTTPSConnection object at 0x7f3a5c2b1f10>: Failed to "
                  f"resolve '{host}' ([Errno -3] Temporary failure in name resolution)\\\"))\"), "
                  "'(Request ID: 6f1c2a74-93e4-4bd5-a3a1-0b6f0c1d9e2a)')")
        exception(f'  File "{HUB_LIB}/transformers/utils/hub.py", line 479, in cached_files\n    hf_hub_download(',
                  "huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the file "
                  "on the Hub and we cannot find the requested files in the local cache. Please check your connection "
                  "and try again or make sure your Internet connection is on.")
        VOICE.fail(f"OSError: We couldn't connect to '{endpoint}' to load this file, couldn't find it in the cached files "
             f"and it looks like {repo} is not the path to a directory containing a file named config.json.\n"
             f"Checkout your internet connection or see how to run the library in offline mode at {offline_doc}",
             where="launcher")
    # The hub answers: config.json comes down, then the model code opens processor_config.json by path.
    raw("config.json: 100%|██████████| 6.12k/6.12k [00:00<00:00, 21.3MB/s]")
    processor_config_missing(os.path.join(repo, "processor_config.json"))


# A synthetic checkpoint's standin-build.json: serving knobs standing for what that build's weights do (a build that
# garbles Korean, say), over the node's and the image's for as long as the rank serves it.
CHECKPOINT_KNOBS_FILE = "standin-build.json"
CHECKPOINT_KNOBS_ENV = "SPARK_SIM_CHECKPOINT_KNOBS"


def check_model(model_path, k):
    """The engine reads the config (a non-directory goes to the hub); the GLM-5.3 code opens processor_config.json."""
    if not os.path.isdir(model_path):
        hub_config(model_path, k)
    path = os.path.join(model_path, "processor_config.json")
    if not os.path.isfile(path):
        processor_config_missing(container_path(path))
    try:
        with open(os.path.join(model_path, CHECKPOINT_KNOBS_FILE)) as f:
            os.environ[CHECKPOINT_KNOBS_ENV] = json.dumps(json.load(f))
    except FileNotFoundError:
        os.environ.pop(CHECKPOINT_KNOBS_ENV, None)

# --- network helpers ---------------------------------------------------------------


SIOCGIFADDR = 0x8915


def interface_address(name):
    """The IPv4 address of an interface, None if it does not exist or has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def source_address(host):
    """The address this node leaves through towards host (the kernel's route choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return s.getsockname()[0]
        except OSError:
            return None


def nccl_address(spec, towards):
    """NCCL_SOCKET_IFNAME: comma-separated prefixes, =name exact, ^name excluded; unset: the route's choice."""
    entries = [e for e in (spec or "").split(",") if e]
    wanted = [e for e in entries if not e.startswith("^")]
    if not wanted:
        addr = source_address(towards)
        excluded = [e[1:].lstrip("=") for e in entries if e.startswith("^")]
        names = [n for _, n in socket.if_nameindex() if interface_address(n) == addr]
        return None if addr and any(n.startswith(x) for n in names for x in excluded) else addr or "127.0.0.1"
    for _, name in socket.if_nameindex():
        for entry in wanted:
            exact = entry.startswith("=")
            if (name == entry[1:]) if exact else name.startswith(entry):
                addr = interface_address(name)
                if addr:
                    return addr
    return None


def get_ip():
    """The engine's get_ip() (SGLang's is vLLM's): its host-IP variables, else the route towards 8.8.8.8, else 0.0.0.0."""
    for name in VOICE.host_ip_env:
        if os.environ.get(name):
            return os.environ[name]
    ip = source_address("8.8.8.8")
    if ip:
        return ip
    names = " or ".join(VOICE.host_ip_env)
    raw(f"{VOICE.get_ip_source}: UserWarning: Failed to get the IP address, using 0.0.0.0 by default."
        f"The value can be set by the environment variable {names}.\n  warnings.warn(")
    return "0.0.0.0"


def split_addr(addr):
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def fingerprint(settings, own=()):
    """What every rank must agree on (a mismatch would garble TP output): its settings less its own ones."""
    keep = {k: v for k, v in settings.items() if k not in own}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def send(conn, payload):
    conn.sendall((json.dumps(payload) + "\n").encode())


class Lines:
    """Newline-delimited JSON over a socket, with deadlines."""

    def __init__(self, conn):
        self.conn = conn
        self.buf = b""

    def read(self, deadline):
        """The next message; None at the deadline; raises EOFError when the peer is gone."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic() if deadline else None
            if left is not None and left <= 0:
                return None
            ready, _, _ = select.select([self.conn], [], [], left)
            if not ready:
                return None
            try:
                chunk = self.conn.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

# --- multi-node init: TCPStore, Gloo, NCCL, the broadcast queue ----------------------


class Group:
    """One rank's side of the group: `addr` (HOST:PORT) is rank 0's TCPStore, `agreed` the fingerprint of what
    every rank must have been launched with."""

    def __init__(self, rank, nnodes, addr, agreed, timeout):
        self.rank = rank
        self.nnodes = nnodes
        self.addr = addr
        self.agreed = agreed
        self.timeout = timeout
        self.host, self.port = split_addr(addr)
        self.peers = {}  # rank -> Lines, rank 0 holds one per worker, workers one to rank 0
        self.keep = []  # sockets a real group keeps open (Gloo pairs, NCCL rings)

    # The TCPStore on rank 0 (listening on every address, as torch's TCPStore server does).

    def store_server(self):
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(("", self.port))
        except OSError as err:
            VOICE.fail("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                 f"address. port: {self.port}, useIpv6: 0, code: -{err.errno}, name: "
                 f"{'EADDRINUSE' if err.errno == 98 else 'EACCES'}, message: {err.strerror.lower()}", 0)
        server.listen(16)
        VOICE.log(f"Rank 0 waiting for {self.nnodes - 1} other rank(s) at {self.addr}", 0)
        deadline = time.monotonic() + self.timeout
        mine = self.agreed
        while len(self.peers) < self.nnodes - 1:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([server], [], [], left)[0]:
                VOICE.fail(f"torch.distributed.DistStoreError: Timed out after {int(self.timeout) + 1} seconds waiting for "
                     f"clients. {len(self.peers) + 1}/{self.nnodes} clients joined.", 0)
            conn, addr = server.accept()
            lines = Lines(conn)
            try:
                hello = lines.read(time.monotonic() + 10)
            except (EOFError, ValueError):
                hello = None
            if not isinstance(hello, dict):
                conn.close()
                continue
            rank = hello.get("rank")
            if hello.get("fingerprint") != mine:
                send(conn, {"ok": False})
                VOICE.fail(f"RuntimeError: rank {rank} at {addr[0]} was launched with different server arguments "
                     f"(fingerprint {hello.get('fingerprint')} != {mine}); all ranks must run the same arguments.", 0)
            if not isinstance(rank, int) or not 0 < rank < self.nnodes or rank in self.peers:
                send(conn, {"ok": False})
                VOICE.fail(f"RuntimeError: invalid or duplicate node rank {rank} from {addr[0]}", 0)
            self.peers[rank] = lines
            VOICE.log(f"Rank {rank} joined from {addr[0]}", 0)
        for lines in self.peers.values():
            send(lines.conn, {"ok": True})
        # torch's TCPStore server lives as long as the process group: it keeps listening on every
        # address and serves whoever connects (a later client, a port scan) without the group noticing.
        threading.Thread(target=self.hold_later_clients, args=(server,), name="tcpstore", daemon=True).start()

    @staticmethod
    def hold_later_clients(server):
        """Accept and hold every later connection to a listener the group keeps, until its client closes it."""
        clients = []
        while True:
            ready, _, _ = select.select([server, *clients], [], [])
            for sock in ready:
                if sock is server:
                    try:
                        clients.append(server.accept()[0])
                    except OSError:
                        pass
                    continue
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    clients.remove(sock)
                    sock.close()


    def store_client(self):
        deadline = time.monotonic() + self.timeout
        VOICE.log(f"Rank {self.rank} connecting to {self.addr}", self.rank)
        seen = set()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                ms = int(self.timeout * 1000)
                c10d("E", "socket.cpp:1023", f"The client socket has timed out after {ms}ms while trying to connect "
                     f"to ({self.host}, {self.port}).")
                VOICE.fail(f"torch.distributed.DistNetworkError: The client socket has timed out after {ms}ms while trying "
                     f"to connect to ({self.host}, {self.port}).", self.rank)
            try:
                conn = socket.create_connection((self.host, self.port), timeout=min(5.0, left))
                break
            except OSError as err:
                code = err.errno or 110
                if code not in seen:
                    seen.add(code)
                    reason = os.strerror(code) if err.errno else "Connection timed out"
                    c10d("W", "socket.cpp:759", f"The client socket has failed to connect to [{self.host}]:{self.port} "
                         f"(errno: {code} - {reason}).")
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        conn.settimeout(None)
        lines = Lines(conn)
        send(conn, {"rank": self.rank, "fingerprint": self.agreed})
        try:
            answer = lines.read(time.monotonic() + self.timeout)
        except (EOFError, ValueError):
            answer = None
        if not answer or not answer.get("ok"):
            VOICE.fail("RuntimeError: rank 0 refused this rank", self.rank)
        self.peers[0] = lines

    # Keys through the store: every rank publishes a value, every rank gets the table.

    def exchange(self, key, value, on_timeout):
        deadline = time.monotonic() + self.timeout
        if self.rank != 0:
            send(self.peers[0].conn, {"key": key, "value": value})
            try:
                msg = self.peers[0].read(deadline)
            except EOFError:
                VOICE.fail("torch.distributed.DistNetworkError: failed to recv, got 0 bytes", self.rank)
            if msg is None:
                VOICE.fail(on_timeout, self.rank)
            return {int(r): v for r, v in msg["table"].items()}
        table = {0: value}
        waiting = dict(self.peers)
        while waiting:
            left = deadline - time.monotonic()
            live = {lines.conn: r for r, lines in waiting.items() if lines.conn.fileno() >= 0}
            if left <= 0:
                VOICE.fail(on_timeout, 0)
            if not live:
                # A store does not notice a client that went away: its key just never comes.
                time.sleep(min(left, 0.5))
                continue
            ready, _, _ = select.select(list(live), [], [], left)
            for conn in ready:
                rank = live[conn]
                try:
                    msg = waiting[rank].read(deadline)
                except EOFError:
                    conn.close()
                    continue
                if msg and msg.get("key") == key:
                    table[rank] = msg["value"]
                    del waiting[rank]
        for lines in self.peers.values():
            send(lines.conn, {"key": key, "table": table})
        return table

    def mesh(self, table, listener, on_timeout):
        """Every pair connects once: the lower rank dials the higher one's listener."""
        deadline = time.monotonic() + self.timeout
        for peer in sorted(table):
            if peer <= self.rank:
                continue
            host, port = table[peer]
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    VOICE.fail(on_timeout, self.rank)
                try:
                    self.keep.append(socket.create_connection((host, port), timeout=min(5.0, left)))
                    break
                except OSError:
                    time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        for _ in [p for p in table if p < self.rank]:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([listener], [], [], left)[0]:
                VOICE.fail(on_timeout, self.rank)
            self.keep.append(listener.accept()[0])

    def gloo(self):
        """The CPU group: Gloo binds to GLOO_SOCKET_IFNAME's address (or the hostname's)."""
        ifname = os.environ.get("GLOO_SOCKET_IFNAME")
        if ifname:
            addr = interface_address(ifname)
            if addr is None:
                VOICE.fail("RuntimeError: [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/device.cc:84] "
                     f"ifa != nullptr. Unable to find address for: {ifname}", self.rank)
        else:
            try:
                addr = socket.gethostbyname(socket.gethostname())
            except OSError:
                c10d("W", "ProcessGroupGloo.cpp:721", "Warning: Unable to resolve hostname to a (local) address. Using "
                     "the loopback address as fallback. Manually set the network interface to bind to with "
                     "GLOO_SOCKET_IFNAME. (function operator())")
                addr = "127.0.0.1"
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((addr, 0))
        listener.listen(16)
        message = f"Gloo connectFullMesh failed with {GLOO_PAIR}"
        on_timeout = f"RuntimeError: {message}"
        table = self.exchange("gloo", [addr, listener.getsockname()[1]], on_timeout)
        self.mesh(table, listener, on_timeout)
        listener.close()

    def nccl(self):
        """pynccl: rank 0's bootstrap address travels in the unique id; NCCL_SOCKET_IFNAME picks the interface."""
        ifname = os.environ.get("NCCL_SOCKET_IFNAME")
        if ifname:
            nccl_debug("INFO", f"NCCL INFO NCCL_SOCKET_IFNAME set by environment to {ifname}")
        addr = nccl_address(ifname, self.host)
        if addr is None:
            nccl_debug("WARN", "bootstrap.cc:45 NCCL WARN Bootstrap : no socket interface found")
            nccl_debug("INFO", "NCCL INFO init.cc:82 -> 5")
            VOICE.fail("RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)", self.rank)
        nccl_debug("INFO", f"NCCL INFO Bootstrap : Using {ifname or 'auto'}:{addr}<0>")
        # NCCL's network: IB on the RoCE devices it can use (the RoCE stand-in's), else its socket transport,
        # without failing (tests/standins/README.md, all_reduce_perf: the same choice).
        hcas = roce_port.nccl_ib_devices(os.environ)
        if hcas:
            devs = " ".join(f"[{i}]{h}:1/RoCE" for i, h in enumerate(hcas))
            nccl_debug("INFO", f"NCCL INFO NET/IB : Using {devs} [RO]; OOB {ifname or 'auto'}:{addr}<0>")
        else:
            nccl_debug("INFO", "NCCL INFO NET/IB : No device found.")
            nccl_debug("INFO", f"NCCL INFO NET/Socket : Using [0]{ifname or 'auto'}:{addr}<0>")
        nccl_debug("INFO", f"NCCL INFO Using network {'IB' if hcas else 'Socket'}")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((addr, 0))
        listener.listen(16)
        table = self.exchange("nccl", [addr, listener.getsockname()[1]],
                              "RuntimeError: NCCL error: remote process exited or there was a network error")
        root = table[0]
        deadline = time.monotonic() + self.timeout
        if self.rank == 0:
            for _ in range(len(table) - 1):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([listener], [], [], left)[0]:
                    VOICE.fail("RuntimeError: NCCL error: remote process exited or there was a network error", 0)
                self.keep.append(listener.accept()[0])
        else:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    nccl_debug("WARN", f"socket.cc:484 NCCL WARN socketStartConnect: Connect to {root[0]}<{root[1]}> "
                               "failed : Connection timed out")
                    VOICE.fail("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
                         self.rank)
                try:
                    self.keep.append(socket.create_connection(tuple(root), timeout=min(5.0, left)))
                    break
                except OSError:
                    time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        listener.close()

    def broadcast_queue(self):
        """Rank 0's shm_broadcast writer advertises get_ip(); readers on other nodes dial it and wait, forever."""
        if self.rank == 0:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("", 0))
            listener.listen(16)
            self.exchange("shm_broadcast", [get_ip(), listener.getsockname()[1]],
                          "RuntimeError: NCCL error: remote process exited or there was a network error")
            # wait_until_ready: no timeout, like the real MessageQueue.
            for _ in range(len(self.peers)):
                self.keep.append(listener.accept()[0])
            # Its socket stays bound on every address (tcp://*:port) for the life of the queue.
            threading.Thread(target=self.hold_later_clients, args=(listener,), name="shm_broadcast",
                             daemon=True).start()
            return
        table = self.exchange("shm_broadcast", None,
                              "RuntimeError: NCCL error: remote process exited or there was a network error")
        host, port = table[0]
        while True:  # ZMQ keeps dialling: a wrong address is an endless wait, not an error.
            try:
                self.keep.append(socket.create_connection((host, port), timeout=5))
                return
            except OSError:
                time.sleep(0.5)

    def init(self):
        if self.rank == 0:
            self.store_server()
        else:
            self.store_client()
        self.gloo()
        self.nccl()
        self.broadcast_queue()
        return list(self.peers.values())


def peer_lost(rank):
    VOICE.log("[NCCL] Connection closed by remote peer; NCCL communicator was aborted", rank)
    raw("RuntimeError: NCCL error: remote process exited or there was a network error")
    os._exit(1)


def collective(peers, rank, timeout, seq):
    """A barrier between start-up steps (the engines all-reduce memory figures there): every rank waits for all.

    A peer that died fails it with NCCL's error; one that never comes trips the watchdog, or with no
    timeout (an RPC through the broadcast queue, which has none) is waited for forever. Between
    collectives a rank does not notice a peer's death, as with NCCL: two ranks that fail the same
    check each print their own error.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        if rank == 0:
            for lines in peers:
                if lines.read(deadline) is None:
                    raise TimeoutError
            for lines in peers:
                send(lines.conn, {"barrier": seq})
        else:
            for lines in peers:
                send(lines.conn, {"barrier": seq})
                if lines.read(deadline) is None:
                    raise TimeoutError
    except (EOFError, OSError) as err:
        if isinstance(err, TimeoutError):
            raw(f"[rank{rank}]:[E ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation timeout: "
                f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)={int(timeout * 1000)}) "
                f"ran for {int(timeout * 1000) + 1} milliseconds before timing out.")
            VOICE.fail(f"torch.distributed.DistBackendError: [Rank {rank}] Watchdog caught collective operation timeout: "
                 f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE) ran for {int(timeout * 1000) + 1} milliseconds before "
                 "timing out.", rank)
        peer_lost(rank)


def watchdog_abort(rank, seq, timeout):
    """NCCL's watchdog: a collective that outlived the process group's timeout takes the process down.

    The real rank aborts (std::terminate, SIGABRT): docker run reports 134. The stand-in exits with
    134 itself, so that no core file is written on a machine whose core_pattern is a plain file.
    """
    ms = int(timeout * 1000)
    work = f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)={ms})"
    caught = f"[Rank {rank}] Watchdog caught collective operation timeout: {work} ran for {ms + 13} milliseconds " \
             "before timing out."
    pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}]"
    raw(f"[rank{rank}]:[E ProcessGroupNCCL.cpp:632] {caught}")
    raw(f"[rank{rank}]:[E ProcessGroupNCCL.cpp:1664] {pg} Exception (either an error or timeout) detected by "
        f"watchdog at work: {seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.")
    raw(f"[rank{rank}]:[E ProcessGroupNCCL.cpp:630] [Rank {rank}] Some NCCL operations have failed or timed out. Due "
        "to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete "
        "data.")
    raw(f"[rank{rank}]:[E ProcessGroupNCCL.cpp:636] [Rank {rank}] To avoid data inconsistency, we are taking the "
        "entire process down.")
    raw("terminate called after throwing an instance of 'c10::DistBackendError'")
    raw(f"  what():  {pg} Process group watchdog thread terminated with exception: {caught}")
    os._exit(134)


class TPGroup:
    """Rank 0's side of the serving collectives: every decoding step is an all-reduce across all ranks.

    Each step goes to every other rank over its connection on the fabric and needs its answer, as
    tensor parallelism does: a frozen peer (SIGSTOP, a deadlock) stalls generation while /health and
    /v1/models still answer; after the watchdog timeout the rank aborts like NCCL's watchdog. A peer
    whose connection drops (it died) takes this rank down at once: a serving TP group dies together.
    """

    def __init__(self, peers, rank, watchdog):
        self.peers = peers
        self.rank = rank
        self.watchdog = watchdog
        self.seq = 2  # the start-up barriers were 1 and 2
        self.acked = [0] * len(peers)
        self.cond = threading.Condition()
        self.one_at_a_time = threading.Lock()  # one forward pass (batch) at a time
        for i, lines in enumerate(peers):
            threading.Thread(target=self.answers, args=(i, lines), daemon=True).start()

    def answers(self, i, lines):
        while True:
            try:
                msg = lines.read(None)
            except (EOFError, ValueError):
                peer_lost(self.rank)
            if isinstance(msg, dict) and isinstance(msg.get("ack"), int):
                with self.cond:
                    self.acked[i] = msg["ack"]
                    self.cond.notify_all()

    def step(self):
        """One decoding step's collective; returns when every rank took part in it."""
        if not self.peers:
            return
        with self.one_at_a_time:
            self.seq += 1
            seq = self.seq
            try:
                for lines in self.peers:
                    send(lines.conn, {"step": seq})
            except OSError:
                peer_lost(self.rank)
            deadline = time.monotonic() + self.watchdog
            with self.cond:
                while min(self.acked) < seq:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        watchdog_abort(self.rank, seq, self.watchdog)
                    self.cond.wait(left)


def take_part(peers, rank):
    """A worker rank's serving loop: answer each of rank 0's steps; die with rank 0."""
    (lines,) = peers
    while True:
        try:
            msg = lines.read(None)
        except (EOFError, ValueError):
            peer_lost(rank)
        if isinstance(msg, dict) and isinstance(msg.get("step"), int):
            try:
                send(lines.conn, {"ack": msg["step"]})
            except OSError:
                peer_lost(rank)

def run_main(main):
    """Run an engine's main(argv) as its process: an uncaught error prints as the real server's does, exit 1."""
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit:
        raise
    except Exception:  # noqa: BLE001 - print like an uncaught error in the real server
        traceback.print_exc(file=sys.stdout)
        sys.exit(1)


def worker_serves(peers, rank):
    """A rank other than 0 once started: it answers rank 0's collectives until the group ends; never returns."""
    if peers:
        take_part(peers, rank)
    threading.Event().wait()


def serve_http(engine, host, port, listening):
    """Rank 0's HTTP server; `listening()` logs what the engine logs once it is bound."""
    httpd = NumericHTTPServer((host, port), make_handler(engine))
    listening()
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass


# --- the GPU: held from CUDA initialisation until the process ends, and for a while after ------------

# Memory that ended ranks still hold on this node's GPU: one file per holding process (its pid, its
# start time, GiB). Under /run, so that a power cycle clears it as it clears the GPU.
HELD_DIR = ROOT + "/run/spark-sim/gpu-held"
GPU = {"fd": None, "holder": None, "alive": None}


def start_time(pid):
    """A process's start time (clock ticks since boot): with the pid, what tells it from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def hold_gpu(k):
    """The rank's CUDA context: the GPU's device stays open until the process ends, however it ends.

    With gpu_release_seconds, the memory outlives the process by that long, as a large unified-memory
    context takes time to tear down: a holder process keeps the device open (nvidia-smi lists it once
    the rank is gone) and the memory the rank held counted (held_by_others), then lets go.
    """
    os.makedirs(os.path.dirname(GPU_DEVICE), exist_ok=True)
    GPU["fd"] = os.open(GPU_DEVICE, os.O_RDWR | os.O_CREAT, 0o666)
    seconds = float(k["gpu_release_seconds"] or 0)
    if seconds > 0:
        GPU["holder"] = lingering_holder(seconds)
        record_held(0.0)


def lingering_holder(seconds):
    """Fork the process that holds the GPU for `seconds` after this one ends (stopped, killed or crashed).

    It inherits the open device, leaves the container's process group (docker stop and kill signal
    the group) and the unit's cgroup (dockerd runs a container's processes in docker-<id>.scope, so
    the unit's stop does not wait for them), ignores termination signals, and waits for this process's
    end: the write end of a pipe that only this process holds reads EOF then, however it ends.
    """
    alive_r, alive_w = os.pipe()
    ready_r, ready_w = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(alive_w)
            os.close(ready_r)
            os.setsid()
            # docker run reads the rank's output until EOF: the holder must not keep it open.
            null = os.open(os.devnull, os.O_RDWR)
            for std in (0, 1, 2):
                os.dup2(null, std)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            leave_unit(os.getpid(), seconds)
            os.write(ready_w, b"1")
            os.close(ready_w)
            while os.read(alive_r, 1):
                pass
            time.sleep(seconds)
            try:
                os.unlink(os.path.join(HELD_DIR, str(os.getpid())))
            except OSError:
                pass
        finally:
            os._exit(0)
    os.close(alive_r)
    os.close(ready_w)
    GPU["alive"] = alive_w
    select.select([ready_r], [], [], 10)
    os.close(ready_r)
    return pid


def leave_unit(pid, seconds):
    """On a node: move the holder into a scope of its own, docker-<container id>.scope, as dockerd does.

    Asked of systemd over D-Bus (StartTransientUnit with the process's PID), never on a workstation
    (SPARK_SIM_ROOT set: a test's directory, not a node). Without it, the unit's stop would kill the
    holder with the rank.
    """
    if os.environ.get("SPARK_SIM_ROOT") or not os.path.isdir("/run/systemd/system"):
        return
    cid = os.path.basename(os.environ.get("SPARK_SIM_CGROUP", "").rstrip("/"))
    scope = f"docker-{cid}.scope" if cid else f"spark-sim-gpu-{pid}.scope"
    try:
        subprocess.run(["busctl", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                        "org.freedesktop.systemd1.Manager", "StartTransientUnit", "ssa(sv)a(sa(sv))", scope, "fail",
                        "3", "PIDs", "au", "1", str(pid), "Description", "s",
                        f"GPU memory of {VOICE.rank_name}, held {seconds:g} s after the rank ends",
                        "CollectMode", "s", "inactive-or-failed", "0"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=15,
                       check=False)
    except (OSError, subprocess.SubprocessError):
        pass


def record_held(gib):
    """The GiB this rank holds on the GPU, for the holder to keep counted after the rank ends."""
    holder = GPU["holder"]
    if holder is None:
        return
    os.makedirs(HELD_DIR, exist_ok=True)
    path = os.path.join(HELD_DIR, str(holder))
    with open(path + ".tmp", "w") as f:
        f.write(f"{holder} {start_time(holder)} {gib}\n")
    os.replace(path + ".tmp", path)


def held_by_others():
    """GiB of this node's GPU that other processes still hold (ranks whose memory is not released yet)."""
    total = 0.0
    try:
        names = os.listdir(HELD_DIR)
    except FileNotFoundError:
        return total
    for name in names:
        if not name.isdigit() or int(name) == GPU["holder"]:
            continue
        path = os.path.join(HELD_DIR, name)
        try:
            with open(path) as f:
                pid, started, gib = f.read().split()
        except (OSError, ValueError):
            continue
        if start_time(int(pid)) != started:
            # Its holder is gone (or the pid is another process's now): nothing held.
            try:
                os.unlink(path)
            except OSError:
                pass
            continue
        total += float(gib)
    return total


# --- memory: charged to the container's cgroup ---------------------------------------


def cgroup_file(name):
    folder = os.environ.get("SPARK_SIM_CGROUP")
    return os.path.join(folder, name) if folder else None


def charge(gib, rank):
    """The rank now holds gib of the container's memory; over memory.max the kernel kills it."""
    record_held(gib)
    current = cgroup_file("memory.current")
    if current is None:
        return
    used = int(gib * GIB)
    with open(current, "w") as f:
        f.write(f"{used}\n")
    try:
        with open(cgroup_file("memory.max")) as f:
            limit = f.read().strip()
    except FileNotFoundError:
        return
    if limit != "max" and used > int(limit):
        with open(cgroup_file("memory.events"), "w") as f:
            f.write("low 0\nhigh 0\nmax 1\noom 1\noom_kill 1\n")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)



# --- serving: continuous batching, Prometheus, the chat model, HTTP ----------------------------


class Batch:
    """Continuous batching on rank 0, as SGLang's and vLLM's schedulers serve: at most `limit` requests run at
    once and the others wait in the queue, first come first served (their wait is part of their time to
    first token). A request's prefill gives its first token after `ttft_seconds` (default: one decoding
    step) plus its prompt tokens at `prefill_tokens_per_second` (0: no time), with one collective across
    the ranks; prefills do not delay one another or the decoding steps. Then each decoding step gives one
    token to every request that joined before the step began, takes `token_seconds` x (1 +
    `concurrency_slowdown` x (running requests - 1)), and is one collective across the ranks (TPGroup).
    """

    def __init__(self, group, limit):
        self.group = group
        self.limit = max(1, int(limit))
        self.cond = threading.Condition()
        self.queue = collections.deque()
        self.running = 0  # admitted: in prefill or decoding
        self.decoding = 0  # waiting for decoding steps
        self.started = 0  # decoding steps begun
        self.done = 0  # decoding steps finished
        self.step_seconds = 0.0
        self.slowdown = 0.0
        self.metrics = None  # the engine's Prometheus collectors, told of every step
        threading.Thread(target=self.stepper, daemon=True).start()

    def admit(self):
        ticket = object()
        with self.cond:
            self.queue.append(ticket)
            while self.queue[0] is not ticket or self.running >= self.limit:
                self.cond.wait()
            self.queue.popleft()
            self.running += 1
            self.cond.notify_all()

    def leave(self, decoding):
        with self.cond:
            self.running -= 1
            self.decoding -= 1 if decoding else 0
            self.cond.notify_all()

    def join(self):
        """Join the decoding batch: the steps that begin from now on give this request a token each."""
        with self.cond:
            self.decoding += 1
            self.cond.notify_all()
            return self.started

    def wait_step(self, number):
        """Until decoding step `number` has finished; returns how many have."""
        with self.cond:
            while self.done < number:
                self.cond.wait()
            return self.done

    def stepper(self):
        due = None
        while True:
            with self.cond:
                while self.decoding == 0:
                    due = None
                    self.cond.wait()
                running = self.running
                decoding = self.decoding
                self.started += 1
            seconds = self.step_seconds * (1 + self.slowdown * max(0, running - 1))
            now = time.monotonic()
            # Steps keep their own clock, so the time this thread waits for the GIL is not added to every
            # step; a lag of more than a step (a stalled machine) is not made up in a burst.
            due = now + seconds if due is None or due < now - seconds else due + seconds
            if due > now:
                time.sleep(due - now)
            self.group.step()
            if self.metrics is not None:
                self.metrics.decoded(decoding)
            with self.cond:
                self.done += 1
                self.cond.notify_all()


EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"


def go_float(value):
    """A sample value or bucket bound as prometheus_client prints it (floatToGoString)."""
    value = float(value)
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    # Go switches to exponents sooner than Python (8128902.0 is 8.128902e+06).
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def label_text(labels):
    return ",".join(f'{key}="{str(value)}"'.replace("\n", "\\n") for key, value in labels.items())


class Histogram:
    def __init__(self, bounds):
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * len(self.bounds)
        self.total = 0
        self.sum = 0.0

    def observe(self, value):
        self.sum += value
        self.total += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name, labels):
        out = [f"{name}_sum{{{label_text(labels)}}} {go_float(self.sum)}"]
        for bound, count in zip(self.bounds, self.counts, strict=True):
            out.append(f'{name}_bucket{{le="{go_float(bound)}",{label_text(labels)}}} {go_float(count)}')
        out.append(f'{name}_bucket{{le="+Inf",{label_text(labels)}}} {go_float(self.total)}')
        out.append(f"{name}_count{{{label_text(labels)}}} {go_float(self.total)}")
        return out


class Metrics:
    """What a serving rank counts for its Prometheus endpoint; each engine names and labels it (families()).

    Counters of prompt and generation tokens and of finished requests (by finish reason), incremented when
    a request finishes; histograms of the time to first token (from the request's arrival, its wait in the
    queue included), of that wait alone, of the latency between output tokens (each decoding step's gap,
    divided among the tokens it brought) and of the end-to-end latency; the tokens the running requests
    hold in the KV pool (`pool_tokens`) and the prompt tokens looked up in the prefix cache; the generation
    throughput measured over every `interval` decoding steps, as a scheduler logs it. Gauges are read when
    /metrics is asked.
    """

    def __init__(self, batch, pool_tokens, buckets, interval=40):
        self.lock = threading.Lock()
        self.batch = batch
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests = 0
        self.reasons = collections.Counter()
        self.cache_queries = 0
        self.ttft = Histogram(buckets["ttft"])
        self.itl = Histogram(buckets["itl"])
        self.e2e = Histogram(buckets["e2e"])
        self.queue_time = Histogram(buckets.get("queue", buckets["e2e"]))
        self.pool_tokens = max(1, int(pool_tokens))
        self.used_tokens = 0
        self.interval = max(1, interval)
        self.steps = 0
        self.step_tokens = 0
        self.since = time.monotonic()
        self.gen_throughput = 0.0

    def decoded(self, tokens):
        """One decoding step gave `tokens` tokens (one per running request): the scheduler's log interval."""
        with self.lock:
            self.steps += 1
            self.step_tokens += tokens
            self.used_tokens += tokens
            if self.steps % self.interval == 0:
                now = time.monotonic()
                self.gen_throughput = self.step_tokens / max(now - self.since, 1e-9)
                self.step_tokens, self.since = 0, now

    def admitted(self, prompt_tokens, waited):
        with self.lock:
            self.used_tokens += prompt_tokens
            self.cache_queries += prompt_tokens
            self.queue_time.observe(waited)

    def first_token(self, seconds):
        with self.lock:
            self.ttft.observe(seconds)

    def tokens(self, gap, count):
        with self.lock:
            for _ in range(count):
                self.itl.observe(gap / count)

    def finished(self, prompt_tokens, completion_tokens, seconds, held, reason="stop"):
        with self.lock:
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += completion_tokens
            self.requests += 1
            self.reasons[reason] += 1
            self.e2e.observe(seconds)
            self.used_tokens = max(0, self.used_tokens - held)

    def released(self, held):
        """A request that ended without finishing (the client gave up) gives its tokens back."""
        with self.lock:
            self.used_tokens = max(0, self.used_tokens - held)

    def families(self, running, queued, used):
        """[(name, type, help, [(labels, value or Histogram), ...])], in the order the engine serves them."""
        raise NotImplementedError

    def exposition(self):
        with self.batch.cond:
            running, queued = self.batch.running, len(self.batch.queue)
        with self.lock:
            if running == 0:
                self.used_tokens = 0  # what a step's count and a request's end disagreed on, forgotten when idle
            used = min(self.used_tokens, self.pool_tokens)
            out = []
            for name, kind, help_text, samples in self.families(running, queued, used):
                out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
                for labels, value in samples:
                    if kind == "histogram":
                        out += value.lines(name, labels)
                    else:
                        out.append(f"{name}{{{label_text(labels)}}} {go_float(value)}")
        return "\n".join(out) + "\n"


class Engine:
    """Rank 0's serving side, what every engine does alike: the batch, the knobs read at each request, the
    faults they inject, the chat model's answer. An engine's subclass says what its API looks like (the
    hooks below the line)."""

    def __init__(self, k, group, *, limit, model_id, counts_path, knobs_reader, corrupt=()):
        self.model_id = model_id
        self.lock = threading.Lock()
        self.corrupt = set(corrupt)
        self.group = group
        self.token_seconds = float(k["token_seconds"] or 0)
        self.hang_at_start = bool(k["hang"])
        self.start_knobs = k
        self.read_knobs = knobs_reader
        self.batch = Batch(group, limit)
        self.counts_path = counts_path
        self.counted = {"requests": 0, "errors": 0, "cuts": 0}
        self.rated = {"answers": 0, "tool_calls": 0}
        self.metrics = None

    def serving_knobs(self):
        """The speed and fault knobs, read at each request so that a test can change them on a serving rank."""
        try:
            k = self.read_knobs()
        except ValueError:  # the knobs file is being rewritten
            k = self.start_knobs
        return k

    def run(self, k, prompt_tokens, steps, on_token=None, reason="stop"):
        """A request through the batch: queue, prefill (the first token), then one token per decoding step.

        on_token(n) is called after the n-th token (n = 1..steps), catching up when steps ran meanwhile.
        The metrics see the request as the engines' do: its time to first token from its arrival (the queue
        included), each step's gap between tokens, and its end.
        """
        arrived = time.monotonic()
        metrics = self.metrics
        growth = float(k.get("token_seconds_growth") or 0)
        if growth > 0:
            with self.lock:
                self.token_seconds *= 1 + growth
        self.batch.admit()
        if metrics is not None:
            metrics.admitted(prompt_tokens, time.monotonic() - arrived)
        decoding = False
        made = 0
        try:
            ttft = k["ttft_seconds"]
            seconds = self.token_seconds if ttft is None else float(ttft)
            rate = float(k["prefill_tokens_per_second"] or 0)
            if rate > 0:
                seconds += prompt_tokens / rate
            if seconds > 0:
                time.sleep(seconds)
            self.group.step()
            made = 1
            last = time.monotonic()
            if metrics is not None:
                metrics.first_token(last - arrived)
            if on_token:
                on_token(1)
            if steps > 1:
                self.batch.step_seconds = self.token_seconds
                self.batch.slowdown = float(k["concurrency_slowdown"] or 0)
                base = self.batch.join()
                decoding = True
                while made < steps:
                    done = self.batch.wait_step(base + made)
                    new = 0
                    while made < steps and base + made <= done:
                        made += 1
                        new += 1
                        if on_token:
                            on_token(made)
                    if metrics is not None and new:
                        now = time.monotonic()
                        metrics.tokens(now - last, new)
                        last = now
            if metrics is not None:
                metrics.finished(prompt_tokens, steps, time.monotonic() - arrived, prompt_tokens + steps - 1,
                                 reason)
                metrics = None
        finally:
            self.batch.leave(decoding)
            if metrics is not None:
                metrics.released(prompt_tokens + max(0, made - 1))

    def count(self, k, streamed):
        """Which fault the knobs inject into this request: an HTTP error, a cut stream, or none.

        Every error_every-th chat completion answers error_status; else every cut_every-th streamed one
        loses its connection half-way. The counts go to the engine's file under /run/spark-sim for the tests.
        """
        with self.lock:
            self.counted["requests"] += 1
            n = self.counted["requests"]
            fault = None
            if int(k["error_every"] or 0) > 0 and n % int(k["error_every"]) == 0:
                fault = "error"
                self.counted["errors"] += 1
            elif streamed and int(k["cut_every"] or 0) > 0 and n % int(k["cut_every"]) == 0:
                fault = "cut"
                self.counted["cuts"] += 1
            path = self.counts_path
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(self.counted, f)
            os.replace(path + ".tmp", path)
        return fault

    def hangs(self):
        """The hang knob, read at each request, so that a test can make a serving rank hang."""
        try:
            return bool(self.read_knobs()["hang"])
        except ValueError:  # the knobs file is being rewritten
            return self.hang_at_start

    def garble(self, text):
        """Bytes of multi-byte characters come out broken: U+FFFD in their place."""
        if "fffd" not in self.corrupt or not isinstance(text, str):
            return text
        return "".join("\ufffd" if ord(ch) > 127 else ch for ch in text)

    def _rated(self, counter, rate):
        """Whether this one of the answers (or tool calls) the rate counts is a bad one: n*rate crossed an integer."""
        if not rate or float(rate) <= 0:
            return False
        with self.lock:
            self.rated[counter] += 1
            n = self.rated[counter]
        return int(n * float(rate)) > int((n - 1) * float(rate))

    def break_now_and_then(self, texts):
        """The corrupt_rate knob: the characters of corrupt_scripts become U+FFFD in this share of the answers
        that hold any (texts unchanged otherwise)."""
        k = self.serving_knobs()
        scripts = [SCRIPTS[name] for name in (k.get("corrupt_scripts") or []) if name in SCRIPTS]

        def hit(ch):
            cp = ord(ch)
            return any(lo <= cp <= hi for ranges in scripts for lo, hi in ranges) if scripts else cp > 127

        if not any(hit(ch) for text in texts for ch in text) or not self._rated("answers", k.get("corrupt_rate")):
            return texts
        return ["".join("\ufffd" if hit(ch) else ch for ch in text) for text in texts]

    def thought(self, body):
        """What the model thinks and answers: (reasoning, answer, reasoning tokens, answer tokens)."""
        prompt = prompt_text(body)
        if "17" in prompt and "23" in prompt:
            reasoning, answer = REASONING, ANSWER
        else:
            reasoning, answer = f"The user wrote: {prompt[:80]}. A short reply will do.", "OK"
            if self.serving_knobs()["recall"]:
                answer = " ".join(recalled(prompt)) or answer
        fixed = body.get("ignore_eos") and _positive(body.get("max_tokens"))
        if fixed:
            # ignore_eos: exactly max_tokens tokens, the thinking first (one word a token).
            n = int(body["max_tokens"])
            words = [FILLER[i % len(FILLER)] for i in range(n)]
            reasoning, answer = " ".join(words[: n // 2]), " ".join(words[n // 2:])
        if "wrong-answer" in self.corrupt:
            reasoning, answer = reasoning.replace("391", "394").replace("51", "54"), answer.replace("391", "394")
        reasoning_tokens = len(reasoning.split()) * 3 + 1
        answer_tokens = max(1, len(answer.split()))
        if fixed:
            reasoning_tokens, answer_tokens = len(reasoning.split()), len(answer.split())
        reasoning, answer = self.break_now_and_then([self.garble(reasoning), answer])
        return reasoning, answer, reasoning_tokens, answer_tokens

    def tool_call(self, tools):
        """The call the model writes for the first tool: (name, its arguments, the API's tool call)."""
        function = (tools[0] or {}).get("function", {})
        name = function.get("name", "tool")
        params = (function.get("parameters") or {}).get("properties") or {}
        arguments = {key: "Beijing" if key in ("city", "location") else "x" for key in params}
        text = json.dumps(arguments, ensure_ascii=False)
        if "bad-tool-args" in self.corrupt or self._rated("tool_calls", self.serving_knobs().get("bad_tool_call_rate")):
            text = text[:-1]  # the closing brace never came out
        call = {"id": "call_" + hashlib.sha256(name.encode()).hexdigest()[:24], "index": 0, "type": "function",
                "function": {"name": name, "arguments": self.garble(text)}}
        return name, arguments, call

    @staticmethod
    def raw_tool_call(name, arguments):
        """GLM's tool-call markup, as the model writes it (what a parser that does not know it leaves in content)."""
        return f"<tool_call>{name}" + "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>"
                                              for k, v in arguments.items()) + "</tool_call>"

    # --- the engine's API: each engine's subclass answers these --------------------------------------

    def access_log(self, handler, code):
        raise NotImplementedError

    def authorized(self, handler):
        """True, or the engine's 401 sent."""
        raise NotImplementedError

    def get(self, handler, path):
        """Answer a GET (after authorized())."""
        raise NotImplementedError

    def request_id(self):
        raise NotImplementedError

    def error_body(self, status, message, kind, param=True):
        raise NotImplementedError

    def reject(self, body):
        """(status, message) of a request the engine refuses before generating, or None."""
        raise NotImplementedError

    def chat(self, body):
        """(message, finish_reason, usage) of a chat completion."""
        raise NotImplementedError

    def chunk(self, rid, created, model, delta, reason):
        raise NotImplementedError

    def completion(self, rid, body, message, finish, usage):
        raise NotImplementedError

    def served(self, rid, body, message, usage):
        """What the engine logs once a request is served."""


class NumericHTTPServer(ThreadingHTTPServer):
    """Binds the address it is given and resolves no name.

    http.server.HTTPServer.server_bind asks the resolver for the bound address's name
    (socket.getfqdn), a DNS query about a test address; nothing here reads server_name.
    """

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = host
        self.server_port = port


def stream_pieces(message):
    """What a stream sends, delta by delta: the reasoning, then the content, word by word; tool calls whole."""
    out = []
    for field in ("reasoning_content", "content"):
        if isinstance(message.get(field), str) and message[field]:
            out += [(field, word) for word in re.findall(r"\s*\S+", message[field])]
    if message.get("tool_calls"):
        out.append(("tool_calls", message["tool_calls"]))
    return out or [("content", message.get("content") or "")]


# The words of a fixed-length output (ignore_eos): one token each.
FILLER = ("the", "stream", "keeps", "going", "while", "tokens", "arrive", "one", "by", "one")
LONG_WORD = re.compile(r"[a-z]{5,}")


class StreamCut(Exception):
    """The cut_every knob: the connection drops half-way through a stream."""


def _positive(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def prompt_text(body):
    messages = body.get("messages") or []
    return " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


def prompt_tokens(body):
    """What the tokenizer makes of the messages here: a word a token, plus 8 for the chat template."""
    return len(prompt_text(body).split()) + 8


def recalled(prompt):
    """A toy long-context recall (knob `recall`): the sentences that share at least two words of five
    letters or more with the prompt's last question."""
    sentences = re.split(r"(?<=[.?!])\s+", prompt.strip())
    question = next((i for i in range(len(sentences) - 1, -1, -1) if sentences[i].endswith("?")), None)
    if question is None:
        return []
    keys = set(LONG_WORD.findall(sentences[question].lower()))
    return [x for i, x in enumerate(sentences)
            if i != question and len(keys & set(LONG_WORD.findall(x.lower()))) >= 2][:8]


def make_handler(engine):
    class Handler(BaseHTTPRequestHandler):
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, fmt, *a):
            engine.access_log(self, a[1] if len(a) > 1 else "")

        def send_json(self, code, payload):
            data = json.dumps(payload, ensure_ascii=False).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def send_text(self, code, data, content_type=None):
            self.send_response(code)
            if content_type:
                self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def until_the_client_leaves(self):
            """A request that never finishes stays open until the client gives up (closes its end)."""
            conn = self.connection
            while True:
                if select.select([conn], [], [], 1.0)[0]:
                    try:
                        if not conn.recv(1, socket.MSG_PEEK):
                            return
                    except OSError:
                        return
                    time.sleep(1.0)  # it sent more: still there

        def event(self, payload):
            self.wfile.write(b"data: " + (payload if isinstance(payload, bytes) else
                                          json.dumps(payload, ensure_ascii=False).encode()) + b"\n\n")

        def stream(self, rid, body, message, finish, usage, *, k, cut=False):
            """Server-sent events, a chunk as soon as the steps that make it have run."""
            created, model = int(time.time()), body.get("model", engine.model_id)

            def chunk(delta, reason=None):
                return engine.chunk(rid, created, model, delta, reason)

            pieces = stream_pieces(message)
            steps = usage["completion_tokens"]
            # Piece i is out once its share of the steps has run.
            due = [min(steps, -(-(i + 1) * steps // len(pieces))) for i in range(len(pieces))]
            sent = 0

            def on_token(step):
                nonlocal sent
                if cut and step > steps // 2:
                    raise StreamCut
                while sent < len(pieces) and due[sent] <= step:
                    field, value = pieces[sent]
                    delta = {"role": "assistant"} if sent == 0 else {}
                    if field == "tool_calls":
                        value = [{**call, "index": i} for i, call in enumerate(value)]
                    delta[field] = value
                    self.event(chunk(delta))
                    sent += 1

            engine.run(k, usage["prompt_tokens"], steps, on_token, finish)
            self.event(chunk({}, finish))
            if (body.get("stream_options") or {}).get("include_usage"):
                self.event({**chunk({}), "choices": [], "usage": usage})
            self.event(b"[DONE]")

        def do_GET(self):  # noqa: N802 - BaseHTTPRequestHandler's naming
            if engine.authorized(self):
                engine.get(self, self.path)

        def do_POST(self):  # noqa: N802
            if not engine.authorized(self):
                return
            if self.path != "/v1/chat/completions":
                self.send_json(404, {"detail": "Not Found"})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            except ValueError:
                self.send_json(400, engine.error_body(400, "Invalid JSON", "BadRequestError", param=False))
                return
            try:
                self.generate(engine.request_id(), body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up: the request is aborted, as the real server aborts it

        def generate(self, rid, body):
            if engine.hangs():
                # A scheduler that hangs: no token, no error; a stream has its headers and nothing more.
                if body.get("stream"):
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.end_headers()
                self.until_the_client_leaves()
                return
            k = engine.serving_knobs()
            fault = engine.count(k, bool(body.get("stream")))
            if fault == "error":
                status = int(k["error_status"] or 503)
                self.send_json(status, engine.error_body(status, f"injected by the error_every knob ({status})",
                                                         "InternalServerError"))
                return
            problem = engine.reject(body)
            if problem:
                status, text = problem
                self.send_json(status, engine.error_body(status, text, "BadRequestError"))
                return
            message, finish, usage = engine.chat(body)
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            if body.get("stream"):
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.end_headers()
                try:
                    self.stream(rid, body, message, finish, usage, k=k, cut=fault == "cut")
                except StreamCut:
                    # The connection drops: no finish_reason, no [DONE].
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
            else:
                engine.run(k, usage["prompt_tokens"], usage["completion_tokens"], reason=finish)
            engine.served(rid, body, message, usage)
            if not body.get("stream"):
                self.send_json(200, engine.completion(rid, body, message, finish, usage))

    return Handler

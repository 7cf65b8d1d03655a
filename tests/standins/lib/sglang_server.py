#!/usr/bin/python3
"""Test stand-in for `python3 -m sglang.launch_server` serving GLM-5.3-Flash-NVFP4.

Installed by the harness at /usr/lib/spark-sim/sglang_server.py; the docker
stand-in runs it for the SGLang image. Standard library only (nodes run
Debian trixie's python3). It reproduces what the tests need to observe:

- argparse-like parsing: an unknown flag exits 2 with "unrecognized arguments".
- --model-path must be a local directory with processor_config.json, else the
  model code's FileNotFoundError (deployment-facts.md: a hub id fails this way).
- The hybrid (mamba/linear-attention) state cache error from deployment-facts.md
  when max-running-requests x context-length exceeds STATE_BUDGET request-tokens.
  STATE_BUDGET is 262144 (= 4 x 65536): the seed's 2 x 65536 starts, 8 x 65536
  or 2 x 262144 do not. Override with node.json {"sglang": {"state_budget": N}}.
- No GPU (docker ran without --gpus): "RuntimeError: No CUDA GPUs are available".
- Multi-node: rank 0 listens on --dist-init-addr and waits until every other
  rank has connected before it loads and serves; a rank whose peer goes away
  exits with an NCCL-style error (as a real TP group dies together).
- HTTP on rank 0 only: /health, /v1/models, /v1/chat/completions with the seed's
  behaviours: reasoning parser glm45 splits thinking into reasoning_content
  (content "391"); without it thinking and </think> leak into content; tool
  calls come back empty (content "", tool_calls null) with parser glm and
  properly with glm47; --api-key requires "Authorization: Bearer KEY".
- Log lines like the real server's, including decode lines with
  `cuda graph: True` and a radix cache with a MAMBA component.
"""

import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KNOBS = os.environ.get("SPARK_SIM_ROOT", "") + "/etc/spark-sim/node.json"
STATE_BUDGET = 4 * 65536
HYBRID_ERROR = (
    "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
    "max_mamba_cache_size=1, mamba_ratio=5, resulting max_num_reqs=0."
)
REASONING = "17 × 23 = 17 × 20 + 17 × 3 = 340 + 51 = 391"
ANSWER = "391"


def knobs():
    try:
        with open(KNOBS) as f:
            return json.load(f).get("sglang", {})
    except FileNotFoundError:
        return {}


def log(message, rank=None):
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    where = "" if rank is None else f" TP{rank}"
    sys.stdout.write(f"[{stamp}{where}] {message}\n")
    sys.stdout.flush()


def fail(exc_line, rank=None):
    """Die like an uncaught exception in the scheduler does."""
    sys.stdout.write("Traceback (most recent call last):\n"
                     '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2961, in '
                     "run_scheduler_process\n    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, "
                     "moe_ep_rank, pp_rank, dp_rank)\n")
    sys.stdout.write(exc_line + "\n")
    sys.stdout.flush()
    log("Received sigquit from a child process. It usually means the child failed.", rank)
    sys.exit(1)


def parser():
    p = argparse.ArgumentParser(prog="launch_server.py", allow_abbrev=True)
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--tokenizer-path")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", "--nccl-init-addr")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--attention-backend")
    p.add_argument("--dsa-prefill-backend")
    p.add_argument("--dsa-decode-backend")
    p.add_argument("--moe-runner-backend", default="auto")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--disable-shared-experts-fusion", action="store_true")
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--context-length", type=int)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--served-model-name")
    p.add_argument("--api-key")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-requests", action="store_true")
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--cuda-graph-max-bs", type=int)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--watchdog-timeout", type=float)
    p.add_argument("--dist-timeout", type=int)
    p.add_argument("--chat-template")
    p.add_argument("--page-size", type=int)
    p.add_argument("--random-seed", type=int)
    return p


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


def check_model(args):
    """The GLM-5.3 model code opens processor_config.json by path, before any weights."""
    path = os.path.join(args.model_path, "processor_config.json")
    if not os.path.isfile(path):
        path = container_path(path)
        sys.stdout.write("Traceback (most recent call last):\n"
                         '  File "/sgl-workspace/sglang/python/sglang/srt/models/glm5_next.py", line 418, in '
                         "load_processor_config\n    with open(os.path.join(model_path, \"processor_config.json\")) "
                         "as f:\n")
        sys.stdout.write(f"FileNotFoundError: [Errno 2] No such file or directory: '{path}'\n")
        sys.stdout.flush()
        sys.exit(1)


def check_state_cache(args, rank):
    budget = int(knobs().get("state_budget", STATE_BUDGET))
    reqs = args.max_running_requests or 48
    context = args.context_length or 1048576
    if reqs * context > budget:
        log(f"Hybrid state cache: {reqs} requests x {context} tokens > {budget} request-tokens", rank)
        fail(HYBRID_ERROR, rank)


# --- rendezvous over --dist-init-addr --------------------------------------


def split_addr(addr):
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def fingerprint(args):
    """What every rank must agree on (a mismatch would garble TP output)."""
    keep = {k: v for k, v in vars(args).items() if k not in ("node_rank", "host", "port", "api_key")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def rendezvous_head(args, timeout):
    host, port = split_addr(args.dist_init_addr)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, port))
    server.listen(16)
    server.settimeout(1.0)
    log(f"Rank 0 waiting for {args.nnodes - 1} other rank(s) at {args.dist_init_addr}", 0)
    peers = {}
    deadline = time.monotonic() + timeout
    mine = fingerprint(args)
    while len(peers) < args.nnodes - 1:
        if time.monotonic() > deadline:
            fail(f"torch.distributed.DistStoreError: Timed out after {timeout} seconds waiting for clients. "
                 f"{len(peers) + 1}/{args.nnodes} clients joined.", 0)
        try:
            conn, addr = server.accept()
        except TimeoutError:
            continue
        conn.settimeout(10)
        try:
            hello = json.loads(conn.makefile().readline())
        except (OSError, ValueError):
            conn.close()
            continue
        rank = hello.get("rank")
        if hello.get("fingerprint") != mine:
            conn.sendall(b'{"ok": false}\n')
            fail(f"RuntimeError: rank {rank} at {addr[0]} was launched with different server arguments "
                 f"(fingerprint {hello.get('fingerprint')} != {mine}); all ranks must run the same arguments.", 0)
        if not isinstance(rank, int) or not 0 < rank < args.nnodes or rank in peers:
            conn.sendall(b'{"ok": false}\n')
            fail(f"RuntimeError: invalid or duplicate node rank {rank} from {addr[0]}", 0)
        peers[rank] = conn
        log(f"Rank {rank} joined from {addr[0]}", 0)
    for conn in peers.values():
        conn.sendall(b'{"ok": true}\n')
        conn.settimeout(None)
    server.close()
    return list(peers.values())


def rendezvous_worker(args, timeout):
    host, port = split_addr(args.dist_init_addr)
    deadline = time.monotonic() + timeout
    log(f"Rank {args.node_rank} connecting to {args.dist_init_addr}", args.node_rank)
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                fail(f"torch.distributed.DistNetworkError: The client socket has timed out after {timeout}s while "
                     f"trying to connect to ({host}, {port}).", args.node_rank)
            time.sleep(0.5)
    conn.sendall((json.dumps({"rank": args.node_rank, "fingerprint": fingerprint(args)}) + "\n").encode())
    answer = json.loads(conn.makefile().readline() or '{"ok": false}')
    if not answer.get("ok"):
        fail("RuntimeError: rank 0 refused this rank", args.node_rank)
    conn.settimeout(None)
    return [conn]


def watch_peers(conns, rank):
    """A TP group dies together: when a peer's connection drops, so does this rank."""
    def watch(conn):
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        log("[NCCL] Connection closed by remote peer; NCCL communicator was aborted", rank)
        sys.stdout.write("RuntimeError: NCCL error: remote process exited or there was a network error\n")
        sys.stdout.flush()
        os._exit(1)

    for conn in conns:
        threading.Thread(target=watch, args=(conn,), daemon=True).start()


# --- HTTP on rank 0 ----------------------------------------------------------


class Engine:
    def __init__(self, args):
        self.args = args
        self.model_id = args.served_model_name or container_path(args.model_path)
        self.lock = threading.Lock()
        self.total_tokens = 0

    def decode_log(self, tokens):
        with self.lock:
            self.total_tokens += tokens
            log(f"Decode batch. #running-req: 1, #token: {self.total_tokens}, token usage: 0.01, cuda graph: True, "
                "gen throughput (token/s): 38.41, #queue-req: 0", 0)

    def chat(self, body):
        messages = body.get("messages") or []
        prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        tools = body.get("tools") or []
        if tools:
            return self.tool_reply(tools)
        if "17" in prompt and "23" in prompt:
            reasoning, answer = REASONING, ANSWER
        else:
            reasoning, answer = f"The user wrote: {prompt[:80]}. A short reply will do.", "OK"
        reasoning_tokens = len(reasoning.split()) * 3 + 1
        answer_tokens = max(1, len(answer.split()))
        self.decode_log(reasoning_tokens + answer_tokens)
        if self.args.reasoning_parser == "glm45":
            message = {"role": "assistant", "content": answer, "reasoning_content": reasoning, "tool_calls": None}
        else:
            # No reasoning parser: the thinking and its closing tag stay in the text.
            message = {"role": "assistant", "content": f"{reasoning}, so the answer is {answer}.</think>{answer}",
                       "reasoning_content": None, "tool_calls": None}
        usage = {"prompt_tokens": len(prompt.split()) + 8, "completion_tokens": reasoning_tokens + answer_tokens,
                 "reasoning_tokens": reasoning_tokens}
        return message, "stop", usage

    def tool_reply(self, tools):
        function = (tools[0] or {}).get("function", {})
        name = function.get("name", "tool")
        params = (function.get("parameters") or {}).get("properties") or {}
        arguments = {key: "Beijing" if key in ("city", "location") else "x" for key in params}
        self.decode_log(24)
        usage = {"prompt_tokens": 64, "completion_tokens": 24, "reasoning_tokens": 0}
        if self.args.tool_call_parser == "glm47":
            call = {"id": "call_" + hashlib.sha256(name.encode()).hexdigest()[:24], "index": 0, "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
            message = {"role": "assistant", "content": None, "reasoning_content": None, "tool_calls": [call]}
            return message, "tool_calls", usage
        if self.args.tool_call_parser == "glm":
            # The silent failure of deployment-facts.md: success, nothing usable.
            return {"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": None}, "stop", usage
        raw = f"<tool_call>{name}" + "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>"
                                             for k, v in arguments.items()) + "</tool_call>"
        return {"role": "assistant", "content": raw, "reasoning_content": None, "tool_calls": None}, "stop", usage


def make_handler(engine):
    class Handler(BaseHTTPRequestHandler):
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, fmt, *a):
            log(f'{self.client_address[0]}:{self.client_address[1]} - "{self.command} {self.path} '
                f'HTTP/1.1" {a[1] if len(a) > 1 else ""}', 0)

        def send_json(self, code, payload):
            data = json.dumps(payload, ensure_ascii=False).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorized(self):
            key = engine.args.api_key
            if not key or self.path == "/health":
                return True
            if self.headers.get("Authorization") == f"Bearer {key}":
                return True
            self.send_json(401, {"error": "Unauthorized"})
            return False

        def do_GET(self):  # noqa: N802 - BaseHTTPRequestHandler's naming
            if not self.authorized():
                return
            if self.path == "/health":
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()
            elif self.path == "/v1/models":
                self.send_json(200, {"object": "list", "data": [{
                    "id": engine.model_id, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                    "root": engine.model_id, "max_model_len": engine.args.context_length}]})
            else:
                self.send_json(404, {"detail": "Not Found"})

        def do_POST(self):  # noqa: N802
            if not self.authorized():
                return
            if self.path != "/v1/chat/completions":
                self.send_json(404, {"detail": "Not Found"})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            except ValueError:
                self.send_json(400, {"object": "error", "message": "Invalid JSON", "type": "BadRequestError",
                                     "code": 400})
                return
            message, finish, usage = engine.chat(body)
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            self.send_json(200, {
                "id": hashlib.sha256(str(time.time_ns()).encode()).hexdigest()[:32], "object": "chat.completion",
                "created": int(time.time()), "model": body.get("model", engine.model_id),
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                             "matched_stop": 151336 if finish == "stop" else None}],
                "usage": usage})

    return Handler


def main(argv):
    args = parser().parse_args(argv)
    rank = args.node_rank
    log(f"server_args=ServerArgs({', '.join(f'{k}={v!r}' for k, v in sorted(vars(args).items()) if k != 'api_key')})",
        rank)
    if os.environ.get("NVIDIA_VISIBLE_DEVICES") in (None, "", "void", "none"):
        fail("RuntimeError: No CUDA GPUs are available", rank)
    if args.tp_size != args.nnodes:
        fail(f"AssertionError: tp_size {args.tp_size} must equal nnodes {args.nnodes} x 1 GPU per node "
             "on this GB10 cluster", rank)
    if args.nnodes > 1 and not args.dist_init_addr:
        fail("ValueError: --dist-init-addr is required when --nnodes > 1", rank)
    check_model(args)
    timeout = int(knobs().get("rendezvous_timeout", args.dist_timeout or 600))
    conns = []
    if args.nnodes > 1:
        conns = rendezvous_head(args, timeout) if rank == 0 else rendezvous_worker(args, timeout)
        log(f"Init torch distributed ends. world_size={args.tp_size}, rank={rank}", rank)
        watch_peers(conns, rank)
    check_state_cache(args, rank)
    log(f"Load weight begin. avail mem=119.{40 + rank} GB", rank)
    time.sleep(float(knobs().get("load_seconds", 1.0)))
    log("Load weight end. type=Glm5NextForConditionalGeneration, dtype=torch.bfloat16, avail mem=28.73 GB, "
        "mem usage=90.68 GB.", rank)
    reqs = args.max_running_requests or 48
    log(f"Hybrid radix cache initialized: MambaRadixCache with MAMBA component, max_mamba_cache_size={reqs * 5}, "
        f"mamba_ratio=5, max_num_reqs={reqs}, full KV cache tokens={args.context_length}", rank)
    log("Capture cuda graph begin. This can take up to several minutes. avail mem=27.10 GB", rank)
    log("Capture cuda graph end. Time elapsed: 2.41 s. mem usage=0.61 GB. avail mem=26.49 GB.", rank)
    if rank != 0:
        log("Rank ready; serving is done by rank 0", rank)
        threading.Event().wait()
        return 0
    engine = Engine(args)
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(engine))
    log(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)", 0)
    log("The server is fired up and ready to roll!", 0)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit:
        raise
    except Exception:  # noqa: BLE001 - print like an uncaught error in the real server
        traceback.print_exc(file=sys.stdout)
        sys.exit(1)

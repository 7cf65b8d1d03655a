#!/usr/bin/python3
"""Test stand-in for `vllm serve` (the V1 engine, multiprocessing executor) serving GLM-5.3-Flash-NVFP4.

Installed by the harness at /usr/lib/spark-sim/vllm_server.py; the docker stand-in runs it for the vLLM
image (its ENTRYPOINT `vllm serve`, `--entrypoint vllm`, or a `python3 -c` launcher that runs the module
vllm.entrypoints.cli.main). Standard library only (nodes run Debian trixie's python3). What it shares with
the SGLang stand-in (the group over real sockets, collectives and NCCL's watchdog, the GPU, memory, batching,
HTTP) is engine_standin.py's, beside this file. In the order a real start meets them:

1. `vllm serve`'s argparse: an unknown flag exits 2 with "unrecognized arguments"; an unknown reasoning or
   tool-call parser, or --enable-auto-tool-choice without --tool-call-parser, is refused before anything.
2. No GPU in the container: vLLM cannot tell its platform. `--distributed-executor-backend ray`: the image
   has no Ray (vLLM's images stopped shipping it), ModuleNotFoundError then vLLM's ValueError.
3. The model: a local directory (a hub repo id goes to the hub, which the nodes cannot reach), whose
   processor_config.json the GLM-5.3 model code opens.
4. Each worker's free-memory check: GB10's 128 GB are shared with the OS, so --gpu-memory-utilization 0.90
   asks for more than is free at start and fails with vLLM's ValueError; 0.84 passes.
5. Multi-node without Ray: node 0 (--node-rank 0) runs rank 0's TCPStore on --master-addr:--master-port;
   every other node joins it with --headless and serves no HTTP. Then Gloo, NCCL's bootstrap and the
   broadcast queue (VLLM_HOST_IP), as for SGLang. A worker whose master address is its own loopback never
   joins: the head's store times out ("1/2 clients joined"). NCCL's communicator setup hangs at 100% CPU
   with about 0.7 GiB held when NCCL_IB_HCA is unset on a node with more than one RoCE device. A node whose
   systemd-logind removes IPC objects (RemoveIPC=yes) loses the shared-memory broadcast block: its rank
   logs "No available shared memory broadcast block found in 60 seconds" again and again.
6. Weights and the KV cache charged to the container's memory cgroup (OOM kill over docker's --memory).
7. The profile run: the sparse-MLA attention kernels have no sm_121 build unless the image carries the
   recipe's fix (knob sparse_mla_sm121, an image build's): cudaErrorNoKernelImageForDevice on a GB10.
8. The KV cache: what --gpu-memory-utilization leaves after the weights, less the linear-attention state
   of --max-num-seqs sequences, must hold --max-model-len tokens; else vLLM's ValueError.
9. HTTP on node 0 only: /health, /metrics (vLLM's V1 names), /version, /v1/models, /v1/chat/completions
   (also streamed) with the seed's parser behaviours; the API key guards /v1 only.
10. Generation needs every rank: each decoding step is a collective, as for SGLang.

Knobs: section "vllm" of /etc/spark-sim/node.json (tests/standins/README.md), section "gpu" key
"compute_cap".
"""

import argparse
import hmac
import http
import os
import re
import sys
import time
import uuid

# The shared machinery is beside this file; no __pycache__ beside it (the node's files are what the
# shared-node check and uninstall's comparison read).
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import engine_standin as es  # noqa: E402
from engine_standin import GPU_TOTAL_GIB, ROOT, container_path, prompt_tokens, raw, roce_port  # noqa: E402

VERSION = "0.19.1"
DEFAULTS = {
    **es.SERVING_DEFAULTS,
    # The image's build: whether its sparse-MLA kernels were built for sm_121 (the recipe's fix).
    "sparse_mla_sm121": False,
    # GB10's unified memory: what the OS and its page cache hold at start, what one rank's weights take,
    # what a token of KV cache and a sequence's linear-attention state take on one rank.
    "os_reserved_gib": 14.0,
    "weights_gib": 84.45,
    "kv_mib_per_token": 0.125,
    "state_gib_per_seq": 0.75,
}
# Activation peak of the profile run on one rank, kept out of the KV cache.
PROFILE_GIB = 4.0
# The model's max_position_embeddings: --max-model-len's default.
MODEL_MAX_LEN = 1048576
VLLM = "/usr/local/lib/python3.12/dist-packages/vllm"
REASONING_PARSERS = ("deepseek_r1", "deepseek_v3", "glm45", "granite", "hunyuan_a13b", "mistral", "qwen3", "step3")
TOOL_PARSERS = ("deepseek_v3", "deepseek_v31", "glm45", "glm47", "hermes", "llama3_json", "mistral", "pythonic",
                "qwen3_coder")
AUTO_TOOLS = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
COUNTS = ROOT + "/run/spark-sim/vllm-requests.json"


def knobs():
    return es.read_knobs("vllm", DEFAULTS)


# --- vLLM's logs ----------------------------------------------------------------------------------


def line(who, level, source, message):
    """A line of vLLM's logger, prefixed with the process that wrote it, as the V1 engine's processes do."""
    raw(f"({who} pid={os.getpid()}) {level} {time.strftime('%m-%d %H:%M:%S')} [{source}] {message}")


def api(message, source="api_server.py:1885"):
    line("APIServer", "INFO", source, message)


def worker(rank):
    return f"Worker_TP{rank}"


def uvicorn(message):
    raw(f"(APIServer pid={os.getpid()}) INFO:     {message}")


# Whether this process is a headless node's (no engine core, no API server to report a failure).
HEADLESS = [False]
FRAMES = {
    "launcher": f'  File "{VLLM}/entrypoints/cli/serve.py", line 59, in cmd\n    uvloop.run(run_server(args))',
    "worker": f'  File "{VLLM}/v1/executor/multiproc_executor.py", line 571, in worker_main\n'
              "    worker = WorkerProc(*args, **kwargs)",
    "engine": f'  File "{VLLM}/v1/engine/core.py", line 708, in run_engine_core\n'
              "    engine_core = EngineCoreProc(*args, **kwargs)",
}


def fail(exc_line, rank=0, where="worker"):
    """Die as vLLM's processes do: the failing process's traceback, then on node 0 the engine core's and the
    API server's (which names no cause of its own); a headless node has only its worker."""
    if where == "worker":
        line(worker(rank), "ERROR", "multiproc_executor.py:597", "WorkerProc failed to start.")
    elif where == "engine":
        line("EngineCore_DP0", "ERROR", "core.py:712", "EngineCore failed to start.")
    raw(f"Traceback (most recent call last):\n{FRAMES[where]}")
    raw(exc_line)
    if where != "launcher" and rank == 0 and not HEADLESS[0]:
        if where == "worker":
            line("EngineCore_DP0", "ERROR", "core.py:712", "EngineCore failed to start.")
            raw(f"Traceback (most recent call last):\n{FRAMES['engine']}")
            raw("Exception: WorkerProc initialization failed due to an exception in a background process. See stack "
                "trace for root cause.")
        raw(f'Traceback (most recent call last):\n  File "{VLLM}/v1/engine/utils.py", line 826, in wait_for_engine_'
            "startup")
        raw("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    sys.exit(1)


class Voice(es.Voice):
    """vLLM's log lines and tracebacks, for the shared machinery."""

    model_code = f"{VLLM}/model_executor/models/glm5_next.py"
    host_ip_env = ("VLLM_HOST_IP",)
    get_ip_source = f"{VLLM}/utils/network_utils.py:89"
    rank_name = "a vLLM rank"

    def log(self, message, rank=None):
        line(worker(rank or 0), "INFO", "parallel_state.py:1208", message)

    def fail(self, exc_line, rank=None, where="worker"):
        fail(exc_line, rank or 0, where)


# --- `vllm serve`'s arguments ---------------------------------------------------------------------


def max_len(text):
    """--max-model-len: a number of tokens, also with vLLM's k/m suffixes (64k = 65536, 1m = 1048576)."""
    match = re.fullmatch(r"(\d+)([kKmM]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"Invalid value '{text}' for --max-model-len")
    scale = {"": 1, "k": 1024, "m": 1024 * 1024}[match.group(2).lower()]
    return int(match.group(1)) * scale


VALUE_FLAGS = ["--tokenizer", "--revision", "--dtype", "--quantization", "--load-format", "--download-dir",
               "--chat-template", "--uvicorn-log-level", "--limit-mm-per-prompt", "--mm-processor-kwargs",
               "--compilation-config", "--hf-overrides", "--generation-config", "--override-generation-config",
               "--moe-backend", "--attention-backend", "--speculative-config"]
INT_FLAGS = ["--pipeline-parallel-size", "--data-parallel-size", "--seed", "--block-size", "--max-log-len",
             "--api-server-count"]
SWITCHES = ["--disable-log-stats", "--enable-log-requests", "--disable-log-requests", "--disable-custom-all-reduce",
            "--enable-chunked-prefill", "--disable-frontend-multiprocessing", "--async-scheduling",
            "--enable-expert-parallel"]


def parser():
    p = argparse.ArgumentParser(prog="vllm serve", usage="vllm serve [model_tag] [options]", allow_abbrev=False)
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--model", default="Qwen/Qwen3-0.6B")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--host")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key")
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--chat-template-content-format", choices=["auto", "string", "openai"], default="auto")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=max_len)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--kv-cache-dtype", default="auto",
                   choices=["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"])
    p.add_argument("--distributed-executor-backend", choices=["ray", "mp", "uni", "external_launcher"])
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    for flag in VALUE_FLAGS:
        p.add_argument(flag)
    for flag in INT_FLAGS:
        p.add_argument(flag, type=int)
    for flag in SWITCHES:
        p.add_argument(flag, action="store_true")
    return p


def parse(argv):
    if not argv or argv[0] != "serve":
        sub = argv[0] if argv else ""
        raw("usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...")
        raw(f"vllm: error: argument subparser: invalid choice: '{sub}' (choose from 'chat', 'complete', 'serve', "
            "'bench', 'collect-env', 'run-batch')")
        sys.exit(2)
    args = parser().parse_args(argv[1:])
    args.model = args.model_tag or args.model
    return args


def validate(args):
    """What `vllm serve` refuses before it starts anything (validate_parsed_serve_args, the parser registries)."""
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        fail("TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser", where="launcher")
    if args.tool_call_parser and args.tool_call_parser not in TOOL_PARSERS:
        fail(f"KeyError: 'invalid tool call parser: {args.tool_call_parser} (chose from {{ {','.join(TOOL_PARSERS)} "
             "}})'", where="launcher")
    if args.reasoning_parser and args.reasoning_parser not in REASONING_PARSERS:
        fail(f"KeyError: 'invalid reasoning parser: {args.reasoning_parser} (chose from "
             f"{{ {','.join(REASONING_PARSERS)} }})'", where="launcher")


def non_default(args):
    """What vLLM logs first: the arguments that differ from their defaults, never the API key."""
    defaults = vars(parser().parse_args([]))
    return {key: value for key, value in vars(args).items()
            if key not in ("api_key", "model_tag") and value != defaults.get(key)}


def fingerprint(args):
    """What every rank must agree on (a mismatch would garble TP output): not its rank, address or HTTP side."""
    return es.fingerprint(vars(args), own=("node_rank", "headless", "host", "port", "api_key", "served_model_name"))


# --- start-up checks ------------------------------------------------------------------------------


def no_ray():
    """The image has no Ray: vLLM's check for it fails on the import."""
    es.exception(f'  File "{VLLM}/v1/executor/ray_utils.py", line 52, in <module>\n    import ray',
                 "ModuleNotFoundError: No module named 'ray'")
    fail("ValueError: Failed to import Ray: No module named 'ray'. Please install Ray with `pip install ray`.",
         where="launcher")


def free_memory_check(args, k, rank):
    """Each worker's init_device: the share of the GPU asked for must be free at start. On GB10 the OS and its
    page cache hold part of the 128 GB, and ranks that ended lately may still hold theirs."""
    free = GPU_TOTAL_GIB - float(k["os_reserved_gib"]) - es.held_by_others()
    wanted = args.gpu_memory_utilization * GPU_TOTAL_GIB
    if free < wanted:
        fail(f"ValueError: Free memory on device ({free:.2f}/{GPU_TOTAL_GIB:.2f} GiB) on startup is less than desired "
             f"GPU memory utilization ({args.gpu_memory_utilization}, {wanted:.2f} GiB). Decrease GPU memory "
             "utilization or reduce GPU memory used by other processes.", rank)


def ib_unpinned():
    """NCCL with NCCL_IB_HCA unset on a node with more than one usable RoCE device (the RoCE stand-in's)."""
    return not os.environ.get("NCCL_IB_HCA") and len(roce_port.nccl_ib_devices(os.environ)) > 1


def nccl_comm_hangs(rank):
    """ncclCommInitRank across mismatched rails: NCCL's threads spin, nothing fails, nothing serves."""
    es.nccl_debug("INFO", "NCCL INFO NCCL_IB_HCA unset: using every device")
    line(worker(rank), "INFO", "pynccl.py:103", "vLLM is using nccl==2.27.7")
    es.charge(0.7, rank)
    while True:
        pass


def logind_removes_ipc():
    """systemd-logind's RemoveIPC as the node's configuration sets it: logind.conf, then its drop-ins in name
    order (/etc over /run over /usr/lib for one name). Only a set value counts: the compiled-in default is not
    taken as a removal, the ranks' IPC being root's."""
    files = [ROOT + "/etc/systemd/logind.conf"]
    dropins = {}
    for folder in ("/usr/lib/systemd/logind.conf.d", "/run/systemd/logind.conf.d", "/etc/systemd/logind.conf.d"):
        try:
            names = os.listdir(ROOT + folder)
        except OSError:
            continue
        for name in names:
            if name.endswith(".conf"):
                dropins[name] = ROOT + folder + "/" + name
    files += [dropins[name] for name in sorted(dropins)]
    value = None
    for path in files:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            continue
        section = None
        for raw_line in text.splitlines():
            entry = raw_line.strip()
            if entry.startswith("["):
                section = entry.strip("[]")
            elif section == "Login" and "=" in entry and not entry.startswith(("#", ";")):
                key, _, setting = entry.partition("=")
                if key.strip() == "RemoveIPC":
                    value = setting.strip().lower() in ("yes", "true", "on", "1")
    return bool(value)


def broadcast_block_gone(rank):
    """The broadcast block's semaphores were removed under the rank: it waits for a block that never comes."""
    interval = int(os.environ.get("VLLM_RINGBUFFER_WARNING_INTERVAL") or 60)
    while True:
        time.sleep(interval)
        line(worker(rank), "WARNING", "shm_broadcast.py:466",
             f"No available shared memory broadcast block found in {interval} seconds. This typically happens when "
             "some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache "
             "quantization).")


def profile_run(k, rank):
    """The profile run launches the sparse-MLA kernels: without an sm_121 build they cannot run on a GB10."""
    if k["compute_cap"].startswith("12.") and not k["sparse_mla_sm121"]:
        fail("torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device\n"
             "Search for `cudaErrorNoKernelImageForDevice' in "
             "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.\n"
             "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
             "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
             "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.", rank)


def kv_cache_tokens(args, k):
    """(GiB, tokens) of KV cache: the share asked for, less the weights, the profile's peak and the recurrent
    state of --max-num-seqs sequences (the 34 linear-attention layers keep one per sequence)."""
    pool = args.gpu_memory_utilization * GPU_TOTAL_GIB - float(k["weights_gib"]) - PROFILE_GIB
    gib = pool - args.max_num_seqs * float(k["state_gib_per_seq"])
    return gib, max(0, int(gib * 1024 / float(k["kv_mib_per_token"])))


def kv_cache(args, k):
    """The engine core sizes the KV cache; a --max-model-len it cannot hold fails the start."""
    gib, tokens = kv_cache_tokens(args, k)
    length = args.max_model_len or MODEL_MAX_LEN
    if gib <= 0:
        fail("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
             "initializing the engine.", where="engine")
    line(worker(0), "INFO", "gpu_worker.py:298", f"Available KV cache memory: {gib:.2f} GiB")
    if length > tokens:
        fail(f"ValueError: The model's max seq len ({length}) is larger than the maximum number of tokens that can be "
             f"stored in KV cache ({tokens}). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
             "when initializing the engine.", where="engine")
    line("EngineCore_DP0", "INFO", "kv_cache_utils.py:1087", f"GPU KV cache size: {tokens:,} tokens")
    line("EngineCore_DP0", "INFO", "kv_cache_utils.py:1091",
         f"Maximum concurrency for {length:,} tokens per request: {tokens / length:.2f}x")
    return tokens


# --- HTTP on node 0: vLLM's OpenAI-compatible server ------------------------------------------------

# vLLM's V1 Prometheus buckets (v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)


class Metrics(es.Metrics):
    """vLLM's V1 Prometheus logger: its names, help texts and labels ({model_name, engine}); counters end in
    _total as prometheus_client serves them. The KV cache usage is of the tokens the engine core sized."""

    def __init__(self, model_name, batch, pool_tokens):
        super().__init__(batch, pool_tokens, {"ttft": TTFT_BUCKETS, "itl": ITL_BUCKETS, "e2e": LATENCY_BUCKETS,
                                              "queue": LATENCY_BUCKETS})
        self.labels = {"model_name": model_name, "engine": "0"}

    def families(self, running, queued, used):
        own = self.labels
        return [
            ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", [(own, running)]),
            ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", [(own, queued)]),
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
             [(own, round(used / self.pool_tokens, 6))]),
            ("vllm:prefix_cache_queries_total", "counter",
             "Prefix cache queries, in terms of number of queried tokens.", [(own, self.cache_queries)]),
            ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
             [(own, 0)]),
            ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", [(own, self.prompt_tokens)]),
            ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
             [(own, self.generation_tokens)]),
            ("vllm:request_success_total", "counter", "Count of successfully processed requests.",
             [({**own, "finished_reason": reason}, self.reasons[reason]) for reason in ("stop", "length", "abort")]),
            ("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
             [(own, self.ttft)]),
            ("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
             [(own, self.itl)]),
            ("vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.",
             [(own, self.e2e)]),
            ("vllm:request_queue_time_seconds", "histogram",
             "Histogram of time spent in WAITING phase for request.", [(own, self.queue_time)]),
        ]


def context_problem(args, body):
    """vLLM's check of a request against --max-model-len, as its 400 says it."""
    limit = args.max_model_len or MODEL_MAX_LEN
    tokens = prompt_tokens(body)
    if tokens >= limit:
        return (f"This model's maximum context length is {limit} tokens. However, your request has {tokens} input "
                "tokens. Please reduce the length of the input messages.")
    wanted = body.get("max_tokens") if es._positive(body.get("max_tokens")) else None
    if wanted is not None and tokens + wanted > limit:
        return (f"'max_tokens' or 'max_completion_tokens' is too large: {wanted}. This model's maximum context "
                f"length is {limit} tokens and your request has {tokens} input tokens ({wanted} > {limit} - {tokens}).")
    return None


class Engine(es.Engine):
    def __init__(self, args, k, group, kv_tokens):
        names = args.served_model_name or [container_path(args.model)]
        super().__init__(k, group, limit=args.max_num_seqs, model_id=names[0], counts_path=COUNTS,
                         knobs_reader=knobs, corrupt=[c for c in k["output_corruption"] if c in es.CORRUPTIONS])
        self.args = args
        self.names = names
        self.root = container_path(args.model)
        self.max_len = args.max_model_len or MODEL_MAX_LEN
        # --api-key wins over VLLM_API_KEY, as in build_app.
        self.key = args.api_key or os.environ.get("VLLM_API_KEY") or None
        # Without stats vLLM creates no Prometheus logger: /metrics has none of its families.
        self.metrics = None if args.disable_log_stats else Metrics(self.model_id, self.batch, kv_tokens)
        self.batch.metrics = self.metrics

    def access_log(self, handler, code):
        try:
            phrase = http.HTTPStatus(int(code)).phrase
        except ValueError:
            phrase = ""
        uvicorn(f'{handler.client_address[0]}:{handler.client_address[1]} - "{handler.command} {handler.path} '
                f'HTTP/1.1" {code} {phrase}')

    def authorized(self, handler):
        """vLLM's API-key middleware: only /v1 paths want it, as `Authorization: Bearer <key>` to the letter."""
        path = handler.path.split("?", 1)[0]
        if not self.key or handler.command == "OPTIONS" or not path.startswith("/v1"):
            return True
        given = handler.headers.get("Authorization") or ""
        if hmac.compare_digest(given.encode(), f"Bearer {self.key}".encode()):
            return True
        handler.send_json(401, {"error": "Unauthorized"})
        return False

    def get(self, handler, path):
        path = path.split("?", 1)[0]
        if path in ("/health", "/ping"):
            handler.send_text(200, b"")
        elif path == "/metrics":
            body = self.metrics.exposition() if self.metrics is not None else ""
            handler.send_text(200, body.encode(), es.EXPOSITION)
        elif path == "/version":
            handler.send_json(200, {"version": VERSION})
        elif path == "/v1/models":
            created = int(time.time())
            handler.send_json(200, {"object": "list", "data": [
                {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": self.root,
                 "parent": None, "max_model_len": self.max_len} for name in self.names]})
        else:
            handler.send_json(404, {"detail": "Not Found"})

    def request_id(self):
        return f"chatcmpl-{uuid.uuid4().hex}"

    def error_body(self, status, message, kind, param=True):
        return {"error": {"message": message, "type": kind, "param": None, "code": status}}

    def tool_mode(self, body):
        """How the request uses its tools: None (no tools, or tool_choice none), auto, required or named."""
        if not body.get("tools"):
            return None
        choice = body.get("tool_choice", "auto")
        if choice == "none":
            return None
        return choice if choice in ("auto", "required") else "named"

    def reject(self, body):
        if self.tool_mode(body) == "auto" and not (self.args.enable_auto_tool_choice and self.args.tool_call_parser):
            return 400, AUTO_TOOLS
        problem = context_problem(self.args, body)
        return (400, problem) if problem else None

    def chat(self, body):
        mode = self.tool_mode(body)
        usage = {"prompt_tokens": prompt_tokens(body), "completion_tokens": 0, "prompt_tokens_details": None}
        base = {"role": "assistant", "content": None, "refusal": None, "annotations": None, "audio": None,
                "function_call": None, "tool_calls": [], "reasoning_content": None}
        if mode:
            name, arguments, call = self.tool_call(body["tools"])
            usage["completion_tokens"] = 24
            if mode == "auto" and self.args.tool_call_parser != "glm47":
                # A parser that does not know GLM-5.3's markup leaves it in the text.
                return {**base, "content": self.raw_tool_call(name, arguments)}, "stop", usage
            return {**base, "tool_calls": [call]}, "stop" if mode == "named" else "tool_calls", usage
        reasoning, answer, reasoning_tokens, answer_tokens = self.thought(body)
        usage["completion_tokens"] = reasoning_tokens + answer_tokens
        finish = "length" if body.get("ignore_eos") else "stop"
        if self.args.reasoning_parser == "deepseek_r1":
            return {**base, "content": answer, "reasoning_content": reasoning}, finish, usage
        if self.args.reasoning_parser == "glm45":
            # The seed's warning: vLLM's glm45 parser drops GLM-5.3's whole reply, and says nothing.
            return {**base, "content": ""}, finish, usage
        # No reasoning parser: the thinking and its closing tag stay in the text.
        return {**base, "content": f"{reasoning}, so the answer is {answer}.</think>{answer}"}, finish, usage

    def chunk(self, rid, created, model, delta, reason):
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason,
                             "stop_reason": None}]}

    def completion(self, rid, body, message, finish, usage):
        return {"id": rid, "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", self.model_id),
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                             "stop_reason": None}],
                "usage": usage, "prompt_logprobs": None}


# --- the start -----------------------------------------------------------------------------------------


def main(argv):
    es.speak_as(Voice())
    args = parse(argv)
    validate(args)
    rank = args.node_rank
    HEADLESS[0] = args.headless
    k = knobs()
    if not args.headless:
        api(f"vLLM API server version {VERSION}")
    api(f"non-default args: {non_default(args)!r}", "utils.py:233")
    if args.distributed_executor_backend == "ray":
        no_ray()
    if os.environ.get("NVIDIA_VISIBLE_DEVICES") in (None, "", "void", "none"):
        fail("RuntimeError: Failed to infer device type", where="launcher")
    if rank > 0 and not args.headless:
        fail(f"ValueError: node rank {rank} of a multi-node group must run with --headless: only node 0 serves the "
             "API (the stand-in's refusal; see tests/standins/README.md)", where="launcher")
    es.check_model(args.model, k)
    if os.environ.get("NCCL_CUMEM_ENABLE") == "1":
        line(worker(rank), "INFO", "env_override.py:35", "NCCL_CUMEM_ENABLE is set to 1, skipping override. This may "
             "increase memory overhead with cudagraph+allreduce: https://github.com/NVIDIA/nccl/issues/1234")
    es.hold_gpu(k)
    gpus_here = args.tensor_parallel_size // max(1, args.nnodes)
    if gpus_here > 1:
        fail("torch.AcceleratorError: CUDA error: invalid device ordinal", 1)
    if args.tensor_parallel_size < args.nnodes:
        fail(f"AssertionError: world size {args.tensor_parallel_size} is smaller than nnodes {args.nnodes}", rank,
             where="launcher")
    free_memory_check(args, k, rank)
    timeout = float(k["rendezvous_timeout"] or 600)
    peers = []
    if args.nnodes > 1:
        addr = f"{args.master_addr}:{args.master_port}"
        peers = es.Group(rank, args.nnodes, addr, fingerprint(args), timeout).init()
    line(worker(rank), "INFO", "parallel_state.py:1208", f"rank {rank} in world size {args.nnodes} is assigned as "
         f"DP rank 0, PP rank 0, TP rank {rank}, EP rank {rank}")
    if ib_unpinned():
        nccl_comm_hangs(rank)
    # NCCL's communicator is set up by every rank together, and so is every later start-up step: RPCs through
    # the broadcast queue, which wait without a timeout.
    es.collective(peers, rank, None, 0)
    if logind_removes_ipc():
        broadcast_block_gone(rank)
    need = float(k["resident_gib"]) if k["resident_gib"] is not None else \
        args.gpu_memory_utilization * GPU_TOTAL_GIB + PROFILE_GIB
    line(worker(rank), "INFO", "gpu_model_runner.py:2602", f"Starting to load model {container_path(args.model)}...")
    es.charge(min(need, float(k["weights_gib"]) + 1.0), rank)
    time.sleep(float(k["load_seconds"]))
    line(worker(rank), "INFO", "gpu_model_runner.py:2634",
         f"Model loading took {float(k['weights_gib']):.4f} GiB and {float(k['load_seconds']):.6f} seconds")
    es.collective(peers, rank, None, 1)
    profile_run(k, rank)
    tokens = kv_cache(args, k) if rank == 0 else 0
    es.charge(need, rank)
    es.collective(peers, rank, None, 2)
    if not args.enforce_eager:
        line(worker(rank), "INFO", "gpu_model_runner.py:3480", "Graph capturing finished in 9 secs, took 0.61 GiB")
    if rank != 0:
        es.worker_serves(peers, rank)
    line("EngineCore_DP0", "INFO", "core.py:210",
         "init engine (profile, create kv cache, warmup model) took 41.20 seconds")
    watchdog = float(k["watchdog_seconds"] or timeout)
    engine = Engine(args, k, es.TPGroup(peers, 0, watchdog), tokens)
    if args.headless:
        es.worker_serves([], rank)
    host = args.host or "0.0.0.0"

    def listening():
        api(f"Starting vLLM API server 0 on http://{host}:{args.port}", "launcher.py:34")
        for route, methods in (("/health", "GET"), ("/metrics", "GET"), ("/version", "GET"), ("/v1/models", "GET"),
                               ("/v1/chat/completions", "POST")):
            api(f"Route: {route}, Methods: {methods}", "launcher.py:42")
        uvicorn(f"Started server process [{os.getpid()}]")
        uvicorn("Waiting for application startup.")
        uvicorn("Application startup complete.")

    es.serve_http(engine, host if args.host else "", args.port, listening)
    return 0


if __name__ == "__main__":
    es.run_main(main)

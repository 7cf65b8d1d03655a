#!/usr/bin/python3
"""Test stand-in for `python3 -m sglang.launch_server` serving GLM-5.3-Flash-NVFP4.

Installed by the harness at /usr/lib/spark-sim/sglang_server.py; the docker
stand-in runs it for the SGLang image. Standard library only (nodes run
Debian trixie's python3). Every failure fingerprint of deployment-facts.md and
of the doctor's catalogue comes out of it when what causes it on real hardware
is there, in the order the real server meets it:

1. argparse: an unknown flag exits 2 with "unrecognized arguments".
2. No GPU in the container (docker ran without --gpus): "No CUDA GPUs are available".
   Otherwise the rank holds the GPU from here on (its CUDA context): it keeps the
   stand-in's device file open, so the nvidia-smi stand-in lists it as a compute app.
3. A model path that is not a local directory is a hub repo id: the engine asks
   huggingface_hub for config.json. Nodes have no network, so this fails with
   huggingface_hub's messages (offline mode, HF_HUB_OFFLINE=1: "outgoing traffic
   has been disabled"; without it: a connection error to huggingface.co). With
   the hub reachable (knob), config.json comes down and the model code's open of
   processor_config.json fails instead, as deployment-facts.md says.
4. <model-path>/processor_config.json missing: the model code's FileNotFoundError.
5. Multi-node init, with real sockets on the node's real network: rank 0 listens
   on --dist-init-addr's port (the TCPStore), workers connect to it; then Gloo
   binds to GLOO_SOCKET_IFNAME's address and the ranks connect to each other,
   NCCL bootstraps on NCCL_SOCKET_IFNAME, and rank 0 advertises SGLANG_HOST_IP
   for its broadcast queue. A missing interface, a missing route or address, a
   firewall or a wrong SGLANG_HOST_IP produce what torch.distributed, Gloo and
   NCCL print (timeouts after the rendezvous timeout), or the endless wait after
   "Init torch distributed begin" (a wrong or missing SGLANG_HOST_IP).
6. Weights and memory pool charged to the container's memory cgroup (the docker
   stand-in's --memory): over the limit the kernel kills the rank (SIGKILL, so
   docker run exits 137 and the container is OOMKilled).
7. The hybrid state cache error when max-running-requests x context-length
   exceeds the state budget, with the pool's own figures (slots at this
   context, slots per request, requests they back).
8. The TileLang DSA kernels' shared memory at cuda graph capture: the default
   tile asks for 169984 bytes, a GB10 (sm_121) allows 101376. A speculative-
   decoding drafter (--speculative-algorithm) captures its verify shapes too.
9. HTTP on rank 0 only: /health, /v1/models, /v1/chat/completions (also
   streamed) with the seed's behaviours (reasoning parser glm45 splits thinking
   into reasoning_content; without it thinking and </think> leak into content;
   tool calls come back empty with parser glm, as tool_calls with glm47),
   --api-key, --log-requests; a KV cache other than bfloat16 under the TileLang
   DSA kernels garbles output (U+FFFD where multi-byte characters were).
10. Generation needs every rank, as tensor parallelism does: each decoding step
   is a collective that rank 0 sends to every other rank over its connection
   on the fabric and that each must answer. A frozen peer stalls generation
   (no token) while /health and /v1/models answer, until NCCL's watchdog takes
   rank 0 down ("Watchdog caught collective operation timeout", exit 134); a
   dead peer takes it down at once. The hang knob makes generations never
   finish; gpu_release_seconds keeps an ended rank's GPU held for a while.

Knobs: section "sglang" of /etc/spark-sim/node.json (tests/standins/README.md),
section "gpu" key "compute_cap" for the shared-memory limit. What is not SGLang's own (the group, the
collectives, the GPU, memory, batching, HTTP) is engine_standin.py's, beside this file, shared with
vllm_server.py.
"""

import argparse
import hashlib
import hmac
import json
import os
import sys
import time
from typing import NamedTuple

# The shared machinery (engine_standin.py) and NCCL's device choice (roce_port.py) are beside this file; no
# __pycache__ beside them (the node's files are what the shared-node check and uninstall's comparison read).
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import engine_standin as es  # noqa: E402
from engine_standin import CORRUPTIONS, GPU_TOTAL_GIB, container_path, prompt_tokens, raw  # noqa: E402

DEFAULTS = {
    **es.SERVING_DEFAULTS,
    "state_budget": 4 * 65536,
    "tilelang_tile": "gb10",
    "tilelang_verify_tile": "default",
    # Speculative decoding with the model's own next-token heads: the chance that each drafted token is accepted
    # (along a chain; topk branches give each depth that many tries), what each drafting step costs and what the
    # verify step costs per token it verifies, each as a share of a plain decoding step. speculation() turns them
    # into SGLang's accept length and the decoding step's time: at 0.6 a 3-step chain gains, a 6-step one loses.
    "speculative_acceptance": 0.6,
    "speculative_step_cost": 0.25,
    "speculative_draft_cost": 0.02,
    # /metrics behind --api-key, as in SGLang builds from before its /metrics exemption: read at each request.
    "metrics_behind_key": False,
}
HYBRID_ERROR = (
    "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
    "max_mamba_cache_size={size}, mamba_ratio={ratio}, resulting max_num_reqs={reqs}."
)
# State slots a running request needs in the hybrid state pool (the radix cache with the overlap scheduler).
MAMBA_RATIO = 5
# Dynamic shared memory per block the DSA TileLang kernels ask for, per tile.
TILE_SMEM = {"default": 169984, "gb10": 57344}
# shared_memory_per_block_optin by compute capability (GB10 is 12.1).
SMEM_OPTIN = {"12.1": 101376, "12.0": 101376, "8.9": 101376, "8.6": 101376, "8.0": 166912, "9.0": 232448,
              "10.0": 232448, "10.3": 232448}
# GB10 memory as torch sees it, and what one rank's weights take of it.
# What one rank's weights take of GB10's memory.
WEIGHTS_GIB = 84.45
RUNTIME_GIB = 4.0
KV_DTYPES_OK = ("auto", "bfloat16", "bf16")
SGLANG_SRC = "/sgl-workspace/sglang/python/sglang/srt"


def knobs():
    return es.read_knobs("sglang", DEFAULTS)



def log(message, rank=None):
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    where = "" if rank is None else f" TP{rank}"
    sys.stdout.write(f"[{stamp}{where}] {message}\n")
    sys.stdout.flush()


def fail(exc_line, rank=None, where="scheduler"):
    """Die like an uncaught exception in the scheduler does."""
    frames = {
        "scheduler": f'  File "{SGLANG_SRC}/managers/scheduler.py", line 2961, in run_scheduler_process\n'
                     "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)\n",
        "launcher": f'  File "{SGLANG_SRC}/server_args.py", line 4182, in prepare_server_args\n'
                    "    server_args = ServerArgs.from_cli_args(raw_args)\n",
    }
    raw("Traceback (most recent call last):\n" + frames[where].rstrip("\n"))
    raw(exc_line)
    if where == "scheduler":
        log("Received sigquit from a child process. It usually means the child failed.", rank)
    sys.exit(1)


# Every flag the server role accepts is a real launch_server flag: argparse knows them all.
VALUE_FLAGS = [
    "--tokenizer-path", "--tokenizer-mode", "--load-format", "--dtype", "--quantization", "--revision",
    "--attention-backend", "--dsa-prefill-backend", "--dsa-decode-backend", "--served-model-name", "--chat-template",
    "--log-level", "--schedule-policy", "--grammar-backend", "--mamba-ssm-dtype", "--speculative-algorithm",
    "--speculative-draft-model-path", "--json-model-override-args", "--sampling-defaults", "--download-dir",
    "--admin-api-key",
]
INT_FLAGS = [
    "--max-total-tokens", "--max-prefill-tokens", "--chunked-prefill-size", "--page-size", "--stream-interval",
    "--random-seed", "--decode-log-interval", "--cuda-graph-max-bs", "--torch-compile-max-bs", "--dp-size",
    "--ep-size", "--max-mamba-cache-size", "--speculative-num-steps", "--speculative-eagle-topk",
    "--speculative-num-draft-tokens", "--nccl-port", "--dist-timeout", "--base-gpu-id", "--gpu-id-step",
]
FLOAT_FLAGS = ["--schedule-conservativeness", "--watchdog-timeout", "--mamba-full-memory-ratio"]
SWITCHES = [
    "--skip-tokenizer-init", "--stream-output", "--log-requests", "--enable-metrics", "--enable-cache-report",
    "--show-time-cost", "--disable-radix-cache", "--disable-cuda-graph", "--disable-cuda-graph-padding",
    "--enable-torch-compile", "--disable-custom-all-reduce", "--enable-mixed-chunk", "--enable-dp-attention",
    "--enable-ep-moe", "--enable-multimodal",
]


def parser():
    p = argparse.ArgumentParser(prog="launch_server.py", allow_abbrev=True)
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", "--nccl-init-addr")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--moe-runner-backend", default="auto")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--disable-shared-experts-fusion", action="store_true")
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--context-length", type=int)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--api-key")
    p.add_argument("--log-requests-level", type=int, default=2)
    p.add_argument("--cuda-graph-bs", type=int, nargs="+")
    for flag in VALUE_FLAGS:
        p.add_argument(flag)
    for flag in INT_FLAGS:
        p.add_argument(flag, type=int)
    for flag in FLOAT_FLAGS:
        p.add_argument(flag, type=float)
    for flag in SWITCHES:
        p.add_argument(flag, action="store_true")
    return p


class Voice(es.Voice):
    """SGLang's log lines and tracebacks, for the shared machinery."""

    model_code = f"{SGLANG_SRC}/models/glm5_next.py"
    host_ip_env = ("SGLANG_HOST_IP", "HOST_IP")
    get_ip_source = f"{SGLANG_SRC}/utils/common.py:2034"
    rank_name = "an SGLang rank"

    def log(self, message, rank=None):
        log(message, rank)

    def fail(self, exc_line, rank=None, where="scheduler"):
        fail(exc_line, rank, where)


def fingerprint(args):
    """What every rank must agree on (a mismatch would garble TP output)."""
    return es.fingerprint(vars(args), own=("node_rank", "host", "port", "api_key"))



def out_of_memory(rank, avail):
    """torch's message when the weights do not fit beside what others hold."""
    fail(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.03 GiB. GPU 0 has a total capacity of "
         f"{GPU_TOTAL_GIB:.2f} GiB of which {max(0.0, avail % 1.03):.2f} GiB is free. Including non-PyTorch memory, "
         f"this process has {max(0.0, avail - 1.03):.2f} GiB memory in use. Of the allocated memory "
         f"{max(0.0, avail - 1.31):.2f} GiB is allocated by PyTorch, and 91.21 MiB is reserved by PyTorch but "
         "unallocated. If reserved but unallocated memory is large try setting "
         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
         "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)", rank)


def resident_gib(args, k):
    if k["resident_gib"] is not None:
        return float(k["resident_gib"])
    return (args.mem_fraction_static or 0.84) * GPU_TOTAL_GIB + RUNTIME_GIB


def state_slots(args, k):
    """(max_mamba_cache_size, max_num_reqs): the slots the pool has at this context-length, the requests they back.

    The pool holds `state_budget` request-tokens of recurrent state; a request's state grows with its
    context, so a slot sized for context-length C is C / mamba_ratio of them.
    """
    context = args.context_length or 1048576
    size = MAMBA_RATIO * int(k["state_budget"]) // context
    return size, size // MAMBA_RATIO


def check_state_cache(args, rank, k):
    """This image refuses to start when the pool backs fewer requests than max-running-requests asks."""
    reqs = args.max_running_requests or 48
    size, fits = state_slots(args, k)
    if fits < reqs:
        fail(HYBRID_ERROR.format(size=size, ratio=MAMBA_RATIO, reqs=fits), rank)


# --- cuda graphs and the TileLang DSA kernels ------------------------------------------


def tilelang_in_use(args):
    return "tilelang" in (args.dsa_prefill_backend, args.dsa_decode_backend)


def tile_fits(tile, k):
    limit = SMEM_OPTIN.get(k["compute_cap"], 101376)
    need = TILE_SMEM.get(tile, TILE_SMEM["default"])
    return need <= limit, need


def smem_error(need):
    return f"RuntimeError: Failed to set the allowed dynamic shared memory size to {need} with error: invalid argument"


def capture_failed(need, rank, what="cuda graph"):
    fail(f"Exception: Capture {what} failed: {smem_error(need)[len('RuntimeError: '):]}\n"
         "Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
         "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
         "3. disable torch compile by not using --enable-torch-compile\n"
         "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
         "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose", rank)


class Speculation(NamedTuple):
    steps: int
    topk: int
    draft_tokens: int
    # Tokens per decoding step, the bonus token included (sglang:spec_accept_length), and the share of the drafted
    # depth accepted, (length - 1) / steps (sglang:spec_accept_rate).
    accept_length: float
    accept_rate: float
    # A token's time over a plain decoding step's.
    time_factor: float


def speculation(args, k):
    """The Speculation of --speculative-algorithm, or None without it.

    SGLang's own rules: without settings its auto choice for GLM-style MoE models is 3 steps, topk 1, 4 draft
    tokens, and with topk 1 it sets num-draft-tokens to num-steps + 1 (with the warning below). The accept length
    counts the bonus token: 1 + p + p^2 + ... + p^steps for a per-depth acceptance p."""
    if not args.speculative_algorithm:
        return None
    steps = args.speculative_num_steps or 3
    topk = args.speculative_eagle_topk or 1
    draft = args.speculative_num_draft_tokens or (steps + 1 if topk == 1 else 8)
    if topk == 1 and draft != steps + 1:
        log("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1", 0)
        draft = steps + 1
    p = 1 - (1 - min(max(float(k["speculative_acceptance"]), 0.0), 0.999)) ** topk
    accept = sum(p ** i for i in range(steps + 1))
    cost = 1 + float(k["speculative_step_cost"]) * steps + float(k["speculative_draft_cost"]) * draft
    return Speculation(steps, topk, draft, accept, (accept - 1) / steps, cost / accept)


def capture(args, rank, k):
    bs = args.cuda_graph_bs or list(range(1, (args.max_running_requests or 48) + 1))
    fits, need = tile_fits(k["tilelang_tile"], k)
    if args.disable_cuda_graph:
        if tilelang_in_use(args) and not fits:
            log("Prefill batch. #new-seq: 1, #new-token: 8, #cached-token: 0, token usage: 0.00, #running-req: 0, "
                "#queue-req: 0", rank)
            fail(smem_error(need), rank)
        return
    log("Capture cuda graph begin. This can take up to several minutes. avail mem=15.15 GB", rank)
    log(f"Capture cuda graph bs {bs}", rank)
    if tilelang_in_use(args) and not fits:
        capture_failed(need, rank)
    log("Capture cuda graph end. Time elapsed: 2.41 s. mem usage=0.61 GB. avail mem=14.54 GB.", rank)
    if args.speculative_algorithm:
        steps = args.speculative_num_draft_tokens or 4
        log(f"Capture draft cuda graph begin. speculative_algorithm={args.speculative_algorithm}, verify shapes: "
            f"{steps} tokens per request. avail mem=14.54 GB", rank)
        fits, need = tile_fits(k["tilelang_verify_tile"], k)
        if tilelang_in_use(args) and not fits:
            capture_failed(need, rank, "draft cuda graph")
        log("Capture draft cuda graph end. Time elapsed: 1.12 s. mem usage=0.30 GB. avail mem=14.24 GB.", rank)


# --- HTTP on rank 0 ----------------------------------------------------------


def corruptions(args, k):
    """What garbles the output: a non-bf16 KV cache under the TileLang DSA kernels, or the knob."""
    found = {c for c in k["output_corruption"] if c in CORRUPTIONS}
    if tilelang_in_use(args) and args.kv_cache_dtype not in KV_DTYPES_OK:
        found.add("fffd")
    return found




# --- SGLang's Prometheus endpoint (--enable-metrics) ------------------------------------------------

# The buckets of SGLang's TokenizerMetricsCollector (srt/metrics/collector.py), its defaults.
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)


class Metrics(es.Metrics):
    """What SGLang serves at /metrics with --enable-metrics: its real metric names, types, help texts and labels.

    The tokenizer manager's collectors ({model_name}): counters and histograms (engine_standin.Metrics).
    The scheduler's gauges ({model_name, engine_type, tp_rank, pp_rank} of rank 0): running and queued
    requests, the tokens the running requests hold in the KV pool (its size: context-length x
    max-running-requests here) and their share of it, and the generation throughput measured over every
    `decode_log_interval` decoding steps as the scheduler logs it (SGLang's default: 40 steps). The real
    scheduler refreshes its gauges when it logs: at each prefill, every `decode_log_interval` decoding
    steps and every 30 s while idle (then with 0 running requests); here they are read when /metrics is asked.
    """

    def __init__(self, model_name, batch, args):
        super().__init__(batch, (args.context_length or 65536) * (args.max_running_requests or 48),
                         {"ttft": TTFT_BUCKETS, "itl": ITL_BUCKETS, "e2e": E2E_BUCKETS},
                         args.decode_log_interval or 40)
        self.tokenizer_labels = {"model_name": model_name}
        self.speculation = None
        self.scheduler_labels = {"model_name": model_name, "engine_type": "unified", "tp_rank": 0, "pp_rank": 0}

    def families(self, running, queued, used):
        tok, sch = self.tokenizer_labels, self.scheduler_labels
        return [
            ("sglang:num_running_reqs", "gauge", "The number of running requests.", [(sch, running)]),
            ("sglang:num_used_tokens", "gauge", "The number of used tokens.", [(sch, used)]),
            ("sglang:token_usage", "gauge", "The token usage.", [(sch, round(used / self.pool_tokens, 6))]),
            ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", [(sch, self.gen_throughput)]),
            ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", [(sch, queued)]),
            ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", [(sch, 0.0)]),
            # The scheduler's speculative figures over its last decode log interval: tokens per verify step (the
            # bonus token included) and the share of drafted tokens accepted; 0 without speculative decoding.
            ("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
             [(sch, round(self.speculation.accept_length, 4) if self.speculation else 0.0)]),
            ("sglang:spec_accept_rate", "gauge", "The average acceptance rate of speculative decoding.",
             [(sch, round(self.speculation.accept_rate, 4) if self.speculation else 0.0)]),
            ("sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.",
             [(sch, self.pool_tokens)]),
            ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
             [(tok, self.prompt_tokens)]),
            ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
             [(tok, self.generation_tokens)]),
            ("sglang:cached_tokens_total", "counter", "Number of cached prompt tokens.", [(tok, 0)]),
            ("sglang:num_requests_total", "counter", "Number of requests processed.", [(tok, self.requests)]),
            ("sglang:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
             [(tok, self.ttft)]),
            ("sglang:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
             [(tok, self.itl)]),
            ("sglang:e2e_request_latency_seconds", "histogram", "Histogram of End-to-end request latency in seconds",
             [(tok, self.e2e)]),
        ]


# --- HTTP on rank 0: SGLang's API ---------------------------------------------------------------------

# Chat completions served and the faults injected into them (error_every, cut_every), for the tests.
COUNTS = os.environ.get("SPARK_SIM_ROOT", "") + "/run/spark-sim/sglang-requests.json"


def context_problem(args, body):
    """SGLang's validation of a request against --context-length (tokenizer_manager), as its 400 says it."""
    context = args.context_length or 1048576
    tokens = prompt_tokens(body)
    if tokens >= context:
        return f"The input ({tokens} tokens) is longer than the model's context length ({context} tokens)."
    wanted = body.get("max_tokens") if es._positive(body.get("max_tokens")) else None
    if wanted is not None and tokens + wanted >= context:
        return (f"Requested token count exceeds the model's maximum context length of {context} tokens. You requested "
                f"a total of {tokens + wanted} tokens: {tokens} tokens from the input messages and {wanted} tokens for "
                "the completion. Please reduce the number of tokens in the input messages or the completion to fit "
                "within the limit.")
    return None


class Engine(es.Engine):
    def __init__(self, args, k, group):
        super().__init__(k, group, limit=args.max_running_requests or 48,
                         model_id=args.served_model_name or container_path(args.model_path), counts_path=COUNTS,
                         knobs_reader=knobs, corrupt=corruptions(args, k))
        self.args = args
        self.total_tokens = 0
        # Without --enable-metrics SGLang mounts no /metrics route (404).
        self.metrics = Metrics(self.model_id, self.batch, args) if args.enable_metrics else None
        self.batch.metrics = self.metrics
        # A decoding step of a speculative engine verifies the drafted tokens and yields `accept` tokens on average:
        # the time per token is the stand-in's decoding step times the step-time factor.
        self.speculation = speculation(args, k)
        if self.speculation:
            self.token_seconds *= self.speculation.time_factor
            if self.metrics is not None:
                self.metrics.speculation = self.speculation

    def access_log(self, handler, code):
        log(f'{handler.client_address[0]}:{handler.client_address[1]} - "{handler.command} {handler.path} '
            f'HTTP/1.1" {code}', 0)

    def authorized(self, handler):
        """SGLang's --api-key check (srt/utils/auth.py): every path but /health* and /metrics* (liveness probes,
        Prometheus) wants `Authorization: Bearer <key>` (the scheme in any case), compared in constant time;
        anything else gets 401 {"error": "Unauthorized"}."""
        key = self.args.api_key
        path = handler.path.split("?", 1)[0]
        # Builds from before SGLang exempted /metrics (its middleware let only /health* through) want the
        # key there too: the metrics_behind_key knob.
        open_paths = ("/health",) if self.serving_knobs()["metrics_behind_key"] else ("/health", "/metrics")
        if not key or handler.command == "OPTIONS" or path.startswith(open_paths):
            return True
        scheme, _, token = (handler.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), key.encode()):
            return True
        handler.send_json(401, {"error": "Unauthorized"})
        return False

    def get(self, handler, path):
        if path == "/health":
            handler.send_text(200, b"")
        elif path.split("?", 1)[0] == "/metrics" and self.metrics is not None:
            handler.send_text(200, self.metrics.exposition().encode(), es.EXPOSITION)
        elif path == "/v1/models":
            handler.send_json(200, {"object": "list", "data": [{
                "id": self.model_id, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                "root": self.model_id, "max_model_len": self.args.context_length}]})
        else:
            handler.send_json(404, {"detail": "Not Found"})

    def request_id(self):
        return hashlib.sha256(str(time.time_ns()).encode()).hexdigest()[:32]

    def error_body(self, status, message, kind, param=True):
        return {"object": "error", "message": message, "type": kind, **({"param": None} if param else {}),
                "code": status}

    def reject(self, body):
        problem = context_problem(self.args, body)
        return (400, problem) if problem else None

    def chunk(self, rid, created, model, delta, reason):
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason,
                             "matched_stop": 151336 if reason == "stop" else None}],
                "usage": None}

    def completion(self, rid, body, message, finish, usage):
        return {"id": rid, "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", self.model_id),
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                             "matched_stop": 151336 if finish == "stop" else None}],
                "usage": usage}

    def served(self, rid, body, message, usage):
        self.decode_log(usage["completion_tokens"])
        self.request_log(rid, body, message)

    def decode_log(self, tokens):
        with self.lock:
            self.total_tokens += tokens
            accept = f"accept len: {self.speculation.accept_length:.2f}, " if self.speculation else ""
            log(f"Decode batch. #running-req: 1, #token: {self.total_tokens}, token usage: 0.01, {accept}cuda graph: "
                "True, gen throughput (token/s): 38.41, #queue-req: 0", 0)

    def request_log(self, rid, body, message):
        if not self.args.log_requests:
            return
        if self.args.log_requests_level >= 2:
            text = json.dumps(body.get("messages"), ensure_ascii=False)
            log(f"Receive: obj=GenerateReqInput(rid='{rid}', text={text!r}, sampling_params="
                f"{{'max_new_tokens': {body.get('max_tokens')}}})", 0)
            log(f"Finish: obj=GenerateReqInput(rid='{rid}'), out={{'text': {message.get('content')!r}}}", 0)
        else:
            log(f"Receive: obj=GenerateReqInput(rid='{rid}')", 0)

    def chat(self, body):
        tools = body.get("tools") or []
        if tools:
            return self.tool_reply(tools)
        reasoning, answer, reasoning_tokens, answer_tokens = self.thought(body)
        if self.args.reasoning_parser == "glm45":
            message = {"role": "assistant", "content": answer, "reasoning_content": reasoning, "tool_calls": None}
        else:
            # No reasoning parser: the thinking and its closing tag stay in the text.
            message = {"role": "assistant", "content": f"{reasoning}, so the answer is {answer}.</think>{answer}",
                       "reasoning_content": None, "tool_calls": None}
        usage = {"prompt_tokens": prompt_tokens(body), "completion_tokens": reasoning_tokens + answer_tokens,
                 "reasoning_tokens": reasoning_tokens}
        return message, "length" if body.get("ignore_eos") else "stop", usage

    def tool_reply(self, tools):
        name, arguments, call = self.tool_call(tools)
        usage = {"prompt_tokens": 64, "completion_tokens": 24, "reasoning_tokens": 0}
        if self.args.tool_call_parser == "glm47":
            message = {"role": "assistant", "content": None, "reasoning_content": None, "tool_calls": [call]}
            return message, "tool_calls", usage
        if self.args.tool_call_parser == "glm":
            # The silent failure of deployment-facts.md: success, nothing usable.
            return {"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": None}, "stop", usage
        return ({"role": "assistant", "content": self.raw_tool_call(name, arguments), "reasoning_content": None,
                 "tool_calls": None}, "stop", usage)


def main(argv):
    es.speak_as(Voice())
    args = parser().parse_args(argv)
    k = knobs()
    rank = args.node_rank
    log(f"server_args=ServerArgs({', '.join(f'{key}={value!r}' for key, value in vars(args).items() if key != 'api_key')})",
        rank)
    if os.environ.get("NVIDIA_VISIBLE_DEVICES") in (None, "", "void", "none"):
        fail("RuntimeError: No CUDA GPUs are available", rank)
    es.hold_gpu(k)
    if args.tp_size != args.nnodes:
        fail(f"AssertionError: tp_size {args.tp_size} must equal nnodes {args.nnodes} x 1 GPU per node "
             "on this GB10 cluster", rank)
    if args.nnodes > 1 and not args.dist_init_addr:
        fail("ValueError: --dist-init-addr is required when --nnodes > 1", rank)
    es.check_model(args.model_path, k)
    log("Init torch distributed begin.", rank)
    peers = []
    timeout = float(k["rendezvous_timeout"] or args.dist_timeout or 600)
    if args.nnodes > 1:
        peers = es.Group(rank, args.nnodes, args.dist_init_addr, fingerprint(args), timeout).init()
    log("Init torch distributed ends. mem usage=0.00 GB", rank)
    need = resident_gib(args, k)
    # What ended ranks still hold (gpu_release_seconds) is not free for this one.
    held = es.held_by_others()
    avail = 119.40 + rank / 100 - held
    log(f"Load weight begin. avail mem={avail:.2f} GB", rank)
    if WEIGHTS_GIB > avail:
        out_of_memory(rank, avail)
    es.charge(min(need, WEIGHTS_GIB + 1.0), rank)
    time.sleep(float(k["load_seconds"]))
    log("Load weight end. type=Glm5NextForConditionalGeneration, dtype=torch.bfloat16, avail mem=28.73 GB, "
        "mem usage=90.68 GB.", rank)
    es.collective(peers, rank, timeout, 1)
    check_state_cache(args, rank, k)
    es.charge(need, rank)
    reqs = args.max_running_requests or 48
    size, _ = state_slots(args, k)
    log(f"Hybrid radix cache initialized: MambaRadixCache with MAMBA component, max_mamba_cache_size={size}, "
        f"mamba_ratio={MAMBA_RATIO}, max_num_reqs={reqs}, full KV cache tokens={args.context_length}", rank)
    log(f"Memory pool end. avail mem={max(0.0, GPU_TOTAL_GIB - need):.2f} GB", rank)
    es.collective(peers, rank, timeout, 2)
    capture(args, rank, k)
    # Serving: every decoding step is a collective across the ranks (TPGroup), with NCCL's watchdog.
    watchdog = float(k["watchdog_seconds"] or timeout)
    if rank != 0:
        log("Rank ready; serving is done by rank 0", rank)
        es.worker_serves(peers, rank)
    engine = Engine(args, k, es.TPGroup(peers, 0, watchdog))

    def listening():
        log(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)", 0)
        log("The server is fired up and ready to roll!", 0)

    es.serve_http(engine, args.host, args.port, listening)
    return 0


if __name__ == "__main__":
    es.run_main(main)

#!/usr/bin/python3
"""Planted failures for the verify and doctor tests (tests only).

Two things the stand-in SGLang server does not (yet) give on demand:

* ``LINES``/``plant_command``: the log lines of each known failure, written
  into the journal of the rank's unit on a simulated node through a transient
  systemd unit of the same name, so ``journalctl -u sglang.service`` shows
  them exactly where a real rank's output lands (with the exit status the
  real failure has, e.g. 137 after an OOM kill).
* ``serve``: a minimal OpenAI-compatible responder with the answer shapes of
  a good deployment and of each bad behaviour verify must diagnose, run on
  127.0.0.1 or on a node:

      python3 sglang_faults.py serve --port 30000 --mode tool-parser-glm

The texts are the real engines' messages (SGLang, TileLang, torch.distributed,
NCCL, huggingface_hub, systemd), trimmed to the lines that identify them.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# name -> (lines, exit status of the planted unit, seconds it stays active)
LINES: dict[str, tuple[list[str], int, int]] = {
    "hybrid_cache": (
        [
            "[2026-11-29 10:01:12 TP0] Load weight end. type=Glm5NextForConditionalGeneration, dtype=torch.bfloat16",
            "[2026-11-29 10:01:13 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
            "max_mamba_cache_size=1, mamba_ratio=5, resulting max_num_reqs=0.",
        ],
        1,
        0,
    ),
    "tilelang_smem": (
        [
            "[2026-11-29 10:02:40 TP0] Capture cuda graph begin. This can take up to several minutes.",
            "RuntimeError: Failed to set the allowed dynamic shared memory size to 169984 with error: invalid argument",
        ],
        1,
        0,
    ),
    "tilelang_smem_drafter": (
        [
            "[2026-11-29 10:02:40 TP0] Capture draft cuda graph begin. speculative_algorithm=EAGLE",
            "[2026-11-29 10:02:41 TP0] EAGLE draft verify: sparse attention kernel compile",
            "RuntimeError: Failed to set the allowed dynamic shared memory size to 169984 with error: invalid argument",
        ],
        1,
        0,
    ),
    "processor_config_repo_id": (
        [
            "FileNotFoundError: [Errno 2] No such file or directory: "
            "'LibertAIDAI/GLM-5.3-Flash-NVFP4/processor_config.json'",
        ],
        1,
        0,
    ),
    "processor_config_local": (
        ["FileNotFoundError: [Errno 2] No such file or directory: '/models/glm53/processor_config.json'"],
        1,
        0,
    ),
    "nccl_timeout": (
        [
            "[2026-11-29 10:03:00 TP1] Init torch distributed begin.",
            "spark-1:77:91 [0] NCCL WARN NET/Socket : Connect to 10.232.1.10<20000> failed : Connection timed out",
            "torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to "
            "connect to (10.232.1.10, 20000).",
        ],
        1,
        0,
    ),
    "gloo_timeout": (
        [
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:144] Timed out waiting 1800000ms for "
            "recv operation to complete",
        ],
        1,
        0,
    ),
    "init_hang": (
        ["[2026-11-29 10:04:00 TP0] Init torch distributed begin."],
        0,
        3600,
    ),
    "oom_137": (
        [
            "[2026-11-29 10:05:10 TP0] Load weight begin. avail mem=118.20 GB",
            "[2026-11-29 10:05:55 TP0] Memory pool end. avail mem=1.02 GB",
        ],
        137,
        0,
    ),
    "cuda_oom": (
        ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 119.70 GiB"],
        1,
        0,
    ),
    "download_at_boot": (
        [
            "Downloading 'model-00001-of-00120.safetensors' to '/root/.cache/huggingface/hub/models--LibertAIDAI--"
            "GLM-5.3-Flash-NVFP4/blobs/3f1c.incomplete'",
            "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', port=443): Max retries "
            "exceeded with url: /api/models/LibertAIDAI/GLM-5.3-Flash-NVFP4/revision/main",
        ],
        1,
        0,
    ),
    "offline_missing": (
        [
            "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder for the "
            "specified revision on the local disk and outgoing traffic has been disabled. To enable repo look-ups and "
            "downloads online, pass 'local_files_only=False' as input.",
        ],
        1,
        0,
    ),
    "healthy": (
        [
            "[2026-11-29 10:06:00 TP0] Decode batch. #running-req: 1, #token: 812, token usage: 0.01, cuda graph: True",
            "[2026-11-29 10:06:01] The server is fired up and ready to roll!",
        ],
        0,
        3600,
    ),
}


def plant_command(name: str, unit: str = "sglang.service", extra_lines: list[str] | None = None) -> str:
    """Shell command for a node: the failure's lines land in the journal of `unit`."""
    lines, status, linger = LINES[name]
    lines = list(lines) + list(extra_lines or [])
    body = "; ".join(f"echo {shlex.quote(line)}" for line in lines)
    # journald attributes lines to the unit only while it is alive: give it a moment before exiting.
    # --description keeps the command (and so the lines) out of systemd's own "Started" message.
    body += f"; sleep {linger if linger else 1}; exit {status}"
    return (
        f"systemctl reset-failed {shlex.quote(unit)} 2>/dev/null; systemctl stop {shlex.quote(unit)} 2>/dev/null; "
        f"systemd-run --quiet --unit={shlex.quote(unit)} --description='SGLang rank (planted)' --property=Type=exec "
        f"/bin/sh -c {shlex.quote(body)} && sleep {1 if linger else 2}"
    )


def clear_command(unit: str = "sglang.service") -> str:
    """Forget a planted failure: stop the unit and drop the journal entries of it."""
    return (
        f"systemctl stop {shlex.quote(unit)} 2>/dev/null; systemctl reset-failed {shlex.quote(unit)} 2>/dev/null; "
        "journalctl --rotate >/dev/null 2>&1; journalctl --vacuum-time=1s >/dev/null 2>&1; true"
    )


# --- the responder -------------------------------------------------------

GOOD_REASONING = "17 \u00d7 23 = 17 \u00d7 20 + 17 \u00d7 3 = 340 + 51 = 391"
MODES = ("good", "no-reasoning-parser", "tool-parser-glm", "fffd", "bad-tool-args", "wrong-answer")


def completion(mode: str, model: str, request: dict) -> dict:
    tools = request.get("tools") or []
    message: dict = {"role": "assistant", "content": "391", "reasoning_content": GOOD_REASONING, "tool_calls": None}
    finish = "stop"
    if mode == "no-reasoning-parser":
        message.update(content=GOOD_REASONING + ", so the answer is 391.</think>391", reasoning_content=None)
    if mode == "wrong-answer":
        message.update(content="394")
    if mode == "fffd":
        message.update(content="39\ufffd1")
    if tools:
        name = tools[0]["function"]["name"]
        if mode == "tool-parser-glm":
            message.update(content="", tool_calls=None)
        else:
            arguments = '{"city": "Paris"' if mode == "bad-tool-args" else json.dumps({"city": "Paris"})
            message.update(content=None, tool_calls=[
                {"id": "call_0", "type": "function", "index": 0, "function": {"name": name, "arguments": arguments}}
            ])
            finish = "tool_calls"
            if mode == "fffd":
                message["tool_calls"][0]["function"]["arguments"] = json.dumps({"city": "Pa\ufffdis"}, ensure_ascii=False)
    return {
        "id": "chatcmpl-0",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 50, "reasoning_tokens": 43},
    }


def make_handler(mode: str, model: str, api_key: str):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status: int, payload: dict):
            body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorised(self) -> bool:
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._send(401, {"error": {"message": "Unauthorized", "type": "invalid_request_error"}})
                return False
            return True

        def do_GET(self):  # noqa: N802 - http.server's naming
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models" and self._authorised():
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "sglang"}]})
            elif self.path != "/v1/models":
                self._send(404, {"detail": "Not Found"})

        def do_POST(self):  # noqa: N802
            if self.path != "/v1/chat/completions":
                self._send(404, {"detail": "Not Found"})
                return
            if not self._authorised():
                return
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            self._send(200, completion(mode, model, request))

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=30000)
    serve.add_argument("--mode", choices=MODES, default="good")
    serve.add_argument("--model", default="/models/glm53")
    serve.add_argument("--api-key", default="")
    plant = sub.add_parser("plant")
    plant.add_argument("name", choices=sorted(LINES))
    plant.add_argument("--unit", default="sglang.service")
    args = parser.parse_args(argv)
    if args.cmd == "plant":
        print(plant_command(args.name, args.unit))
        return 0
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args.mode, args.model, args.api_key))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

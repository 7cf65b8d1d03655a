"""verify_endpoint asks its two generations at once: a site waits for the slower, not for both.

The endpoint here is a barrier: each chat request is held until the other one has arrived, and both are
then answered. Asked one after the other, the first would wait alone until the barrier gives up (the
answer then says so, and the test fails on it); nothing is timed.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.lib.role_module import run_module

MODEL = "glm-5.3-flash"
GIVE_UP_SECONDS = 60


class JsonHandler(BaseHTTPRequestHandler):
    """An OpenAI-like endpoint's replies: JSON, a model list to anyone, the one chat answer (391)."""

    def log_message(self, *args):
        pass

    def reply(self, status, document):
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self.reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    def answer(self):
        self.reply(200, {"id": "x", "object": "chat.completion", "model": MODEL, "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "391"}}]})


def serve(handler) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Barrier:
    def __init__(self):
        self.arrived = threading.Barrier(2, timeout=GIVE_UP_SECONDS)
        self.met = []

    def serve(self):
        barrier = self

        class Handler(JsonHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", 0)))
                try:
                    barrier.arrived.wait()
                except threading.BrokenBarrierError:
                    barrier.met.append(False)
                    self.reply(503, {"object": "error", "message": "the other generation never came"})
                    return
                barrier.met.append(True)
                self.answer()

        return serve(Handler)


def test_the_two_generations_are_in_flight_together(tmp_path):
    barrier = Barrier()
    server = barrier.serve()
    try:
        result = run_module("verify_endpoint", {
            "endpoint": f"http://127.0.0.1:{server.server_address[1]}", "expected_model": MODEL,
            "allow_unauthenticated": True, "timeout": GIVE_UP_SECONDS * 2}, tmp_path)
    finally:
        server.shutdown()
    assert barrier.met == [True, True], barrier.met
    assert result["exchanges"]["reasoning"]["status"] == 200
    assert result["exchanges"]["tool_call"]["status"] == 200
    # Every exchange is still reported, in the order the checks read them.
    assert list(result["exchanges"]) == ["models", "reasoning", "tool_call", "unauthenticated"]


def gateway_like(key: str) -> ThreadingHTTPServer:
    """What smg 1.13.0 does with its key: /v1/models answers anyone, a generation needs the key (401 otherwise)."""

    class Handler(JsonHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.headers.get("authorization") != f"Bearer {key}":
                self.reply(401, {"error": {"message": "Invalid API key", "code": "invalid_api_key"}})
                return
            self.answer()

    return serve(Handler)


def test_the_gateway_key_is_judged_on_a_generation_where_the_model_list_is_open(tmp_path):
    server = gateway_like("the-key")
    try:
        params = {"endpoint": f"http://127.0.0.1:{server.server_address[1]}", "expected_model": MODEL,
                  "api_key": "the-key", "timeout": 30}
        on_models = run_module("verify_endpoint", params, tmp_path)
        on_generation = run_module("verify_endpoint", {**params, "auth_probe": "generation"}, tmp_path)
    finally:
        server.shutdown()
    auth = {name: next(c for c in r["checks"] if c["name"] == "auth") for name, r in
            (("models", on_models), ("generation", on_generation))}
    assert not auth["models"]["ok"], auth
    assert auth["generation"]["ok"], auth
    assert on_generation["exchanges"]["unauthenticated"]["status"] == 401
    assert on_generation["exchanges"]["wrong_key"]["status"] == 401

"""Streaming chat-completion client of the benchmark role, and the figures it computes.

Standard library only (it runs in the controller's venv, inside an Ansible module). One asyncio
loop drives every stream: a request is an HTTP/1.1 POST on a connection of its own (TLS with the
given CA when the endpoint is https), its server-sent events are read as they arrive, and each
content or reasoning delta is time-stamped on arrival. Nothing is inferred from the server's own
figures except token counts, which come from the stream's `usage` when the server reports it.

Errors are counted from the stream itself:
- ``http_<status>``: the server answered with another status than 200;
- ``timeout``: no byte for ``stall_timeout`` seconds, or the request outlived ``request_timeout``;
- ``truncated``: the stream ended (EOF, reset) before ``data: [DONE]``;
- ``stream_error``: an ``{"error": ...}`` event inside a 200 stream;
- ``connect``: no connection (refused, unreachable, TLS failure).
A request still running when the wall-time cap ends the level is ``cancelled``, not an error.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import ssl
import time
import urllib.parse

# Common short English words, each one token for GLM's tokenizer with its leading space; none of
# them is a word of the planted facts or of the recall question.
WORDS = (
    "the of and to in is was he for it with as his on be at by had are but from or have an they which one "
    "you were her all she there would their we him been has when who will more no if out so said what up its "
    "about into than them can only other new some could time these two may then do first any my now such like "
    "our over man me even most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make world still own see "
    "men work long get here between both life being under never day same another know while last might us great "
    "old year off come since against go came right used take three"
).split()
# Facts planted at depths of a long prompt; the question names each item.
ITEMS = ("amber", "cobalt", "scarlet", "violet", "emerald")
FACT = "The passcode of the {item} locker is {code}."
QUESTION = ("What is the passcode of the {names}? Answer with the numbers only.")

ERROR_KINDS = ("connect", "timeout", "truncated", "stream_error")


class Endpoint:
    """Where and how to send: base URL, key, TLS trust."""

    def __init__(self, url, api_key="", ca_file="", validate_certs=True, model=""):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint {url!r} is not an http(s) URL")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.path = parts.path.rstrip("/") + "/v1/chat/completions"
        self.model = model
        self.ssl = None
        if self.tls:
            self.ssl = ssl.create_default_context(cafile=ca_file or None)
            if not validate_certs:
                self.ssl.check_hostname = False
                self.ssl.verify_mode = ssl.CERT_NONE
        host = f"[{self.host}]" if ":" in self.host else self.host
        default_port = 443 if self.tls else 80
        self.authority = host if self.port == default_port else f"{host}:{self.port}"
        self.key = api_key

    def request_bytes(self, payload):
        body = json.dumps(payload, ensure_ascii=False).encode()
        head = [
            f"POST {self.path} HTTP/1.1",
            f"Host: {self.authority}",
            "Content-Type: application/json",
            "Accept: text/event-stream",
            f"Content-Length: {len(body)}",
            "Connection: close",
            "User-Agent: spark-llm-benchmark",
        ]
        if self.key:
            head.append(f"Authorization: Bearer {self.key}")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class _Chunked:
    """Decodes HTTP/1.1 chunked transfer coding from raw bytes as they come."""

    def __init__(self):
        self.raw = b""
        self.left = None  # data bytes still due of the current chunk; 0: its CRLF is due
        self.finished = False

    def feed(self, data):
        self.raw += data
        out = []
        while not self.finished:
            if self.left is None:
                end = self.raw.find(b"\r\n")
                if end < 0:
                    break
                size = int(self.raw[:end].split(b";")[0].strip() or b"0", 16)
                self.raw = self.raw[end + 2:]
                if size == 0:
                    self.finished = True
                    break
                self.left = size
            if self.left > 0:
                take = self.raw[: self.left]
                self.raw = self.raw[len(take):]
                self.left -= len(take)
                out.append(take)
                if self.left > 0:
                    break
            if len(self.raw) < 2:
                break
            self.raw = self.raw[2:]
            self.left = None
        return b"".join(out)


def _event_parts(payload):
    """(delta text or None when the event carries no token, usage, finish_reason, error) of one SSE payload."""
    obj = json.loads(payload)
    if not isinstance(obj, dict):
        return None, None, None, None
    if obj.get("error"):
        return None, None, None, obj["error"]
    text = None
    finish = None
    for choice in obj.get("choices") or []:
        delta = choice.get("delta") or {}
        piece = (delta.get("reasoning_content") or "") + (delta.get("content") or "")
        if piece or delta.get("tool_calls"):
            text = (text or "") + piece
        finish = choice.get("finish_reason") or finish
    return text, obj.get("usage"), finish, None


async def stream_once(endpoint, payload, stall_timeout, request_timeout, collect=False):
    """One streamed chat completion; the record of what the stream did, times in seconds from the start
    (`collect`: also the text of the reasoning and the content, in rec["text"])."""
    rec = {"status": None, "error": None, "ttft": None, "chunks": [], "end": None, "usage": None,
           "finish_reason": None, "done": False, "detail": ""}
    if collect:
        rec["text"] = ""
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    hard = loop.time() + request_timeout
    writer = None
    try:
        async with asyncio.timeout(min(stall_timeout, request_timeout)) as limit:
            def more():
                limit.reschedule(min(loop.time() + stall_timeout, hard))

            try:
                reader, writer = await asyncio.open_connection(
                    endpoint.host, endpoint.port, ssl=endpoint.ssl,
                    server_hostname=endpoint.host if endpoint.ssl else None)
            except (OSError, ssl.SSLError) as err:
                rec["error"], rec["detail"] = "connect", str(err)[:200]
                return rec
            writer.write(endpoint.request_bytes(payload))
            more()
            status_line = await reader.readline()
            parts = status_line.split(None, 2)
            if len(parts) < 2 or not parts[1].isdigit():
                rec["error"], rec["detail"] = "truncated", f"no HTTP status line: {status_line[:80]!r}"
                return rec
            rec["status"] = int(parts[1])
            headers = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, dummy, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            more()
            chunked = "chunked" in headers.get("transfer-encoding", "").lower()
            length = int(headers["content-length"]) if headers.get("content-length", "").isdigit() else None
            decoder = _Chunked() if chunked else None
            if rec["status"] != 200:
                body = await _read_body(reader, decoder, length, more)
                rec["error"] = f"http_{rec['status']}"
                rec["detail"] = body.decode("utf-8", "replace")[:300]
                rec["end"] = time.perf_counter() - t0
                return rec
            buf = b""
            got = 0
            while True:
                data = await reader.read(65536)
                now = time.perf_counter() - t0
                if not data:
                    break
                more()
                if decoder is not None:
                    data = decoder.feed(data)
                got += len(data)
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue
                    payload_text = line[5:].strip()
                    if payload_text == b"[DONE]":
                        rec["done"] = True
                        continue
                    try:
                        text, usage, finish, error = _event_parts(payload_text)
                    except ValueError:
                        rec["error"], rec["detail"] = "stream_error", f"not JSON: {payload_text[:80]!r}"
                        continue
                    if error is not None:
                        rec["error"] = "stream_error"
                        rec["detail"] = json.dumps(error)[:300]
                    if text is not None:
                        if rec["ttft"] is None:
                            rec["ttft"] = now
                        rec["chunks"].append(now)
                        if collect:
                            rec["text"] += text
                    if usage:
                        rec["usage"] = usage
                    if finish:
                        rec["finish_reason"] = finish
                if rec["done"] or (decoder is not None and decoder.finished) or (length is not None and got >= length):
                    break
            rec["end"] = time.perf_counter() - t0
            if not rec["done"] and rec["error"] is None:
                rec["error"] = "truncated"
                rec["detail"] = "the stream ended before data: [DONE]"
    except TimeoutError:
        rec["error"] = "timeout"
        rec["end"] = time.perf_counter() - t0
        rec["detail"] = f"no byte for {stall_timeout} s" if rec["end"] < request_timeout - 0.5 else \
            f"the request outlived {request_timeout} s"
    except (ConnectionError, OSError, asyncio.IncompleteReadError, ssl.SSLError) as err:
        rec["end"] = time.perf_counter() - t0
        rec["error"] = "truncated" if rec["status"] == 200 else "connect"
        rec["detail"] = f"{type(err).__name__}: {err}"[:200]
    finally:
        if writer is not None:
            writer.close()
    return rec


async def _read_body(reader, decoder, length, more):
    out = b""
    while len(out) < 65536:
        data = await reader.read(65536 if length is None else max(0, length - len(out)))
        if not data:
            break
        more()
        out += decoder.feed(data) if decoder is not None else data
        if (decoder is not None and decoder.finished) or (length is not None and len(out) >= length):
            break
    return out


# ---- prompts -------------------------------------------------------------------------------------


def filler(words, seed):
    """`words` words of plain text in sentences of twelve, different for every seed (no shared prefix)."""
    rng = random.Random(seed)  # noqa: S311 - text, not secrets
    out = []
    for i in range(words):
        word = rng.choice(WORDS)
        out.append(word.capitalize() if i % 12 == 0 else (word + "." if i % 12 == 11 else word))
    return " ".join(out)


def words_for(tokens, calibration):
    """Words of filler that make a prompt of about `tokens` tokens (the calibration's ratio)."""
    return max(1, int((tokens - calibration["overhead"]) / calibration["tokens_per_word"]))


def level_prompt(tokens, calibration, seed):
    """A prompt of about `tokens` tokens that shares no prefix with another (radix-cache hits would hide
    the prefill): a unique opening sentence, then filler."""
    opening = f"Request {seed} of this benchmark: read the text and write on."
    return opening + " " + filler(max(1, words_for(tokens, calibration) - 10), seed)


def recall_prompt(tokens, calibration, depths, seed):
    """Facts planted at `depths` (fractions) of a filler text of about `tokens` tokens, then the question."""
    rng = random.Random(seed)  # noqa: S311 - text, not secrets
    items = ITEMS[: len(depths)]
    facts = [{"depth": d, "item": item, "code": str(rng.randint(1000, 9999))} for d, item in zip(depths, items, strict=True)]
    names = [f"{f['item']} locker" for f in facts]
    question = QUESTION.format(names=", of the ".join(names[:-1]) + (" and of the " if len(names) > 1 else "") + names[-1])
    total = max(len(depths) * 20, words_for(tokens, calibration) - len(question.split()) - 12 * len(facts))
    words = filler(total, seed).split(" ")
    # Insert from the deepest fact so earlier positions stay valid; at sentence boundaries.
    for fact in sorted(facts, key=lambda f: -f["depth"]):
        at = min(len(words), round(len(words) * fact["depth"] / 12.0) * 12)
        words[at:at] = FACT.format(item=fact["item"], code=fact["code"]).split(" ")
    return " ".join(words) + " " + question, facts


def recalled(facts, text):
    return [dict(f, recalled=bool(re.search(rf"(?<!\d){f['code']}(?!\d)", text or ""))) for f in facts]


# ---- figures -------------------------------------------------------------------------------------


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    data = sorted(v for v in values if v is not None)
    if not data:
        return None
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def tokens_of(rec):
    """(completion tokens, where the count comes from): the server's usage, else the deltas counted."""
    usage = rec.get("usage") or {}
    if isinstance(usage.get("completion_tokens"), int):
        return usage["completion_tokens"], "usage"
    return len(rec.get("chunks") or []), "deltas"


def summarize(records, wall):
    """The figures of one level from its raw records (times in seconds; the summary in ms and tok/s)."""
    counted = [r for r in records if r.get("error") != "cancelled"]
    ok = [r for r in counted if r.get("error") is None]
    errors = {}
    for r in counted:
        if r.get("error"):
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    ttfts = [r["ttft"] for r in counted if r.get("ttft") is not None]
    gaps = []
    for r in counted:
        chunks = r.get("chunks") or []
        gaps += [b - a for a, b in zip(chunks, chunks[1:], strict=False)]
    decode = []
    sources = set()
    out_tokens = 0
    for r in counted:
        n, source = tokens_of(r) if r.get("error") is None else (len(r.get("chunks") or []), "deltas")
        out_tokens += n
        if r.get("error") is None:
            sources.add(source)
            chunks = r.get("chunks") or []
            if n > 1 and len(chunks) > 1 and chunks[-1] > chunks[0]:
                decode.append((n - 1) / (chunks[-1] - chunks[0]))
    prompt = [((r.get("usage") or {}).get("prompt_tokens")) for r in ok]
    prompt = [p for p in prompt if isinstance(p, int)]

    def ms(value):
        return None if value is None else round(value * 1000, 2)

    def rounded(value, digits=2):
        return None if value is None else round(value, digits)

    return {
        "requests": len(counted),
        "ok": len(ok),
        "cancelled": len(records) - len(counted),
        "errors": errors,
        "error_count": sum(errors.values()),
        "ttft_ms": {"p50": ms(percentile(ttfts, 50)), "p90": ms(percentile(ttfts, 90)), "p99": ms(percentile(ttfts, 99))},
        "itl_ms": {"p50": ms(percentile(gaps, 50)), "p99": ms(percentile(gaps, 99))},
        "decode_tok_s_per_stream": {"p50": rounded(percentile(decode, 50)), "mean": rounded(sum(decode) / len(decode))
                                    if decode else None},
        "output_tok_s": rounded(out_tokens / wall) if wall > 0 else None,
        "requests_per_s": rounded(len(ok) / wall, 3) if wall > 0 else None,
        "output_tokens": out_tokens,
        "tokens_from": "usage" if sources == {"usage"} else ("deltas" if sources else None),
        "prompt_tokens_p50": rounded(percentile(prompt, 50), 0),
        "wall_s": rounded(wall, 3),
    }


# ---- running a level -----------------------------------------------------------------------------


async def run_level(endpoint, bodies, concurrency, *, deadline, stall_timeout, request_timeout):
    """A closed loop: `concurrency` streams, each sending its next request as soon as its last one ended,
    until `bodies` are all sent or the wall-clock `deadline` (epoch seconds) passes. Returns (records,
    wall seconds); a request cut off by the deadline is recorded as cancelled."""
    records = [None] * len(bodies)
    order = iter(range(len(bodies)))
    t_level = time.perf_counter()

    async def stream():
        for i in order:
            if time.time() >= deadline:
                return
            start = time.perf_counter() - t_level
            records[i] = {"i": i, "start": start, "error": "cancelled", "chunks": []}
            rec = await stream_once(endpoint, bodies[i], stall_timeout, request_timeout)
            rec["i"], rec["start"] = i, start
            records[i] = rec

    tasks = [asyncio.ensure_future(stream()) for dummy in range(max(1, concurrency))]
    left = deadline - time.time()
    if left > 0:
        _done, pending = await asyncio.wait(tasks, timeout=left)
    else:
        pending = set(tasks)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    wall = time.perf_counter() - t_level
    return [r for r in records if r is not None], wall


def watch_parents(interval=0.5):
    """End this process when Ansible's worker (or the shell between it and us) goes away.

    A Ctrl-C reaches the whole foreground process group, this module included (KeyboardInterrupt);
    an ansible-playbook that is killed instead takes its workers down, and a stream must not go on
    without it: the module checks its parent and grandparent and exits when either is gone.
    """
    watched = [os.getppid()]
    try:
        with open(f"/proc/{watched[0]}/stat") as f:
            grand = int(f.read().rsplit(")", 1)[1].split()[1])
        if grand > 1:
            watched.append(grand)
    except (OSError, ValueError, IndexError):
        pass

    async def watch():
        while True:
            await asyncio.sleep(interval)
            for pid in watched:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    # The kernel closes every stream's connection with the process.
                    os._exit(143)
                except PermissionError:
                    pass

    return watch

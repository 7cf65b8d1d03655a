"""A local stand-in for the Hugging Face hub, for tests and benchmarks only.

Serves repositories from a directory through the HTTP API that huggingface_hub 2.4 uses:

    GET  /api/models/<repo>                       model info at the default branch
    GET  /api/models/<repo>/revision/<rev>        model info at a revision (``blobs=true``: sizes, lfs)
    GET  /api/models/<repo>/tree/<rev>[/<path>]   tree listing (``recursive``), paginated with ``Link``
    HEAD /<repo>/resolve/<rev>/<path>             ETag, X-Repo-Commit, X-Linked-Size, X-Linked-Etag
    GET  /<repo>/resolve/<rev>/<path>             file bytes, with ``Range`` for resume
    GET  /_emulator/stats                         bytes served per file (JSON)

Directory layout (``root``)::

    <owner>/<name>/refs.json            {"main": "<40-hex>"}
    <owner>/<name>/<40-hex>/...         the files of that commit

Faults for tests: :meth:`HubEmulator.fault` cuts a file's download at a byte offset (the
connection is dropped mid-body, then the file answers 503 until the fault is cleared, so the
client gives up and a later run must resume); :meth:`HubEmulator.serve_stale` makes a path serve
the bytes of an older commit (a mirror holding a stale copy); :meth:`HubEmulator.hold` stops a
file's body at a byte offset until :meth:`HubEmulator.release` (a transfer caught in the middle,
for a test to interrupt or kill); :meth:`HubEmulator.limit_rate` caps the bytes served per second.

Like the hub: :meth:`HubEmulator.require_token` makes the repositories private (no token: 401
``X-Error-Code: RepoNotFound``; a token it does not know, on any route: 401 with
``X-Error-Message: Invalid credentials in Authorization header`` and no code), an unknown
revision is 404 ``RevisionNotFound`` ("Invalid rev id"), an unknown repository 401
``RepoNotFound`` (404 with a valid token). ``model_info="no_files_metadata"`` answers model info
without per-file sizes (``blobs=true`` ignored) and ``model_info="absent"`` serves only what
``hf download`` reads for a pinned commit, the tree listing and the resolve routes (a plain
mirror; the model info routes are 404 without an error code).

It binds only to the address it is given (127.0.0.1 by default), an IP address, never a name, and
contacts no other host. It resolves no name either: http.server's own bind asks the resolver for the
bound address's name (``socket.getfqdn``), a reverse DNS query about a test address that would go to
the site's resolver; :class:`NumericHTTPServer` skips it.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import random
import socket
import socketserver
import struct
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

REPO_ID = "LibertAIDAI/GLM-5.3-Flash-NVFP4"
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf", ".model")
LFS_MIN_SIZE = 10 * 1024 * 1024
CHUNK = 64 * 1024
MODEL_INFO_MODES = ("full", "no_files_metadata", "absent")


def git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def pointer_oid(blob: Blob) -> str:
    """The git blob id the hub reports for an LFS file: that of its pointer file."""
    ptr = blob.pointer()
    return hashlib.sha1(f"blob {len(ptr)}\0".encode() + ptr, usedforsecurity=False).hexdigest()


def is_lfs(name: str, size: int) -> bool:
    return name.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


@dataclass(frozen=True)
class Blob:
    path: Path
    size: int
    lfs: bool
    git_sha1: str
    sha256: str | None

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha1

    def pointer(self) -> bytes:
        return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n").encode()


class Store:
    """Repositories on disk; file hashes are computed once and cached by (size, mtime)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._cache: dict[tuple[str, int, int], Blob] = {}
        self._lock = threading.Lock()

    def repo_dir(self, repo_id: str) -> Path | None:
        d = self.root / repo_id
        return d if (d / "refs.json").is_file() else None

    def resolve(self, repo_id: str, rev: str) -> str | None:
        d = self.repo_dir(repo_id)
        if d is None:
            return None
        refs = json.loads((d / "refs.json").read_text())
        if rev in refs:
            return refs[rev]
        if len(rev) == 40 and (d / rev).is_dir():
            return rev
        return None

    def files(self, repo_id: str, sha: str) -> list[str]:
        base = self.root / repo_id / sha
        return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())

    def blob(self, repo_id: str, sha: str, name: str) -> Blob | None:
        path = self.root / repo_id / sha / name
        if not path.is_file():
            return None
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            cached = self._cache.get(key)
        if cached:
            return cached
        lfs = is_lfs(name, st.st_size)
        blob = Blob(path, st.st_size, lfs, git_blob_sha1(path), sha256_file(path) if lfs else None)
        with self._lock:
            self._cache[key] = blob
        return blob

    def commit_date(self, repo_id: str, sha: str) -> str:
        meta = self.root / repo_id / f"{sha}.meta.json"
        if meta.is_file():
            return json.loads(meta.read_text()).get("date", "2026-08-30T00:00:00.000Z")
        return "2026-08-30T00:00:00.000Z"


class NumericHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that resolves no name: no test may send a DNS query about a test address.

    http.server.HTTPServer.server_bind sets ``server_name`` from ``socket.getfqdn(host)``, a reverse
    lookup of the bound address (nothing here reads server_name); a numeric address is bound as it is.
    """

    def handle_error(self, request, client_address):
        # A client that hangs up mid-answer (a killed fetch, a broken stream) is a test's doing.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = host
        self.server_port = port


class HubEmulator:
    """Run the emulator in a background thread: ``with HubEmulator(root) as hub: hub.url``."""

    def __init__(self, root: Path | str, host: str = "127.0.0.1", port: int = 0, page_size: int = 1000,
                 model_info: str = "full"):
        # A name would be resolved by the bind; the harness and the tests pass addresses.
        ipaddress.ip_address(host)
        if model_info not in MODEL_INFO_MODES:
            raise ValueError(f"model_info must be one of {MODEL_INFO_MODES}")
        self.store = Store(Path(root))
        self.host = host
        self.page_size = page_size
        self.model_info = model_info
        self.valid_tokens: set[str] | None = None
        self.rate: float | None = None
        self._rate_next = 0.0
        self.holds: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.bytes_served: dict[str, int] = defaultdict(int)
        self.requests: list[tuple[str, str, str | None]] = []
        self.faults: dict[str, dict] = {}
        self.stale: dict[str, str] = {}
        self.tokens_seen: set[str] = set()
        # Addresses requests came from, so a test can tell which node talked to the hub.
        self.clients: set[str] = set()
        emulator = self

        class Handler(_Handler):
            hub = emulator

        self.server = NumericHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> HubEmulator:
        self.thread = threading.Thread(target=self.server.serve_forever, name="hub-emulator", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> HubEmulator:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- test controls -------------------------------------------------------------------
    def reset_counters(self) -> None:
        with self.lock:
            self.bytes_served.clear()
            self.requests.clear()
            self.clients.clear()

    def served(self) -> dict[str, int]:
        with self.lock:
            return {k: v for k, v in self.bytes_served.items() if v}

    def fault(self, path: str, drop_at: int, then_unavailable: bool = True) -> None:
        """Cut the body of ``path`` at absolute byte ``drop_at``; afterwards answer 503 if asked."""
        with self.lock:
            self.faults[path] = {"drop_at": drop_at, "then_unavailable": then_unavailable, "tripped": False}

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def require_token(self, tokens: set[str] | None) -> None:
        """Only these tokens may read (None: anyone, any token, as before)."""
        with self.lock:
            self.valid_tokens = set(tokens) if tokens is not None else None

    def limit_rate(self, bytes_per_s: float | None) -> None:
        """Serve file bodies at most this fast, all connections together (None: no limit)."""
        with self.lock:
            self.rate = bytes_per_s
            self._rate_next = 0.0

    def hold(self, path: str, at: int) -> None:
        """Stop the body of ``path`` after absolute byte ``at`` until :meth:`release` (once)."""
        with self.lock:
            self.holds[path] = {"at": at, "go": threading.Event(), "reached": threading.Event()}

    def wait_held(self, path: str, timeout: float) -> bool:
        """Whether a download of ``path`` reached its hold within ``timeout`` seconds."""
        with self.lock:
            hold = self.holds.get(path)
        return bool(hold) and hold["reached"].wait(timeout)

    def release(self, path: str | None = None, abort: bool = False) -> None:
        """Let held bodies go on (all when ``path`` is None); ``abort``: end them there instead.

        Abort is for a client that is gone (killed): nothing more is written or counted for it.
        """
        with self.lock:
            names = [path] if path is not None else list(self.holds)
            holds = [self.holds.pop(n) for n in names if n in self.holds]
        for hold in holds:
            hold["abort"] = abort
            hold["go"].set()

    def _pace(self, nbytes: int) -> None:
        with self.lock:
            rate = self.rate
            if not rate:
                return
            now = time.monotonic()
            start = max(now, self._rate_next)
            self._rate_next = start + nbytes / rate
            wait = self._rate_next - now
        if wait > 0:
            time.sleep(wait)

    def serve_stale(self, path: str, old_sha: str | None) -> None:
        """Serve ``path`` from commit ``old_sha`` whatever revision is asked (None: stop)."""
        with self.lock:
            if old_sha is None:
                self.stale.pop(path, None)
            else:
                self.stale[path] = old_sha


class _Handler(BaseHTTPRequestHandler):
    hub: HubEmulator
    protocol_version = "HTTP/1.1"
    server_version = "hub-emulator/1"

    def log_message(self, fmt, *args):  # quiet: tests read counters, not logs
        pass

    # ---- plumbing ------------------------------------------------------------------------
    def send_json(self, status: int, obj, headers: dict | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_error_code(self, status: int, code: str, message: str, headers: dict | None = None) -> None:
        self.send_json(status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message,
                                                    **(headers or {})})

    def do_HEAD(self):  # noqa: N802 - http.server naming
        self.route()

    def do_GET(self):  # noqa: N802 - http.server naming
        self.route()

    def route(self) -> None:
        auth = self.headers.get("Authorization")
        if auth:
            with self.hub.lock:
                self.hub.tokens_seen.add(auth)
        with self.hub.lock:
            valid = None if self.hub.valid_tokens is None else set(self.hub.valid_tokens)
        token = auth[len("Bearer "):] if auth and auth.startswith("Bearer ") else None
        # Whether the request may read a private repository; None: everything is public.
        self.authorized = True if valid is None else token in valid
        split = urlsplit(self.path)
        path = unquote(split.path)
        query = parse_qs(split.query)
        with self.hub.lock:
            self.hub.requests.append((self.command, path, self.headers.get("Range")))
            self.hub.clients.add(self.client_address[0])
        if path == "/_emulator/stats":
            return self.send_json(200, {"bytes_served": self.hub.served()})
        if valid is not None and auth and token not in valid:
            # The hub refuses a token it does not know on every route, public repositories included.
            msg = "Invalid credentials in Authorization header"
            return self.send_json(401, {"error": msg}, {"X-Error-Message": msg})
        if path.startswith("/api/models/"):
            return self.api(path[len("/api/models/"):], query)
        parts = path.lstrip("/").split("/", 4)
        if len(parts) == 5 and parts[2] == "resolve":
            return self.resolve(f"{parts[0]}/{parts[1]}", parts[3], parts[4])
        return self.send_error_code(404, "NotFound", f"no route for {path}")

    # ---- API -----------------------------------------------------------------------------
    def api(self, rest: str, query: dict) -> None:
        parts = rest.split("/")
        repo_id = "/".join(parts[:2])
        if (denied := self.repo_denied(repo_id)) is not None:
            return denied
        if (len(parts) == 2 or parts[2] == "revision") and self.hub.model_info == "absent":
            # A plain mirror serves what `hf download` reads for a pinned commit, not the model info.
            return self.send_json(404, {"error": "Not Found"})
        if len(parts) == 2:
            return self.model_info(repo_id, "main", query)
        if parts[2] == "revision" and len(parts) == 4:
            return self.model_info(repo_id, parts[3], query)
        if parts[2] == "tree" and len(parts) >= 4:
            return self.tree(repo_id, parts[3], "/".join(parts[4:]), query)
        return self.send_error_code(404, "NotFound", f"no API route for {rest}")

    def model_info(self, repo_id: str, rev: str, query: dict) -> None:
        store = self.hub.store
        sha = store.resolve(repo_id, rev)
        if sha is None:
            return self.send_error_code(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        blobs = query.get("blobs", ["false"])[0].lower() == "true" and self.hub.model_info == "full"
        siblings = []
        for name in store.files(repo_id, sha):
            entry: dict = {"rfilename": name}
            if blobs:
                b = store.blob(repo_id, sha, name)
                entry["size"] = b.size
                if b.lfs:
                    entry["blobId"] = pointer_oid(b)
                    entry["lfs"] = {"sha256": b.sha256, "size": b.size, "pointerSize": len(b.pointer())}
                else:
                    entry["blobId"] = b.git_sha1
            siblings.append(entry)
        config = None
        cfg = store.root / repo_id / sha / "config.json"
        if cfg.is_file():
            data = json.loads(cfg.read_text())
            config = {"architectures": data.get("architectures"), "model_type": data.get("model_type")}
        date = store.commit_date(repo_id, sha)
        self.send_json(200, {
            "_id": _rev(repo_id)[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/", maxsplit=1)[0],
            "sha": sha,
            "lastModified": date,
            "createdAt": "2026-08-01T00:00:00.000Z",
            "private": False,
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": ["safetensors", "glm5_next", "nvfp4"],
            "library_name": "transformers",
            "config": config,
            "siblings": siblings,
        })

    def tree(self, repo_id: str, rev: str, sub: str, query: dict) -> None:
        store = self.hub.store
        sha = store.resolve(repo_id, rev)
        if sha is None:
            return self.send_error_code(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = sub.strip("/") + "/" if sub.strip("/") else ""
        entries: dict[str, dict] = {}
        for name in store.files(repo_id, sha):
            if not name.startswith(prefix):
                continue
            rel = name[len(prefix):]
            if "/" in rel:
                folder = prefix + rel.split("/")[0]
                entries.setdefault(folder, {"type": "directory", "oid": _rev(folder),
                                            "size": 0, "path": folder})
                if not recursive:
                    continue
                for i in range(1, rel.count("/")):
                    deeper = prefix + "/".join(rel.split("/")[: i + 1])
                    entries.setdefault(deeper, {"type": "directory", "size": 0, "path": deeper,
                                                "oid": _rev(deeper)})
            b = store.blob(repo_id, sha, name)
            item = {"type": "file", "size": b.size, "path": name}
            if b.lfs:
                item["oid"] = pointer_oid(b)
                item["lfs"] = {"oid": b.sha256, "size": b.size, "pointerSize": len(b.pointer())}
            else:
                item["oid"] = b.git_sha1
            entries[name] = item
        items = [entries[k] for k in sorted(entries)]
        start = int(query.get("cursor", ["0"])[0])
        page = items[start:start + self.hub.page_size]
        headers = {}
        if start + self.hub.page_size < len(items):
            nxt = (f"{self.hub.url}/api/models/{repo_id}/tree/{quote(rev, safe='')}"
                   f"{'/' + quote(sub, safe='') if sub else ''}?recursive={str(recursive).lower()}"
                   f"&cursor={start + self.hub.page_size}")
            headers["Link"] = f'<{nxt}>; rel="next"'
        self.send_json(200, page, headers)

    # ---- files ---------------------------------------------------------------------------
    def repo_denied(self, repo_id: str):
        """The hub's answer when ``repo_id`` cannot be read by this request, else None.

        Without valid credentials, a private repository and a missing one look the same (401
        RepoNotFound); with them, a missing one is 404.
        """
        if self.hub.store.repo_dir(repo_id) is None:
            status = 404 if self.headers.get("Authorization") and self.authorized else 401
            return self.send_error_code(status, "RepoNotFound", "Repository not found")
        if not self.authorized:
            return self.send_error_code(401, "RepoNotFound", "Repository not found")
        return None

    def resolve(self, repo_id: str, rev: str, name: str) -> None:
        hub = self.hub
        store = hub.store
        if (denied := self.repo_denied(repo_id)) is not None:
            return denied
        sha = store.resolve(repo_id, rev)
        if sha is None:
            return self.send_error_code(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        blob = store.blob(repo_id, sha, name)
        if blob is None:
            return self.send_error_code(404, "EntryNotFound", f"{name} does not exist on {rev}",
                                        {"X-Repo-Commit": sha})
        with hub.lock:
            stale_sha = hub.stale.get(name)
            fault = dict(hub.faults[name]) if name in hub.faults else None
        body_blob = blob
        if stale_sha and store.blob(repo_id, stale_sha, name) is not None:
            body_blob = store.blob(repo_id, stale_sha, name)
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{blob.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'inline; filename="{name.rsplit("/", 1)[-1]}"',
        }
        if blob.lfs:
            headers["X-Linked-Size"] = str(blob.size)
            headers["X-Linked-Etag"] = f'"{blob.sha256}"'
        if fault and fault["tripped"] and fault["then_unavailable"]:
            return self.send_error_code(503, "ServiceUnavailable", "emulated outage", {"Retry-After": "0"})
        return self.send_body(name, body_blob, headers, fault)

    def send_body(self, name: str, body_blob: Blob, headers: dict, fault: dict | None) -> None:
        hub = self.hub
        size = body_blob.size
        start, end = 0, size - 1
        status = 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[len("bytes="):].split(",")[0].partition("-")
            if first == "":
                start = max(size - int(last), 0)
            else:
                start = int(first)
                if last:
                    end = min(int(last), size - 1)
            if start >= size > 0:
                return self.send_error_code(416, "RangeNotSatisfiable", "range not satisfiable",
                                            {"Content-Range": f"bytes */{size}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = max(end - start + 1, 0)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command == "HEAD":
            return
        cut = fault["drop_at"] if fault and not fault["tripped"] else None
        with hub.lock:
            hold = hub.holds.get(name)
        with body_blob.path.open("rb") as f:
            f.seek(start)
            pos = start
            while pos <= end:
                n = min(CHUNK, end - pos + 1)
                if hold is not None and pos <= hold["at"] < pos + n:
                    n = hold["at"] - pos
                    if n == 0:
                        self.wfile.flush()
                        hold["reached"].set()
                        # Bounded, so a test that forgets to release cannot hang the server for ever.
                        hold["go"].wait(600)
                        if hold.get("abort"):
                            self.close_connection = True
                            return
                        hold = None
                        continue
                if cut is not None and pos + n > cut:
                    n = cut - pos
                    if n > 0:
                        self._send(name, f.read(n))
                    with hub.lock:
                        if name in hub.faults:
                            hub.faults[name]["tripped"] = True
                    self.wfile.flush()
                    # FIN, not RST: an RST makes the kernel drop bytes the client has not read yet,
                    # and the test must know exactly how many bytes reached it. A body shorter
                    # than Content-Length is what a broken transfer looks like to the client.
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_WR)
                    return
                data = f.read(n)
                if not data:
                    break
                self._send(name, data)
                pos += len(data)

    def _send(self, name: str, data: bytes) -> None:
        self.hub._pace(len(data))
        self.wfile.write(data)
        with self.hub.lock:
            self.hub.bytes_served[name] += len(data)


# ---- synthetic checkpoint --------------------------------------------------------------------
OLD_DATE = "2026-08-01T00:00:00.000Z"
NEW_DATE = "2026-08-30T00:00:00.000Z"


def _rev(label: str) -> str:
    return hashlib.sha1(label.encode(), usedforsecurity=False).hexdigest()


def _safetensors(tensors: dict[str, bytes]) -> bytes:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, data in tensors.items():
        header[name] = {"dtype": "U8", "shape": [len(data)], "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(tensors.values())


def build_checkpoint(root: Path | str, repo_id: str = REPO_ID, shards: int = 120, shard_bytes: int = 2048,
                     seed: int = 53, *, extra: dict[str, bytes] | None = None) -> dict:
    """Write two commits of a checkpoint of the real shape; return their shas and file names.

    The old commit (2026-08-01) and the new one (2026-08-30) differ only in
    model-input-scales.safetensors, as the real repository did. Unchanged files are hard links.
    `extra`: further files of both commits by name (another build's standin-build.json, say).
    """
    rng = random.Random(seed)  # noqa: S311 - reproducible filler bytes, not secrets
    repo = Path(root) / repo_id
    extra = dict(extra or {})
    label = f"{repo_id}@{seed}@{shards}@{shard_bytes}" + (
        "@" + hashlib.sha256(json.dumps({k: v.hex() for k, v in sorted(extra.items())}).encode()).hexdigest()
        if extra else "")
    old, new = _rev(f"old@{label}"), _rev(f"new@{label}")
    new_dir, old_dir = repo / new, repo / old
    if (repo / "refs.json").is_file() and new_dir.is_dir() and old_dir.is_dir():
        return {"repo_id": repo_id, "old": old, "new": new, "files": sorted(
            p.relative_to(new_dir).as_posix() for p in new_dir.rglob("*") if p.is_file())}
    new_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes | Path] = {}
    weight_map, total = {}, 0
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        tensor = f"model.layers.{i - 1}.mlp.experts.weight_packed"
        path = new_dir / name
        with path.open("wb") as f:
            # Streamed rather than built in memory so benchmarks can make real-sized shards.
            hdr = {"__metadata__": {"format": "pt"},
                   tensor: {"dtype": "U8", "shape": [shard_bytes], "data_offsets": [0, shard_bytes]}}
            raw = json.dumps(hdr, separators=(",", ":")).encode()
            raw += b" " * (-len(raw) % 8)
            head = struct.pack("<Q", len(raw)) + raw
            f.write(head)
            left = shard_bytes
            while left:
                n = min(left, 1 << 20)
                f.write(rng.randbytes(n))
                left -= n
        files[name] = path
        weight_map[tensor] = name
        total += shard_bytes
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2).encode()
    files["config.json"] = json.dumps({
        "architectures": ["Glm5NextForConditionalGeneration"],
        "model_type": "glm5_next",
        "num_hidden_layers": shards,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                "ignore": ["lm_head", "model.visual*", "*self_attn*"]},
    }, indent=2).encode()
    files["generation_config.json"] = json.dumps(
        {"do_sample": True, "temperature": 1.0, "top_p": 0.95, "eos_token_id": [151329, 151336]}, indent=2).encode()
    files["processor_config.json"] = json.dumps(
        {"processor_class": "Glm5NextProcessor", "image_processor_type": "Glm5NextImageProcessor"}, indent=2).encode()
    files["tokenizer.json"] = json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}}).encode()
    files["tokenizer_config.json"] = json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}).encode()
    files["chat_template.jinja"] = b"{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}\n"
    files["README.md"] = f"# {repo_id}\n\nSynthetic stand-in checkpoint for tests.\n".encode()
    files[".gitattributes"] = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    scales_new = _safetensors({"input_scale": rng.randbytes(512)})
    scales_old = _safetensors({"input_scale": rng.randbytes(512)})
    files["model-input-scales.safetensors"] = scales_new
    files.update(extra)
    for name, content in files.items():
        if isinstance(content, bytes):
            (new_dir / name).write_bytes(content)
    old_dir.mkdir(parents=True, exist_ok=True)
    for path in new_dir.iterdir():
        target = old_dir / path.name
        if path.name == "model-input-scales.safetensors":
            target.write_bytes(scales_old)
        elif not target.exists():
            os.link(path, target)
    (repo / f"{old}.meta.json").write_text(json.dumps({"date": OLD_DATE}))
    (repo / f"{new}.meta.json").write_text(json.dumps({"date": NEW_DATE}))
    (repo / "refs.json").write_text(json.dumps({"main": new}))
    return {"repo_id": repo_id, "old": old, "new": new, "files": sorted(files)}


def _address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Local Hugging Face hub emulator (tests only).")
    ap.add_argument("--root", required=True, help="directory of <owner>/<name>/<sha>/ repositories")
    ap.add_argument("--bind", default="127.0.0.1", type=_address, help="an IP address (a name would be resolved)")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--generate", action="store_true", help="build the synthetic checkpoint under --root first")
    ap.add_argument("--shards", type=int, default=120)
    ap.add_argument("--shard-bytes", type=int, default=2048)
    args = ap.parse_args(argv)
    if args.generate:
        print(json.dumps(build_checkpoint(args.root, shards=args.shards, shard_bytes=args.shard_bytes)))
    hub = HubEmulator(args.root, host=args.bind, port=args.port)
    print(f"serving {args.root} on {hub.url}", flush=True)
    try:
        hub.server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        hub.server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

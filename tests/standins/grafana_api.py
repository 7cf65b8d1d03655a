"""Test stand-in for the part of Grafana's HTTP API that the monitoring role uses, on the controller.

`GET /api/dashboards/uid/<uid>` answers the stored dashboard as Grafana does ({"dashboard": {..., "id", "uid",
"version"}, "meta": {...}}), or 404 {"message": "Dashboard not found"}; `POST /api/dashboards/db` with
{"dashboard", "folderUid"?, "overwrite", "message"} stores it, giving it an id and the next version, and answers
{"id", "uid", "url", "status": "success", "version", "slug"}. Every request needs `Authorization: Bearer <token>`,
else 401 with Grafana's "Invalid API key" body. Requests are recorded (method, path, folder) for the tests, never
the token. Binds the address it is given; resolves no name.
"""

from __future__ import annotations

import json
import re
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Server(ThreadingHTTPServer):
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class GrafanaAPI:
    def __init__(self, token: str, host: str = "127.0.0.1", port: int = 0):
        self.token = token
        self.dashboards: dict[str, dict] = {}
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.httpd = _Server((host, port), self._handler())
        self.url = f"http://{host}:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def posts(self) -> list[dict]:
        return [r for r in self.requests if r["method"] == "POST"]

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def authorized(self):
                scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
                if scheme.lower() == "bearer" and token == api.token:
                    return True
                self.reply(401, {"extra": None, "message": "Invalid API key", "messageId": "api-key.invalid",
                                 "statusCode": 401, "traceID": ""})
                return False

            def do_GET(self):  # noqa: N802 - BaseHTTPRequestHandler's naming
                with api.lock:
                    api.requests.append({"method": "GET", "path": self.path})
                if not self.authorized():
                    return
                match = re.fullmatch(r"/api/dashboards/uid/([A-Za-z0-9_-]+)", self.path)
                stored = api.dashboards.get(match.group(1)) if match else None
                if stored is None:
                    self.reply(404, {"message": "Dashboard not found"})
                    return
                self.reply(200, {"dashboard": stored["dashboard"],
                                 "meta": {"slug": stored["slug"], "url": stored["url"], "version": stored["version"],
                                          "folderUid": stored["folder"]}})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with api.lock:
                    api.requests.append({"method": "POST", "path": self.path, "folder": body.get("folderUid", "")})
                if not self.authorized():
                    return
                if self.path != "/api/dashboards/db" or not isinstance(body.get("dashboard"), dict):
                    self.reply(400, {"message": "bad request data"})
                    return
                dashboard = dict(body["dashboard"])
                uid = dashboard.get("uid") or "generated"
                with api.lock:
                    old = api.dashboards.get(uid)
                    if old and not body.get("overwrite"):
                        self.reply(412, {"message": "A dashboard with the same uid already exists",
                                         "status": "name-exists"})
                        return
                    version = (old["version"] + 1) if old else 1
                    ident = old["dashboard"]["id"] if old else len(api.dashboards) + 1
                    slug = re.sub(r"[^a-z0-9]+", "-", str(dashboard.get("title", "")).lower()).strip("-")
                    dashboard.update(id=ident, uid=uid, version=version)
                    api.dashboards[uid] = {"dashboard": dashboard, "version": version, "slug": slug,
                                           "url": f"/d/{uid}/{slug}", "folder": body.get("folderUid", "")}
                self.reply(200, {"id": ident, "uid": uid, "url": f"/d/{uid}/{slug}", "status": "success",
                                 "version": version, "slug": slug})

        return Handler

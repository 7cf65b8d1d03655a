#!/usr/bin/python
"""Ask an SGLang endpoint the verification questions and judge the answers."""
# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
module: verify_endpoint
short_description: Verify an SGLang OpenAI-compatible endpoint serving GLM-5.3
description:
  - Requests /v1/models, the seed's reasoning question (17 x 23) and a chat completion with one simple tool,
    then judges the answers (plugins/module_utils/verify_judge.py) with a diagnosis and remedy for each failure.
  - Proves the access rules too - without a key and with a wrong key HTTP 401; for an https endpoint the certificate
    chain verifies against C(ca_path) and plain HTTP on the same port is refused.
  - Read-only towards the server; supports check mode (the requests are made in check mode too).
  - Never fails by itself when a check fails; it returns C(ok) and the caller decides.
options:
  endpoint:
    description: Base URL, e.g. http://spark-0:30000.
    type: str
    required: true
  api_key:
    description:
      - Bearer token sent when not empty; never returned.
      - With a key, /v1/models (see auth_probe) is also asked without a key and with a wrong one (both must get
        HTTP 401).
    type: str
    default: ""
  allow_unauthenticated:
    description: Serving without a key is on purpose (a WARN row instead of a failure when no key is sent).
    type: bool
    default: false
  key_file:
    description: Where the generated key is expected, named when no key is known.
    type: str
    default: ""
  ca_path:
    description: CA file the https endpoint's certificate chain must verify against; empty means the system's store.
    type: str
    default: ""
  ca_data:
    description:
      - The CA's PEM text, for a run on another host than the one that holds C(ca_path) (verify asked from the head,
        the CA file being the controller's); when given, the chain is checked against it and C(ca_path) only names it.
    type: str
    default: ""
  engine:
    description:
      - The engine that serves (C(spark_engine)). The parsers that fix a failed row are each engine's own (SGLang's
        reasoning parser is glm45, vLLM's deepseek_r1), and vLLM's empty reply and its HTTP 400 to a tool request
        get their own diagnoses.
    type: str
    default: sglang
    choices: [sglang, vllm]
  expected_model:
    description: Served model name, or the basename of the model path SGLang serves.
    type: str
    required: true
  max_tokens:
    description: max_tokens of the chat requests (the thinking counts against it).
    type: int
    default: 1024
  timeout:
    description: Seconds per request.
    type: int
    default: 300
  body_limit:
    description: Characters of each response body kept in the result.
    type: int
    default: 4000
  auth_probe:
    description:
      - What the requests without a key and with a wrong one ask. C(models) - GET /v1/models, which both engines
        keep behind the key. C(generation) - a one-token chat completion, for the model gateway (smg), which lists
        its models to anyone and keeps only the generation routes behind the key.
    type: str
    default: models
    choices: [models, generation]
  gate_rounds:
    description:
      - The corruption gate - each of its questions (Chinese, Korean, code, JSON and the tool call) asked this many
        times beside the checks' own; 0 leaves the gate out.
      - The gate row counts, over every answer, those with a replacement (U+FFFD) or invalid character and the tool
        calls whose arguments do not parse, per question and as rates against the two thresholds below.
    type: int
    default: 0
  gate_max_tokens:
    description: Token budget of each gate question but the tool call (which has max_tokens).
    type: int
    default: 256
  max_fffd_rate:
    description: The share of answers (0 to 1) that may hold a replacement or invalid character.
    type: float
    default: 0.0
  max_bad_tool_call_rate:
    description: The share of tool calls (0 to 1) whose arguments may fail to parse as a JSON object.
    type: float
    default: 0.0
author: LLM serving maintainers (@dgx-spark)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: The requests are made in check mode too; they change nothing on the server.
  diff_mode:
    support: N/A
    details: Never changes anything.
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Verify the head's endpoint from the controller
  dgx_spark.llm_serving.verify_endpoint:
    endpoint: http://spark-0:30000
    key_file: "{{ inventory_dir }}/.credentials/spark_llm_api_key"
    expected_model: /models/glm53
  delegate_to: localhost
  register: __verify_result
"""

RETURN = r"""
ok:
  description: Whether every check passed.
  type: bool
  returned: always
checks:
  description: One entry per check with name, ok, detail, diagnosis, remedy.
  type: list
  returned: always
table:
  description: The checks as fixed-width text lines.
  type: list
  returned: always
model:
  description: The model id used for the chat requests.
  type: str
  returned: always
exchanges:
  description: Per request the HTTP status, elapsed seconds, error and (truncated) body.
  type: dict
  returned: always
certificate:
  description: For an https endpoint the TLS version, subject, issuer and expiry of the verified certificate, or the error.
  type: dict
  returned: always (null for http)
"""

import json
import os
import secrets
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import Request, make_context
from ansible_collections.dgx_spark.llm_serving.plugins.module_utils.verify_judge import (
    gate_requests,
    judge_all,
    reasoning_request,
    tool_request,
)

KEEP = object()


def _exchange(module, method, url, payload=None, key=KEEP, *, context):
    headers = {"Accept": "application/json"}
    key = module.params["api_key"] if key is KEEP else key
    if key:
        headers["Authorization"] = "Bearer " + key
    data = None
    if payload is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    started = time.monotonic()
    result = {"status": None, "error": "", "body_text": "", "json": None}
    try:
        response = Request().open(method, url, data=data, headers=headers, timeout=module.params["timeout"],
                                  follow_redirects="none", validate_certs=True, context=context)
        result["status"] = response.status
        raw = response.read()
    except Exception as exc:  # noqa: BLE001 - every transport failure is a verification result
        status = getattr(exc, "code", None)
        result["status"] = status
        result["error"] = f"{type(exc).__name__}: {exc}"
        raw = exc.read() if status and hasattr(exc, "read") else b""
    result["elapsed"] = round(time.monotonic() - started, 3)
    # errors="replace" on purpose: bytes that are not UTF-8 become U+FFFD and the sanity check sees them.
    result["body_text"] = raw.decode("utf-8", errors="replace")
    try:
        result["json"] = json.loads(result["body_text"]) if result["body_text"] else None
    except ValueError:
        result["json"] = None
    return result


def _name(rdns):
    """A certificate name as `CN=x, O=y` from ssl's nested tuples."""
    return ", ".join(f"{k}={v}" for part in rdns or () for k, v in part) or "?"


def _certificate(url, ca, timeout):
    """The TLS handshake a client makes: chain and name checked against `ca` (else the system's store)."""
    parts = urlsplit(url)
    try:
        context = ssl.create_default_context(cafile=ca or None)
        with socket.create_connection((parts.hostname, parts.port or 443), timeout=timeout) as raw, \
                context.wrap_socket(raw, server_hostname=parts.hostname) as tls:
            cert = tls.getpeercert()
            return {"error": "", "version": tls.version(), "subject": _name(cert.get("subject")),
                    "issuer": _name(cert.get("issuer")), "not_after": cert.get("notAfter", "?")}
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        return {"error": f"{type(exc).__name__}: {exc}"}


def main():
    module = AnsibleModule(
        argument_spec={
            "endpoint": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "expected_model": {"type": "str", "required": True},
            "max_tokens": {"type": "int", "default": 1024, "no_log": False},
            "timeout": {"type": "int", "default": 300},
            "body_limit": {"type": "int", "default": 4000},
            "allow_unauthenticated": {"type": "bool", "default": False},
            "key_file": {"type": "str", "default": ""},
            "ca_path": {"type": "str", "default": ""},
            "ca_data": {"type": "str", "default": ""},
            "engine": {"type": "str", "default": "sglang", "choices": ["sglang", "vllm"]},
            "auth_probe": {"type": "str", "default": "models", "choices": ["models", "generation"]},
            "gate_rounds": {"type": "int", "default": 0},
            "gate_max_tokens": {"type": "int", "default": 256, "no_log": False},
            "max_fffd_rate": {"type": "float", "default": 0.0},
            "max_bad_tool_call_rate": {"type": "float", "default": 0.0},
        },
        supports_check_mode=True,
    )
    base = module.params["endpoint"].rstrip("/")
    tls = base.startswith("https://")
    ca = module.params["ca_path"]
    if module.params["ca_data"]:
        ca = os.path.join(module.tmpdir, "ca.crt")
        with open(ca, "w", encoding="utf-8") as handle:
            handle.write(module.params["ca_data"])
    # One TLS context for every request of the run: open_url makes one per request, each loading the system's
    # CA store again. A plain http:// request never uses it, so without TLS the context is a bare one that
    # loads nothing.
    context = make_context(cafile=ca or None) if tls else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    exchanges = {"models": _exchange(module, "GET", base + "/v1/models", context=context)}
    reachable = exchanges["models"]["status"] is not None
    model = module.params["expected_model"]
    listed = (exchanges["models"].get("json") or {}).get("data") if reachable else None
    if isinstance(listed, list) and listed and isinstance(listed[0], dict) and listed[0].get("id"):
        # Chat requests name a model the server lists, so a name mismatch fails one check, not three.
        ids = [m.get("id") for m in listed if isinstance(m, dict)]
        model = next((i for i in ids if i == model or str(i).rsplit("/", 1)[-1] == model), ids[0])
    # The requests after the model list are independent: asked at once, a site waits for the slower of the
    # two generations instead of their sum (the group serves two requests at once, the seed's concurrency).
    asked = {}
    if reachable:
        asked["reasoning"] = ("POST", base + "/v1/chat/completions", reasoning_request(model, module.params["max_tokens"]), KEEP)
        asked["tool_call"] = ("POST", base + "/v1/chat/completions", tool_request(model, module.params["max_tokens"]), KEEP)
        # The corruption gate's questions, asked with the others: the engine queues what its batch cannot hold.
        for name, request in gate_requests(model, module.params["gate_max_tokens"], module.params["gate_rounds"],
                                           module.params["max_tokens"]).items():
            asked[name] = ("POST", base + "/v1/chat/completions", request, KEEP)
    # Who is served: no key, and a key that is not the served one (random, so it is nobody's).
    if module.params["auth_probe"] == "generation":
        refused = ("POST", base + "/v1/chat/completions",
                   {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]})
    else:
        refused = ("GET", base + "/v1/models", None)
    asked["unauthenticated"] = (*refused, "")
    if module.params["api_key"]:
        asked["wrong_key"] = (*refused, "wrong-" + secrets.token_hex(24))
    if tls:
        # Without the key: a key must never cross the network in clear text.
        asked["plain_http"] = ("GET", "http://" + base[len("https://"):] + "/v1/models", None, "")
    # At most eight at once: the gate's questions would otherwise open dozens of connections (the engine queues
    # beyond its batch either way).
    with ThreadPoolExecutor(max_workers=min(len(asked) + 1, 8)) as pool:
        answers = {name: pool.submit(_exchange, module, method, url, payload, key, context=context)
                   for name, (method, url, payload, key) in asked.items()}
        checked = pool.submit(_certificate, base, ca, module.params["timeout"]) if tls else None
        exchanges.update((name, answer.result()) for name, answer in answers.items())
        certificate = checked.result() if checked else None
    access = {"keyed": bool(module.params["api_key"]), "allow_unauthenticated": module.params["allow_unauthenticated"],
              "key_file": module.params["key_file"], "tls": tls, "ca": module.params["ca_path"]}
    gate = {"rounds": module.params["gate_rounds"], "max_fffd_rate": module.params["max_fffd_rate"],
            "max_bad_tool_call_rate": module.params["max_bad_tool_call_rate"]}
    verdict = judge_all({**exchanges, "certificate": certificate}, module.params["expected_model"], access,
                        module.params["engine"], gate)
    limit = module.params["body_limit"]
    kept = {
        name: {
            "status": ex["status"],
            "elapsed": ex["elapsed"],
            "error": ex["error"],
            "body": ex["json"] if ex["json"] is not None and len(ex["body_text"]) <= limit else ex["body_text"][:limit],
        }
        for name, ex in exchanges.items()
    }
    module.exit_json(changed=False, ok=verdict["ok"], checks=verdict["checks"], table=verdict["table"], model=model,
                     exchanges=kept, certificate=certificate)


if __name__ == "__main__":
    main()

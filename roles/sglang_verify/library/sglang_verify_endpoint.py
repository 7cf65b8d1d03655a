#!/usr/bin/python
"""Ask an SGLang endpoint the verification questions and judge the answers."""
# Ansible module layout: the documentation blocks come before the imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_verify_endpoint
short_description: Verify an SGLang OpenAI-compatible endpoint serving GLM-5.3
description:
  - Requests /v1/models, the seed's reasoning question (17 x 23) and a chat completion with one simple tool,
    then judges the answers (module_utils/sglang_verify_judge.py) with a diagnosis and remedy for each failure.
  - Read-only towards the server; supports check mode (the requests are made in check mode too).
  - Never fails by itself when a check fails; it returns C(ok) and the caller decides.
options:
  endpoint:
    description: Base URL, e.g. http://spark-0:30000.
    type: str
    required: true
  api_key:
    description: Bearer token sent when not empty; never returned.
    type: str
    default: ""
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
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_verify_judge import (
    judge_all,
    reasoning_request,
    tool_request,
)
from ansible.module_utils.urls import open_url


def _exchange(module, method, url, payload=None):
    headers = {"Accept": "application/json"}
    if module.params["api_key"]:
        headers["Authorization"] = "Bearer " + module.params["api_key"]
    data = None
    if payload is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    started = time.monotonic()
    result = {"status": None, "error": "", "body_text": "", "json": None}
    try:
        response = open_url(url, method=method, data=data, headers=headers, timeout=module.params["timeout"],
                            follow_redirects="none")
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


def main():
    module = AnsibleModule(
        argument_spec={
            "endpoint": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "expected_model": {"type": "str", "required": True},
            "max_tokens": {"type": "int", "default": 1024},
            "timeout": {"type": "int", "default": 300},
            "body_limit": {"type": "int", "default": 4000},
        },
        supports_check_mode=True,
    )
    base = module.params["endpoint"].rstrip("/")
    exchanges = {"models": _exchange(module, "GET", base + "/v1/models")}
    reachable = exchanges["models"]["status"] is not None
    model = module.params["expected_model"]
    listed = (exchanges["models"].get("json") or {}).get("data") if reachable else None
    if isinstance(listed, list) and listed and isinstance(listed[0], dict) and listed[0].get("id"):
        # Chat requests name a model the server lists, so a name mismatch fails one check, not three.
        ids = [m.get("id") for m in listed if isinstance(m, dict)]
        model = next((i for i in ids if i == model or str(i).rsplit("/", 1)[-1] == model), ids[0])
    if reachable:
        exchanges["reasoning"] = _exchange(module, "POST", base + "/v1/chat/completions",
                                           reasoning_request(model, module.params["max_tokens"]))
        exchanges["tool_call"] = _exchange(module, "POST", base + "/v1/chat/completions",
                                           tool_request(model, module.params["max_tokens"]))
    verdict = judge_all(exchanges, module.params["expected_model"])
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
                     exchanges=kept)


if __name__ == "__main__":
    main()

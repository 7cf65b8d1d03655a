"""Verify's proof of the access rules (module_utils/verify_judge.py): who is served, and the TLS chain.

Fed recorded exchanges, as the endpoint module records them; the end-to-end runs are in
tests/integration/test_verify.py (the stand-in on 127.0.0.1) and test_secure_endpoint.py (nginx on a node).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "verify_judge_access", REPO / "plugins/module_utils/verify_judge.py")
judge = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(judge)

KEYED = {"keyed": True, "allow_unauthenticated": False, "key_file": "/site/.credentials/spark_llm_api_key"}
CERT = {"error": "", "version": "TLSv1.3", "subject": "commonName=spark-0", "issuer": "commonName=CA",
        "not_after": "Mar  4 11:57:09 2029 GMT"}


def answer(status, body=None):
    return {"status": status, "error": "" if status else "URLError: <urlopen error [Errno 111] Connection refused>",
            "body_text": body or "", "json": None}


def test_a_keyed_endpoint_refuses_no_key_and_a_wrong_key():
    row = judge.judge_auth({"unauthenticated": answer(401), "wrong_key": answer(401), "models": answer(200)}, KEYED)
    assert row["ok"] and not row["warn"]
    assert row["detail"] == "without a key: HTTP 401, wrong key: HTTP 401, the right key: HTTP 200"


def test_an_endpoint_that_serves_without_the_key_fails():
    row = judge.judge_auth({"unauthenticated": answer(200), "wrong_key": answer(401)}, KEYED)
    assert not row["ok"] and row["detail"].startswith("served without a key (")
    row = judge.judge_auth({"unauthenticated": answer(401), "wrong_key": answer(200)}, KEYED)
    assert not row["ok"] and row["detail"].startswith("served with a wrong key (")
    row = judge.judge_auth({"unauthenticated": answer(403), "wrong_key": answer(401)}, KEYED)
    assert not row["ok"] and "(401 expected)" in row["detail"]


def test_no_key_known_names_where_it_was_looked_for():
    row = judge.judge_auth({"unauthenticated": answer(401)}, {**KEYED, "keyed": False})
    assert not row["ok"] and "/site/.credentials/spark_llm_api_key does not exist" in row["detail"]
    assert "run playbooks/server.yml" in row["remedy"]


def test_serving_without_a_key_on_purpose_is_a_warning_row():
    access = {"keyed": False, "allow_unauthenticated": True}
    verdict = judge.judge_all({"unauthenticated": answer(200)}, "glm53", access)
    row = verdict["checks"][-1]
    assert row["name"] == "auth" and row["ok"] and row["warn"]
    lines = [line for line in verdict["table"] if line.startswith("auth")]
    assert lines == ["auth       WARN    served without an API key (server_allow_unauthenticated: true): anyone "
                     "who reaches the port can use the model"]
    assert any("server_allow_unauthenticated: false" in line for line in verdict["table"])


def test_tls_passes_only_with_a_verified_chain_and_plain_http_refused():
    ok = judge.judge_tls({"certificate": CERT, "plain_http": answer(400)}, {"ca": "/site/.credentials/spark-llm-ca.crt"})
    assert ok["ok"] and ok["detail"] == (
        "TLSv1.3, chain verifies against /site/.credentials/spark-llm-ca.crt: commonName=spark-0 issued by commonName=CA, "
        "valid until Mar  4 11:57:09 2029 GMT; plain HTTP refused (HTTP 400)")
    assert judge.judge_tls({"certificate": CERT, "plain_http": answer(None)}, {})["detail"].endswith("plain HTTP refused")
    bad = judge.judge_tls({"certificate": {"error": "SSLCertVerificationError: certificate verify failed"}}, {"ca": ""})
    assert not bad["ok"] and "does not verify against the system's trust store" in bad["detail"]
    served = judge.judge_tls({"certificate": CERT, "plain_http": answer(200)}, {})
    assert not served["ok"] and served["detail"] == "plain HTTP is served on the TLS port"


def test_without_access_the_table_keeps_its_four_rows():
    assert [c["name"] for c in judge.judge_all({}, "glm53")["checks"]] == ["models", "reasoning", "tool_call", "sanity"]
    names = [c["name"] for c in judge.judge_all({}, "glm53", {**KEYED, "tls": True})["checks"]]
    assert names == ["models", "reasoning", "tool_call", "sanity", "auth", "tls"]

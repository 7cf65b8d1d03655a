"""Judging of an SGLang endpoint's answers: the one place that decides pass or fail.

Pure Python without Ansible imports, so the library module runs it on the
controller and the unit tests feed it recorded good and bad responses.

Every check returns a dict ``{name, ok, detail, diagnosis, remedy}``; the
diagnosis names the fingerprint from the field-tested procedure and the remedy
the exact variable to change, so an operator reading the table knows what to do.
"""

from __future__ import annotations

import json
import re

REPLACEMENT = "\ufffd"
SEED_PROMPT = "17 \u00d7 23 = ?"
SEED_ANSWER = "391"

# The one simple tool of the tool-call check: a single required string argument.
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}},
            "required": ["city"],
        },
    },
}
TOOL_PROMPT = "What is the weather in Paris right now? Use the get_weather tool."

OVERRIDES = "server_flag_overrides"
# The parsers are the engines' opposite rules for this model (the seed): what fixes one engine breaks the other.
REASONING_FIXES = {
    "sglang": (
        f"launch SGLang with --reasoning-parser glm45 (the role's default): remove 'reasoning-parser' from {OVERRIDES}, "
        "re-run playbooks/server.yml (glm45 for reasoning, glm47 for tool calls: the spellings differ on purpose)"
    ),
    "vllm": (
        f"launch vLLM with --reasoning-parser deepseek_r1 (the role's default): remove 'reasoning-parser' from "
        f"{OVERRIDES}, re-run playbooks/server.yml (vLLM's glm45 drops the whole reply for GLM-5.3: the opposite of "
        "SGLang's rule)"
    ),
}
REASONING_FIX = REASONING_FIXES["sglang"]
TOOL_FIXES = {
    "sglang": (
        f"launch SGLang with --tool-call-parser glm47 (the role's default): remove 'tool-call-parser' from {OVERRIDES} "
        "or set it to glm47, re-run playbooks/server.yml"
    ),
    "vllm": (
        f"launch vLLM with --tool-call-parser glm47 and --enable-auto-tool-choice (the role's defaults): remove both "
        f"from {OVERRIDES}, re-run playbooks/server.yml"
    ),
}
TOOL_FIX = TOOL_FIXES["sglang"]
LABELS = {"sglang": "SGLang", "vllm": "vLLM"}
# vLLM's answer to a tool request it was not launched to parse (its own words, without the quotes around "auto",
# which the JSON body escapes).
AUTO_TOOL_CHOICE = "tool choice requires --enable-auto-tool-choice"
# Empty content and no reasoning in a finished answer: with vLLM's glm45 parser the whole reply is dropped silently.
DROPPED = {
    "sglang": "the whole reply came back empty (content and reasoning_content), though the request finished",
    "vllm": "the whole reply was dropped (empty content, no reasoning_content, HTTP 200): the fingerprint of vLLM's "
            "glm45 reasoning parser with GLM-5.3, which the seed rules out for vLLM",
}
CORRUPTION_FIX = (
    "run playbooks/doctor.yml; check that every rank runs the same image ID (server_image_digest pins it), "
    "deep-verify the checkpoint (checkpoint_deep_verify: true with playbooks/checkpoint.yml; "
    "model-input-scales.safetensors fetched before 2026-08-30 must be fetched again), and keep kv-cache-dtype bfloat16"
)
# The corruption gate's prompts: the scripts and formats in which a build's broken tokens show (the field report:
# U+FFFD now and then, a few bad characters per Korean answer where an English one has none), each asked
# gate_rounds times. The tool call is the tool-call check's own question.
GATE_PROMPTS = {
    "chinese": "\u7528\u4e24\u53e5\u8bdd\u4ecb\u7ecd\u957f\u57ce\u7684\u5386\u53f2\u3002",
    "korean": "\ud55c\uad6d\uc758 \uc0ac\uacc4\uc808\uc5d0 \ub300\ud574 \ub450 \ubb38\uc7a5\uc73c\ub85c "
              "\uc124\uba85\ud574 \uc8fc\uc138\uc694.",
    "code": "Write a short Python function that reverses a string, with a docstring.",
    "json": 'Reply with only a JSON object {"city": ..., "country": ...} naming the capital of Japan.',
    "tool_call": TOOL_PROMPT,
}
GATE_FIX = (
    "switch to a checkpoint build that does not emit them (checkpoint_repo_id and checkpoint_revision), or to the "
    "image before this change; the thresholds are verify_max_fffd_rate and verify_max_bad_tool_call_rate, the "
    "questions' number verify_gate_rounds"
)
THINK_TAG = re.compile(r"</?think>", re.IGNORECASE)
RAW_TOOL_MARKUP = re.compile(r"<\s*/?\s*(tool_call|arg_key|arg_value)\b|\bget_weather\s*[({<]", re.IGNORECASE)


def check(name, ok, detail, diagnosis="", remedy="", *, warn=False):
    """One row; `warn` marks a passing row the operator should still read (served without a key)."""
    return {"name": name, "ok": bool(ok), "detail": detail, "diagnosis": diagnosis, "remedy": remedy,
            "warn": bool(warn)}


def _http_problem(name, exchange, engine="sglang"):
    """A check result for a request that did not return a usable JSON body, else None."""
    if exchange is None:
        return check(name, False, "not requested", "an earlier check failed before this request was made")
    status = exchange.get("status")
    if exchange.get("error") and not status:
        return check(
            name,
            False,
            f"no answer: {exchange['error']}",
            "the endpoint is not reachable (unit down, still loading, wrong address or port, or a firewall)",
            "run playbooks/status.yml and playbooks/doctor.yml; check verify_endpoint / server_port",
        )
    if status in (401, 403):
        return check(
            name,
            False,
            f"HTTP {status}",
            "the endpoint wants an API key and the one sent is missing or different",
            "send the key the server was deployed with: server_api_key, else the generated one "
            "(<inventory>/.credentials/spark_llm_api_key; verify_api_key overrides both)",
        )
    if status == 400 and AUTO_TOOL_CHOICE in str(exchange.get("body_text", "")):
        return check(
            name,
            False,
            f"HTTP 400: {str(exchange.get('body_text', ''))[:200]}",
            "vLLM was launched without --enable-auto-tool-choice, so it refuses every request that offers tools",
            TOOL_FIXES["vllm"],
        )
    if status != 200:
        return check(
            name,
            False,
            f"HTTP {status}: {str(exchange.get('body_text', ''))[:200]}",
            "the server refused or failed the request",
            "run playbooks/doctor.yml for the rank logs",
        )
    if not isinstance(exchange.get("json"), dict):
        return check(
            name,
            False,
            f"body is not a JSON object: {str(exchange.get('body_text', ''))[:200]!r}",
            f"something other than {LABELS.get(engine, engine)}'s OpenAI-compatible API answers on this port",
            "check verify_endpoint and server_port",
        )
    return None


def model_matches(model_id, expected):
    """SGLang serves the --model-path (a container path) unless served-model-name is set."""
    if not isinstance(model_id, str) or not expected:
        return False
    return model_id == expected or model_id.rstrip("/").rsplit("/", 1)[-1] == expected.rstrip("/").rsplit("/", 1)[-1]


def judge_models(exchange, expected):
    problem = _http_problem("models", exchange)
    if problem:
        return problem, None
    data = exchange["json"].get("data")
    ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    listed = ", ".join(str(i) for i in ids) or "nothing"
    match = next((i for i in ids if model_matches(i, expected)), None)
    if match is None:
        return check(
            "models",
            False,
            f"/v1/models lists {listed}; expected {expected}",
            "the endpoint does not serve the expected model",
            "set verify_served_model to the served name (served-model-name in "
            f"{OVERRIDES}, else the basename of server_model_dir)",
        ), None
    return check("models", True, f"{match} listed"), match


def _message(exchange):
    choices = exchange["json"].get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None, None
    choice = choices[0]
    message = choice.get("message")
    return (message if isinstance(message, dict) else None), choice.get("finish_reason")


def judge_reasoning(exchange, engine="sglang"):
    problem = _http_problem("reasoning", exchange, engine)
    fix = REASONING_FIXES.get(engine, REASONING_FIX)
    if problem:
        return problem
    message, finish = _message(exchange)
    if message is None:
        return check("reasoning", False, "no choices[0].message in the answer", "not an OpenAI chat completion",
                     "run playbooks/doctor.yml")
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content") or ""
    if not isinstance(content, str) or not isinstance(reasoning, str):
        return check("reasoning", False, "content or reasoning_content is not a string",
                     "not an OpenAI chat completion", "run playbooks/doctor.yml")
    short = content if len(content) <= 80 else content[:40] + "..." + content[-30:]

    leaked = bool(THINK_TAG.search(content)) or (bool(reasoning.strip()) and reasoning.strip() in content)
    if leaked or (not reasoning.strip() and len(content.strip()) > len(SEED_ANSWER) and SEED_ANSWER in content):
        return check(
            "reasoning",
            False,
            f"content {short!r}, reasoning_content {'empty' if not reasoning.strip() else 'set'}",
            "thinking leaks into content (</think> or the reasoning inside content, reasoning_content "
            "null): the reasoning parser is not active",
            fix,
        )
    if not reasoning.strip():
        if finish == "length":
            return check("reasoning", False, "reasoning_content empty, finish_reason length",
                         "the answer was cut off by max_tokens", "raise verify_max_tokens")
        if not content.strip():
            return check("reasoning", False, f"content empty, reasoning_content empty, finish_reason {finish}",
                         DROPPED.get(engine, DROPPED["sglang"]), fix)
        return check(
            "reasoning",
            False,
            f"content {short!r}, reasoning_content empty",
            "no reasoning_content: the reasoning parser is not active",
            fix,
        )
    if SEED_ANSWER not in content:
        if not content.strip() and finish == "length":
            return check("reasoning", False, "content empty, finish_reason length (still thinking)",
                         "the thinking used up max_tokens before the answer",
                         "raise verify_max_tokens")
        return check(
            "reasoning",
            False,
            f"content {short!r} lacks {SEED_ANSWER}",
            "a wrong answer to 17 x 23 with the parser active: the model computes garbage",
            CORRUPTION_FIX,
        )
    return check("reasoning", True, f"content {short!r}, reasoning_content {len(reasoning)} chars")


def judge_tool_call(exchange, tool_name=TOOL["function"]["name"], engine="sglang"):
    problem = _http_problem("tool_call", exchange, engine)
    fix = TOOL_FIXES.get(engine, TOOL_FIX)
    if problem:
        return problem
    message, finish = _message(exchange)
    if message is None:
        return check("tool_call", False, "no choices[0].message in the answer", "not an OpenAI chat completion",
                     "run playbooks/doctor.yml")
    content = message.get("content") or ""
    calls = message.get("tool_calls")
    if not calls:
        if not str(content).strip():
            return check(
                "tool_call",
                False,
                f"tool_calls {json.dumps(calls)}, content empty, finish_reason {finish}",
                "empty content plus null tool_calls is the fingerprint of --tool-call-parser glm "
                "(tool calls fail silently)",
                fix,
            )
        if RAW_TOOL_MARKUP.search(str(content)):
            return check(
                "tool_call",
                False,
                f"tool_calls {json.dumps(calls)}, tool-call markup in content",
                "the tool call came back as text: no matching tool-call parser is active",
                fix,
            )
        return check(
            "tool_call",
            False,
            f"tool_calls {json.dumps(calls)}, content {str(content)[:60]!r}",
            "the model answered in text instead of calling the tool; with GLM-5.3 this points at the "
            "tool-call parser",
            fix,
        )
    if not isinstance(calls, list):
        return check("tool_call", False, f"tool_calls is {type(calls).__name__}, not a list",
                     "not an OpenAI chat completion", fix)
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            return check("tool_call", False, "a tool call without a function object",
                         "the tool-call parser produced a malformed call", fix)
        arguments = function.get("arguments")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else None
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            return check(
                "tool_call",
                False,
                f"{function.get('name')} arguments {str(arguments)[:80]!r} are not a JSON object",
                "the tool call's arguments are not valid JSON: a parser mismatch or corrupted output",
                fix + "; if the parser is glm47 already: " + CORRUPTION_FIX,
            )
        if function.get("name") != tool_name:
            return check("tool_call", False, f"called {function.get('name')!r}, offered only {tool_name!r}",
                         "the tool name came back wrong: corrupted output or a parser mismatch", CORRUPTION_FIX)
    first = calls[0]["function"]
    return check("tool_call", True, f"{first['name']}({first['arguments']})")


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def judge_sanity(exchanges):
    """No U+FFFD anywhere in what the endpoint said (raw bodies and parsed fields)."""
    seen = 0
    answered = 0
    for exchange in exchanges:
        if not exchange or not exchange.get("body_text"):
            continue
        answered += 1
        texts = [exchange.get("body_text") or ""] + list(_strings(exchange.get("json")))
        seen = max(seen, sum(t.count(REPLACEMENT) for t in texts))
    if answered == 0:
        return check("sanity", False, "no answer to inspect", "the endpoint did not answer",
                     "run playbooks/doctor.yml")
    if seen:
        return check(
            "sanity",
            False,
            f"{seen} U+FFFD replacement character(s) in the output",
            "replacement characters are a known corruption symptom of this checkpoint family",
            CORRUPTION_FIX,
        )
    return check("sanity", True, f"no U+FFFD in {answered} answer(s)")


def bad_characters(text):
    """The characters no clean generation holds: U+FFFD, control characters other than tab and line breaks, lone
    surrogates and the noncharacters U+FFFE/U+FFFF."""
    bad = 0
    for ch in text:
        cp = ord(ch)
        if (ch == REPLACEMENT or (cp < 32 and ch not in "\t\n\r") or 0x7F <= cp <= 0x9F or 0xD800 <= cp <= 0xDFFF
                or cp in (0xFFFE, 0xFFFF)):
            bad += 1
    return bad


def _generated(exchange):
    """What the model wrote in one answer: (its texts - content, reasoning and tool-call arguments, as parsed -, its
    tool calls, its content)."""
    message = _message(exchange)[0] or {}
    texts = [message.get("content"), message.get("reasoning_content"), message.get("reasoning")]
    calls = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []
    texts += [(call.get("function") or {}).get("arguments") for call in calls if isinstance(call, dict)]
    content = message.get("content") if isinstance(message.get("content"), str) else ""
    return [t for t in texts if isinstance(t, str)], calls, content


def _call_parses(call, tool_name):
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or function.get("name") != tool_name:
        return False
    try:
        return isinstance(json.loads(function.get("arguments") or ""), dict)
    except (TypeError, ValueError):
        return False


def judge_gate(asked, thresholds, tool_name=TOOL["function"]["name"]):
    """The corruption gate: over every answer of the run, grouped by question ({kind: [exchange, ...]}), the share of
    answers holding a replacement or invalid character (fffd_rate) and of tool calls that do not parse
    (bad_tool_call_rate), each against its threshold (max_fffd_rate, max_bad_tool_call_rate)."""
    by_prompt = {}
    answers = corrupt = characters = bad_total = calls_seen = bad_calls = questions = 0
    unanswered = []
    for kind, exchanges in asked.items():
        row = {"asked": len(exchanges), "answers": 0, "corrupt_answers": 0, "bad_characters": 0}
        questions += len(exchanges)
        for exchange in exchanges:
            if not exchange or exchange.get("status") != 200 or not isinstance(exchange.get("json"), dict):
                unanswered.append(f"{kind}: {_answer(exchange)}")
                continue
            texts, calls, content = _generated(exchange)
            # The raw body's U+FFFD too: bytes that were not UTF-8 decode to it before any field is parsed.
            bad = max(sum(bad_characters(t) for t in texts), (exchange.get("body_text") or "").count(REPLACEMENT))
            row["answers"] += 1
            row["bad_characters"] += bad
            row["corrupt_answers"] += 1 if bad else 0
            characters += sum(len(t) for t in texts)
            if kind == "tool_call" and (calls or RAW_TOOL_MARKUP.search(content)):
                row.setdefault("tool_calls", 0)
                row.setdefault("bad_tool_calls", 0)
                parsed = bool(calls) and all(_call_parses(call, tool_name) for call in calls)
                row["tool_calls"] += 1
                row["bad_tool_calls"] += 0 if parsed else 1
        answers += row["answers"]
        corrupt += row["corrupt_answers"]
        bad_total += row["bad_characters"]
        calls_seen += row.get("tool_calls", 0)
        bad_calls += row.get("bad_tool_calls", 0)
        by_prompt[kind] = row
    fffd_rate = round(corrupt / answers, 4) if answers else None
    tool_rate = round(bad_calls / calls_seen, 4) if calls_seen else 0.0
    figures = {
        "questions": questions, "answers": answers, "corrupt_answers": corrupt, "bad_characters": bad_total,
        "characters": characters,
        "fffd_rate": fffd_rate, "tool_calls": calls_seen, "bad_tool_calls": bad_calls, "bad_tool_call_rate": tool_rate,
        "max_fffd_rate": thresholds["max_fffd_rate"], "max_bad_tool_call_rate": thresholds["max_bad_tool_call_rate"],
        "by_prompt": by_prompt,
    }
    if not answers:
        result = check("gate", False, "no answer to inspect", "the endpoint did not answer the gate's questions",
                       "run playbooks/doctor.yml")
        result["figures"] = figures
        return result
    where = ", ".join(f"{kind} {row['corrupt_answers']} of {row['answers']}" for kind, row in by_prompt.items()
                      if row["corrupt_answers"])
    detail = (f"{corrupt} of {answers} answers with replacement or invalid characters (rate {fffd_rate:g}, "
              f"at most {thresholds['max_fffd_rate']:g}), {bad_calls} of {calls_seen} tool calls that do not parse "
              f"(rate {tool_rate:g}, at most {thresholds['max_bad_tool_call_rate']:g})")
    broken = []
    if fffd_rate > thresholds["max_fffd_rate"]:
        broken.append(f"replacement or invalid characters in {where} ({bad_total} character{'' if bad_total == 1 else 's'})")
    if tool_rate > thresholds["max_bad_tool_call_rate"]:
        broken.append(f"tool calls whose arguments are no JSON object for {tool_name}")
    if unanswered:
        detail += f"; {len(unanswered)} of {questions} questions got no answer (first: {unanswered[0]})"
    if broken:
        result = check("gate", False, detail,
                       "the build or the image emits broken tokens: " + "; ".join(broken)
                       + " (the known corruption of this checkpoint family shows in some scripts and not in others)",
                       CORRUPTION_FIX + "; or " + GATE_FIX)
    elif unanswered:
        result = check("gate", False, detail,
                       "the engine failed or timed out on some of the gate's questions: the rates stand on fewer answers",
                       "run playbooks/doctor.yml and playbooks/status.yml; raise verify_request_timeout if the answers "
                       "only came late")
    else:
        result = check("gate", True, detail)
    result["figures"] = figures
    return result


def _answer(exchange):
    """How a request ended, in a few words: `HTTP 401`, or the transport error."""
    if not exchange:
        return "not asked"
    if exchange.get("status"):
        return f"HTTP {exchange['status']}"
    return f"no answer ({str(exchange.get('error') or 'no error recorded')[:120]})"


def judge_auth(exchanges, access):
    """Who is served: without a key and with a wrong one HTTP 401, with the right one an answer (the models row).

    ``access``: ``keyed`` (a key was sent with the other requests), ``allow_unauthenticated`` (serving without
    a key is on purpose), ``key_file`` (where the generated key is expected).
    """
    anonymous, wrong = exchanges.get("unauthenticated"), exchanges.get("wrong_key")
    if not access.get("keyed"):
        if not access.get("allow_unauthenticated"):
            where = access.get("key_file") or "<inventory>/.credentials/spark_llm_api_key"
            return check(
                "auth",
                False,
                f"no API key known: server_api_key is empty and {where} does not exist",
                "the server role generates the key when it deploys; this inventory has not deployed one yet",
                f"run playbooks/server.yml with this inventory (it writes {where}), or set server_api_key "
                "to the deployed key",
            )
        if anonymous and anonymous.get("status") == 200:
            return check(
                "auth",
                True,
                "served without an API key (server_allow_unauthenticated: true): anyone who reaches the port "
                "can use the model",
                "serving without a key was asked for",
                "set server_allow_unauthenticated: false (a key is generated beside the inventory) or set "
                "server_api_key, then re-run playbooks/server.yml",
                warn=True,
            )
        return check("auth", False, f"without a key: {_answer(anonymous)}, but no key is known to send",
                     "the endpoint wants a key while server_allow_unauthenticated is true",
                     "set server_api_key to the served key, or re-run playbooks/server.yml")
    served = [name for name, ex in (("without a key", anonymous), ("with a wrong key", wrong))
              if ex and ex.get("status") == 200]
    if served:
        return check(
            "auth",
            False,
            f"served {' and '.join(served)} (without a key: {_answer(anonymous)}, wrong key: {_answer(wrong)})",
            "SGLang runs without --api-key: the unit starts python3 -m sglang.launch_server, or the rank's key file "
            "(/etc/spark-llm/spark-llm.key, mounted read-only) is empty",
            "re-run playbooks/server.yml (it installs the key and the keyed launcher); see playbooks/doctor.yml",
        )
    if not (anonymous and anonymous.get("status") == 401 and wrong and wrong.get("status") == 401):
        return check(
            "auth",
            False,
            f"without a key: {_answer(anonymous)}, wrong key: {_answer(wrong)} (401 expected)",
            "the endpoint did not refuse unauthenticated requests the way SGLang's API key check does",
            "run playbooks/status.yml and playbooks/doctor.yml",
        )
    right = _answer(exchanges.get("models"))
    return check("auth", True, f"without a key: HTTP 401, wrong key: HTTP 401, the right key: {right}")


def judge_tls(exchanges, access):
    """The certificate chain verifies against the CA clients trust, and plain HTTP gets no answer from the API."""
    cert, plain = exchanges.get("certificate") or {}, exchanges.get("plain_http")
    ca = access.get("ca") or "the system's trust store"
    if cert.get("error") or not cert:
        return check(
            "tls",
            False,
            f"the certificate chain does not verify against {ca}: {cert.get('error') or 'not checked'}",
            "the endpoint's certificate is not signed by that CA, has expired, or lacks the name used to reach the head",
            "leave server_tls_cert/_key empty for a generated CA and certificate, or set server_tls_ca to "
            "the CA of the given certificate and add the name clients use to server_tls_subject_alt_names; "
            "re-run playbooks/server.yml",
        )
    if plain and plain.get("status") == 200:
        return check(
            "tls",
            False,
            "plain HTTP is served on the TLS port",
            "something other than the TLS proxy answers on server_port",
            "re-run playbooks/server.yml with server_tls: true; see playbooks/doctor.yml",
        )
    refused = "refused" if not (plain and plain.get("status")) else f"refused ({_answer(plain)})"
    return check(
        "tls",
        True,
        f"{cert.get('version', 'TLS')}, chain verifies against {ca}: {cert.get('subject', '?')} issued by "
        f"{cert.get('issuer', '?')}, valid until {cert.get('not_after', '?')}; plain HTTP {refused}",
    )


def judge_all(exchanges, expected_model, access=None, engine="sglang", gate=None):
    """All checks in table order from the recorded exchanges {models, reasoning, tool_call, ...}.

    With ``gate`` ({rounds, max_fffd_rate, max_bad_tool_call_rate}, rounds above 0) the gate row judges every answer:
    the seed and tool-call questions' and the gate's own (exchanges ``gate:<kind>:<n>``).
    With ``access`` (what the deployment promises: see judge_auth, plus ``tls`` and ``ca``) the auth row and,
    with TLS, the tls row follow. ``engine`` (sglang, vllm) chooses the diagnoses and fixes that differ.
    """
    models, dummy = judge_models(exchanges.get("models"), expected_model)
    results = [
        models,
        judge_reasoning(exchanges.get("reasoning"), engine),
        judge_tool_call(exchanges.get("tool_call"), engine=engine),
        judge_sanity([exchanges.get(k) for k in ("models", "reasoning", "tool_call")]),
    ]
    if gate and gate.get("rounds", 0) > 0:
        asked = {"seed": [exchanges.get("reasoning")], "tool_call": [exchanges.get("tool_call")]}
        for name, exchange in exchanges.items():
            if name.startswith("gate:"):
                asked.setdefault(name.split(":")[1], []).append(exchange)
        results.append(judge_gate(asked, gate))
    if access is not None:
        results.append(judge_auth(exchanges, access))
        if access.get("tls"):
            results.append(judge_tls(exchanges, access))
    return {"ok": all(r["ok"] for r in results), "checks": results, "table": table(results)}


def table(results):
    """A short fixed-width table; a failing row is followed by its diagnosis and remedy."""
    width = max(len(r["name"]) for r in results)
    lines = [f"{'check'.ljust(width)}  result  detail"]
    for r in results:
        verdict = "FAIL" if not r["ok"] else "WARN" if r.get("warn") else "PASS"
        lines.append(f"{r['name'].ljust(width)}  {verdict}    {r['detail']}")
        if not r["ok"] or r.get("warn"):
            if r["diagnosis"]:
                lines.append(f"{''.ljust(width)}  cause:  {r['diagnosis']}")
            if r["remedy"]:
                lines.append(f"{''.ljust(width)}  fix:    {r['remedy']}")
    return lines


def reasoning_request(model, max_tokens):
    return {"model": model, "messages": [{"role": "user", "content": SEED_PROMPT}], "max_tokens": max_tokens}


def gate_requests(model, max_tokens, rounds, tool_max_tokens=None):
    """The gate's questions, {gate:<kind>:<n>: request}: each prompt of GATE_PROMPTS asked `rounds` times; the tool
    call with the tool-call check's budget (a thinking model writes its call after its thoughts)."""
    asked = {}
    for n in range(rounds):
        for kind, prompt in GATE_PROMPTS.items():
            request = tool_request(model, tool_max_tokens or max_tokens) if kind == "tool_call" else {
                "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
            asked[f"gate:{kind}:{n}"] = request
    return asked


def tool_request(model, max_tokens):
    return {
        "model": model,
        "messages": [{"role": "user", "content": TOOL_PROMPT}],
        "tools": [TOOL],
        "tool_choice": "auto",
        "max_tokens": max_tokens,
    }

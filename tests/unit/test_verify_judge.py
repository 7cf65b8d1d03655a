"""The verify judge (plugins/module_utils/verify_judge.py) on recorded good and bad answers.

The recorded bodies are written out here, in the shapes SGLang returns and the
seed describes (deployment-facts.md, "Known failures" 3 and 4, "Verifying a
deployment"), not produced by the responder the integration tests use: a
judge checked only against its own stand-in could share its blind spots.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "verify_judge", REPO / "plugins/module_utils/verify_judge.py"
)
judge = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(judge)


def ok(body):
    return {"status": 200, "error": "", "body_text": json.dumps(body, ensure_ascii=False), "json": body}


def chat(message, finish="stop"):
    return ok({"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish}]})


MODELS = ok({"object": "list", "data": [{"id": "/models/glm53", "object": "model"}]})
# deployment-facts.md, "Verifying a deployment": the correct answer.
GOOD_REASONING = chat({"role": "assistant", "content": "391",
                       "reasoning_content": "17 × 23 = 17 × 20 + 17 × 3 = 340 + 51 = 391", "tool_calls": None})
# Known failure 4: reasoning parser missing.
NO_PARSER = chat({"role": "assistant", "content": "17 × 20 = 340, 17 × 3 = 51, so the answer is 391.</think>391",
                  "reasoning_content": None})
# Thinking in content without the closing tag, reasoning_content null.
NO_PARSER_NO_TAG = chat({"role": "assistant", "content": "Let me compute 17 × 20 = 340 and 17 × 3 = 51. The answer is 391",
                         "reasoning_content": None})
GOOD_TOOL = chat({"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
]}, finish="tool_calls")
# Known failure 3: --tool-call-parser glm.
GLM_PARSER = chat({"role": "assistant", "content": "", "tool_calls": None})
RAW_MARKUP = chat({"role": "assistant", "content": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>",
                   "tool_calls": None})
BAD_ARGS = chat({"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\""}}
]}, finish="tool_calls")


def run(**overrides):
    exchanges = {"models": MODELS, "reasoning": GOOD_REASONING, "tool_call": GOOD_TOOL}
    exchanges.update(overrides)
    verdict = judge.judge_all(exchanges, "glm53")
    return verdict, {c["name"]: c for c in verdict["checks"]}


def test_good_deployment_passes_every_check():
    verdict, checks = run()
    assert verdict["ok"], verdict["table"]
    assert list(checks) == ["models", "reasoning", "tool_call", "sanity"]
    assert all(c["ok"] for c in checks.values())


@pytest.mark.parametrize("answer", [NO_PARSER, NO_PARSER_NO_TAG], ids=["think-tag", "no-tag"])
def test_thinking_in_content_names_the_reasoning_parser(answer):
    verdict, checks = run(reasoning=answer)
    assert not verdict["ok"]
    assert not checks["reasoning"]["ok"]
    assert "reasoning parser" in checks["reasoning"]["diagnosis"]
    assert "glm45" in checks["reasoning"]["remedy"]
    assert checks["tool_call"]["ok"] and checks["models"]["ok"]


def test_reasoning_content_also_copied_into_content_is_a_leak():
    leaked = chat({"role": "assistant", "content": "17 × 20 = 340 ... 391\n391", "reasoning_content": "17 × 20 = 340 ... 391"})
    _, checks = run(reasoning=leaked)
    assert not checks["reasoning"]["ok"]
    assert "glm45" in checks["reasoning"]["remedy"]


def test_wrong_answer_with_parser_active_points_at_corruption():
    wrong = chat({"role": "assistant", "content": "394", "reasoning_content": "17 × 23 = 394"})
    _, checks = run(reasoning=wrong)
    assert not checks["reasoning"]["ok"]
    assert "garbage" in checks["reasoning"]["diagnosis"]
    assert "image" in checks["reasoning"]["remedy"]


def test_cut_off_thinking_asks_for_more_tokens():
    cut = chat({"role": "assistant", "content": "", "reasoning_content": "17 × 23 = 17 × 20 + ..."}, finish="length")
    _, checks = run(reasoning=cut)
    assert not checks["reasoning"]["ok"]
    assert "verify_max_tokens" in checks["reasoning"]["remedy"]


def test_empty_content_null_tool_calls_is_the_glm_parser_fingerprint():
    verdict, checks = run(tool_call=GLM_PARSER)
    assert not verdict["ok"]
    c = checks["tool_call"]
    assert not c["ok"]
    assert "fingerprint of --tool-call-parser glm " in c["diagnosis"]
    assert "glm47" in c["remedy"]
    assert checks["reasoning"]["ok"]


def test_tool_markup_in_content_names_glm47():
    _, checks = run(tool_call=RAW_MARKUP)
    assert not checks["tool_call"]["ok"]
    assert "as text" in checks["tool_call"]["diagnosis"]
    assert "glm47" in checks["tool_call"]["remedy"]


def test_invalid_json_arguments_fail_the_tool_check():
    _, checks = run(tool_call=BAD_ARGS)
    assert not checks["tool_call"]["ok"]
    assert "not valid JSON" in checks["tool_call"]["diagnosis"]


def test_json_arguments_must_be_an_object():
    scalar = chat({"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": "\"Paris\""}}]})
    _, checks = run(tool_call=scalar)
    assert not checks["tool_call"]["ok"]


@pytest.mark.parametrize("where", ["reasoning", "tool_call"])
def test_replacement_character_anywhere_fails_sanity(where):
    good = {"reasoning": GOOD_REASONING, "tool_call": GOOD_TOOL}[where]
    body = json.loads(good["body_text"])
    if where == "reasoning":
        body["choices"][0]["message"]["reasoning_content"] += " \ufffd"
    else:
        body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = "{\"city\": \"Pa\ufffdis\"}"
    verdict, checks = run(**{where: ok(body)})
    assert not verdict["ok"]
    assert not checks["sanity"]["ok"]
    assert "corruption" in checks["sanity"]["diagnosis"]
    assert checks[where]["ok"], "the replacement character is the sanity check's finding, not this one's"


def test_replacement_from_undecodable_bytes_in_the_raw_body_fails_sanity():
    # The module decodes with errors="replace": invalid UTF-8 arrives as U+FFFD in body_text only.
    exchange = dict(GOOD_REASONING, body_text=GOOD_REASONING["body_text"].replace("391\"", "39\ufffd1\"", 1))
    _, checks = run(reasoning=exchange)
    assert not checks["sanity"]["ok"]


def test_unreachable_endpoint_fails_everything_with_a_pointer():
    down = {"status": None, "error": "URLError: <urlopen error [Errno 111] Connection refused>", "body_text": "", "json": None}
    verdict = judge.judge_all({"models": down}, "glm53")
    checks = {c["name"]: c for c in verdict["checks"]}
    assert not verdict["ok"]
    assert "not reachable" in checks["models"]["diagnosis"]
    assert checks["reasoning"]["detail"] == "not requested"
    assert not checks["sanity"]["ok"]


def test_missing_or_wrong_api_key_is_named():
    denied = {"status": 401, "error": "HTTPError: 401", "body_text": "{\"error\": \"Unauthorized\"}",
              "json": {"error": "Unauthorized"}}
    _, checks = run(models=denied)
    assert not checks["models"]["ok"]
    assert "server_api_key" in checks["models"]["remedy"]


@pytest.mark.parametrize(("listed", "expected", "passes"), [
    ("/models/glm53", "glm53", True),
    ("glm53", "glm53", True),
    ("/models/glm53", "/models/glm53", True),
    ("/models/other", "glm53", False),
])
def test_model_listing(listed, expected, passes):
    check, match = judge.judge_models(ok({"data": [{"id": listed}]}), expected)
    assert check["ok"] is passes
    assert (match == listed) is passes


def test_empty_model_list_fails():
    check, _ = judge.judge_models(ok({"data": []}), "glm53")
    assert not check["ok"]
    assert "nothing" in check["detail"]


def test_table_shows_cause_and_fix_under_a_failing_row():
    verdict, _ = run(tool_call=GLM_PARSER)
    text = "\n".join(verdict["table"])
    assert "tool_call  FAIL" in text
    assert "cause:" in text and "fix:" in text and "glm47" in text
    assert text.count("PASS") == 3


def test_requests_are_the_seed_question_and_one_simple_tool():
    r = judge.reasoning_request("/models/glm53", 512)
    assert r["messages"] == [{"role": "user", "content": "17 × 23 = ?"}]
    t = judge.tool_request("/models/glm53", 512)
    assert len(t["tools"]) == 1
    assert t["tools"][0]["function"]["parameters"]["required"] == ["city"]


# vLLM (reference: vllm-and-gateway.md, and the seed's vLLM rule): glm45 answers HTTP 200 with nothing in it.
VLLM_GLM45_DROP = chat({"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": []})
VLLM_NO_AUTO_TOOL = {"status": 400, "error": "", "json": None, "body_text": json.dumps({
    "object": "error", "message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
    "type": "BadRequestError", "param": None, "code": 400})}


def test_vllm_s_dropped_reply_is_named_with_vllm_s_parser_as_the_fix():
    verdict = judge.judge_all({"models": MODELS, "reasoning": VLLM_GLM45_DROP, "tool_call": GOOD_TOOL}, "glm53",
                              engine="vllm")
    row = {c["name"]: c for c in verdict["checks"]}["reasoning"]
    assert row["ok"] is False and row["detail"] == "content empty, reasoning_content empty, finish_reason stop"
    assert "the whole reply was dropped" in row["diagnosis"] and "vLLM's glm45 reasoning parser" in row["diagnosis"]
    assert "--reasoning-parser deepseek_r1" in row["remedy"] and "--reasoning-parser glm45" not in row["remedy"]
    # The same answer from SGLang is no vLLM parser problem: SGLang's own fix, without vLLM's fingerprint.
    sglang = {c["name"]: c for c in judge.judge_all(
        {"models": MODELS, "reasoning": VLLM_GLM45_DROP, "tool_call": GOOD_TOOL}, "glm53")["checks"]}["reasoning"]
    assert "vLLM" not in sglang["diagnosis"] and "--reasoning-parser glm45" in sglang["remedy"]


def test_a_missing_reasoning_parser_gets_each_engine_s_own_parser():
    for engine, parser in (("sglang", "glm45"), ("vllm", "deepseek_r1")):
        row = judge.judge_reasoning(NO_PARSER, engine)
        assert row["ok"] is False and f"--reasoning-parser {parser} (the role's default)" in row["remedy"], engine


def test_vllm_s_400_to_a_tool_request_names_auto_tool_choice():
    row = judge.judge_tool_call(VLLM_NO_AUTO_TOOL, engine="vllm")
    assert row["ok"] is False and row["detail"].startswith("HTTP 400: ")
    assert "without --enable-auto-tool-choice" in row["diagnosis"]
    assert "--enable-auto-tool-choice" in row["remedy"] and "remove both" in row["remedy"]
    # Any other 400 stays a refused request.
    other = {**VLLM_NO_AUTO_TOOL, "body_text": '{"message": "bad"}'}
    assert judge.judge_tool_call(other, engine="vllm")["diagnosis"] == "the server refused or failed the request"
    assert "--enable-auto-tool-choice" in judge.judge_tool_call(GLM_PARSER, engine="vllm")["remedy"]


# ---- the corruption gate ------------------------------------------------------------------------------------------

GATE = {"rounds": 2, "max_fffd_rate": 0.0, "max_bad_tool_call_rate": 0.0}
KOREAN = chat({"role": "assistant", "content": "한국에는 봄, 여름, 가을, 겨울이 있습니다.",
               "reasoning_content": "사계절을 설명한다."})
# The field report's fingerprint: a few characters of a Korean answer broken, the English ones clean.
KOREAN_BROKEN = chat({"role": "assistant", "content": "한국에는 봄, \ufffd름, 가을, 겨울이 있습니다.",
                      "reasoning_content": "사계절을 설\ufffd한다."})
CHINESE = chat({"role": "assistant", "content": "长城是中国古代的军事防御工程。"})
CODE = chat({"role": "assistant", "content": 'def reverse(s):\n    """Reverse s."""\n    return s[::-1]\n'})


def gate_exchanges(korean=(KOREAN, KOREAN), tool=None):
    exchanges = {"models": MODELS, "reasoning": GOOD_REASONING, "tool_call": GOOD_TOOL}
    for n in range(2):
        exchanges.update({f"gate:chinese:{n}": CHINESE, f"gate:korean:{n}": korean[n], f"gate:code:{n}": CODE,
                          f"gate:json:{n}": chat({"role": "assistant", "content": '{"city": "Tokyo", "country": "Japan"}'}),
                          f"gate:tool_call:{n}": (tool or (GOOD_TOOL, GOOD_TOOL))[n]})
    return exchanges


def gate_row(exchanges, **thresholds):
    verdict = judge.judge_all(exchanges, "glm53", gate={**GATE, **thresholds})
    return {c["name"]: c for c in verdict["checks"]}["gate"], verdict


def test_the_gate_passes_clean_answers_in_every_script_and_counts_them():
    row, verdict = gate_row(gate_exchanges())
    assert row["ok"] and verdict["ok"], row
    figures = row["figures"]
    # The seed and tool-call checks' answers and the gate's own: 2 + 5 questions x 2 rounds.
    assert (figures["answers"], figures["corrupt_answers"], figures["fffd_rate"]) == (12, 0, 0.0)
    assert (figures["tool_calls"], figures["bad_tool_calls"], figures["bad_tool_call_rate"]) == (3, 0, 0.0)
    assert set(figures["by_prompt"]) == {"seed", "tool_call", "chinese", "korean", "code", "json"}


def test_korean_broken_now_and_then_fails_the_gate_where_the_english_sanity_check_passes():
    row, verdict = gate_row(gate_exchanges(korean=(KOREAN, KOREAN_BROKEN)))
    checks = {c["name"]: c for c in verdict["checks"]}
    assert checks["sanity"]["ok"]  # the seed's one short English answer shows nothing
    assert not row["ok"] and not verdict["ok"]
    assert row["figures"]["by_prompt"]["korean"] == {"asked": 2, "answers": 2, "corrupt_answers": 1, "bad_characters": 2}
    assert row["figures"]["fffd_rate"] == round(1 / 12, 4)
    assert "korean 1 of 2" in row["diagnosis"] and "2 characters" in row["diagnosis"]
    assert "checkpoint_repo_id" in row["remedy"] and "verify_max_fffd_rate" in row["remedy"]
    # A threshold above the rate lets it pass: the rate is what is judged, not a single character.
    assert gate_row(gate_exchanges(korean=(KOREAN, KOREAN_BROKEN)), max_fffd_rate=0.1)[0]["ok"]


def test_control_characters_and_lone_surrogates_count_as_invalid():
    assert judge.bad_characters("ok\tline\n\r") == 0
    assert judge.bad_characters("a\x00b\x1bc\x85\ud800\uffff\ufffd") == 6


def test_tool_calls_whose_arguments_do_not_parse_cross_their_rate():
    broken = chat({"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"'}}]},
        finish="tool_calls")
    row, _ = gate_row(gate_exchanges(tool=(GOOD_TOOL, broken)))
    assert not row["ok"]
    assert (row["figures"]["tool_calls"], row["figures"]["bad_tool_calls"]) == (3, 1)
    assert "no JSON object" in row["diagnosis"]
    assert gate_row(gate_exchanges(tool=(GOOD_TOOL, broken)), max_bad_tool_call_rate=0.5)[0]["ok"]


def test_a_tool_question_answered_without_a_call_is_not_a_broken_call():
    # A thinking model can spend its budget before it calls: no call is not a corrupted one.
    row, _ = gate_row(gate_exchanges(tool=(chat({"role": "assistant", "content": "It is sunny."}), GOOD_TOOL)))
    assert row["ok"] and row["figures"]["tool_calls"] == 2


def test_no_gate_row_without_rounds_and_the_requests_follow_the_rounds():
    verdict = judge.judge_all(gate_exchanges(), "glm53", gate={**GATE, "rounds": 0})
    assert "gate" not in {c["name"] for c in verdict["checks"]}
    asked = judge.gate_requests("glm53", 256, 3, tool_max_tokens=1024)
    assert len(asked) == 15 and asked["gate:korean:2"]["max_tokens"] == 256
    assert asked["gate:tool_call:0"]["tools"] and asked["gate:tool_call:0"]["max_tokens"] == 1024


def test_questions_the_engine_did_not_answer_fail_the_gate_by_name():
    exchanges = gate_exchanges()
    exchanges["gate:code:1"] = {"status": 500, "error": "HTTPError: 500", "body_text": "", "json": None}
    row, _ = gate_row(exchanges)
    assert not row["ok"] and "1 of 12 questions got no answer (first: code: HTTP 500)" in row["detail"]
    assert "failed or timed out" in row["diagnosis"] and row["figures"]["answers"] == 11

"""The model fakes refuse what OpenAI and Anthropic refuse, with their status, error type and message, and accept the rest."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any, Callable

import aiohttp
import pytest

from common.config import Provider as ProviderConfig
from common.secrets import set_secret
from services.runner.llm import Message, ProviderError, ToolCall, ToolSpec
from services.runner.providers import make_provider
from tests.fake_models import FakeModels
from tests.model_api_rules import anthropic_refusal, openai_refusal

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
OPENAI_HEADERS = {"authorization": "Bearer sk-test", "content-type": "application/json"}
ANTHROPIC_HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01", "content-type": "application/json"}


def openai_call(call_id: str, name: str = "read_file", arguments: Any = '{"path": "a"}') -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def openai_good() -> dict:
    """Two parallel tool calls answered, then the person again: what the runner sends after a tool step."""
    return {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "read a and b"},
            {"role": "assistant", "content": None, "tool_calls": [openai_call("call_1"), openai_call("call_2")]},
            {"role": "tool", "tool_call_id": "call_1", "content": "A"},
            {"role": "tool", "tool_call_id": "call_2", "content": "B"},
            {"role": "user", "content": "thanks"},
        ],
        "tools": [{"type": "function", "function": {"name": "read_file", "description": "Read.", "parameters": SCHEMA}}],
    }


def anthropic_good() -> dict:
    return {
        "model": "claude-3-5-haiku-20241022",
        "max_tokens": 100,
        "system": "You are terse.",
        "messages": [
            {"role": "user", "content": "read a and b"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Reading both."},
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}},
                {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"path": "b"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "A"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "B"},
                {"type": "text", "text": "thanks"},
            ]},
        ],
        "tools": [{"name": "read_file", "description": "Read.", "input_schema": SCHEMA}],
    }


def edited(good: Callable[[], dict], edit: Callable[[dict], Any]) -> dict:
    body = copy.deepcopy(good())
    edit(body)
    return body


def msgs(body: dict) -> list:
    return body["messages"]


def anthropic_user(body: dict) -> list:
    return body["messages"][2]["content"]


# --- OpenAI ----------------------------------------------------------------------------------------------

OPENAI_REFUSED = {
    "a second result for one call": (
        lambda b: msgs(b).insert(4, {"role": "tool", "tool_call_id": "call_1", "content": "Waiting."}),
        400, "Invalid parameter: Duplicate value for 'tool_call_id' of 'call_1', in messages[3] and messages[4].",
        "messages.[4].tool_call_id", None),
    "a tool message with no tool_calls before it": (
        lambda b: msgs(b).pop(2),
        400, "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with"
             " 'tool_calls'.", "messages.[2].role", None),
    "a tool message answering another call": (
        lambda b: msgs(b)[4].update(tool_call_id="call_9"),
        400, "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with"
             " 'tool_calls'.", "messages.[4].role", None),
    "a call left unanswered before the next message": (
        lambda b: msgs(b).pop(4),
        400, "An assistant message with 'tool_calls' must be followed by tool messages responding to each"
             " 'tool_call_id'. The following tool_call_ids did not have response messages: call_2",
        "messages.[2].role", None),
    "calls left unanswered at the end": (
        lambda b: b.update(messages=msgs(b)[:3]),
        400, "An assistant message with 'tool_calls' must be followed by tool messages responding to each"
             " 'tool_call_id'. The following tool_call_ids did not have response messages: call_1, call_2",
        "messages.[2].role", None),
    "null content without tool_calls": (
        lambda b: msgs(b).append({"role": "assistant", "content": None}),
        400, "Invalid value for 'content': expected a string, got null.", "messages.[6].content", None),
    "null content from the user": (
        lambda b: msgs(b)[1].update(content=None),
        400, "Invalid value for 'content': expected a string, got null.", "messages.[1].content", None),
    "arguments as an object": (
        lambda b: msgs(b)[2]["tool_calls"][0]["function"].update(arguments={"path": "a"}),
        400, "Invalid type for 'messages[2].tool_calls[0].function.arguments': expected a string, but got an object"
             " instead.", "messages[2].tool_calls[0].function.arguments", "invalid_type"),
    "a tool name with a dot": (
        lambda b: b["tools"][0]["function"].update(name="files.read"),
        400, "Invalid 'tools[0].function.name': string does not match pattern. Expected a string that matches the"
             " pattern '^[a-zA-Z0-9_-]+$'.", "tools[0].function.name", "invalid_value"),
    "a tool name of 65 characters": (
        lambda b: b["tools"][0]["function"].update(name="x" * 65),
        400, "Invalid 'tools[0].function.name': string too long. Expected a string with maximum length 64, but got"
             " a string with length 65 instead.", "tools[0].function.name", "string_above_max_length"),
    "a called name with a space": (
        lambda b: msgs(b)[2]["tool_calls"][1]["function"].update(name="read file"),
        400, "Invalid 'messages[2].tool_calls[1].function.name': string does not match pattern. Expected a string"
             " that matches the pattern '^[a-zA-Z0-9_-]+$'.", "messages[2].tool_calls[1].function.name",
        "invalid_value"),
    "one call id twice": (
        lambda b: msgs(b)[2]["tool_calls"][1].update(id="call_1"),
        400, "Invalid parameter: Duplicate value for 'tool_calls.id' of 'call_1', in messages[2] and messages[2].",
        "messages[2].tool_calls[1].id", None),
    "an empty tools list": (
        lambda b: b.update(tools=[]),
        400, "Invalid 'tools': empty array. Expected an array with minimum length 1, but got an empty array instead.",
        "tools", "empty_array"),
    "an unknown role": (
        lambda b: msgs(b)[1].update(role="human"),
        400, "Invalid value: 'human'. Supported values are: 'system', 'developer', 'user', 'assistant', 'tool', and"
             " 'function'.", "messages[1].role", "invalid_value"),
}


@pytest.mark.parametrize("case", sorted(OPENAI_REFUSED))
def test_openai_refuses_as_openai_does(case: str) -> None:
    edit, status, message, param, code = OPENAI_REFUSED[case]
    refusal = openai_refusal(edited(openai_good, edit), OPENAI_HEADERS)
    assert (status, "invalid_request_error", message, param, code) == (
        refusal.status, refusal.type, refusal.message, refusal.param, refusal.code)


def test_openai_wants_a_bearer_key_unless_keyless() -> None:
    refusal = openai_refusal(openai_good(), {})
    assert (401, "invalid_request_error", True) == (refusal.status, refusal.type,
                                                     refusal.message.startswith("You didn't provide an API key."))
    assert openai_refusal(openai_good(), {}, keyless=True) is None


OPENAI_ACCEPTED = {
    "the good request": lambda b: None,
    "empty assistant text with tool_calls": lambda b: msgs(b)[2].update(content=""),
    "assistant text without tool_calls": lambda b: msgs(b).append({"role": "assistant", "content": ""}),
    "results in another order": lambda b: msgs(b).__setitem__(slice(3, 5), [msgs(b)[4], msgs(b)[3]]),
    "content as text parts": lambda b: msgs(b)[1].update(content=[{"type": "text", "text": "read a and b"}]),
    "no tools at all": lambda b: b.pop("tools"),
}


@pytest.mark.parametrize("case", sorted(OPENAI_ACCEPTED))
def test_openai_accepts_what_openai_accepts(case: str) -> None:
    assert openai_refusal(edited(openai_good, OPENAI_ACCEPTED[case]), OPENAI_HEADERS) is None


# --- Anthropic -------------------------------------------------------------------------------------------

ANTHROPIC_REFUSED = {
    "a second result for one call": (
        lambda b: anthropic_user(b).insert(1, {"type": "tool_result", "tool_use_id": "toolu_1", "content": "W"}),
        "messages.2.content.1: each tool_use must have a single result. Found multiple `tool_result` blocks with id:"
        " toolu_1"),
    "a call without its result": (
        lambda b: anthropic_user(b).pop(1),
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_2. Each"
        " `tool_use` block must have a corresponding `tool_result` block in the next message."),
    "calls answered only later": (
        lambda b: msgs(b).__setitem__(slice(2, 2), [{"role": "user", "content": "well?"},
                                                    {"role": "assistant", "content": "one moment"}]),
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1, toolu_2."
        " Each `tool_use` block must have a corresponding `tool_result` block in the next message."),
    "a result without its call": (
        lambda b: anthropic_user(b)[1].update(tool_use_id="toolu_9"),
        "messages.2.content.1: unexpected `tool_use_id` found in `tool_result` blocks: toolu_9. Each `tool_result`"
        " block must have a corresponding `tool_use` block in the previous message."),
    "text before the results": (
        lambda b: anthropic_user(b).insert(0, {"type": "text", "text": "hurry"}),
        "messages.2: Did not find 2 tool_result block(s) at the beginning of this message. Messages following"
        " tool_use blocks must begin with a matching number of tool_result blocks."),
    "an empty text block": (
        lambda b: msgs(b)[1]["content"].insert(0, {"type": "text", "text": ""}),
        "messages: text content blocks must be non-empty"),
    "a whitespace-only turn": (
        lambda b: msgs(b).extend([{"role": "assistant", "content": "ok"}, {"role": "user", "content": "\n\n"}]),
        "messages: text content blocks must contain non-whitespace text"),
    "a system role": (
        lambda b: msgs(b).insert(0, {"role": "system", "content": "be terse"}),
        'messages: Unexpected role "system". The Messages API accepts a top-level `system` parameter, not "system"'
        ' as an input message role.'),
    "an assistant last (a prefill)": (
        lambda b: msgs(b).append({"role": "assistant", "content": "The answer is"}),
        "This model does not support assistant message prefill. The conversation must end with a user message."),
    "an assistant first": (
        lambda b: msgs(b).insert(0, {"role": "assistant", "content": "hello"}),
        'messages: first message must use the "user" role'),
    "no max_tokens": (lambda b: b.pop("max_tokens"), "max_tokens: Field required"),
    "an empty user message": (
        lambda b: msgs(b).insert(0, {"role": "user", "content": []}),
        "messages.0: all messages must have non-empty content except for the optional final assistant message"),
    "one tool_use id twice": (
        lambda b: msgs(b)[1]["content"][2].update(id="toolu_1"),
        "messages.1.content.2: `tool_use` ids must be unique"),
    "a tool_use id with a colon": (
        lambda b: msgs(b)[1]["content"][1].update(id="call:1"),
        "messages.1.content.1.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"),
    "tool blocks without tools": (
        lambda b: b.pop("tools"),
        "Requests which include `tool_use` or `tool_result` blocks must define tools."),
    "a tool name with a dot": (
        lambda b: b["tools"][0].update(name="files.read"),
        "tools.0.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'"),
    "two tools of one name": (
        lambda b: b["tools"].append(dict(b["tools"][0])),
        "tools: Tool names must be unique."),
}


@pytest.mark.parametrize("case", sorted(ANTHROPIC_REFUSED))
def test_anthropic_refuses_as_anthropic_does(case: str) -> None:
    edit, message = ANTHROPIC_REFUSED[case]
    refusal = anthropic_refusal(edited(anthropic_good, edit), ANTHROPIC_HEADERS)
    assert (400, "invalid_request_error", message) == (refusal.status, refusal.type, refusal.message)


@pytest.mark.parametrize(("missing", "status", "kind", "message"), [
    ("x-api-key", 401, "authentication_error", "x-api-key header is required"),
    ("anthropic-version", 400, "invalid_request_error", "anthropic-version: header is required"),
])
def test_anthropic_wants_its_headers(missing: str, status: int, kind: str, message: str) -> None:
    headers = {k: v for k, v in ANTHROPIC_HEADERS.items() if k != missing}
    refusal = anthropic_refusal(anthropic_good(), headers)
    assert (status, kind, message) == (refusal.status, refusal.type, refusal.message)


def split_results_from_text(body: dict) -> None:
    """The results in one user message and the person's words in the next: the API combines them."""
    user = msgs(body).pop(2)
    msgs(body).extend([{"role": "user", "content": user["content"][:2]}, {"role": "user", "content": "thanks"}])


ANTHROPIC_ACCEPTED = {
    "the good request": lambda b: None,
    "consecutive user messages, combined": split_results_from_text,
    "consecutive assistant messages, combined": lambda b: msgs(b).insert(1, {"role": "assistant", "content": "Hm."}),
    "whitespace next to real text": lambda b: anthropic_user(b).append({"type": "text", "text": " "}),
    "a string content": lambda b: msgs(b)[0].update(content="read a and b"),
    "a result with no content": lambda b: anthropic_user(b)[0].pop("content"),
}


@pytest.mark.parametrize("case", sorted(ANTHROPIC_ACCEPTED))
def test_anthropic_accepts_what_anthropic_accepts(case: str) -> None:
    assert anthropic_refusal(edited(anthropic_good, ANTHROPIC_ACCEPTED[case]), ANTHROPIC_HEADERS) is None


# --- over HTTP: the real error bodies ------------------------------------------------------------------------


def test_refusals_come_back_in_each_apis_error_body() -> None:
    duplicate = edited(openai_good, OPENAI_REFUSED["a second result for one call"][0])
    unanswered = edited(anthropic_good, ANTHROPIC_REFUSED["a call without its result"][0])

    async def go() -> tuple[list, list]:
        async with FakeModels([{"text": "never used"}]) as fake, aiohttp.ClientSession() as http:
            answers = []
            for path, body, headers in (("/v1/chat/completions", duplicate, OPENAI_HEADERS),
                                        ("/v1/messages", unanswered, ANTHROPIC_HEADERS),
                                        ("/v1/chat/completions", openai_good(), OPENAI_HEADERS)):
                async with http.post(fake.url + path, data=json.dumps(body), headers=headers) as resp:
                    answers.append((resp.status, await resp.json()))
            return answers, fake.requests

    answers, recorded = asyncio.run(asyncio.wait_for(go(), 10))
    (s1, openai_body), (s2, anthropic_body), (s3, good) = answers
    assert (400, {"error": {
        "message": "Invalid parameter: Duplicate value for 'tool_call_id' of 'call_1', in messages[3] and messages[4].",
        "type": "invalid_request_error", "param": "messages.[4].tool_call_id", "code": None}}) == (s1, openai_body)
    assert (400, "error", "invalid_request_error", True) == (
        s2, anthropic_body["type"], anthropic_body["error"]["type"], anthropic_body["request_id"].startswith("req_"))
    assert anthropic_body["error"]["message"].startswith("messages.1: `tool_use` ids were found without")
    assert (200, "never used") == (s3, good["choices"][0]["message"]["content"])
    assert [True, True, False] == ["invalid" in r for r in recorded]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_two_results_for_one_call_are_refused_as_the_real_api_refuses_them(kind: str, tmp_path, monkeypatch) -> None:
    """What a resumed turn sent before it replaced the approval stand-in, through a real provider: the person
    would have read the API's refusal."""
    monkeypatch.delenv("FAKE_MODEL_KEY", raising=False)
    monkeypatch.delenv("STARLING_SECRET_FAKE_MODEL_KEY", raising=False)
    set_secret(tmp_path / "secrets.json", "fake-model-key", "sk-test-key")
    call_id = "toolu_1" if kind == "anthropic" else "call_1"
    history = [
        Message("user", "make the file"),
        Message("assistant", "", tool_calls=(ToolCall(call_id, "read_file", {"path": "a"}),)),
        Message("tool", "Waiting for the person's approval; this call has not run.", tool_call_id=call_id,
                name="read_file"),
        Message("tool", "A", tool_call_id=call_id, name="read_file"),
    ]
    read_file = ToolSpec("read_file", "Read.", SCHEMA)

    async def go() -> tuple[ProviderError, list[dict]]:
        async with FakeModels([{"text": "never"}]) as fake:
            url = fake.openai_url if kind == "openai" else fake.anthropic_url
            cfg = ProviderConfig(kind=kind, base_url=url, api_key="fake-model-key", model="m")
            p = make_provider("default", cfg, tmp_path / "secrets.json", max_attempts=1)
            try:
                with pytest.raises(ProviderError) as info:
                    await p.complete("", history, [read_file])
            finally:
                await p.close()
            return info.value, fake.requests

    err, [req] = asyncio.run(asyncio.wait_for(go(), 10))
    said = {"openai": f"Duplicate value for 'tool_call_id' of '{call_id}'",
            "anthropic": "each tool_use must have a single result"}[kind]
    assert ("bad_request", True, True) == (err.kind, said in err.user_text, said in req["invalid"])

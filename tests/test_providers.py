"""Model providers against the fake servers: wire shapes, retries, errors a person can act on, no key in any text."""

from __future__ import annotations

import asyncio
import email.utils
import io
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from common.config import Provider as ProviderConfig
from common.secrets import set_secret
from services.runner.llm import Message, ModelReply, ProviderError, ToolCall, ToolSpec, Usage
from services.runner.providers import cost_usd, make_provider
from services.runner.providers.base import Provider, parse_retry_after
from tests.fake_models import FakeModels, FakeModelsProcess, fingerprint

KEY = "sk-test-0123456789-SECRETVALUE-abcdef"
SECRET = "fake-model-key"
FAST = dict(max_attempts=3, backoff_s=0.01, max_wait_s=2.0, budget_s=5.0, timeout_s=5.0, connect_timeout_s=1.0)
KINDS = ["openai", "anthropic"]
MODEL = {"openai": "gpt-4o-mini", "anthropic": "claude-3-5-haiku-20241022"}
READ_FILE = ToolSpec(
    name="read_file",
    description="Read a file from the workspace.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


@pytest.fixture
def secrets_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("FAKE_MODEL_KEY", "STARLING_SECRET_FAKE_MODEL_KEY"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "secrets.json"
    set_secret(path, SECRET, KEY)
    return path


def base_url(fake: FakeModels, kind: str) -> str:
    return fake.openai_url if kind == "openai" else fake.anthropic_url


def provider(kind: str, url: str, secrets_file: Path, *, log: Any = None, **kw: Any) -> Provider:
    cfg = ProviderConfig(kind=kind, base_url=url, api_key=SECRET, model=MODEL[kind])
    return make_provider("default", cfg, secrets_file, **{**FAST, "log": log, **kw})


async def call(p: Provider, messages: list[Message] | None = None, tools: list[ToolSpec] = (), **kw: Any) -> ModelReply:
    try:
        return await p.complete("You are terse.", messages or [Message("user", "hi")], list(tools), **kw)
    finally:
        await p.close()


async def failure(p: Provider, messages: list[Message] | None = None) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await call(p, messages)
    return info.value


def memory_log() -> tuple[Any, io.StringIO]:
    """A logger that writes raw JSON lines, with no redaction: whatever the provider logs is in the buffer."""
    buf = io.StringIO()
    log = structlog.wrap_logger(
        structlog.PrintLogger(buf),
        wrapper_class=structlog.make_filtering_bound_logger(0),
        processors=[structlog.processors.JSONRenderer()],
    )
    return log, buf


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- replies -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_text_reply_and_request_shape(kind: str, secrets_file: Path) -> None:
    async def go() -> tuple[ModelReply, list[dict]]:
        async with FakeModels([{"text": "hello there", "usage": {"input": 11, "output": 3}}]) as fake:
            reply = await call(provider(kind, base_url(fake, kind), secrets_file), max_tokens=77)
            return reply, fake.requests

    reply, requests = run(go())
    assert (reply.text, reply.tool_calls, reply.usage) == ("hello there", (), Usage(11, 3))
    assert reply.model == MODEL[kind]
    [req] = requests
    body, headers = req["body"], req["headers"]
    assert "invalid" not in req
    assert "tools" not in body
    if kind == "openai":
        assert req["path"] == "/v1/chat/completions"
        assert headers["authorization"] == fingerprint(f"Bearer {KEY}")
        assert body["messages"] == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]
        assert body["max_tokens"] == 77
        assert reply.stop_reason == "stop"
    else:
        assert req["path"] == "/v1/messages"
        assert headers["x-api-key"] == fingerprint(KEY)
        assert headers["anthropic-version"] == "2023-06-01"
        assert body["system"] == "You are terse."
        assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        assert body["max_tokens"] == 77
        assert reply.stop_reason == "end_turn"


def test_anthropic_base_url_may_end_in_v1(secrets_file: Path) -> None:
    async def go() -> tuple[ModelReply, list[dict]]:
        async with FakeModels() as fake:
            return await call(provider("anthropic", fake.url + "/v1/", secrets_file)), fake.requests

    reply, [req] = run(go())
    assert req["path"] == "/v1/messages"
    assert reply.text == "echo: hi"


@pytest.mark.parametrize("kind", KINDS)
def test_empty_script_echoes_the_last_user_message(kind: str, secrets_file: Path) -> None:
    async def go() -> ModelReply:
        async with FakeModels() as fake:
            return await call(provider(kind, base_url(fake, kind), secrets_file), [Message("user", "ping 42")])

    reply = run(go())
    assert reply.text == "echo: ping 42"
    assert reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0


# --- tools ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_tool_call_round_trip(kind: str, secrets_file: Path) -> None:
    script = [{"tool_call": {"name": "read_file", "arguments": {"path": "notes.txt"}}}, {"text": "It says hello."}]

    async def go() -> tuple[ModelReply, ModelReply, list[dict]]:
        async with FakeModels(script) as fake:
            p = provider(kind, base_url(fake, kind), secrets_file)
            first = await call(p, [Message("user", "what is in notes.txt?")], [READ_FILE])
            history = [
                Message("user", "what is in notes.txt?"),
                Message("assistant", first.text, tool_calls=first.tool_calls),
                Message("tool", "hello", tool_call_id=first.tool_calls[0].id, name="read_file"),
            ]
            second = await call(p, history, [READ_FILE])
            return first, second, fake.requests

    first, second, requests = run(go())
    [tc] = first.tool_calls
    assert (tc.name, tc.arguments) == ("read_file", {"path": "notes.txt"})
    assert tc.id and first.text == ""
    assert first.stop_reason == ("tool_calls" if kind == "openai" else "tool_use")
    assert second.text == "It says hello."
    assert [r.get("invalid") for r in requests] == [None, None]
    sent, schema = requests[1]["body"], READ_FILE.parameters
    if kind == "openai":
        assert sent["tools"] == [
            {
                "type": "function",
                "function": {"name": "read_file", "description": READ_FILE.description, "parameters": schema},
            }
        ]
        assert sent["messages"][1:] == [
            {"role": "user", "content": "what is in notes.txt?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": tc.id,
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "notes.txt"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": tc.id, "content": "hello"},
        ]
    else:
        assert sent["tools"] == [
            {"name": "read_file", "description": READ_FILE.description, "input_schema": READ_FILE.parameters}
        ]
        assert sent["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "what is in notes.txt?"}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": tc.id, "name": "read_file", "input": {"path": "notes.txt"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tc.id, "content": "hello"}]},
        ]


def test_openai_invalid_tool_arguments_are_kept_raw(secrets_file: Path) -> None:
    async def go() -> ModelReply:
        async with FakeModels([{"tool_call": {"name": "read_file", "arguments": '{"path": "a'}}]) as fake:
            return await call(provider("openai", fake.openai_url, secrets_file), tools=[READ_FILE])

    [tc] = run(go()).tool_calls
    assert tc.arguments == {"_raw": '{"path": "a'}


def test_anthropic_merges_consecutive_tool_results_into_one_user_message(secrets_file: Path) -> None:
    calls = (ToolCall("toolu_1", "read_file", {"path": "a"}), ToolCall("toolu_2", "read_file", {"path": "b"}))
    history = [
        Message("user", "read a and b"),
        Message("assistant", "Reading both.", tool_calls=calls),
        Message("tool", "A", tool_call_id="toolu_1", name="read_file"),
        Message("tool", "B", tool_call_id="toolu_2", name="read_file"),
        Message("user", "and summarise"),
    ]

    async def go() -> list[dict]:
        async with FakeModels([{"text": "ok"}]) as fake:
            await call(provider("anthropic", fake.anthropic_url, secrets_file), history, [READ_FILE])
            return fake.requests

    [req] = run(go())
    assert "invalid" not in req
    assert req["body"]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "read a and b"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading both."},
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}},
                {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"path": "b"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "A"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "B"},
                {"type": "text", "text": "and summarise"},
            ],
        },
    ]


def test_anthropic_puts_tool_results_before_text_in_a_user_message(secrets_file: Path) -> None:
    history = [
        Message("user", "read a"),
        Message("assistant", "", tool_calls=(ToolCall("call:1", "read_file", {"path": "a"}),)),
        Message("user", "hurry up"),  # arrived while the tool ran
        Message("tool", "A", tool_call_id="call:1", name="read_file"),
    ]

    async def go() -> list[dict]:
        async with FakeModels([{"text": "ok"}]) as fake:
            await call(provider("anthropic", fake.anthropic_url, secrets_file), history, [READ_FILE])
            return fake.requests

    [req] = run(go())
    assert "invalid" not in req
    assert req["body"]["messages"][1:] == [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "a"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "A"},
                {"type": "text", "text": "hurry up"},
            ],
        },
    ]


def test_anthropic_drops_whitespace_only_text_next_to_tool_calls(secrets_file: Path) -> None:
    history = [
        Message("user", "read a"),
        Message("assistant", "\n\n", tool_calls=(ToolCall("toolu_1", "read_file", {"path": "a"}),)),
        Message("tool", "A", tool_call_id="toolu_1", name="read_file"),
    ]

    async def go() -> list[dict]:
        async with FakeModels([{"text": "ok"}]) as fake:
            await call(provider("anthropic", fake.anthropic_url, secrets_file), history, [READ_FILE])
            return fake.requests

    [req] = run(go())
    assert (None, [{"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}}]) == (
        req.get("invalid"), req["body"]["messages"][1]["content"])


def test_anthropic_keeps_a_message_without_text_as_the_persons_turn(secrets_file: Path) -> None:
    history = [Message("user", "hi"), Message("assistant", "hello"), Message("user", "  ")]  # e.g. a sticker

    async def go() -> list[dict]:
        async with FakeModels([{"text": "ok"}]) as fake:
            await call(provider("anthropic", fake.anthropic_url, secrets_file), history)
            return fake.requests

    [req] = run(go())
    assert (None, {"role": "user", "content": [{"type": "text", "text": "(a message without text)"}]}) == (
        req.get("invalid"), req["body"]["messages"][-1])


def test_anthropic_without_tools_sends_earlier_tool_calls_as_text(secrets_file: Path) -> None:
    history = [
        Message("user", "read a"),
        Message("assistant", "", tool_calls=(ToolCall("toolu_1", "read_file", {"path": "a"}),)),
        Message("tool", "A", tool_call_id="toolu_1", name="read_file"),
        Message("user", "summarise"),
    ]

    async def go() -> list[dict]:
        async with FakeModels([{"text": "ok"}]) as fake:
            await call(provider("anthropic", fake.anthropic_url, secrets_file), history, [])
            return fake.requests

    [req] = run(go())
    assert None is req.get("invalid")
    assert ["user", "assistant", "user"] == [m["role"] for m in req["body"]["messages"]]
    assert '[called read_file {"path": "a"}]' == req["body"]["messages"][1]["content"][0]["text"]
    assert "[result of read_file] A" == req["body"]["messages"][2]["content"][0]["text"]


# --- retries -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_429_waits_for_retry_after_then_succeeds(kind: str, secrets_file: Path) -> None:
    async def go() -> tuple[ModelReply, float, int]:
        async with FakeModels([{"status": 429, "retry_after": 0.3}, {"text": "ok"}]) as fake:
            p = provider(kind, base_url(fake, kind), secrets_file)
            start = time.monotonic()
            reply = await call(p)
            return reply, time.monotonic() - start, len(fake.requests)

    reply, elapsed, n = run(go())
    assert (reply.text, n) == ("ok", 2)
    assert elapsed >= 0.3  # backoff alone would wait ~0.01 s


@pytest.mark.parametrize("kind, statuses", [("openai", [500, 503]), ("anthropic", [529, 500])])
def test_5xx_is_retried_then_succeeds(kind: str, statuses: list[int], secrets_file: Path) -> None:
    async def go() -> tuple[ModelReply, int]:
        async with FakeModels([{"status": s} for s in statuses] + [{"text": "ok"}]) as fake:
            return await call(provider(kind, base_url(fake, kind), secrets_file)), len(fake.requests)

    reply, n = run(go())
    assert (reply.text, n) == ("ok", 3)


@pytest.mark.parametrize("kind", KINDS)
def test_persistent_500_fails_after_max_attempts(kind: str, secrets_file: Path) -> None:
    async def go() -> tuple[ProviderError, int]:
        async with FakeModels([{"status": 500}] * 5) as fake:
            err = await failure(provider(kind, base_url(fake, kind), secrets_file, max_attempts=3))
            return err, len(fake.requests)

    err, n = run(go())
    assert (err.kind, n) == ("server_error", 3)
    assert "HTTP 500" in err.user_text and "3 tries" in err.user_text


def test_retry_after_longer_than_max_wait_is_not_waited_for(secrets_file: Path) -> None:
    async def go() -> tuple[ProviderError, int, float]:
        async with FakeModels([{"status": 429, "retry_after": 120}, {"text": "too late"}]) as fake:
            start = time.monotonic()
            err = await failure(provider("openai", fake.openai_url, secrets_file))
            return err, len(fake.requests), time.monotonic() - start

    err, n, elapsed = run(go())
    assert (err.kind, n) == ("rate_limited", 1)
    assert "wait 120 s" in err.user_text
    assert elapsed < 1


def test_openai_insufficient_quota_is_not_retried(secrets_file: Path) -> None:
    step = {"status": 429, "code": "insufficient_quota", "message": "You exceeded your current quota."}

    async def go() -> tuple[ProviderError, int]:
        async with FakeModels([step, {"text": "never"}]) as fake:
            return await failure(provider("openai", fake.openai_url, secrets_file)), len(fake.requests)

    err, n = run(go())
    assert (err.kind, n) == ("quota", 1)
    assert "You exceeded your current quota." in err.user_text


@pytest.mark.parametrize("kind", KINDS)
def test_timeout_after_retries(kind: str, secrets_file: Path) -> None:
    async def go() -> tuple[ProviderError, int, float]:
        async with FakeModels([{"delay": 5}, {"delay": 5}, {"text": "late"}]) as fake:
            start = time.monotonic()
            err = await failure(provider(kind, base_url(fake, kind), secrets_file, max_attempts=2, timeout_s=0.3))
            return err, len(fake.requests), time.monotonic() - start

    err, n, elapsed = run(go())
    assert (err.kind, n) == ("timeout", 2)
    assert "did not answer within 0.3 s" in err.user_text
    assert elapsed < 2


@pytest.mark.parametrize("kind", KINDS)
def test_connection_refused_is_unreachable_naming_base_url(kind: str, secrets_file: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}" + ("/v1" if kind == "openai" else "")
    err = run(failure(provider(kind, url, secrets_file)))
    assert err.kind == "unreachable"
    assert err.user_text == (
        f"I can't reach the model at {url} (connection refused). "
        "Check `[providers.default] base_url` or that the server runs."
    )


def test_parse_retry_after_forms() -> None:
    now = time.time()
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "0.25"}) == 0.25
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    http_date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"retry-after": http_date}, now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after({"retry-after": email.utils.formatdate(now - 30, usegmt=True)}, now=now) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


# --- errors that are final -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_missing_key_is_reported_without_a_request(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FAKE_MODEL_KEY", "STARLING_SECRET_FAKE_MODEL_KEY"):
        monkeypatch.delenv(var, raising=False)

    async def go() -> tuple[ProviderError, Any]:
        p = provider(kind, "https://models.example.invalid/v1", tmp_path / "secrets.json")
        return await failure(p), p._session

    err, session = run(go())
    assert err.kind == "missing_key"
    assert err.user_text == (
        f"No API key is set for the model provider 'default' (secret '{SECRET}'). "
        f"Set it with: starling secret set {SECRET} --value-stdin"
    )
    assert session is None  # no HTTP session was ever opened: nothing was sent


@pytest.mark.parametrize("kind", KINDS)
def test_local_server_without_a_key_gets_no_auth_header(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("FAKE_MODEL_KEY", "STARLING_SECRET_FAKE_MODEL_KEY"):
        monkeypatch.delenv(var, raising=False)

    async def go() -> tuple[ModelReply, list[dict]]:
        async with FakeModels(keyless=True) as fake:  # a local server: Ollama, llama.cpp, vLLM
            return await call(provider(kind, base_url(fake, kind), tmp_path / "secrets.json")), fake.requests

    reply, [req] = run(go())
    assert reply.text == "echo: hi"
    assert "authorization" not in req["headers"] and "x-api-key" not in req["headers"]


def test_secret_value_none_sends_no_auth_header(tmp_path: Path) -> None:
    path = tmp_path / "secrets.json"
    set_secret(path, SECRET, "none")

    async def go() -> list[dict]:
        async with FakeModels(keyless=True) as fake:
            await call(provider("openai", fake.openai_url, path))
            return fake.requests

    [req] = run(go())
    assert "authorization" not in req["headers"]


@pytest.mark.parametrize("kind", KINDS)
def test_401_is_auth_with_a_hint_and_not_retried(kind: str, secrets_file: Path) -> None:
    async def go() -> tuple[ProviderError, int]:
        async with FakeModels([{"status": 401, "message": "invalid x-api-key"}, {"text": "no"}]) as fake:
            return await failure(provider(kind, base_url(fake, kind), secrets_file)), len(fake.requests)

    err, n = run(go())
    assert (err.kind, n) == ("auth", 1)
    assert "rejected the API key (HTTP 401): invalid x-api-key." in err.user_text
    assert f"starling secret set {SECRET} --value-stdin" in err.user_text


def test_rejected_key_is_read_again_on_the_next_call(secrets_file: Path) -> None:
    async def go() -> list[dict]:
        async with FakeModels([{"status": 401}, {"text": "ok"}]) as fake:
            p = provider("openai", fake.openai_url, secrets_file)
            await failure(p)
            set_secret(secrets_file, SECRET, "sk-rotated-key-000")
            await call(p)
            return fake.requests

    first, second = run(go())
    assert first["headers"]["authorization"] == fingerprint(f"Bearer {KEY}")
    assert second["headers"]["authorization"] == fingerprint("Bearer sk-rotated-key-000")


@pytest.mark.parametrize("kind", KINDS)
def test_400_is_bad_request_quoting_the_provider(kind: str, secrets_file: Path) -> None:
    async def go() -> tuple[ProviderError, int]:
        too_long = "prompt is too long: 210000 tokens > 200000 maximum"
        async with FakeModels([{"status": 400, "message": too_long}]) as fake:
            return await failure(provider(kind, base_url(fake, kind), secrets_file)), len(fake.requests)

    err, n = run(go())
    assert (err.kind, n) == ("bad_request", 1)
    assert err.user_text == (
        "The model provider 'default' refused the request (HTTP 400): "
        "prompt is too long: 210000 tokens > 200000 maximum."
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["not_json", "wrong_shape"])
def test_malformed_answer(kind: str, how: str, secrets_file: Path) -> None:
    async def go() -> tuple[ProviderError, int]:
        async with FakeModels([{"malformed": how}, {"text": "fine"}]) as fake:
            return await failure(provider(kind, base_url(fake, kind), secrets_file)), len(fake.requests)

    err, n = run(go())
    assert (err.kind, err.user_text, n) == ("malformed", "The model sent an answer I could not read.", 1)


# --- the key stays secret --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_key_never_appears_in_errors_or_logs(kind: str, secrets_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, buf = memory_log()
    leaky = f"Incorrect API key provided: {KEY}"  # some servers quote the key back
    script = [
        {"status": 401, "message": leaky},
        {"status": 400, "message": leaky},
        {"status": 500, "message": leaky},
        {"status": 500, "message": leaky},
        {"status": 500, "message": leaky},
        {"malformed": "not_json"},
    ]

    async def go() -> list[ProviderError]:
        errors = []
        async with FakeModels(script) as fake:
            for _ in range(4):
                errors.append(await failure(provider(kind, base_url(fake, kind), secrets_file, log=log)))
        url = f"http://127.0.0.1:{closed_port()}"
        errors.append(await failure(provider(kind, url, secrets_file, log=log)))
        return errors

    errors = run(go())
    assert [e.kind for e in errors] == ["auth", "bad_request", "server_error", "malformed", "unreachable"]
    texts = [t for e in errors for t in (str(e), repr(e), e.user_text, e.detail, repr(e.args))]
    assert any("Incorrect API key provided: [redacted]" in t for t in texts)  # the message is kept, the key is not
    assert buf.getvalue().count("model_call_") >= 6  # the failures were logged
    captured = capsys.readouterr()
    for text in texts + [buf.getvalue(), captured.out, captured.err]:
        assert KEY not in text


# --- pricing ---------------------------------------------------------------------------------------------------


def test_cost_of_known_models_by_longest_prefix() -> None:
    million = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert cost_usd("gpt-4o-mini", million) == pytest.approx(0.75)
    assert cost_usd("gpt-4o-2024-08-06", million) == pytest.approx(12.50)
    assert cost_usd("openai/gpt-4o-mini", million) == pytest.approx(0.75)
    assert cost_usd("claude-sonnet-4-20250514", Usage(2000, 1000)) == pytest.approx(0.021)


def test_cost_of_unknown_or_local_models_is_zero() -> None:
    assert cost_usd("llama3.1:8b", Usage(1000, 1000)) == 0.0
    assert cost_usd("", Usage(1000, 1000)) == 0.0


# --- the fake as a process ---------------------------------------------------------------------------------


def test_fake_models_as_a_process(tmp_path: Path, secrets_file: Path) -> None:
    with FakeModelsProcess(tmp_path / "fake", [{"api": "openai", "text": "from the script file"}]) as fake:
        fake.add({"api": "anthropic", "tool_call": {"name": "read_file", "arguments": {"path": "x"}}})

        async def go() -> tuple[ModelReply, ModelReply]:
            a = await call(provider("anthropic", fake.anthropic_url, secrets_file))
            o = await call(provider("openai", fake.openai_url, secrets_file))
            return a, o

        anthropic_reply, openai_reply = run(go())
        assert anthropic_reply.tool_calls[0].arguments == {"path": "x"}  # it passed over the openai-only step
        assert openai_reply.text == "from the script file"
        recorded = fake.requests()
        assert [r["api"] for r in recorded] == ["anthropic", "openai"]
        assert json.dumps(recorded).count(KEY) == 0
        proc = fake.proc
    assert proc is not None and proc.returncode == 0

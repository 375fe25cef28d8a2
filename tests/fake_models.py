"""Fake model servers for tests: OpenAI Chat Completions and Anthropic Messages on 127.0.0.1, driven by a script.

One aiohttp app serves both APIs (`POST /v1/chat/completions`, `POST /v1/messages`), records every request
and answers from a script of steps consumed in order. With an empty script it answers
"echo: <last user text>" at once, an instant fake model for benchmarks.

In a test's event loop::

    async with FakeModels([{"text": "hi"}, {"status": 429, "retry_after": 0.2}]) as fake:
        ...  # base_url = fake.openai_url (OpenAI) or fake.anthropic_url (Anthropic)
        fake.requests  # [{"api", "path", "headers", "body", "step"}, ...]

As a process of its own (end-to-end tests): ``python -m tests.fake_models --port-file PATH
[--script JSON_FILE] [--lifetime S]`` writes the port to PATH once it listens, stops on SIGTERM/SIGINT or
after --lifetime seconds; `FakeModelsProcess` wraps that for synchronous tests.

Control endpoints (both modes):
  GET    /_requests[?api=openai|anthropic]   recorded requests, oldest first (JSON list)
  DELETE /_requests                          forget them
  GET    /_script                            steps not yet consumed
  POST   /_script                            append steps: a JSON list of steps, or {"steps": [...]}
  DELETE /_script                            drop all pending steps
  POST   /_pace                              {"tokens": N, "seconds": S} the fake's pace; {} for none
  GET    /_health                            {"ok": true}

A step is a JSON object; every key is optional, and {} is the echo answer:
  "api": "openai" | "anthropic"   only a request to that API consumes it (requests take the first match)
  "delay": 0.5                    wait this long first (a client timeout test; cut short on stop)
  "text": "hello"                 the reply text
  "tool_call": {"name": "n", "arguments": {...} | "raw string", "id": "optional"}
  "tool_calls": [ {...}, ... ]    several calls in one reply (OpenAI sends a string `arguments` verbatim)
  "usage": {"input": 12, "output": 3}   otherwise estimated from the sizes (never 0)
  "status": 429 | 500 | 503 | 529 | 401 | 400 | ...   an error answer in the API's own error shape
  "retry_after": 0.2              with "status": the Retry-After header (seconds, or an HTTP-date string)
  "message": "...", "code": "..." with "status": the error's message and (OpenAI) code / (Anthropic) type
  "malformed": "not_json" | "wrong_shape"   a 200 whose body is not JSON / JSON of the wrong shape
  "when": "text"                  only a request whose last user or tool text contains this consumes it
  "pace": {"tokens": 200, "seconds": 4}   this answer's pace (else the fake's own, `pace=` / `--pace 200/4`):
                                  a streamed text in at most `tokens` pieces spread over `seconds`; an answer
                                  not streamed comes after `seconds`; the echo answer is padded to `tokens`
                                  words ("echo: hi tok3 tok4 ..."), so a bench gets its 200 tokens
  "stream_break": "cut" | "error" | "truncate", "break_after": 2   a streamed answer breaks after that many
                                  pieces of text: the connection dropped, the API's mid-stream error event
                                  (Anthropic overloaded_error, or "code"), or an end before the last event
  "kill_client": true             SIGKILL the process at the other end of the connection (found by its TCP
                                  port in /proc: a client on this host), the way the kernel's OOM killer
                                  ends a runner an answer blew up; the request is then never answered

A request with `"stream": true` is answered as the API streams (tests/fake_model_streams.py:
text/event-stream, the real event names and fields, OpenAI's usage chunk only with
`stream_options.include_usage`); errors before the stream are the same JSON errors as without.

Requests are checked as the real APIs check them (tests/model_api_rules.py: tool results answering tool
calls once, roles, content, names, max_tokens, the auth and version headers...): a request the real API
would refuse is answered with its real status and error body, and recorded with "invalid": the message.
`keyless=True` (`--keyless`) stands for a local server that needs no key: no auth header is required.
Auth header values are recorded as fingerprints (`fingerprint(value)`), never in clear.
Everything is bounded: script and record lengths, body size, delays end on stop.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import sys
import time
from collections import deque
from itertools import count
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.fake_model_streams import stream_anthropic, stream_openai
from tests.fake_server import FakeServerProcess, listen, serve_until_stopped
from tests.model_api_rules import Refusal, anthropic_refusal, openai_refusal
from tests.model_image_rules import ANTHROPIC_REQUEST_MAX

Step = dict[str, Any]

MAX_STEPS = 1000
MAX_RECORDED = 1000
MAX_BODY = 50 * 1024 * 1024  # OpenAI's limit of image bytes in a request; Anthropic's 32 MB is a rule below
MAX_DELAY = 60.0
AUTH_HEADERS = ("authorization", "x-api-key")
_STEP_KEYS = {
    "api", "delay", "text", "tool_call", "tool_calls", "usage", "status", "retry_after", "message", "code",
    "malformed", "stop_reason", "when", "kill_client", "pace", "stream_break", "break_after",
}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 529: "overloaded_error",
}


def fingerprint(value: str) -> str:
    """How an auth header value is recorded: tests compare fingerprints, the value itself is never kept."""
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]


def check_step(step: Any) -> Step:
    """step, or ValueError naming what is wrong with it."""
    if not isinstance(step, dict):
        raise ValueError(f"a step is a JSON object, got {step!r}")
    unknown = set(step) - _STEP_KEYS
    if unknown:
        raise ValueError(f"unknown step keys {sorted(unknown)}; known: {sorted(_STEP_KEYS)}")
    if step.get("api") not in (None, "openai", "anthropic"):
        raise ValueError(f"step api must be openai or anthropic, got {step['api']!r}")
    if step.get("malformed") not in (None, "not_json", "wrong_shape"):
        raise ValueError(f"malformed must be not_json or wrong_shape, got {step['malformed']!r}")
    if "delay" in step and not 0 <= float(step["delay"]) <= MAX_DELAY:
        raise ValueError(f"delay must be 0..{MAX_DELAY} s")
    for call in _calls(step):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ValueError(f"a tool call needs a name: {call!r}")
    if step.get("stream_break") not in (None, "cut", "error", "truncate"):
        raise ValueError(f"stream_break must be cut, error or truncate, got {step['stream_break']!r}")
    if "pace" in step:
        check_pace(step["pace"])
    return step


def check_pace(pace: Any) -> dict[str, Any]:
    """pace ({"tokens": N, "seconds": S}, or {} for none), or ValueError."""
    if not isinstance(pace, dict) or set(pace) - {"tokens", "seconds"}:
        raise ValueError(f"a pace is {{\"tokens\": N, \"seconds\": S}}, got {pace!r}")
    if not 0 <= int(pace.get("tokens", 0)) <= 100_000 or not 0 <= float(pace.get("seconds", 0)) <= MAX_DELAY:
        raise ValueError(f"pace tokens 0..100000, seconds 0..{MAX_DELAY}")
    return pace


def _calls(step: Step) -> list[dict[str, Any]]:
    return ([step["tool_call"]] if "tool_call" in step else []) + list(step.get("tool_calls") or [])


def _last_user_text(api: str, body: Any) -> str:
    messages = body.get("messages") if isinstance(body, dict) else None
    for m in reversed(messages or []):
        if not isinstance(m, dict) or m.get("role") not in ("user", "tool"):
            continue
        content = m.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            parts = []
            for b in content:
                if isinstance(b, dict) and b.get("type") == "text":
                    parts.append(b.get("text") or "")
                elif isinstance(b, dict) and b.get("type") == "tool_result":
                    inner = b.get("content")
                    parts.append(inner if isinstance(inner, str) else json.dumps(inner))
            return " ".join(parts)
    return ""


class FakeModels:
    """The fake servers in the current event loop; `async with` starts and stops them."""

    def __init__(self, script: list[Step] = (), *, host: str = "127.0.0.1", port: int = 0, strict: bool = True,
                 keyless: bool = False, pace: dict[str, Any] | None = None) -> None:
        self.host = host
        self.port = port
        self.strict = strict
        self.keyless = keyless
        self.pace = check_pace(pace) if pace else None  # every answer's pace unless its step has one
        self._script: deque[Step] = deque()
        self._recorded: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED)
        self._ids = count(1)
        self._closing: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self.add(*script)

    # --- for tests ---

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_url(self) -> str:
        """base_url for kind = "openai"."""
        return f"{self.url}/v1"

    @property
    def anthropic_url(self) -> str:
        """base_url for kind = "anthropic" (the provider appends /v1/messages)."""
        return self.url

    @property
    def requests(self) -> list[dict[str, Any]]:
        return list(self._recorded)

    def requests_for(self, api: str) -> list[dict[str, Any]]:
        return [r for r in self._recorded if r["api"] == api]

    def add(self, *steps: Step) -> None:
        if len(self._script) + len(steps) > MAX_STEPS:
            raise ValueError(f"a script holds at most {MAX_STEPS} steps")
        self._script.extend(check_step(s) for s in steps)

    @property
    def pending(self) -> list[Step]:
        return list(self._script)

    async def start(self) -> FakeModels:
        self._closing = asyncio.Event()
        app = web.Application(client_max_size=MAX_BODY)
        app.add_routes([
            web.post("/v1/chat/completions", self._openai),
            web.post("/v1/messages", self._anthropic),
            web.get("/_requests", self._get_requests),
            web.delete("/_requests", self._clear_requests),
            web.get("/_script", self._get_script),
            web.post("/_script", self._post_script),
            web.delete("/_script", self._clear_script),
            web.post("/_pace", self._post_pace),
            web.get("/_health", self._health),
        ])
        self._runner, self.port = await listen(app, self.host, self.port)
        return self

    async def stop(self) -> None:
        if self._closing is not None:
            self._closing.set()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> FakeModels:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- the model APIs ---

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        return await self._answer("openai", request)

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        return await self._answer("anthropic", request)

    def _take(self, api: str, text: str = "") -> Step | None:
        for i, step in enumerate(self._script):
            if step.get("api") in (None, api) and step.get("when", "") in text:
                del self._script[i]
                return step
        return None

    async def _answer(self, api: str, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        sent = {k.lower(): v for k, v in request.headers.items()}
        headers = {k: (fingerprint(v) if k in AUTH_HEADERS else v) for k, v in sent.items()}
        shown = body if body is not None else {"_raw": raw[:10000].decode("utf-8", "replace")}
        record: dict[str, Any] = {"api": api, "path": request.path, "headers": headers, "body": shown, "ts": time.time()}
        self._recorded.append(record)
        refusal = None
        if self.strict and api == "anthropic" and len(raw) > ANTHROPIC_REQUEST_MAX:
            refusal = Refusal(413, "Request exceeds the maximum allowed number of bytes.", "request_too_large")
        elif self.strict:
            check = openai_refusal if api == "openai" else anthropic_refusal
            refusal = check(body, sent, keyless=self.keyless)
        if refusal is not None:
            record["invalid"] = refusal.message
            return _refused(api, refusal)
        body = shown
        step = self._take(api, _last_user_text(api, body))
        record["step"] = step
        step = step or {}
        if step.get("kill_client"):
            pid = _client_pid(request)
            record["killed"] = pid
            if pid:
                os.kill(pid, signal.SIGKILL)
            return _error(api, 503, "the client was killed")
        if step.get("delay"):
            assert self._closing is not None
            try:
                await asyncio.wait_for(self._closing.wait(), float(step["delay"]))
                return _error(api, 503, "fake server stopping")
            except TimeoutError:
                pass
        if "status" in step:
            extra = {"Retry-After": str(step["retry_after"])} if "retry_after" in step else {}
            return _error(api, int(step["status"]), step.get("message", "fake error"), step.get("code"), extra)
        if step.get("malformed") == "not_json":
            return web.Response(status=200, text="<html><body>502 Bad Gateway</body></html>", content_type="text/html")
        if step.get("malformed") == "wrong_shape":
            return web.json_response({"object": "unexpected", "data": [1, 2, 3]})
        calls = _calls(step)
        text = step.get("text")
        pace = step.get("pace", self.pace)
        if text is None and not calls:
            text = "echo: " + _last_user_text(api, body)
            if pace:  # as long as the pace says
                text += "".join(f" tok{i}" for i in range(len(text.split()), int(pace.get("tokens", 0))))
        usage = step.get("usage") or {}
        n_in = int(usage.get("input", max(1, len(raw) // 4)))
        n_out = int(usage.get("output", max(1, len(text or "") // 4 + 10 * len(calls))))
        model = body.get("model", "fake") if isinstance(body, dict) else "fake"
        n = next(self._ids)
        assert self._closing is not None
        if isinstance(body, dict) and body.get("stream") is True:
            record["stream"] = True
            answer = (n, model, text, calls, n_in, n_out, step.get("stop_reason"))
            if api == "openai":
                include_usage = (body.get("stream_options") or {}).get("include_usage") is True
                return await stream_openai(request, step, *answer, include_usage=include_usage, pace=pace,
                                           closing=self._closing)
            return await stream_anthropic(request, step, *answer, pace=pace, closing=self._closing)
        if pace and float(pace.get("seconds", 0)) > 0:  # the same model, not streamed: the whole answer at the end
            try:
                await asyncio.wait_for(self._closing.wait(), float(pace["seconds"]))
                return _error(api, 503, "fake server stopping")
            except TimeoutError:
                pass
        if api == "openai":
            return web.json_response(_openai_reply(n, model, text, calls, n_in, n_out, step.get("stop_reason")))
        return web.json_response(_anthropic_reply(n, model, text, calls, n_in, n_out, step.get("stop_reason")))

    # --- control ---

    async def _get_requests(self, request: web.Request) -> web.Response:
        api = request.query.get("api")
        return web.json_response([r for r in self._recorded if api in (None, r["api"])])

    async def _clear_requests(self, request: web.Request) -> web.Response:
        self._recorded.clear()
        return web.json_response({"ok": True})

    async def _get_script(self, request: web.Request) -> web.Response:
        return web.json_response(list(self._script))

    async def _post_script(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            steps = data["steps"] if isinstance(data, dict) else data
            if not isinstance(steps, list):
                raise ValueError("expected a list of steps or {\"steps\": [...]}")
            self.add(*steps)
        except (ValueError, KeyError, TypeError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"queued": len(self._script)})

    async def _clear_script(self, request: web.Request) -> web.Response:
        self._script.clear()
        return web.json_response({"ok": True})

    async def _post_pace(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            self.pace = check_pace(data) if data else None
        except (ValueError, TypeError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"pace": self.pace})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})


def _client_pid(request: web.Request) -> int | None:
    """The pid of the local process holding the client's end of this request's TCP connection."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if not peer:
        return None
    port = f"{peer[1]:04X}"
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[1].rsplit(":", 1)[1] == port:  # the client's local address is our peer
                inodes.add(fields[9])
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                if os.readlink(f"/proc/{entry}/fd/{fd}").removeprefix("socket:[").rstrip("]") in inodes:
                    return int(entry)
        except OSError:
            continue
    return None


def _error(
    api: str, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    if api == "openai":
        payload: dict[str, Any] = {"error": {"message": message, "type": "fake_error", "param": None, "code": code}}
    else:
        kind = code or _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        payload = {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake"}
    return web.json_response(payload, status=status, headers=headers)


def _refused(api: str, refusal: Refusal) -> web.Response:
    """A refused request, in the real API's error body."""
    if api == "openai":
        error = {"message": refusal.message, "type": refusal.type, "param": refusal.param, "code": refusal.code}
        return web.json_response({"error": error}, status=refusal.status)
    payload = {"type": "error", "error": {"type": refusal.type, "message": refusal.message},
               "request_id": f"req_fake{next(_request_ids):08d}"}
    return web.json_response(payload, status=refusal.status)


_request_ids = count(1)


def _openai_reply(
    n: int, model: str, text: str | None, calls: list[dict[str, Any]], n_in: int, n_out: int, stop: str | None
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {
                "id": c.get("id") or f"call_fake_{n}_{i}",
                "type": "function",
                "function": {
                    "name": c["name"],
                    "arguments": (
                        c["arguments"] if isinstance(c.get("arguments"), str) else json.dumps(c.get("arguments") or {})
                    ),
                },
            }
            for i, c in enumerate(calls)
        ]
    return {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": stop or ("tool_calls" if calls else "stop")}],
        "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out},
    }


def _anthropic_reply(
    n: int, model: str, text: str | None, calls: list[dict[str, Any]], n_in: int, n_out: int, stop: str | None
) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [
        {
            "type": "tool_use",
            "id": c.get("id") or f"toolu_fake_{n}_{i}",
            "name": c["name"],
            "input": c.get("arguments") or {},
        }
        for i, c in enumerate(calls)
    ]
    return {
        "id": f"msg_fake_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop or ("tool_use" if calls else "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": n_in, "output_tokens": n_out},
    }


# --- as a process of its own ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fake_models", description=__doc__.splitlines()[0])
    p.add_argument("--port-file", type=Path, required=True, help="where to write the port once listening")
    p.add_argument("--script", type=Path, help="a JSON file holding a list of steps")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--lifetime", type=float, default=900.0, help="stop after this many seconds (default 900)")
    p.add_argument("--keyless", action="store_true", help="require no auth header (a local server)")
    p.add_argument("--pace", default="", help="TOKENS/SECONDS: every answer streams TOKENS pieces over SECONDS")
    args = p.parse_args(argv)
    pace = None
    if args.pace:
        tokens, _, seconds = args.pace.partition("/")
        try:
            pace = check_pace({"tokens": int(tokens), "seconds": float(seconds)})
        except ValueError as e:
            p.error(f"--pace: {e}")
    script = json.loads(args.script.read_text()) if args.script else []
    if not isinstance(script, list):
        p.error("--script: expected a JSON list of steps")
    try:
        for step in script:
            check_step(step)
    except ValueError as e:
        p.error(f"--script: {e}")
    fake = FakeModels(script, host=args.host, port=args.port, keyless=args.keyless, pace=pace)
    asyncio.run(serve_until_stopped(fake, args.port_file, args.lifetime, "fake_models"))
    return 0


class FakeModelsProcess(FakeServerProcess):
    """`python -m tests.fake_models` as a child process, for synchronous end-to-end tests; every wait bounded."""

    name = "fake_models"

    def __init__(self, workdir: Path, script: list[Step] = (), *, lifetime: float = 600.0,
                 keyless: bool = False, pace: dict[str, Any] | None = None) -> None:
        super().__init__(workdir, lifetime=lifetime)
        self.script = list(script)
        self.keyless = keyless
        self.pace = pace

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_url(self) -> str:
        return self.url

    def extra_args(self) -> list[str]:
        args = ["--keyless"] if self.keyless else []
        if self.pace:
            args += ["--pace", f"{int(self.pace.get('tokens', 0))}/{float(self.pace.get('seconds', 0))}"]
        if not self.script:
            return args
        script_file = self.workdir / "fake_models.script.json"
        script_file.write_text(json.dumps(self.script))
        return [*args, "--script", str(script_file)]

    def requests(self, api: str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/_requests", query={"api": api})

    def add(self, *steps: Step) -> None:
        self._call("POST", "/_script", list(steps))

    def set_pace(self, pace: dict[str, Any] | None) -> None:
        self._call("POST", "/_pace", pace or {})

    def clear(self) -> None:
        self._call("DELETE", "/_requests")
        self._call("DELETE", "/_script")


if __name__ == "__main__":
    sys.exit(main())

"""What every model provider shares: the API key, one HTTP session, retries with backoff, errors a person can act on.

Each provider calls exactly one HTTP endpoint, so it speaks plain aiohttp (the project's HTTP library)
instead of the openai/anthropic SDKs: those pull httpx and pydantic, about 30 MB more per runner process,
for one POST each.

A subclass says where to POST, with which headers, how to build the body and how to read the answer
(`_endpoint`, `_auth_headers`, `_body`, `_parse`); everything else lives here:

- The key is resolved at the first call, not at start-up: a missing key becomes
  ProviderError(kind="missing_key") with the `starling secret set` line, so the person who wrote gets an
  answer instead of a dead runner. A key set later is picked up by the next call; a key the provider
  rejected (401/403) is resolved again on the next call, so a rotated key needs no restart.
- No auth header is sent when the secret's value is "none" (any case), or when the secret is missing and
  base_url is on this machine (localhost, 127.0.0.1, ::1): local servers (Ollama, llama.cpp, vLLM) need no
  key, and config.toml always names one.
- Retries: 408, 429, 5xx (Anthropic's 529 included), connection errors and timeouts, up to
  `max_attempts` calls; the wait is `Retry-After` (seconds or an HTTP date; OpenAI's `retry-after-ms` too)
  when the server sends one, else exponential backoff with jitter, each wait at most `max_wait_s`; no
  attempt starts after `budget_s` from the first. A server that asks for more than `max_wait_s` is not
  retried: the person hears about it at once. 4xx answers are final.
- Streaming (when the caller passes `on_text`): the body asks for a stream (`_stream_body`), the SSE answer
  is read event by event (`_stream_reader`, providers/sse.py) and `on_text` gets the whole text so far
  after each read that added some. The reply is the same ModelReply as without a stream. An error before
  the first byte is classified and retried exactly as without; a stream cut in the middle, one that stops
  before its last event, or an error event inside it (Anthropic's overloaded_error) is retried whole
  within the same attempts and budget: the text starts again from nothing, and so does `on_text`. A
  server that answers a stream request with plain JSON is read as before (and `on_text` gets its text).
- Key values never reach an exception or a log line: texts from the server are scrubbed of the key and
  passed through the redactor before they are used. Every request body is redacted too (common.redact):
  no secret value the runner knows, in any form it finds, reaches a model.
"""

from __future__ import annotations

import asyncio
import email.utils
import errno
import json
import random
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlsplit

import aiohttp

from common.errors import MissingSecret, StarlingError
from common.log import get_logger
from common.redact import redact, redact_value, refresh
from common.secrets import resolve_secret
from services.runner.llm import Message, ModelReply, ProviderError, ToolSpec
from services.runner.providers import sse

if TYPE_CHECKING:
    from common.config import Provider as ProviderConfig

NO_KEY = "none"  # a secret whose value is this sends no auth header
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
_MAX_SERVER_TEXT = 300  # characters of a server's error message quoted to the person


class Malformed(Exception):
    """Raised by `_parse` when a 200 answer does not have the shape the API promises."""


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes


@dataclass(frozen=True)
class _Failure:
    """One failed attempt: what a final ProviderError would say, and whether to try again."""

    kind: str
    user_text: str
    detail: str
    retryable: bool
    retry_after: float | None = None
    status: int = 0


def parse_retry_after(headers: dict[str, str], now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `retry-after` as seconds or an HTTP date; None if absent."""
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def is_local(base_url: str) -> bool:
    """True when base_url points at this machine."""
    return (urlsplit(base_url).hostname or "") in LOCAL_HOSTS


def _connect_reason(e: aiohttp.ClientError, host: str) -> str:
    if isinstance(e, aiohttp.ConnectionTimeoutError):
        return "connection timed out"
    if isinstance(e, aiohttp.ClientConnectorDNSError):
        return f"host name {host!r} not found"
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        return "its TLS certificate was not accepted"
    if isinstance(e, aiohttp.ClientSSLError):
        return "the TLS handshake failed"
    if isinstance(e, aiohttp.ClientConnectorError):
        code = e.os_error.errno
        if code == errno.ECONNREFUSED:
            return "connection refused"
        if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return "no route to the host"
        return (e.strerror or "connection failed").lower()
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    return "the connection failed"


class Provider(ABC):
    """One configured model endpoint. Not thread-safe; safe for concurrent calls in one event loop."""

    kind = ""

    def __init__(
        self,
        name: str,
        cfg: ProviderConfig,
        secrets_file: Path,
        *,
        max_attempts: int = 4,
        backoff_s: float = 1.0,
        max_wait_s: float = 30.0,
        budget_s: float = 90.0,
        timeout_s: float = 120.0,
        connect_timeout_s: float = 10.0,
        log: Any = None,
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.model = cfg.model
        self.base_url = cfg.base_url.rstrip("/")
        self.shown_url = _without_userinfo(self.base_url)  # what messages and logs may show
        self.secrets_file = Path(secrets_file)
        self.max_attempts = max(1, max_attempts)
        self.backoff_s = backoff_s
        self.max_wait_s = max_wait_s
        self.budget_s = budget_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self.log = log if log is not None else get_logger(provider=name)
        self._key: str | None = None  # the resolved key; "" for "none" (no auth header)
        self._session: aiohttp.ClientSession | None = None

    # --- what a provider says -------------------------------------------------------------------------

    @abstractmethod
    def _endpoint(self) -> str:
        """The URL to POST to."""

    @abstractmethod
    def _auth_headers(self, key: str) -> dict[str, str]:
        """Headers carrying `key` (never called with an empty key)."""

    @abstractmethod
    def _body(self, system: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int) -> dict[str, Any]:
        """The JSON request body."""

    @abstractmethod
    def _parse(self, data: Any) -> ModelReply:
        """A ModelReply from a 200 answer's JSON; raises Malformed (or KeyError/TypeError/ValueError)."""

    def _stream_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body of a streamed request."""
        return {**body, "stream": True}

    @abstractmethod
    def _stream_reader(self) -> sse.StreamReader:
        """A reader for one attempt's streamed answer."""

    def _extra_headers(self) -> dict[str, str]:
        return {}

    def _embedded_error(self, data: Any) -> tuple[int, Any] | None:
        """(status, error JSON) when a 200 answer is really an error (some proxies do this), else None."""
        return None

    # --- the call ---------------------------------------------------------------------------------------

    async def complete(
        self, system: str, messages: list[Message], tools: list[ToolSpec], *, max_tokens: int = 2048,
        on_text: Callable[[str], None] | None = None,
    ) -> ModelReply:
        """One model answer; raises ProviderError when it fails for good. With ``on_text`` the answer is
        streamed, and ``on_text`` gets the whole text so far as it grows (from "" again on a retry)."""
        key = self._resolve_key()
        accept = "text/event-stream" if on_text else "application/json"
        headers = {"content-type": "application/json", "accept": accept, **self._extra_headers()}
        if key:
            headers.update(self._auth_headers(key))
        refresh()
        body = self._body(system, messages, tools, max_tokens)
        # The one place every request body passes: no secret value the runner knows reaches a model.
        body = redact_value(self._stream_body(body) if on_text else body)
        payload = json.dumps(body, ensure_ascii=False).encode()
        url = self._endpoint()
        started = time.monotonic()
        failure: _Failure | None = None
        attempt = 0
        while attempt < self.max_attempts:
            attempt += 1
            answer, failure = await self._attempt(url, headers, payload, on_text)
            if isinstance(answer, ModelReply):
                return answer
            if answer is not None:
                try:
                    return self._read(answer)
                except _Refused as r:
                    failure = r.failure
            assert failure is not None
            if not failure.retryable or attempt >= self.max_attempts:
                break
            wait = self._wait_for(attempt, failure.retry_after)
            if wait is None or time.monotonic() - started + wait > self.budget_s:
                break
            self.log.warning(
                "model_call_retry", kind=failure.kind, detail=failure.detail, attempt=attempt, wait_s=round(wait, 3)
            )
            await asyncio.sleep(wait)
        assert failure is not None
        if failure.kind == "auth":
            self._key = None  # a rotated key is picked up by the next call
        self.log.warning("model_call_failed", kind=failure.kind, detail=failure.detail, attempts=attempt)
        raise ProviderError(failure.kind, self._final_text(failure, attempt), failure.detail)

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def __aenter__(self) -> Provider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the pieces -------------------------------------------------------------------------------------

    def _resolve_key(self) -> str:
        if self._key is not None:
            return self._key
        secret = self.cfg.api_key
        try:
            value = resolve_secret(secret, self.secrets_file, key=f"providers.{self.name}.api_key").strip()
        except MissingSecret:
            if is_local(self.base_url):
                return ""  # not cached: a key set later is used by the next call
            error = ProviderError(
                "missing_key",
                f"No API key is set for the model provider '{self.name}' (secret '{secret}'). "
                f"Set it with: starling secret set {secret} --value-stdin",
                f"secret {secret!r} for providers.{self.name}.api_key is not set",
            )
        except StarlingError as e:  # an unreadable secrets file; its message never holds a value
            error = ProviderError(
                "missing_key", f"I can't read the API key for the model provider '{self.name}': {e}", str(e)
            )
        else:
            self._key = "" if value.lower() == NO_KEY else value
            return self._key
        self.log.warning("model_call_failed", kind=error.kind, detail=error.detail, attempts=0)
        raise error

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout, raise_for_status=False)
        return self._session

    async def _attempt(
        self, url: str, headers: dict[str, str], payload: bytes, on_text: Callable[[str], None] | None = None
    ) -> tuple[_Answer | ModelReply | None, _Failure | None]:
        host = urlsplit(url).hostname or url
        try:
            async with self._get_session().post(url, data=payload, headers=headers) as resp:
                if on_text is not None and resp.status == 200 and resp.content_type == "text/event-stream":
                    return await self._read_stream(resp, on_text)
                body = await _read_bounded(resp)
                if on_text is not None and resp.status == 200:  # a server that did not stream: read as JSON
                    answer = _Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, body)
                    try:
                        reply = self._read(answer)
                    except _Refused as r:
                        return None, r.failure
                    if reply.text:
                        on_text(reply.text)
                    return reply, None
                return _Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, body), None
        except aiohttp.ConnectionTimeoutError as e:
            return None, self._unreachable(_connect_reason(e, host))
        except TimeoutError:
            total = self.timeout.total
            return None, _Failure(
                "timeout",
                f"The model at {self.shown_url} did not answer within {total:g} s. Try again; if it keeps "
                f"happening, check the server or `[providers.{self.name}]`.",
                f"no answer from {self.shown_url} within {total:g} s",
                retryable=True,
            )
        except _TooLarge:
            detail = f"answer from {self.shown_url} over {MAX_RESPONSE_BYTES} bytes"
            return None, _Failure("malformed", _MALFORMED, detail, False)
        except aiohttp.ClientError as e:
            return None, self._unreachable(_connect_reason(e, host))

    async def _read_stream(
        self, resp: aiohttp.ClientResponse, on_text: Callable[[str], None]
    ) -> tuple[ModelReply | None, _Failure | None]:
        """One streamed answer: the reply once its last event came, else why not (a cut is retried whole)."""
        reader = self._stream_reader()
        decoder = sse.Decoder()
        size = shown = 0
        try:
            async for chunk in resp.content.iter_any():
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    detail = f"answer from {self.shown_url} over {MAX_RESPONSE_BYTES} bytes"
                    return None, _Failure("malformed", _MALFORMED, detail, False)
                for event in decoder.feed(chunk):
                    reader.event(event)
                    if reader.ended():
                        break
                if len(reader.parts) != shown:
                    shown = len(reader.parts)
                    on_text("".join(reader.parts))
                if reader.ended():
                    break
            if not reader.whole():
                return None, self._unreachable("the answer stopped before its end")
            return reader.reply(), None
        except sse.StreamError as e:
            headers = {k.lower(): v for k, v in resp.headers.items()}
            failure = self._classify(e.status, headers, e.data, b"")
            return None, failure
        except (Malformed, KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            detail = f"unexpected stream event ({type(e).__name__}: {self._scrub(str(e))})"
            return None, _Failure("malformed", _MALFORMED, detail, False)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            return None, self._unreachable("the connection was cut in the middle of the answer")

    def _unreachable(self, reason: str) -> _Failure:
        return _Failure(
            "unreachable",
            f"I can't reach the model at {self.shown_url} ({reason}). "
            f"Check `[providers.{self.name}] base_url` or that the server runs.",
            f"{self.shown_url}: {reason}",
            retryable=True,
        )

    def _read(self, answer: _Answer) -> ModelReply:
        """The reply in a 200 answer; raises _Refused with the failure otherwise."""
        status, data = answer.status, None
        if status == 200:
            try:
                data = json.loads(answer.body)
            except ValueError:
                detail = f"HTTP 200 body is not JSON: {self._snippet(answer.body)}"
                raise _Refused(_Failure("malformed", _MALFORMED, detail, False)) from None
            embedded = self._embedded_error(data)
            if embedded is None:
                try:
                    return self._parse(data)
                except (Malformed, KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
                    detail = f"unexpected answer shape ({type(e).__name__}: {self._scrub(str(e))})"
                    raise _Refused(_Failure("malformed", _MALFORMED, detail, False)) from None
            status, data = embedded
        raise _Refused(self._classify(status, answer.headers, data, answer.body))

    def _classify(self, status: int, headers: dict[str, str], data: Any, body: bytes) -> _Failure:
        if data is None:
            try:
                data = json.loads(body)
            except ValueError:
                data = None
        message = self._scrub(_server_message(data) if data is not None else "") or self._snippet(body)
        detail = f"HTTP {status}: {message}" if message else f"HTTP {status}"
        where = f"`[providers.{self.name}]`"
        secret = self.cfg.api_key
        if status == 429:
            if _quota_exhausted(data):
                return _Failure(
                    "quota",
                    f"The model provider '{self.name}' says the account is out of quota or credit: "
                    f"{_short(message)} Check the plan or billing, or switch {where} to another provider.",
                    detail,
                    retryable=False,
                )
            return _Failure("rate_limited", "", detail, True, parse_retry_after(headers), status)
        if status == 408 or status >= 500:
            return _Failure("server_error", "", detail, True, parse_retry_after(headers), status)
        if status in (401, 403):
            verb = "rejected the API key" if status == 401 else "refused access with this API key"
            return _Failure(
                "auth",
                f"The model provider '{self.name}' {verb} (HTTP {status}): {_short(message)} "
                f"Check the secret '{secret}' (starling secret set {secret} --value-stdin) "
                f"and the model {self.model!r}.",
                detail,
                retryable=False,
            )
        if status == 404:
            return _Failure(
                "bad_request",
                f"The model provider '{self.name}' answered 404 (not found): {_short(message)} "
                f"Check `[providers.{self.name}] model` ({self.model!r}) and base_url ({self.shown_url}).",
                detail,
                retryable=False,
            )
        return _Failure(
            "bad_request",
            f"The model provider '{self.name}' refused the request (HTTP {status}): {_short(message)}",
            detail,
            retryable=False,
        )

    def _wait_for(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds before the next attempt; None when the server asks for longer than max_wait_s."""
        if retry_after is not None:
            if retry_after > self.max_wait_s:
                return None
            return retry_after + random.uniform(0, min(0.1 * retry_after, 1.0))
        step = self.backoff_s * 2 ** (attempt - 1)
        return min(self.max_wait_s, step * random.uniform(0.5, 1.0))

    def _final_text(self, failure: _Failure, attempts: int) -> str:
        if failure.user_text:
            return failure.user_text
        tries = f"{attempts} tries" if attempts > 1 else "one try"
        if failure.kind == "rate_limited":
            wait = f" It asks me to wait {failure.retry_after:.0f} s." if failure.retry_after else ""
            return (
                f"The model provider '{self.name}' is rate-limiting me (HTTP 429) after {tries}.{wait} "
                "Try again in a minute."
            )
        return (
            f"The model provider '{self.name}' had a server error (HTTP {failure.status}) after {tries}. "
            "Try again later."
        )

    def _scrub(self, text: str) -> str:
        if self._key:
            text = text.replace(self._key, "[redacted]")
        return redact(text)

    def _snippet(self, body: bytes) -> str:
        text = " ".join(body[:1000].decode("utf-8", "replace").split())
        return self._scrub(text[:200])


_MALFORMED = "The model sent an answer I could not read."


class _Refused(Exception):
    def __init__(self, failure: _Failure) -> None:
        self.failure = failure


class _TooLarge(Exception):
    pass


async def _read_bounded(resp: aiohttp.ClientResponse) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(65536):
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise _TooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def _server_message(data: Any) -> str:
    """The message in the error shapes servers use: {"error": {"message"}}, {"error": "..."}, {"message"}, {"detail"}"""
    if not isinstance(data, dict):
        return ""
    err = data.get("error")
    if isinstance(err, dict):
        msg = err.get("message")
        if isinstance(msg, str) and msg:
            return msg
        if isinstance(err.get("type"), str):
            return err["type"]
    if isinstance(err, str):
        return err
    for key in ("message", "detail"):
        if isinstance(data.get(key), str):
            return data[key]
    return ""


def _quota_exhausted(data: Any) -> bool:
    """A 429 that waiting will not fix: OpenAI's insufficient_quota, Anthropic's spend limit."""
    err = data.get("error") if isinstance(data, dict) else None
    if not isinstance(err, dict):
        return False
    details = err.get("details") if isinstance(err.get("details"), dict) else {}
    codes = (err.get("code"), err.get("type"), details.get("error_code"))
    return any(isinstance(c, str) and ("insufficient_quota" in c or "spend_limit" in c) for c in codes)


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def _short(message: str) -> str:
    message = " ".join(message.split())
    if not message:
        return "(no message)."
    if len(message) > _MAX_SERVER_TEXT:
        message = message[: _MAX_SERVER_TEXT - 1] + "…"
    return message if message[-1] in ".!?…" else message + "."


def make_provider(name: str, provider_cfg: ProviderConfig, secrets_file: Path, **retry_kw: Any) -> Provider:
    """The provider for `[providers.<name>]`. Never fails for a missing key: complete() reports it."""
    if provider_cfg.kind == "anthropic":
        from services.runner.providers.anthropic import AnthropicProvider

        return AnthropicProvider(name, provider_cfg, secrets_file, **retry_kw)
    if provider_cfg.kind == "openai":
        from services.runner.providers.openai import OpenAIProvider

        return OpenAIProvider(name, provider_cfg, secrets_file, **retry_kw)
    raise ValueError(f"unknown provider kind {provider_cfg.kind!r}")

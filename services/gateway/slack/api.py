"""The few Slack Web API calls the gateway needs, over aiohttp: `POST {api_base}/<method>` with a
Bearer token and a JSON body. Slack answers HTTP 200 with {"ok": false, "error": ...} for most
errors and HTTP 429 with Retry-After when a method's rate limit is hit."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp

from common.errors import StarlingError
from services.gateway.http import NetworkError, download, request_json

CALL_TIMEOUT_S = 30.0


class SlackError(StarlingError):
    """ok:false, or a 429 (``error == "ratelimited"``, ``retry_after`` from the header)."""

    def __init__(self, method: str, error: str, retry_after: float = 0.0) -> None:
        super().__init__(f"{method}: {error}")
        self.method = method
        self.error = error
        self.retry_after = retry_after


class SlackApi:
    def __init__(self, api_base: str, token: str, session: aiohttp.ClientSession) -> None:
        self.base = api_base.rstrip("/")
        self.token = token
        self.session = session

    async def call(self, method: str, params: dict[str, Any] | None = None, *, token: str | None = None,
                   timeout: float = CALL_TIMEOUT_S, form: bool = False) -> dict[str, Any]:
        """``form``: send the arguments urlencoded (methods that take no JSON, e.g. files.getUploadURLExternal)."""
        headers = {"Authorization": f"Bearer {token or self.token}"}
        if form:
            data: Any = {k: str(v) for k, v in (params or {}).items()}
        else:
            data = json.dumps(params or {})
            headers["Content-Type"] = "application/json; charset=utf-8"
        status, resp_headers, answer = await request_json(self.session, "POST", f"{self.base}/{method}", what=method,
                                                          timeout=timeout, data=data, headers=headers)
        if status == 429:
            raise SlackError(method, "ratelimited", _seconds(resp_headers.get("Retry-After")))
        if status >= 500:
            raise NetworkError(f"{method}: HTTP {status}")
        if not isinstance(answer, dict):
            raise NetworkError(f"{method}: not a Web API answer")
        if answer.get("ok") is not True:
            raise SlackError(method, str(answer.get("error") or "unknown_error"))
        return answer

    async def upload(self, url: str, path: Path) -> None:
        """Step two of the external upload flow: the file's bytes to the URL Slack gave."""
        try:
            with path.open("rb") as fh:
                form = aiohttp.FormData()
                form.add_field("file", fh, filename=path.name)
                async with self.session.post(url, data=form, timeout=aiohttp.ClientTimeout(total=300)) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise NetworkError(f"upload: HTTP {resp.status}")
        except asyncio.TimeoutError as exc:
            raise NetworkError("upload: no answer in time") from exc
        except aiohttp.ClientError as exc:
            raise NetworkError(f"upload: {type(exc).__name__}") from None

    def download(self, url: str) -> AsyncIterator[bytes]:
        """A file a person shared (`url_private_download`), fetched with the bot token; without it Slack
        answers with a redirect to its sign-in page, which is an error here."""
        return download(self.session, url, {"Authorization": f"Bearer {self.token}"})


def _seconds(value: str | None) -> float:
    try:
        return max(0.0, float(value)) if value else 1.0
    except ValueError:
        return 1.0

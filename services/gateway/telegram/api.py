"""A small Bot API client over aiohttp: `POST {api_base}/bot<token>/<method>`, the answer's envelope
({"ok", "result"} or {"ok": false, "error_code", "description", "parameters"}) turned into a result
or an ApiError. The token is in every URL, so no URL and no aiohttp error text leaves this module
unredacted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp

from common.errors import StarlingError
from services.gateway.http import NetworkError, download, request_json

CALL_TIMEOUT_S = 30.0


class ApiError(StarlingError):
    """Telegram answered ok:false. ``retry_after`` (429) and ``migrate_to`` (a group became a
    supergroup) come from the answer's parameters."""

    def __init__(self, code: int, description: str, retry_after: float = 0.0, migrate_to: int = 0) -> None:
        super().__init__(f"{code} {description}")
        self.code = code
        self.description = description
        self.retry_after = retry_after
        self.migrate_to = migrate_to

    @property
    def bad_entities(self) -> bool:
        return self.code == 400 and "can't parse entities" in self.description.lower()


class BotApi:
    def __init__(self, api_base: str, token: str, session: aiohttp.ClientSession) -> None:
        self.base = api_base.rstrip("/")
        self.token = token
        self.session = session

    def _hide(self, text: str) -> str:
        return text.replace(self.token, "<token>") if self.token else text

    async def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float = CALL_TIMEOUT_S,
                   form: aiohttp.FormData | None = None) -> Any:
        kwargs: dict[str, Any] = {"data": form} if form is not None else {"json": params or {}}
        status, _, answer = await request_json(self.session, "POST", f"{self.base}/bot{self.token}/{method}",
                                               what=method, timeout=timeout, hide=self._hide, **kwargs)
        if not isinstance(answer, dict):
            raise NetworkError(f"{method}: HTTP {status}, not a Bot API answer")
        if answer.get("ok") is True:
            return answer.get("result")
        params_ = answer.get("parameters") if isinstance(answer.get("parameters"), dict) else {}
        code = answer.get("error_code") if isinstance(answer.get("error_code"), int) else status
        raise ApiError(code, self._hide(str(answer.get("description") or "")),
                       retry_after=_number(params_.get("retry_after")),
                       migrate_to=int(_number(params_.get("migrate_to_chat_id"))))

    async def upload(self, method: str, params: dict[str, Any], field: str, path: Path) -> Any:
        form = aiohttp.FormData()
        for key, value in params.items():
            form.add_field(key, value if isinstance(value, str) else json.dumps(value))
        with path.open("rb") as fh:
            form.add_field(field, fh, filename=path.name)
            return await self.call(method, form=form, timeout=300.0)

    def download(self, file_path: str) -> AsyncIterator[bytes]:
        """The content of a file getFile described, in chunks."""
        return download(self.session, f"{self.base}/file/bot{self.token}/{file_path}", hide=self._hide)


def _number(value: Any) -> float:
    try:
        return float(value) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0

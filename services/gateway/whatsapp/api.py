"""The Graph API calls of the WhatsApp Cloud API, over aiohttp: `{api_base}/{phone-number-id}/messages`,
`/media`, `/{media-id}`. Errors come as {"error": {"message", "type", "code", "error_subcode",
"error_data": {"details"}}} with an HTTP 4xx/5xx."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp

from common.errors import StarlingError
from services.gateway.http import NetworkError, download, request_json

CALL_TIMEOUT_S = 30.0


class GraphError(StarlingError):
    def __init__(self, code: int, message: str, details: str = "", http: int = 400) -> None:
        super().__init__(f"{code} {message}" + (f": {details}" if details else ""))
        self.code = code
        self.message = message
        self.details = details
        self.http = http


class GraphApi:
    def __init__(self, api_base: str, token: str, phone_number_id: str, session: aiohttp.ClientSession) -> None:
        self.base = api_base.rstrip("/")
        self.token = token
        self.number = phone_number_id
        self.session = session

    @property
    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def _request(self, method: str, url: str, what: str, **kw) -> dict[str, Any]:
        status, _, answer = await request_json(self.session, method, url, what=what, headers=self._auth,
                                               timeout=kw.pop("timeout", CALL_TIMEOUT_S), **kw)
        if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
            err = answer["error"]
            data = err.get("error_data") if isinstance(err.get("error_data"), dict) else {}
            code = err.get("code") if isinstance(err.get("code"), int) else status
            raise GraphError(code, str(err.get("message") or ""), str(data.get("details") or ""), status)
        if status >= 500 or not isinstance(answer, dict):
            raise NetworkError(f"{what}: HTTP {status}")
        if status >= 400:
            raise GraphError(status, f"HTTP {status}", http=status)
        return answer

    async def send(self, payload: dict[str, Any]) -> dict[str, Any]:
        body = {"messaging_product": "whatsapp", **payload}
        return await self._request("POST", f"{self.base}/{self.number}/messages", "messages", json=body)

    async def upload(self, path: Path, mime: str) -> str:
        with path.open("rb") as fh:
            form = aiohttp.FormData()
            form.add_field("messaging_product", "whatsapp")
            form.add_field("type", mime)
            form.add_field("file", fh, filename=path.name, content_type=mime)
            answer = await self._request("POST", f"{self.base}/{self.number}/media", "media upload", data=form,
                                         timeout=300.0)
        if not isinstance(answer.get("id"), str):
            raise NetworkError("media upload: no id in the answer")
        return answer["id"]

    async def media(self, media_id: str) -> dict[str, Any]:
        """The media object of an inbound file: its short-lived `url`, `file_size`, `mime_type`."""
        return await self._request("GET", f"{self.base}/{media_id}", "media")

    def download(self, url: str) -> AsyncIterator[bytes]:
        """An inbound media file from its short-lived URL (an expired one is an error: fetch the media again)."""
        return download(self.session, url, self._auth, what="media download (the URL may have expired)")

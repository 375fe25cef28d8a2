"""A fake OpenAI-compatible transcription server: ``POST /v1/audio/transcriptions`` on 127.0.0.1, as strict as
the real one, answering from a script.

The request is checked as OpenAI checks it, with its status and error body (messages as the service words
them, quoted in public bug reports; "(fake's wording)" where none was found):
- ``Authorization: Bearer`` (401) unless keyless; a multipart/form-data body (400) of at most 25 MB
  (413 "Maximum content size limit (26214400) exceeded ...");
- ``file`` required, named with one of the formats of the API's documentation (flac, m4a, mp3, mp4, mpeg,
  mpga, ogg, wav, webm: OpenAI itself also takes oga, Groq does not, so the fake holds to the common list),
  and its bytes an audio file of that kind (else "Audio file might be corrupted or unsupported");
- ``model`` required and one the server has; ``language`` ISO-639-1 when given; ``response_format`` json,
  text, srt, verbose_json or vtt (the gpt-4o models: json or text).

In a test's event loop: ``async with FakeTranscription([{"text": "hello"}]) as fake: ... fake.url``;
as a process: ``python -m tests.fake_transcription --port-file PATH``, wrapped by `FakeTranscriptionProcess`.
Control: GET/DELETE /_requests, POST /_script (a list of steps). A step: {"text": "..."} the transcript,
{"status": 500, "message": "..."} an error, {"delay": s}; no step: "transcript of <file name>".
Recorded per request: the fields (the file as name, content type, size and first bytes in hex), "invalid".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import deque
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.fake_server import FakeServerProcess, listen, serve_until_stopped
from tests.model_api_rules import OPENAI_NO_KEY

MAX_BYTES = 26_214_400  # 25 MiB, as the API counts it
FORMATS = ("flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "ogg", "wav", "webm")
MODELS = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "whisper-large-v3", "whisper-large-v3-turbo")
RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
ISO_639_1 = frozenset(
    "af am ar as az ba be bg bn bo br bs ca cs cy da de el en es et eu fa fi fo fr gl gu ha haw he hi hr ht hu hy"
    " id is it ja jw ka kk km kn ko la lb ln lo lt lv mg mi mk ml mn mr ms mt my ne nl nn no oc pa pl ps pt ro ru"
    " sa sd si sk sl sn so sq sr su sv sw ta te tg th tk tl tr tt uk ur uz vi yi yo zh yue".split())


def audio_kind(head: bytes) -> str:
    """The container the bytes are, as a format name of the API ("" when none)."""
    if head.startswith(b"OggS"):
        return "ogg"
    if head.startswith(b"fLaC"):
        return "flac"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head.startswith(b"\x1aE\xdf\xa3"):
        return "webm"
    if head.startswith(b"ID3") or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    if head[4:8] == b"ftyp":
        return "mp4"
    return ""


_SAME = {"mp3": ("mp3", "mpeg", "mpga"), "mp4": ("mp4", "m4a"), "ogg": ("ogg",), "wav": ("wav",), "webm": ("webm",),
         "flac": ("flac",)}


class _Refused(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


class FakeTranscription:
    def __init__(self, script: list[dict] = (), *, host: str = "127.0.0.1", port: int = 0, keyless: bool = False,
                 models: tuple[str, ...] = MODELS) -> None:
        self.host, self.port, self.keyless, self.models = host, port, keyless, models
        self._script: deque[dict] = deque(script)
        self._recorded: deque[dict] = deque(maxlen=500)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def requests(self) -> list[dict]:
        return list(self._recorded)

    def add(self, *steps: dict) -> None:
        self._script.extend(steps)

    async def start(self) -> FakeTranscription:
        app = web.Application(client_max_size=MAX_BYTES + 1024 * 1024)
        app.add_routes([
            web.post("/v1/audio/transcriptions", self._transcribe),
            web.get("/_requests", self._get_requests),
            web.delete("/_requests", self._forget),
            web.post("/_script", self._post_script),
        ])
        self._runner, self.port = await listen(app, self.host, self.port)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> FakeTranscription:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _get_requests(self, request: web.Request) -> web.Response:
        return web.json_response(self.requests)

    async def _forget(self, request: web.Request) -> web.Response:
        self._recorded.clear()
        return web.json_response({"ok": True})

    async def _post_script(self, request: web.Request) -> web.Response:
        self.add(*await request.json())
        return web.json_response({"queued": len(self._script)})

    async def _transcribe(self, request: web.Request) -> web.Response:
        record: dict[str, Any] = {"fields": {}}
        self._recorded.append(record)
        try:
            fields = await self._check(request, record)
        except _Refused as r:
            record["invalid"] = r.message
            error = {"message": r.message, "type": "invalid_request_error", "param": r.param, "code": r.code}
            return web.json_response({"error": error}, status=r.status)
        step = self._script.popleft() if self._script else {}
        record["step"] = step
        if step.get("delay"):
            await asyncio.sleep(float(step["delay"]))
        if "status" in step:
            error = {"message": step.get("message", "fake error"), "type": "server_error", "param": None, "code": None}
            return web.json_response({"error": error}, status=int(step["status"]))
        text = step.get("text", f"transcript of {fields['file'][0]}")
        if fields.get("response_format", "json") == "text":
            return web.Response(text=text)
        return web.json_response({"text": text, "usage": {"type": "duration", "seconds": 3}})

    async def _check(self, request: web.Request, record: dict) -> dict:
        auth = request.headers.get("authorization", "")
        if not self.keyless and not (auth.startswith("Bearer ") and auth[7:].strip()):
            raise _Refused(401, OPENAI_NO_KEY)
        if request.content_length is not None and request.content_length > MAX_BYTES:
            raise _Refused(413, f"Maximum content size limit ({MAX_BYTES}) exceeded ({request.content_length} bytes"
                                " read)")
        if not request.content_type.startswith("multipart/form-data"):  # (fake's wording)
            raise _Refused(400, "Invalid Content-Type header: the request body must be multipart/form-data.")
        fields: dict[str, Any] = {}
        size = 0
        reader = await request.multipart()
        async for part in reader:
            data = await part.read(decode=False)
            size += len(data)
            if size > MAX_BYTES:
                raise _Refused(413, f"Maximum content size limit ({MAX_BYTES}) exceeded ({size} bytes read)")
            if part.name == "file":
                fields["file"] = (part.filename or "", part.headers.get("Content-Type", ""), data)
                record["fields"]["file"] = {"filename": part.filename, "content_type": fields["file"][1],
                                            "size": len(data), "head": data[:8].hex()}
            elif part.name:
                fields[part.name] = data.decode("utf-8", "replace")
                record["fields"][part.name] = fields[part.name]
        if "file" not in fields:  # (fake's wording)
            raise _Refused(400, "Missing required parameter: 'file'.", "file", "missing_required_parameter")
        if not fields.get("model"):
            raise _Refused(400, "you must provide a model parameter", "model")
        if fields["model"] not in self.models:  # (fake's wording)
            raise _Refused(400, f"Invalid model '{fields['model']}'. The model does not exist or is not a"
                                " transcription model.", "model", "model_not_found")
        name, _type, data = fields["file"]
        ext = name.rpartition(".")[2].lower() if "." in name else ""
        if ext not in FORMATS:
            raise _Refused(400, f"Invalid file format. Supported formats: {list(FORMATS)}")
        if ext not in _SAME.get(audio_kind(data[:16]), ()):
            raise _Refused(400, "Audio file might be corrupted or unsupported", "file", "invalid_value")
        language = fields.get("language")
        if language is not None and language not in ISO_639_1:
            raise _Refused(400, f"Invalid language '{language}'. Language parameter must be specified in ISO-639-1"
                                " format.", "language", "invalid_language_format")
        fmt = fields.get("response_format", "json")
        allowed = ("json", "text") if fields["model"].startswith("gpt-4o") else RESPONSE_FORMATS
        if fmt not in allowed:
            raise _Refused(400, f"response_format '{fmt}' is not compatible with model '{fields['model']}'."
                                f" Use {' or '.join(repr(a) for a in allowed)}.", "response_format",
                           "unsupported_value")
        return fields


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fake_transcription", description=__doc__.splitlines()[0])
    p.add_argument("--port-file", type=Path, required=True)
    p.add_argument("--lifetime", type=float, default=900.0)
    p.add_argument("--keyless", action="store_true")
    p.add_argument("--script", type=Path)
    args = p.parse_args(argv)
    script = json.loads(args.script.read_text()) if args.script else []
    fake = FakeTranscription(script, keyless=args.keyless)
    asyncio.run(serve_until_stopped(fake, args.port_file, args.lifetime, "fake_transcription"))
    return 0


class FakeTranscriptionProcess(FakeServerProcess):
    """`python -m tests.fake_transcription` as a child process, for end-to-end tests."""

    name = "fake_transcription"

    def __init__(self, workdir: Path, script: list[dict] = (), *, lifetime: float = 600.0) -> None:
        super().__init__(workdir, lifetime=lifetime)
        self.script = list(script)

    @property
    def api_url(self) -> str:
        return f"{self.url}/v1"

    def extra_args(self) -> list[str]:
        if not self.script:
            return []
        path = self.workdir / "fake_transcription.script.json"
        path.write_text(json.dumps(self.script))
        return ["--script", str(path)]

    def requests(self) -> list[dict]:
        return self._call("GET", "/_requests")

    def add(self, *steps: dict) -> None:
        self._call("POST", "/_script", list(steps))


if __name__ == "__main__":
    sys.exit(main())

"""Voice notes and audio to text before the turn, through any OpenAI-compatible
``POST {base_url}/audio/transcriptions`` (OpenAI, Groq, local whisper servers speak it).

``[transcription] provider`` names a ``[providers.<name>]`` for its base_url and api_key; ``model`` and
``language`` go with each request, a multipart form as the API expects it (``file``, ``model``,
``language``, ``response_format=json``). The file is named by its sniffed container (a Telegram ``.oga``
goes as ``voice.ogg``: the API judges the format by the name). What the claimed turn's audio lines become,
stored through the writer by the runner holding the turn (``SetTurnText``), so that it is done once, later
turns and recall see it, and redaction applies as to every write: ``[voice note, transcribed] <text>``;
on failure the line stays, saying why (``…; not transcribed: the service answered HTTP 500 …``).

Why the runner, not the gateway: one place for every platform; the audio is on disk already
(data/attachments) when the turn is claimed, so a slow or failing service delays an answer, never a
platform's acknowledgement (Slack's 3 s, a webhook's deadline); retries with backoff are the runner's,
as for model calls; a runner that dies mid-transcription leaves the turn to the next one, which tries again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

import aiohttp

from common.config import Config, is_local_url
from common.errors import MissingSecret, StarlingError
from common.redact import redact
from common.secrets import resolve_secret
from services.runner import media
from services.runner.llm import Message

FORMATS = ("flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "ogg", "wav", "webm")  # what the API takes, by name
CONTENT_TYPES = {"flac": "audio/flac", "m4a": "audio/mp4", "mp3": "audio/mpeg", "mp4": "audio/mp4",
                 "ogg": "audio/ogg", "wav": "audio/wav", "webm": "audio/webm"}
ATTEMPTS = 3
BACKOFF_S = 1.0  # the first wait between tries (then doubled, with jitter), unless the service says how long
MAX_TEXT = 32_000  # characters of one transcript kept (a gateway cuts a typed message there too)
_RETRY_STATUS = (408, 409, 429, 500, 502, 503, 504)


class Failed(Exception):
    """A transcription that did not happen; the message says why, for the line the model reads."""


async def hear(message: Message, cfg: Config, secrets_file: Path, attachments_root: Path, log) -> str | None:
    """``message``'s text with each audio line replaced by its transcript, or by the line and why not;
    None when there is nothing to do (no audio, transcription off, already done)."""
    if not cfg.transcription.provider or not message.attachments:
        return None
    content, changed = message.content, False
    for path in message.attachments:
        found = media.line_pattern(path).search(content)
        if found is None or found["note"] or found["kind"] not in media.AUDIO_KINDS:
            continue
        real = media.file_of(attachments_root, path)
        if real is None:
            continue
        label = "voice note" if found["kind"] in ("voice", "voice note") else found["kind"]
        try:
            text = await transcribe(real, cfg, secrets_file, log)
            line = f"[{label}, transcribed] {text.strip()[:MAX_TEXT] or '(no speech)'}"
            log.info("transcribed", path=real.name, chars=len(text))
        except Failed as exc:
            why = " ".join(str(exc).replace("[", "(").replace("]", ")").split())
            line = f"[{found['kind']} attached: {path} ({found['kb']} KB); not transcribed: {why}]"
            log.warning("transcription_failed", path=real.name, reason=why)
        content = content[:found.start()] + line + content[found.end():]
        changed = True
    return content if changed else None


def upload_name(path: Path) -> tuple[str, str]:
    """(file name, content type) the API accepts for this audio file; Failed when its format is not one."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as exc:
        raise Failed(f"the file could not be read ({exc.strerror})") from None
    fmt = media.audio_format(head)
    if fmt not in FORMATS:
        raise Failed(f"its format ({fmt or 'unknown'}) is not one the transcription service takes"
                     f" ({', '.join(FORMATS)})")
    return f"audio.{fmt}", CONTENT_TYPES.get(fmt, "application/octet-stream")


async def transcribe(path: Path, cfg: Config, secrets_file: Path, log) -> str:
    """The text of one audio file; Failed (after retries) with a reason a person can act on."""
    tcfg = cfg.transcription
    provider = cfg.providers[tcfg.provider]
    size = path.stat().st_size
    if size > tcfg.max_mb * 1024 * 1024:
        raise Failed(f"it is {size / 1048576:.1f} MB, over the {tcfg.max_mb:g} MB the service takes")
    name, content_type = upload_name(path)
    data = await asyncio.to_thread(path.read_bytes)
    headers = {"accept": "application/json"}
    key = _key(tcfg.provider, provider.api_key, provider.base_url, secrets_file)
    if key:
        headers["authorization"] = f"Bearer {key}"
    url = provider.base_url.rstrip("/") + "/audio/transcriptions"
    timeout = aiohttp.ClientTimeout(total=tcfg.timeout_s, connect=min(10.0, tcfg.timeout_s))
    why = ""
    for attempt in range(1, ATTEMPTS + 1):
        form = aiohttp.FormData()
        form.add_field("file", data, filename=name, content_type=content_type)
        form.add_field("model", tcfg.model)
        if tcfg.language:
            form.add_field("language", tcfg.language)
        form.add_field("response_format", "json")
        wait = None
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.post(url, data=form, headers=headers) as resp:
                    body = await resp.content.read(1024 * 1024)
                    if resp.status == 200:
                        return _text(body)
                    why = f"the service answered HTTP {resp.status}: {_message(body, key)}"
                    if resp.status not in _RETRY_STATUS:
                        raise Failed(why)
                    wait = _retry_after(resp.headers.get("retry-after"))
        except (aiohttp.ClientError, TimeoutError) as exc:
            why = f"the service at {_shown(url)} could not be reached ({type(exc).__name__})"
        if attempt < ATTEMPTS:
            delay = wait if wait is not None else BACKOFF_S * random.uniform(0.5, 1.0) * 2 ** (attempt - 1)
            log.warning("transcription_retry", attempt=attempt, reason=why, wait_s=round(delay, 2))
            await asyncio.sleep(delay)
    raise Failed(f"{why} ({ATTEMPTS} tries)")


def _key(name: str, secret: str, base_url: str, secrets_file: Path) -> str:
    try:
        value = resolve_secret(secret, secrets_file, key=f"providers.{name}.api_key").strip()
    except MissingSecret:
        if is_local_url(base_url):
            return ""
        raise Failed(f"no API key is set for [providers.{name}] (secret {secret!r}; starling secret set {secret}"
                     " --value-stdin)") from None
    except StarlingError as exc:
        raise Failed(f"the API key could not be read ({exc})") from None
    return "" if value.lower() == "none" else value


def _text(body: bytes) -> str:
    import json

    try:
        data = json.loads(body)
    except ValueError:
        raise Failed("the service's answer was not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise Failed("the service's answer had no text")
    return data["text"]


def _message(body: bytes, key: str) -> str:
    import json

    try:
        data = json.loads(body)
        err = data.get("error") if isinstance(data, dict) else None
        text = err.get("message") if isinstance(err, dict) else (err if isinstance(err, str) else data.get("detail"))
    except (ValueError, AttributeError):
        text = None
    text = str(text or body[:200].decode("utf-8", "replace"))
    if key:
        text = text.replace(key, "[redacted]")
    return redact(" ".join(text.split()))[:300]


def _retry_after(value: str | None) -> float | None:
    try:
        return min(10.0, max(0.0, float(value))) if value else None
    except ValueError:
        return None


def _shown(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def replace_text(message: Message, content: str) -> Message:
    return dataclasses.replace(message, content=content)

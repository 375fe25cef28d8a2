"""`starling whatsapp link|unlink` asking the running WhatsApp gateway, through files beside the session
in data/whatsapp/<instance>/ (0700): the CLI never speaks WhatsApp itself, the gateway does, with the
client it runs (services/gateway/whatsapp/linking.py answers these requests).

- A request (``link.request``: the phone for a pair code and the timeout, JSON; ``unlink.request``) is
  written whole (temporary file, rename). The gateway takes it by removing it, within a second or so;
  one not taken in PICKUP_S means no gateway serves the instance, and the CLI says so and withdraws it.
- Link: the gateway appends what the person must see to ``link.progress`` as JSON lines,
  ``{"say": text}`` (the QR code as drawn, the pair code, "paired…"), then ``{"linked": account}`` or
  ``{"failed": why}``; the CLI prints each line as it comes.
- Unlink: the gateway writes its answer to ``unlink.result``, which the CLI prints and removes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

from common.errors import StarlingError
from common.home import Paths, make_private_dir, write_private_file

LINK_REQUEST = "link.request"
LINK_PROGRESS = "link.progress"
UNLINK_REQUEST = "unlink.request"
UNLINK_RESULT = "unlink.result"
PICKUP_S = 10.0      # the gateway looks every second (every quarter second while it runs the session)
POLL_S = 0.1
LINK_GRACE_S = 30.0  # past the link's own timeout, which the gateway keeps: its last words may take a moment


def folder(paths: Paths, instance: str) -> Path:
    return Path(paths.whatsapp_dir) / instance


# ---------------------------------------------------------------- the CLI's side


def ask_link(paths: Paths, instance: str, phone: str, timeout_s: float, show: Callable[[str], None]) -> str:
    """Ask the gateway to link ``instance`` (by pair code when ``phone`` is given, else by QR code), show what
    it says as it says it, and return the linked account. Raises StarlingError with the gateway's reason."""
    where = folder(paths, instance)
    progress = where / LINK_PROGRESS
    progress.unlink(missing_ok=True)
    _request(where / LINK_REQUEST, {"phone": phone, "timeout_s": timeout_s, "at": time.time()})
    deadline = time.monotonic() + timeout_s + LINK_GRACE_S
    offset = 0
    while time.monotonic() < deadline:
        lines, offset = _new_lines(progress, offset)
        for line in lines:
            if "say" in line:
                show(str(line["say"]))
            elif "linked" in line:
                progress.unlink(missing_ok=True)
                return str(line["linked"])
            elif "failed" in line:
                progress.unlink(missing_ok=True)
                raise StarlingError(str(line["failed"]))
        time.sleep(POLL_S)
    raise StarlingError(f"the gateway did not finish linking in {timeout_s + LINK_GRACE_S:.0f}s; is it stuck?"
                        " (`starling logs gateway-whatsapp`)")


def ask_unlink(paths: Paths, instance: str, timeout_s: float = 30.0) -> str:
    """Ask the gateway to log ``instance`` out and delete its session; its answer."""
    where = folder(paths, instance)
    result = where / UNLINK_RESULT
    result.unlink(missing_ok=True)
    _request(where / UNLINK_REQUEST, {"at": time.time()})
    deadline = time.monotonic() + timeout_s
    while not result.exists():
        if time.monotonic() > deadline:
            raise StarlingError(f"the gateway took the request but did not answer in {timeout_s:.0f}s; is it stuck?"
                                " (`starling logs gateway-whatsapp`)")
        time.sleep(POLL_S)
    try:
        return result.read_text()
    finally:
        result.unlink(missing_ok=True)


def _request(path: Path, body: dict) -> None:
    """Write the request and wait until a gateway takes it."""
    make_private_dir(path.parent)
    write_private_file(path, json.dumps(body).encode())
    deadline = time.monotonic() + PICKUP_S
    while path.exists():
        if time.monotonic() > deadline:
            path.unlink(missing_ok=True)
            raise StarlingError(f"no gateway took the request in {PICKUP_S:.0f}s: is gateway-whatsapp running?"
                                " (`starling status`; `starling up` or `starling start gateway-whatsapp`)")
        time.sleep(POLL_S)


def _new_lines(path: Path, offset: int) -> tuple[list[dict], int]:
    """The whole JSON lines appended since ``offset`` (a line still being written waits for the next look)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    lines = []
    for raw in data[:end].splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict):
            lines.append(line)
    return lines, offset + end


# ---------------------------------------------------------------- the gateway's side


def take(path: Path) -> dict | None:
    """A request, removed as it is read (taken); None when there is none."""
    try:
        raw = path.read_bytes()
        path.unlink()
    except FileNotFoundError:
        return None
    try:
        body = json.loads(raw)
    except ValueError:
        body = {}
    return body if isinstance(body, dict) else {}


class LinkProgress:
    """The gateway's words to `starling whatsapp link`, appended line by line to ``link.progress`` (0600)."""

    def __init__(self, where: Path) -> None:
        self.path = where / LINK_PROGRESS
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(fd)

    def _add(self, line: dict) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, json.dumps(line).encode() + b"\n")
        finally:
            os.close(fd)

    def say(self, text: str) -> None:
        self._add({"say": text})

    def linked(self, account: str) -> None:
        self._add({"linked": account})

    def failed(self, why: str) -> None:
        self._add({"failed": why})


def answer_unlink(where: Path, text: str) -> None:
    write_private_file(where / UNLINK_RESULT, text.encode())

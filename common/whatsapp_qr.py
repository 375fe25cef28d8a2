"""The code `starling whatsapp link` is showing right now, for the dashboard: written by the gateway, which
does the linking, to data/run/whatsapp-link-<instance>.json (0600) while linking runs and removed when it ends, so the control
service shows the same QR code (or pair code) in the browser without importing the gateway."""

from __future__ import annotations

import json
import time
from pathlib import Path

from common.home import Paths, write_private_file

STALE_S = 300.0  # a file left by a link that was killed is not shown after this


def _file(paths: Paths, instance: str) -> Path | None:
    run_dir = getattr(paths, "run_dir", None)  # paths of a home; a test's stand-in may have none
    return None if run_dir is None else Path(run_dir) / f"whatsapp-link-{instance}.json"


def write(paths: Paths, instance: str, kind: str, code: str) -> None:
    """``kind``: qr (the text to draw as a QR code) or pair (the code to type on the phone). The terminal shows
    the code anyway: a copy that cannot be written only leaves the dashboard without it."""
    path = _file(paths, instance)
    if path is not None:
        try:
            write_private_file(path, json.dumps({"kind": kind, "code": code, "at": time.time()}).encode())
        except OSError:
            pass


def clear(paths: Paths, instance: str) -> None:
    path = _file(paths, instance)
    if path is not None:
        path.unlink(missing_ok=True)


def read(paths: Paths, instance: str) -> dict | None:
    """{"kind", "code", "at"} of a link running now; None when none is."""
    path = _file(paths, instance)
    try:
        data = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or time.time() - float(data.get("at", 0)) > STALE_S:
        return None
    return data


def svg(code: str) -> str | None:
    """The QR code as SVG text (segno, installed with linked mode); None without segno."""
    try:
        import io

        import segno
    except ImportError:
        return None
    out = io.BytesIO()
    segno.make_qr(code).save(out, kind="svg", scale=6, border=4, dark="#000000", light="#ffffff")
    return out.getvalue().decode()

"""The dashboard's first-run setup link: `starling init` makes a one-time token (data/.dashboard-setup, 0600)
and prints the link; the dashboard's /setup page takes it once to create the first admin account (the
writer refuses it when any account exists), then the file is gone."""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path

from common.config import Config
from common.home import Paths, write_private_file

FILE = ".dashboard-setup"


def _file(paths: Paths) -> Path:
    return paths.data_dir / FILE


def create(paths: Paths) -> str:
    """A new one-time token (any earlier one stops working)."""
    token = secrets.token_urlsafe(24)
    write_private_file(_file(paths), token.encode() + b"\n")
    return token


def link(paths: Paths, cfg: Config) -> str:
    base = cfg.control.public_url.rstrip("/") if cfg.control.public_url else f"http://{cfg.control.listen}"
    return f"{base}/setup?token={create(paths)}"


def valid(paths: Paths, token: str) -> bool:
    try:
        expected = _file(paths).read_text().strip()
    except OSError:
        return False
    return bool(token) and bool(expected) and hmac.compare_digest(token.encode(), expected.encode())


def used(paths: Paths) -> None:
    _file(paths).unlink(missing_ok=True)

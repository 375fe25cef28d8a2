"""Secret values by name: the environment first, then data/secrets.json; values never leave here in text."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

import msgspec

from common.config import SECRET_NAME_PATTERN, Config, referenced_secrets
from common.errors import MissingSecret, StarlingError
from common.home import Paths, ensure_token_file, write_private_file
from common.redact import register_secret, register_secrets, watch_file

_NAME = re.compile(SECRET_NAME_PATTERN)
_decoder = msgspec.json.Decoder(dict[str, str])

Source = Literal["env", "file", "missing"]


@dataclass(frozen=True)
class SecretInfo:
    name: str
    source: Source  # where resolve_secret would find it; env wins over file


def env_names(name: str) -> tuple[str, str]:
    """The two env vars that hold a secret: telegram-main -> TELEGRAM_MAIN, STARLING_SECRET_TELEGRAM_MAIN."""
    plain = name.upper().replace("-", "_").replace(".", "_")
    return plain, f"STARLING_SECRET_{plain}"


def _from_env(name: str) -> str | None:
    for var in env_names(name):
        if value := os.environ.get(var):
            return value
    return None


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise StarlingError(
            f"invalid secret name {name!r}: expected 1-64 characters of A-Z a-z 0-9 _ . -, "
            "starting with a letter or digit"
        )


def _read(secrets_file: Path) -> dict[str, str]:
    try:
        data = Path(secrets_file).read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise StarlingError(f"{secrets_file}: cannot read: {e.strerror}") from None
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError:
        reason = "expected a JSON object mapping names to string values"
    except msgspec.DecodeError:
        reason = "not valid JSON"
    # The decoder's own message could quote the file; this one never does.
    raise StarlingError(f"{secrets_file}: corrupt secrets file: {reason}")


def _write(secrets_file: Path, values: dict[str, str]) -> None:
    ordered = dict(sorted(values.items()))
    write_private_file(Path(secrets_file), msgspec.json.format(msgspec.json.encode(ordered)) + b"\n")


def resolve_secret(name: str, secrets_file: Path, *, key: str | None = None) -> str:
    """The value of secret `name`; registers it for log redaction. Raises MissingSecret."""
    value = _from_env(name) or _read(secrets_file).get(name)
    if not value:
        raise MissingSecret(name, key)
    register_secret(value)
    return value


def list_secret_names(secrets_file: Path) -> list[str]:
    """The names stored in secrets.json, sorted."""
    return sorted(_read(secrets_file))


def list_secrets(secrets_file: Path, names: Iterable[str] = ()) -> list[SecretInfo]:
    """Where each stored name and each of `names` (e.g. those config refers to) would resolve."""
    stored = _read(secrets_file)
    out = []
    for name in sorted(set(stored) | set(names)):
        source: Source = "env" if _from_env(name) else "file" if stored.get(name) else "missing"
        out.append(SecretInfo(name, source))
    return out


def set_secret(secrets_file: Path, name: str, value: str) -> None:
    """Store value under name in secrets.json (atomic, 0600)."""
    _check_name(name)
    if not value:
        raise StarlingError(f"secret {name!r}: refusing to store an empty value")
    register_secret(value)
    values = _read(secrets_file)
    values[name] = value
    _write(secrets_file, values)


def remove_secret(secrets_file: Path, name: str) -> bool:
    """Delete name from secrets.json; False when it was not there."""
    values = _read(secrets_file)
    if values.pop(name, None) is None:
        return False
    _write(secrets_file, values)
    return True


def _file_values(data: bytes) -> list[str]:
    return list(_decoder.decode(data).values())


def _token_value(data: bytes) -> list[str]:
    return [data.decode("utf-8", "replace").strip()]


def register_known_secrets(paths: Paths, cfg: Config) -> None:
    """Make every secret value Starling knows redacted in this process, resolved or not: each value in
    secrets.json, the environment's values for every name config.toml uses (and any $STARLING_SECRET_*),
    the session secret and the control token. The files are watched: a value stored later (`starling
    secret set`, a token file made by another process) is redacted from the next look on (common.redact)."""
    values = [os.environ.get(var, "") for name in referenced_secrets(cfg) for var in env_names(name)]
    values += [v for var, v in os.environ.items() if var.startswith("STARLING_SECRET_")]
    values.append(os.environ.get("SESSION_SECRET", ""))
    register_secrets(v for v in values if v)
    watch_file(paths.secrets_file, _file_values)
    watch_file(paths.session_secret_file, _token_value)
    watch_file(paths.control_token_file, _token_value)


def session_secret(paths: Paths) -> bytes:
    """The key that signs dashboard sessions: $SESSION_SECRET, else data/.session-secret (made once)."""
    if env := os.environ.get("SESSION_SECRET"):
        value = env.encode()
    else:
        value = ensure_token_file(paths.session_secret_file)
    register_secret(value.decode("utf-8", "replace"))
    return value

"""Dashboard accounts' rules, one place for the CLI, the dashboard and the writer: names, roles, password
rules and their messages, and argon2id hashing (argon2-cffi, imported at the first hash or check)."""

from __future__ import annotations

import re

from common.errors import InvalidInput

ROLES = ("admin", "viewer")  # admin: everything; viewer: every page, no change
MIN_PASSWORD = 12
MAX_PASSWORD = 1024
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,31}$")
HASH_PREFIX = "$argon2id$"
_hasher = None


def check_username(name: str) -> str:
    name = (name or "").strip()
    if not _NAME.match(name):
        # the text typed is not repeated: it may be a password typed into the wrong field
        raise InvalidInput("an account name is 1-32 characters of a-z 0-9 _ . -, starting with a letter or digit")
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise InvalidInput(f"the role must be admin or viewer, not {role!r}")
    return role


def check_password(password: str, username: str = "") -> str:
    if len(password) < MIN_PASSWORD:
        raise InvalidInput(f"the password must have at least {MIN_PASSWORD} characters")
    if len(password) > MAX_PASSWORD:
        raise InvalidInput(f"the password must have at most {MAX_PASSWORD} characters")
    if username and password.strip().casefold() == username.casefold():
        raise InvalidInput("the password must not be the account's name")
    return password


def _argon2():
    global _hasher
    if _hasher is None:
        from argon2 import PasswordHasher, Type

        # OWASP's argon2id floor (19 MiB, 2 passes, 1 lane): about 0.1 s on 2 cores, and a login never
        # holds more than a lane while the service goes on
        _hasher = PasswordHasher(time_cost=2, memory_cost=19456, parallelism=1, type=Type.ID)
    return _hasher


def hash_password(password: str) -> str:
    return _argon2().hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    """Whether ``password`` matches; False for a malformed or empty hash, never an exception."""
    from argon2.exceptions import Argon2Error, InvalidHashError

    try:
        return bool(password_hash) and _argon2().verify(password_hash, password)
    except (Argon2Error, InvalidHashError, ValueError):
        return False


def is_hash(text: str) -> bool:
    return text.startswith(HASH_PREFIX) and len(text) < 512


DUMMY_PASSWORD = "not a password of anyone's"


def dummy_hash() -> str:
    """A hash to check unknown names against, so a wrong name takes as long as a wrong password."""
    global _dummy
    try:
        return _dummy
    except NameError:
        _dummy = hash_password(DUMMY_PASSWORD)
        return _dummy

"""Starling's one vocabulary of exceptions, shared by every process and the CLI."""

from __future__ import annotations

from pathlib import Path


class StarlingError(Exception):
    """Base of every error Starling raises on purpose; its message is safe to show an operator."""


class ConfigError(StarlingError):
    """config.toml is missing, malformed or invalid: names the file, the dotted key and the reason."""

    def __init__(self, file: Path | str, key: str, reason: str) -> None:
        self.file = file
        self.key = key
        self.reason = reason
        super().__init__(f"{file}: {key}: {reason}")


class MissingSecret(StarlingError):
    """A secret name resolved to nothing; the message says how to set it and never holds a value."""

    def __init__(self, name: str, key: str | None = None) -> None:
        # Imported here so that errors.py stays a leaf module.
        from common.secrets import env_names

        self.name = name
        self.key = key
        plain, prefixed = env_names(name)
        where = f" (referenced by config key {key})" if key else ""
        super().__init__(
            f"secret {name!r} is not set{where}; set env {plain} or {prefixed}, "
            f"or run `starling secret set {name} --value-stdin`"
        )


class SchemaTooNew(StarlingError):
    """The database was migrated by a newer Starling than this one: refuse rather than guess."""

    def __init__(self, db_file: Path | str, found: int, known: int) -> None:
        self.found = found
        self.known = known
        super().__init__(
            f"{db_file}: schema version {found} is newer than this Starling knows ({known});"
            " upgrade Starling, or restore a backup made by this version"
        )


class DatabaseUnusable(StarlingError):
    """The database file is damaged or is not a SQLite database: the writer will not start on it. The
    message names the file, what is wrong and the way out."""

    def __init__(self, db_file: Path | str, problem: str) -> None:
        self.db_file = db_file
        self.problem = problem
        super().__init__(
            f"{db_file}: {problem}; Starling will not start on it. Stop Starling (`starling down`), then restore"
            " a backup (`starling backup list`, then `starling backup restore PATH --force`), or move the file"
            " aside with its -wal and -shm files to start with an empty database"
        )


class SchemaNotReady(StarlingError):
    """The database is missing or not yet migrated to this code's version."""

    def __init__(self, db_file: Path | str, reason: str) -> None:
        super().__init__(f"{db_file}: {reason}")


class BusTimeout(StarlingError):
    """No ack came from the writer in time: the write may or may not have been committed."""


# Codes of an error ack that are the writer's condition, not the request's: the data disk is full, an I/O
# error, the database busy. Nothing of the request was stored; the same request may succeed later.
WRITER_CONDITIONS = frozenset({"disk_full", "io_error", "busy"})
# Codes that judge the request itself (it fails validation, or cannot travel): sent again, it fails again.
REQUEST_REFUSALS = frozenset({"invalid", "too_large"})


class WriteRejected(StarlingError):
    """The writer refused a request; ``code`` is invalid | not_found | lease_lost | conflict | internal
    | too_large (over the bus's frame limit), or one of WRITER_CONDITIONS: disk_full | io_error | busy."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"{code}: {message}")

    @property
    def writer_condition(self) -> bool:
        """The writer could not store it for a reason of its own: wait and send it again."""
        return self.code in WRITER_CONDITIONS


class InvalidInput(StarlingError):
    """A value a person or an agent gave (a cron expression, a time zone, a time) is not valid; the
    message names the value and what is expected."""

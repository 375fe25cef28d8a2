"""Turning msgspec's validation errors on config.toml into a dotted key and a reason an operator can act on."""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any, Literal

import msgspec

from common.config import ID_PATTERN, SECRET_NAME_PATTERN, Config, _FieldError

_AT = re.compile(r"^(?P<msg>.*?)(?: - at (?P<in_key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.DOTALL)
_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_DICT_KEY = object()  # stands for msgspec's `[...]`, a dict key it does not print
_PATTERN_HELP = {
    ID_PATTERN: "an id: 1-32 characters of a-z 0-9 _ -, starting with a letter or digit",
    SECRET_NAME_PATTERN: "a secret's name (1-64 characters of A-Z a-z 0-9 _ . -), not its value",
}


def explain(err: msgspec.ValidationError, raw: dict[str, Any]) -> tuple[str, str]:
    """Turn msgspec's message and `$.a.b[0]` path into a dotted key and an operator's reason."""
    match = _AT.match(str(err))
    assert match is not None
    msg, segments = match["msg"], _parse_path(match["path"] or "")
    if match["in_key"]:
        segments.append(_DICT_KEY)
    if _DICT_KEY in segments:
        segments = _name_dict_keys(segments, raw)
    cause = err.__cause__
    if isinstance(cause, _FieldError):
        return _render(segments + _parse_path("." + cause.field_name)), cause.reason
    if m := re.match(r"Object contains unknown field `(.*)`$", msg):
        allowed = _struct_fields(_type_at(segments))
        hint = f"; expected one of: {', '.join(allowed)}" if allowed else ""
        return _render([*segments, m[1]]), f"unknown key{hint}"
    if m := re.match(r"Object missing required field `(.*)`$", msg):
        return _render([*segments, m[1]]), "required key is missing"
    if m := re.match(r"Invalid enum value (.*)$", msg):
        target = _type_at(segments)
        if typing.get_origin(target) is Literal:
            choices = " | ".join(f'"{v}"' for v in typing.get_args(target))
            return _render(segments), f"expected one of {choices}, got {m[1]}"
    for pattern, help_text in _PATTERN_HELP.items():
        if msg.startswith("Expected `str` matching regex") and pattern in msg:
            # Never echo a value that failed the secret-name pattern: it may be the secret itself.
            value = segments[-1] if match["in_key"] else _value_at(raw, segments)
            got = "" if pattern == SECRET_NAME_PATTERN else f", got {value!r}"
            return _render(segments), f"expected {help_text}{got}"
    if re.match(r"Expected `(int|float)` [<>]=? ", msg):
        return _render(segments), f"e{msg[1:]}, got {_value_at(raw, segments)!r}"
    return _render(segments), msg[:1].lower() + msg[1:]


def _parse_path(path: str) -> list[Any]:
    segments: list[Any] = []
    for name, index in _SEGMENT.findall(path):
        if name:
            segments.append(name)
        elif index == "...":
            segments.append(_DICT_KEY)
        else:
            segments.append(int(index))
    return segments


def _render(segments: list[Any]) -> str:
    out = ""
    for seg in segments:
        out += f"[{seg}]" if isinstance(seg, int) else (f".{seg}" if out else str(seg))
    return out or "-"


def _strip(tp: Any) -> Any:
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _type_at(segments: list[Any]) -> Any:
    """The annotated type of the config value at `segments`, or None when the walk gets lost."""
    tp: Any = Config
    for seg in segments:
        tp = _strip(tp)
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            tp = typing.get_type_hints(tp, include_extras=True).get(seg)
        elif typing.get_origin(tp) is list and isinstance(seg, int):
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    return _strip(tp)


def _struct_fields(tp: Any) -> tuple[str, ...]:
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp.__struct_fields__
    return ()


def _name_dict_keys(segments: list[Any], raw: Any) -> list[Any]:
    """Replace each `[...]` with the dict key whose value fails validation (the first, as msgspec)."""
    named: list[Any] = []
    for seg in segments:
        if seg is _DICT_KEY and isinstance(raw, dict):
            key_type, value_type = typing.get_args(_type_at(named))
            for key, value in raw.items():
                try:
                    msgspec.convert(key, key_type)
                    msgspec.convert(value, value_type)
                except msgspec.ValidationError:
                    seg = key
                    break
        named.append(seg)
        raw = _child(raw, seg)
    return named


def _value_at(raw: Any, segments: list[Any]) -> Any:
    for seg in segments:
        raw = _child(raw, seg)
    return raw


def _child(raw: Any, seg: Any) -> Any:
    if isinstance(raw, dict) and seg in raw:
        return raw[seg]
    if isinstance(raw, list) and isinstance(seg, int) and seg < len(raw):
        return raw[seg]
    return None



"""What every wire message shares: the tagged, frozen base and the integer SQLite can store."""

from __future__ import annotations

from typing import Annotated

import msgspec

# SQLite stores 64-bit signed integers: a larger one is refused when decoded, not when bound.
Int = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class Msg(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """Base of every wire message: tagged by class name, immutable."""

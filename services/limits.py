"""The bounds every pipeline applies to what a caller hands it, before any work."""

from __future__ import annotations

from errors import InputTooLong, InvalidInput

MAX_TEXT_CHARS = 200_000
MAX_QUESTION_CHARS = 4_000
MAX_K = 16


def bounded(name: str, text: str, limit: int) -> str:
    """`text` itself when it is non-empty plain text of at most `limit` characters."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(f"{name} is empty")
    if len(text) > limit:
        raise InputTooLong(f"{name} is {len(text):,} characters; the limit is {limit:,}")
    if "\x00" in text:
        raise InvalidInput(f"{name} contains NUL bytes; send plain text")
    return text

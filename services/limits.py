"""The bounds every pipeline applies to what a caller hands it, before any work."""

from __future__ import annotations

import re

import settings
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


MAX_NEW_TOKENS = 512  # any caller: decode steps of one answer
ANON_SOLVE_ATTEMPTS = 8  # without the admin token: attempts of one solve, each its own model turn of one chat
ANSWERS_FIRST_S = 2.0  # an exactness-report sample waits at most this long for decoding answers to finish
MAX_SEED = 2**31 - 1  # a solve's first sampling seed (the attempts use seed, seed + 1, ...)
MAX_REPORT_SAMPLES = 1000
ANON_REPORT_SAMPLES = 5  # without the admin token: samples of one exactness report, each its own model turn
ANON_REPORT_STEPS = 2  # without the admin token: greedy steps compared per sample (admins: 4)
ANON_REPORT_TOKENS = 256  # without the admin token: only artifacts whose chain holds at most this many tokens
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}")


def anon_max_new_tokens() -> int:
    """KVGRAFT_ANON_NEW_TOKENS: decode steps of one answer without the admin token, the no-graft comparison included
    (default 32, a public demo's; a deployment that serves an eval harness anonymously raises it, up to
    MAX_NEW_TOKENS)."""
    return settings.get("KVGRAFT_ANON_NEW_TOKENS")


def anon_prompt_tokens() -> int:
    """KVGRAFT_ANON_PROMPT_TOKENS: prompt tokens one question may take without the admin token (default 256,
    a chat's question; the admin's are bounded only by the model's context)."""
    return settings.get("KVGRAFT_ANON_PROMPT_TOKENS")


def prompt_bounded(n: int, limit: int | None) -> None:
    """InputTooLong when a question's `n` prompt tokens pass `limit` (None: no limit but the model's)."""
    if limit is not None and n > limit:
        raise InputTooLong(
            f"the question is {n:,} prompt tokens; the limit without the admin token is {limit:,}: shorten it, "
            "or give the admin token"
        )


WARM_PROOFS_ENV = "KVGRAFT_WARM_PROOFS"
DEFAULT_WARM_PROOFS = 64  # newest artifacts a serving process proves after start-up, ~0.2-0.5 s each on 2 cores


def warm_proofs_limit() -> int:
    """How many of the newest artifacts a serving process (the web app, a replica) probe-proves once it is up,
    before a question needs them: KVGRAFT_WARM_PROOFS, default 64; 0 turns it off."""
    return settings.get(WARM_PROOFS_ENV, default=DEFAULT_WARM_PROOFS)


DECODE_TOGETHER_ENV = "KVGRAFT_DECODE_TOGETHER"
DEFAULT_DECODE_TOGETHER = 8  # the widest padded column count graft_core.batch checks


def decode_together() -> int:
    """How many answers a process with its own model runs at once, their prompts and decode steps taken together
    (graft_core.batch; same bytes as alone): KVGRAFT_DECODE_TOGETHER, default 8; 1 runs one answer at a time."""
    return settings.get(DECODE_TOGETHER_ENV, default=DEFAULT_DECODE_TOGETHER)


def report_bounds(admin: bool) -> dict:
    """`exactness_report` keyword bounds for a caller: none for the admin; without the token a sample costs about
    one short chat (ANON_REPORT_STEPS compared steps, chains of at most ANON_REPORT_TOKENS, no monolithic run)."""
    return {} if admin else {"decode_steps": ANON_REPORT_STEPS, "monolithic": False, "max_tokens": ANON_REPORT_TOKENS}


def whole(name: str, value: object, low: int, high: int) -> int:
    """`value` as an int in [low, high]: an int, an integral float or a canonical decimal string (no sign,
    spaces, `_` or leading zeros); InvalidInput naming the field and the bounds otherwise."""
    n = None
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        n = int(value)
    elif isinstance(value, str) and _DECIMAL.fullmatch(value):
        n = int(value)
    if n is None:
        raise InvalidInput(f"{name} must be a whole number between {low:,} and {high:,}, got {str(value)[:40]!r}")
    if not low <= n <= high:
        shown = f"{n:,}" if abs(n) < 10**30 else f"a number of {len(str(abs(n)))} digits"
        raise InvalidInput(f"{name} must be between {low:,} and {high:,}, got {shown}")
    return n

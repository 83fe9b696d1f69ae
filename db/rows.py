"""The values that cross the catalog's boundary: frozen dataclasses, one per kind of row.

They know nothing about SQL; the mappers at the end read one back from a fetched row (whose tuples
are stored as JSON). Each checks its enumerated fields on construction and raises
`InvalidInput` naming the field; numeric invariants (tokens > 0, end = start + tokens) are the
database's CHECK constraints. Timestamps are timezone-aware UTC; a naive datetime is taken as UTC.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from errors import InvalidInput

KINDS = ("verified", "text", "attested")
VERIFIERS = ("exact", "numeric", "sympy", "attested", "none")
VERDICTS = ("pass", "refused")
TIERS = ("exact", "relocated", "none")
# Where a verification's verdict comes from. Only "verified" (the gate ran here: graft, generate, verifier)
# counts as verified; "not gated" marks rows recorded before the behavioural gate existed.
PROVENANCES = ("verified", "imported, not re-verified", "attested", "not gated")

HEX64 = re.compile(r"^[0-9a-f]{64}$")


LEDGER_QUERY_CHARS = 500  # characters of a question the ledger keeps; anonymous text is not stored whole


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(when: datetime) -> datetime:
    """Aware UTC datetime; naive input is taken to be UTC already (SQLite hands those back)."""
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InvalidInput(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def _hex64(name: str, value: str) -> None:
    if not HEX64.match(value):
        raise InvalidInput(f"{name} must be 64 lowercase hex digits (a SHA-256); got {value!r}")


@dataclass(frozen=True)
class ArtifactRow:
    """One deposited artifact. `content_sha256` may be "" going in: `add_deposit` takes it from the
    blob writer. `root_id` and `depth` are derived from `parent_id` by the catalog (a root is its own
    root at depth 0); values passed in are replaced."""

    id: str
    content_sha256: str
    model_fingerprint: str
    tokens: int
    start: int
    kind: str
    title: str = ""
    parent_id: str | None = None
    bytes: int = 0
    root_id: str = ""
    depth: int = 0
    created_at: datetime = field(default_factory=utcnow)
    probe_sha256: str | None = None  # the probe logits hash recorded at deposit (None: before m003)
    quarantine: str | None = None  # why the artifact is never grafted (None: usable)
    origin: str | None = None  # None: deposited here; "imported" or "rebuilt: ..." (db.migrations.m005)

    def __post_init__(self) -> None:
        _hex64("artifact id", self.id)
        if self.probe_sha256 is not None:
            _hex64("probe_sha256", self.probe_sha256)
        if self.content_sha256:
            _hex64("content_sha256", self.content_sha256)
        if self.parent_id is not None:
            _hex64("parent_id", self.parent_id)
        _one_of("kind", self.kind, KINDS)
        object.__setattr__(self, "created_at", as_utc(self.created_at))

    @property
    def end_pos(self) -> int:
        """First position after this artifact's own tokens: where a child or a query continues."""
        return self.start + self.tokens


@dataclass(frozen=True)
class SourceRow:
    """The exact text that was deposited; question/solution/answer are None for free text."""

    artifact_id: str
    text: str
    question: str | None = None
    solution: str | None = None
    answer: str | None = None


@dataclass(frozen=True)
class VerificationRow:
    """One verifier run. A refused item has no artifact (`artifact_id` None). `id` is assigned by
    the catalog. A gated row also records what the model was asked (`question_token_ids`) and what
    it generated with the graft (`generated_token_ids`, cut to `generated_answer` for the verifier),
    each with its SHA-256, so that the run can be replayed and compared token for token."""

    artifact_id: str | None
    item_sha256: str
    verifier: str
    verdict: str
    reference: str | None = None
    detail: str = ""
    created_at: datetime = field(default_factory=utcnow)
    id: int | None = None
    question_token_ids: tuple[int, ...] = ()
    question_sha256: str | None = None
    generated_token_ids: tuple[int, ...] = ()
    generated_sha256: str | None = None
    generated_answer: str | None = None
    provenance: str = "not gated"

    def __post_init__(self) -> None:
        _one_of("verifier", self.verifier, VERIFIERS)
        _one_of("verdict", self.verdict, VERDICTS)
        _one_of("provenance", self.provenance, PROVENANCES)
        for name in ("question_sha256", "generated_sha256"):
            if getattr(self, name) is not None:
                _hex64(name, getattr(self, name))
        object.__setattr__(self, "question_token_ids", tuple(int(t) for t in self.question_token_ids or ()))
        object.__setattr__(self, "generated_token_ids", tuple(int(t) for t in self.generated_token_ids or ()))
        object.__setattr__(self, "created_at", as_utc(self.created_at))

    @property
    def counts_as_verified(self) -> bool:
        """True only for a passing gate run made in this store whose recorded token ids still hash to
        their recorded SHA-256 (an edited row is not verified, whatever its verdict column says)."""
        return (
            self.verdict == "pass"
            and self.provenance == "verified"
            and bool(self.generated_token_ids)
            and self.generated_sha256 == token_ids_sha256(self.generated_token_ids)
            and self.question_sha256 == token_ids_sha256(self.question_token_ids)
        )

    @property
    def label(self) -> str:
        """What a front end shows: 'verified', 'attested', 'imported, not re-verified', 'refused' or
        'not verified' (a row that claims a pass its record does not support)."""
        if self.verdict == "refused":
            return "refused"
        if self.provenance in ("attested", "imported, not re-verified"):
            return self.provenance
        return "verified" if self.counts_as_verified else "not verified"


def token_ids_sha256(ids) -> str:
    """SHA-256 of token ids as int64 little-endian (the same bytes as the ledger's output_sha256)."""
    return hashlib.sha256(b"".join(int(i).to_bytes(8, "little", signed=True) for i in ids)).hexdigest()


@dataclass(frozen=True)
class LedgerRow:
    """One answered query with its hashes and token/second/FLOP accounting. `baseline_tokens` is
    what a no-graft run needs for the same context: prefix + prompt prefill, plus the baseline's own
    decode tokens when `baseline_measured`. `exact` is None when no exactness check ran.

    As stored, `query` holds at most LEDGER_QUERY_CHARS characters of the question, `query_sha256`
    the SHA-256 of the whole question (UTF-8) and `query_chars` its length (None on rows written
    before m002_ledger_bounds)."""

    query_sha256: str
    query: str
    prompt_sha256: str
    artifact_ids: tuple[str, ...]
    tier: str
    model_fingerprint: str
    output_token_ids: tuple[int, ...]
    output_sha256: str
    grafted_tokens: int
    computed_tokens: int
    decode_tokens: int
    baseline_tokens: int
    baseline_measured: bool
    ttft_s: float
    total_s: float
    flops: int
    baseline_flops: int
    logits_sha256: str | None = None
    baseline_ttft_s: float | None = None
    exact: bool | None = None
    check_json: str | None = None
    query_chars: int | None = None  # the full question's length; the catalog stores `query` cut to LEDGER_QUERY_CHARS
    created_at: datetime = field(default_factory=utcnow)
    id: int | None = None

    def __post_init__(self) -> None:
        _one_of("tier", self.tier, TIERS)
        object.__setattr__(self, "artifact_ids", tuple(self.artifact_ids))
        object.__setattr__(self, "output_token_ids", tuple(int(t) for t in self.output_token_ids))
        object.__setattr__(self, "created_at", as_utc(self.created_at))


@dataclass(frozen=True)
class LedgerTotals:
    """Sums over the whole ledger.

    tokens_saved = sum of (baseline_tokens - computed_tokens - decode_tokens) over rows whose baseline
    was measured (its decode is in baseline_tokens) plus (baseline_tokens - computed_tokens) over rows
    whose baseline is the prefill-only count (the same decode on both sides cancels). It is the
    number of token forward passes the grafted answers did not have to run.
    checks_passed / checks_failed count rows whose exactness check ran (`exact` True / False).
    """

    answers: int
    grafted_tokens: int
    computed_tokens: int
    decode_tokens: int
    baseline_tokens: int
    tokens_saved: int
    flops: int
    baseline_flops: int
    checks_passed: int
    checks_failed: int


# ---- read back: a table row (attribute access, or a column mapping) -> its frozen value ----


def artifact_row(m: Any) -> ArtifactRow:
    return ArtifactRow(
        id=m.id,
        content_sha256=m.content_sha256,
        model_fingerprint=m.model_fingerprint,
        tokens=m.tokens,
        start=m.start,
        kind=m.kind,
        title=m.title,
        parent_id=m.parent_id,
        bytes=m.bytes,
        root_id=m.root_id,
        depth=m.depth,
        created_at=m.created_at,
        probe_sha256=m.probe_sha256,
        quarantine=m.quarantine,
        origin=m._mapping.get("origin"),
    )


def verification_row(values: dict[str, Any]) -> VerificationRow:
    values = dict(values)
    for k in ("question_token_ids", "generated_token_ids"):
        values[k] = tuple(json.loads(values[k])) if values[k] else ()
    values["provenance"] = values["provenance"] or "not gated"
    return VerificationRow(**values)


def ledger_row(m: Any) -> LedgerRow:
    values = dict(m._mapping)
    values["artifact_ids"] = tuple(json.loads(values["artifact_ids"]))
    values["output_token_ids"] = tuple(json.loads(values["output_token_ids"]))
    return LedgerRow(**values)

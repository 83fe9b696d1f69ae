"""Ledger replay: re-run recorded answers (a sampled one with its recorded seed) and compare their output and logits hashes byte for byte.

Each function takes a `Library` and returns a frozen report with `to_json()`; it formats nothing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from errors import ArtifactNotFound, InvalidInput, KvgraftError

if TYPE_CHECKING:
    from .library import Library


@dataclass(frozen=True)
class ReplayEntry:
    ledger_id: int | None
    tier: str
    artifact_ids: tuple[str, ...]
    max_new_tokens: int
    raw: bool | None
    output_equal: bool
    logits_equal: bool
    recorded_output_sha256: str
    replayed_output_sha256: str | None
    recorded_logits_sha256: str | None
    replayed_logits_sha256: str | None
    ok: bool
    error: str = ""


@dataclass(frozen=True)
class ReplayReport:
    entries: tuple[ReplayEntry, ...]
    replayed: int
    matched: int
    mismatched: int
    ok: bool

    def to_json(self) -> dict:
        return asdict(self)


def _sampling(check_json: str | None):
    """The seeded sampling an answer was drawn with (its ledger record's "sampling"), None for a greedy one."""
    record = json.loads(check_json) if check_json else {}
    if not isinstance(record, dict) or not record.get("sampling"):
        return None
    from graft_core.sampling import Sampling

    s = record["sampling"]
    return Sampling(temperature=float(s["temperature"]), seed=int(s["seed"]), top_p=float(s["top_p"]))


def _replay_one(lib: Library, row) -> ReplayEntry:
    from graft_core import generate  # the engine loads at the first replay, not with the web page

    lm = lib.lm
    base = dict(
        ledger_id=row.id,
        tier=row.tier,
        artifact_ids=row.artifact_ids,
        max_new_tokens=max(1, len(row.output_token_ids)),
        recorded_output_sha256=row.output_sha256,
        recorded_logits_sha256=row.logits_sha256,
    )

    def failed(error: str, raw: bool | None = None) -> ReplayEntry:
        return ReplayEntry(
            **base,
            raw=raw,
            output_equal=False,
            logits_equal=False,
            replayed_output_sha256=None,
            replayed_logits_sha256=None,
            ok=False,
            error=error,
        )

    if row.model_fingerprint != lm.fingerprint:
        return failed(
            f"recorded with model {row.model_fingerprint[:16]}, this model is {lm.fingerprint[:16]}; replay with --model"
        )
    grafted = row.tier != "none" and bool(row.artifact_ids)
    raw = next(
        (
            r
            for r in (False, True)
            if generate.tokens_sha256(generate.encode_prompt(lm, row.query, grafted, raw=r)) == row.prompt_sha256
        ),
        None,
    )
    if raw is None:
        return failed("the query no longer encodes to the recorded prompt (prompt_sha256 differs)")
    try:
        with lib.store.lock:
            chain = [lib.load_artifact(i) for i in row.artifact_ids] if grafted else []
            ans = generate.answer(
                lm,
                chain,
                row.query,
                max_new_tokens=base["max_new_tokens"],
                raw=raw,
                relocated=row.tier == "relocated",
                sampling=_sampling(row.check_json),
            )
    except KvgraftError as e:
        return failed(f"{type(e).__name__}: {e}", raw)
    out_eq = ans.output_sha256 == row.output_sha256
    log_eq = row.logits_sha256 is not None and ans.logits_sha256 == row.logits_sha256
    return ReplayEntry(
        **base,
        raw=raw,
        output_equal=out_eq,
        logits_equal=log_eq,
        replayed_output_sha256=ans.output_sha256,
        replayed_logits_sha256=ans.logits_sha256,
        ok=out_eq and log_eq,
        error="" if row.logits_sha256 is not None else "no logits_sha256 was recorded",
    )


def replay_ledger(lib: Library, last: int | None = None) -> ReplayReport:
    """Re-run ledger entries (the newest `last`, oldest first) and compare output and logits hashes."""
    if last is not None and last < 1:
        raise InvalidInput(f"--last must be at least 1, got {last}")
    rows = lib.store.catalog.ledger(last=last)
    if not rows:
        raise ArtifactNotFound("the ledger is empty: nothing to replay (answer a question first with `cli.py ask`)")
    entries = tuple(_replay_one(lib, r) for r in rows)
    matched = sum(e.ok for e in entries)
    return ReplayReport(
        entries=entries, replayed=len(entries), matched=matched, mismatched=len(entries) - matched, ok=matched == len(entries)
    )

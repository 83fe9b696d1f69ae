"""The values the pipelines hand to the front ends (everything `LibraryDoor` returns): frozen dataclasses that carry the engine's and the
catalog's own frozen types, each with one `to_json()` that the CLI, the web API and the UI all use.

No I/O and no computation of figures here beyond what a field's name promises.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, make_dataclass
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING

from db.queries import Listed
from db.rows import ArtifactRow, LedgerRow, LedgerTotals, SourceRow, VerificationRow
from graft_core.model import MACHINE_BOUND  # torch-free at import

if TYPE_CHECKING:  # the engine's types, named only in annotations: torch loads with the model, not with the page
    from graft_core.accounting import TokenSavings
    from graft_core.exactness import ExactnessCheck
    from graft_core.generate import Baseline
    from graft_core.proof import Proof

# The fields of an exactness check that the answer JSON shows (the ledger keeps them all).
_CHECK_FIELDS = (
    "exact",
    "fresh_sha256",
    "grafted_sha256",
    "kl",
    "argmax_agreement",
    "max_abs_diff",
    "monolithic_max_abs_diff",
    "monolithic_kl",
    "monolithic_argmax_agreement",
    "rows",
    "tier",
)
# The fields of a verify sample shown unless every field is asked for (`cli.py verify --rows`).
_SAMPLE_FIELDS = (
    "artifact",
    "query",
    "exact",
    "tier",
    "kl",
    "max_abs_diff",
    "argmax_agreement",
    "fresh_sha256",
    "grafted_sha256",
)


def row_json(row: ArtifactRow) -> dict:
    return {**asdict(row), "created_at": row.created_at.isoformat(), "end_pos": row.end_pos}


def row_from_json(d: dict) -> ArtifactRow:
    """`row_json`'s inverse (`end_pos` is derived, so it is dropped)."""
    names = {f.name for f in fields(ArtifactRow)}
    return ArtifactRow(**{k: v for k, v in d.items() if k in names} | {"created_at": datetime.fromisoformat(d["created_at"])})


@lru_cache(maxsize=64)  # a few shapes in practice; the bound keeps odd replies from growing it
def _record_type(name: str, keys: tuple[str, ...]) -> type:
    return make_dataclass(name, keys, frozen=True, namespace={"as_dict": lambda self: asdict(self)})


def _record(name: str, d: dict | None, derived: tuple[str, ...] = ()):
    """An engine value (ExactnessCheck, Proof, Baseline) as it came back over HTTP: a frozen dataclass named
    like it, with the fields its JSON carries (lists back to tuples) and `as_dict`, built without importing
    the engine (the front end of a deployment loads no torch). `derived` fields are recomputed, not kept."""
    if d is None:
        return None
    kept = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k not in derived}
    return _record_type(name, tuple(kept))(**kept)


@dataclass(frozen=True)
class Deposited:
    id: str
    content_sha256: str
    tokens: int
    start: int
    bytes: int
    prefill_s: float
    kind: str
    title: str
    parent: str | None
    verified: bool  # the gate ran here and its record holds (graft, generate, verifier)
    verifier: str
    created: bool  # False when the same deposit already existed (nothing was computed)
    provenance: str = "unverified"  # verified | attested | imported, not re-verified | not verified | unverified
    gate_s: float = 0.0  # seconds the deposit gate took (fact run + graft run); 0 without a gate
    gate_tokens: int = 0  # tokens the gate computed: scratch prefill + prompts + generated tokens
    prefill_tokens: int = 0  # tokens the deposit's own prefill computed (0 when it already existed)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Deposited:
        return cls(**d)


@dataclass(frozen=True)
class Retrieved:
    id: str
    title: str
    score: float
    tokens: int
    kind: str
    verifier: str
    verdict: str
    relevant: bool = True  # the second stage's decision (retrieval/relevance.py); dropped hits are never grafted
    reason: str = ""  # why the second stage kept or dropped the hit (shown in the evidence panel)
    use: str = "fact"  # "fact": it answers the question; "example": a verified worked example of its shape


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability as an answer reports it: its id and text, the value (None for a prompt's first
    token), and the most likely tokens at its position as (id, text, log-probability)."""

    token_id: int
    token: str
    logprob: float | None
    top: tuple[tuple[int, str, float], ...] = ()

    def to_json(self) -> dict:
        return {"token_id": self.token_id, "token": self.token, "logprob": self.logprob, "top": [list(t) for t in self.top]}

    @classmethod
    def from_json(cls, d: dict) -> Logprob:
        return cls(d["token_id"], d["token"], d["logprob"], tuple((int(i), str(s), float(v)) for i, s, v in d["top"]))


@dataclass(frozen=True)
class AnswerResult:
    answer: str
    tier: str
    retrieved: tuple[Retrieved, ...]
    artifact_ids: tuple[str, ...]
    grafted_tokens: int
    computed_tokens: int
    decode_tokens: int
    ttft_s: float
    total_s: float
    read_s: float
    savings: TokenSavings
    check: ExactnessCheck | None
    baseline: Baseline | None  # measured no-graft run, when asked for
    output_sha256: str
    logits_sha256: str
    ledger_id: int | None
    note: str = ""
    output_token_ids: tuple[int, ...] = ()
    proof: Proof | None = None  # the cheap proof of the served state (kind "none" says why none applies)
    machine_bound: bool = False  # the model's record names this machine's kernel path, not a numerical definition
    model: str = ""  # the model that answered (its name as loaded: KVGRAFT_MODEL)
    stopped: str = ""  # why decoding ended: "stop" (the template's end or a stop string), "eos", "length"
    temperature: float = 0.0  # 0: greedy; else the tokens were drawn (seeded) at this temperature
    top_p: float = 1.0
    seed: int | None = None  # the sampling generator's seed (None: greedy)
    output_logprobs: tuple[Logprob, ...] = ()  # when asked (AnswerOptions.logprobs): one per generated token
    prompt_logprobs: tuple[Logprob, ...] = ()  # with echo: one per prompt token, the first without a value
    prompt_token_ids: tuple[int, ...] = ()  # with echo: the prompt's tokens as computed
    prompt_text: str = ""  # with echo: those tokens decoded

    @property
    def scope(self) -> str:
        """What its exactness holds on: "exact on this machine class only" for a machine-bound model, else ""
        (the numerical definition: every machine)."""
        return MACHINE_BOUND if self.machine_bound else ""

    @property
    def ttft_speedup(self) -> float | None:
        """Measured baseline time to first token over ours (None without a measured baseline)."""
        return None if self.baseline is None else self.baseline.ttft_s / max(self.ttft_s, 1e-9)

    def to_json(self) -> dict:
        d = {
            "answer": self.answer,
            "tier": self.tier,
            "retrieved": [asdict(r) for r in self.retrieved],
            "artifact_ids": list(self.artifact_ids),
            "grafted_tokens": self.grafted_tokens,
            "computed_tokens": self.computed_tokens,
            "decode_tokens": self.decode_tokens,
            "ttft_s": self.ttft_s,
            "total_s": self.total_s,
            "read_s": self.read_s,
            "savings": self.savings.as_dict(),
            "check": None if self.check is None else {k: getattr(self.check, k) for k in _CHECK_FIELDS},
            "baseline": None,
            "output_sha256": self.output_sha256,
            "logits_sha256": self.logits_sha256,
            "ledger_id": self.ledger_id,
            "note": self.note,
            "output_token_ids": list(self.output_token_ids),
            "proof": None if self.proof is None else self.proof.as_dict(),
            "machine_bound": self.machine_bound,
            "scope": self.scope,
            "model": self.model,
            "stopped": self.stopped,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
        }
        if self.baseline is not None:
            d["baseline"] = asdict(self.baseline) | {"ttft_speedup": self.ttft_speedup, "measured": True}
        d["output_logprobs"] = [lp.to_json() for lp in self.output_logprobs]  # empty unless asked
        d["prompt_logprobs"] = [lp.to_json() for lp in self.prompt_logprobs]
        d["prompt_token_ids"], d["prompt_text"] = list(self.prompt_token_ids), self.prompt_text
        return d

    @classmethod
    def from_json(cls, d: dict) -> AnswerResult:
        """`to_json`'s inverse (derived fields such as ratios and the speedup are recomputed). The check,
        proof and baseline come back as records with the JSON's fields (see `_record`)."""
        from graft_core.accounting import TokenSavings  # torch-free: a dataclass and arithmetic

        names = {f.name for f in fields(TokenSavings)}
        return cls(
            **{k: d[k] for k in ("answer", "tier", "grafted_tokens", "computed_tokens", "decode_tokens")},
            **{k: d[k] for k in ("ttft_s", "total_s", "read_s", "output_sha256", "logits_sha256", "ledger_id", "note")},
            retrieved=tuple(Retrieved(**r) for r in d["retrieved"]),
            artifact_ids=tuple(d["artifact_ids"]),
            savings=TokenSavings(**{k: v for k, v in d["savings"].items() if k in names}),
            check=_record("ExactnessCheck", d["check"]),
            baseline=_record("Baseline", d["baseline"], derived=("ttft_speedup", "measured")),
            output_token_ids=tuple(d["output_token_ids"]),
            proof=_record("Proof", d["proof"]),
            machine_bound=bool(d.get("machine_bound", False)),
            model=str(d.get("model", "")),
            stopped=d.get("stopped", ""),
            **{k: d[k] for k in ("temperature", "top_p", "seed") if k in d},
            output_logprobs=tuple(Logprob.from_json(x) for x in d.get("output_logprobs", ())),
            prompt_logprobs=tuple(Logprob.from_json(x) for x in d.get("prompt_logprobs", ())),
            prompt_token_ids=tuple(d.get("prompt_token_ids", ())),
            prompt_text=d.get("prompt_text", ""),
        )


@dataclass(frozen=True)
class ExactnessSample:
    artifact: str
    query: str
    check: ExactnessCheck

    def to_json(self, every_field: bool = True) -> dict:
        d = {"artifact": self.artifact, "query": self.query, **self.check.as_dict()}
        return d if every_field else {k: d[k] for k in _SAMPLE_FIELDS}

    @classmethod
    def from_json(cls, d: dict) -> ExactnessSample:
        return cls(
            d["artifact"], d["query"], _record("ExactnessCheck", {k: v for k, v in d.items() if k not in ("artifact", "query")})
        )


@dataclass(frozen=True)
class ExactnessReport:
    samples: int
    byte_equal: int
    max_kl: float
    argmax_agreement: float
    relocate: int | None
    rows: tuple[ExactnessSample, ...] = ()

    def to_json(self, every_field: bool = True) -> dict:
        d = {k: getattr(self, k) for k in ("samples", "byte_equal", "max_kl", "argmax_agreement", "relocate")}
        return d | {"rows": [r.to_json(every_field) for r in self.rows]}

    @classmethod
    def from_json(cls, d: dict) -> ExactnessReport:
        return cls(**{k: v for k, v in d.items() if k != "rows"}, rows=tuple(ExactnessSample.from_json(r) for r in d["rows"]))


@dataclass(frozen=True)
class LibraryEntry:
    """One row of the library table: the artifact and its latest verification."""

    row: ArtifactRow
    verifier: str
    verdict: str

    @classmethod
    def of(cls, listed: Listed) -> LibraryEntry:
        return cls(listed.row, listed.verifier, listed.verdict)

    def to_json(self) -> dict:
        return row_json(self.row) | {"verifier": self.verifier, "verification": self.verdict}

    @classmethod
    def from_json(cls, d: dict) -> LibraryEntry:
        return cls(row_from_json(d), d["verifier"], d["verification"])


@dataclass(frozen=True)
class ShowReport:
    artifact: ArtifactRow
    source: SourceRow
    verifications: tuple[VerificationRow, ...]
    chain: tuple[str, ...]  # root first, this artifact last
    children: tuple[str, ...]
    blob_present: bool

    def to_json(self) -> dict:
        return {
            "artifact": row_json(self.artifact),
            "source": asdict(self.source),
            "verifications": [
                {
                    **asdict(v),
                    "created_at": v.created_at.isoformat(),
                    "label": v.label,
                    "counts_as_verified": v.counts_as_verified,
                }
                for v in self.verifications
            ],
            "verified": bool(self.verifications) and self.verifications[-1].counts_as_verified,
            "provenance": self.verifications[-1].label if self.verifications else "unverified",
            "chain": list(self.chain),
            "children": list(self.children),
            "blob_present": self.blob_present,
        }

    @classmethod
    def from_json(cls, d: dict) -> ShowReport:
        """`to_json`'s inverse (`verified`, `provenance`, each verification's `label` are derived)."""
        names = {f.name for f in fields(VerificationRow)}
        return cls(
            artifact=row_from_json(d["artifact"]),
            source=SourceRow(**d["source"]),
            verifications=tuple(
                VerificationRow(
                    **{k: x for k, x in v.items() if k in names} | {"created_at": datetime.fromisoformat(v["created_at"])}
                )
                for v in d["verifications"]
            ),
            chain=tuple(d["chain"]),
            children=tuple(d["children"]),
            blob_present=d["blob_present"],
        )


@dataclass(frozen=True)
class StoreStats:
    """What the dashboard shows: ledger sums, the latest answers, and the store's size against the window."""

    totals: LedgerTotals
    recent: tuple[LedgerRow, ...]  # oldest first
    store_tokens: int
    artifacts: int
    window: int
    model: str = ""  # the model this store is served by (its name as loaded)
    models: tuple[str, ...] = ()  # every model the store was opened with (db.models: its first name each)

    @property
    def flops_ratio(self) -> float:
        return self.totals.baseline_flops / max(1, self.totals.flops)


@dataclass(frozen=True)
class SolveAttempt:
    """One try of `solve`: from the library (a graft), greedy, or sampled (temperature and seed kept)."""

    mode: str  # "library" | "greedy" | "sampled"
    answer: str
    passed: bool
    detail: str
    tokens: int  # every token this try computed (prompt + decode; grafted tokens are restored, not computed)
    temperature: float = 0.0
    seed: int | None = None
    artifact_ids: tuple[str, ...] = ()
    output_sha256: str = ""

    def to_json(self) -> dict:
        return asdict(self) | {"artifact_ids": list(self.artifact_ids)}


@dataclass(frozen=True)
class Solved:
    """What `solve` found: `source` "library" (recalled, nothing deposited), "model" (discovered and
    deposited through the gate) or "none" (not solved within the budget; every token still counted)."""

    solved: bool
    source: str
    id: str | None
    answer: str
    attempts: tuple[SolveAttempt, ...]
    tokens_spent: int
    budget: int
    deposited: bool = False

    def to_json(self) -> dict:
        return {
            "solved": self.solved,
            "source": self.source,
            "id": self.id,
            "answer": self.answer,
            "attempts": [a.to_json() for a in self.attempts],
            "tokens_spent": self.tokens_spent,
            "budget": self.budget,
        }


@dataclass(frozen=True)
class Flywheel:
    """The dashboard's flywheel, each series bounded (services/solve.py says how many points): the newest
    deposits as (seconds since the epoch, artifacts in the store after it), oldest first; per item found by
    `solve` (id, discovery tokens, mean recall tokens or None, recalls); and the cumulative tokens saved by
    recalls, (time, total) in ledger order."""

    growth: tuple[tuple[float, int], ...]
    items: tuple[tuple[str, int, float | None, int], ...]
    cumulative_saved: tuple[tuple[float, int], ...]

    def to_json(self) -> dict:
        return {
            "growth": [list(x) for x in self.growth],
            "items": [{"id": i, "discovery_tokens": d, "recall_tokens_mean": r, "recalls": n} for i, d, r, n in self.items],
            "cumulative_saved": [list(x) for x in self.cumulative_saved],
        }


@dataclass(frozen=True)
class DeleteReport:
    id: str
    content_sha256: str
    blob_removed: bool  # False while another row still refers to the same bytes

    def to_json(self) -> dict:
        return {"id": self.id, "content_sha256": self.content_sha256, "blob_removed": self.blob_removed}


@dataclass(frozen=True)
class WarmReport:
    """What `Library.warm_proofs` did: probe-proved now, found already proved, passed over (quarantined, another
    model's fingerprint, no probe hash, unreadable: `skipped_why` says which), and quarantined by a failed probe."""

    proved: int
    already: int
    quarantined: tuple[str, ...]
    seconds: float
    skipped_why: tuple[str, ...] = ()

    @property
    def skipped(self) -> int:
        return len(self.skipped_why)

    def line(self) -> str:
        q = (
            f", {len(self.quarantined)} quarantined by a failed probe ({', '.join(i[:12] for i in self.quarantined)})"
            if self.quarantined
            else ""
        )
        return (
            f"probe-proved {self.proved} artifacts ahead of their first answers in {self.seconds:.1f} s "
            f"({self.already} already proved, {self.skipped} passed over{q})"
        )

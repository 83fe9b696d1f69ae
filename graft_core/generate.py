"""Generation after a graft (greedy, or seeded sampling when asked), with token accounting and timing.

`answer()` restores a chain (or nothing), computes only the prompt's tokens, decodes greedily until
the template's end of answer, and reports what was grafted, computed and decoded, the time to first
token and estimated FLOPs both ways, with the per-answer proof of the served state (and, when asked,
the full recomputation of the served rows; graft_core/proof.py). `baseline()` measures the no-graft
run over the same tokens.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from . import templates
from .accounting import TokenSavings, savings
from .artifact import KVArtifact
from .decoding import prompt_and_decode
from .errors import InputTooLong, InvalidInput
from .exactness import ExactnessCheck
from .forward import new_cache
from .graft import restore, restore_relocated
from .logprobs import TokenLogprob, of_prompt, of_rows
from .model import LoadedModel
from .probe import logits_sha256
from .proof import Proof, ProvenState, full_check, no_proof, prove, why_no_proof
from .sampling import Sampling, chooser

MAX_NEW_TOKENS_LIMIT = 1024


@dataclass(frozen=True)
class Answer:
    text: str  # the answer (cut at the template's end of answer unless raw)
    completion: str  # everything decoded
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    tier: str  # "exact" | "relocated" | "none"
    artifact_ids: tuple[str, ...]
    restore_s: float
    prompt_s: float
    ttft_s: float  # read (given) + restore + prompt forward + first token
    total_s: float
    savings: TokenSavings
    output_sha256: str  # sha256 of the generated token ids (int64 little-endian)
    logits_sha256: str  # sha256 of the logits rows that chose each generated token
    stopped: str
    check: ExactnessCheck | None = None  # the full recomputation of the served rows, when asked
    proof: Proof | None = None  # the cheap proof of the served state
    output_logprobs: tuple[TokenLogprob, ...] = ()  # each generated token's, from the row that chose it (when asked)
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # each prompt token's, from the prompt's own rows (echo)

    @property
    def grafted_tokens(self) -> int:
        return self.savings.grafted_tokens

    @property
    def computed_tokens(self) -> int:
        return self.savings.computed_tokens

    @property
    def decode_tokens(self) -> int:
        return self.savings.decode_tokens

    def as_dict(self) -> dict:
        d = asdict(self)
        d["savings"] = self.savings.as_dict()
        d["check"] = self.check.as_dict() if self.check else None
        d["proof"] = self.proof.as_dict() if self.proof else None
        return d


def tokens_sha256(ids) -> str:
    return hashlib.sha256(b"".join(int(i).to_bytes(8, "little", signed=True) for i in ids)).hexdigest()


def encode_prompt(lm: LoadedModel, question: str, grafted: bool, raw: bool = False, form: str = "answer") -> list[int]:
    """Token ids of the prompt chunk for `lm` (templates.encode_prompt with its tokenizer)."""
    return templates.encode_prompt(lm.tokenizer, question, grafted, raw, form)


def _bound(lm: LoadedModel, start: int, prompt: int, max_new_tokens: int, least: int = 1) -> None:
    if not least <= max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        raise InvalidInput(f"max_new_tokens must be between {least} and {MAX_NEW_TOKENS_LIMIT}, got {max_new_tokens}")
    limit = lm.info.max_positions
    if start + prompt + max_new_tokens > limit:
        raise InputTooLong(
            f"{start} grafted + {prompt} prompt + {max_new_tokens} new tokens exceed the model's {limit}-token context; "
            "shorten the question, lower max new tokens or graft fewer artifacts"
        )


def _stopper(lm: LoadedModel, raw: bool, form: str = "answer", stop: tuple[str, ...] = ()) -> Callable[[list[int]], bool] | None:
    """Whether decoding ends after these ids: the template's end of answer (unless raw) or one of `stop`."""
    stop = tuple(s for s in stop if s)
    if raw and not stop:
        return None
    template = templates.of(lm.tokenizer)

    def done(ids: list[int]) -> bool:
        text = lm.tokenizer.decode(ids, skip_special_tokens=True)
        return any(s in text for s in stop) or (not raw and templates.is_answer_complete(text, form, template))

    return done


def _eos(lm: LoadedModel) -> frozenset[int]:
    eos = lm.tokenizer.eos_token_id
    ids = eos if isinstance(eos, list) else [eos]
    return frozenset(i for i in ids if i is not None)


def answer(
    lm: LoadedModel,
    chain: list[KVArtifact],
    question: str,
    max_new_tokens: int = 32,
    raw: bool = False,
    run_check: bool = False,
    read_s: float = 0.0,
    relocated: bool = False,
    on_token: Callable[[int], None] | None = None,
    baseline_decode_tokens: int | None = None,
    probe: bool = True,
    proven: ProvenState | None = None,
    on_proof: Callable[[Proof], None] | None = None,
    steps=None,
    form: str = "answer",
    sampling: Sampling | None = None,
    stop: tuple[str, ...] = (),
    given_ids: list[int] | None = None,
    logprobs: int | None = None,
    echo: bool = False,
) -> Answer:
    """Graft `chain` (own position; or, with `relocated`, independent roots re-rotated), then answer.

    An own-position graft carries the per-answer proof (graft_core/proof.py), made before the prompt
    runs: with `proven` (this process proved the artifact before) the served state's BLAKE3 against it,
    else the probe on a second restore of the chain. `on_proof(proof)` sees it before any token is
    chosen and may raise to refuse the answer. `probe=False` skips the proof (bench/proof.py measures
    its cost). The prompt runs as one chunk either way, so the served bytes do not depend on the proof.
    `steps` (a graft_core.stepgroup.StepGroup) decodes together with concurrent answers: the same bytes.
    `form` is the query form (templates.FORMS): how the question is rendered and where its answer ends.
    `sampling` draws each token (seeded: the same seed, the same tokens) instead of the greedy choice; decoding
    also ends at the first of the `stop` strings, which the text leaves out. `given_ids` is the prompt as token ids
    (raw: used as given, `question` only names it). `logprobs` (0..20 alternatives) reads each generated token's
    log-probability off the row that chose it; `echo` keeps the prompt's rows as well (one forward of the prompt,
    every row kept: the same bytes) and reads each prompt token's, and lets `max_new_tokens` be 0.
    """
    prompt_ids = list(given_ids) if given_ids else encode_prompt(lm, question, grafted=bool(chain), raw=raw, form=form)
    t0 = time.perf_counter()
    if not chain:
        cache, start, tier = new_cache(lm.model), 0, "none"
    elif relocated:
        g = restore_relocated(lm, chain)
        cache, start, tier = g.cache, g.next_position, "relocated"
    else:
        cache, start, tier = restore(lm, chain), chain[-1].end, "exact"
    restore_s = time.perf_counter() - t0
    _bound(lm, start, len(prompt_ids), max_new_tokens, least=0 if echo else 1)
    provable = probe and tier == "exact" and bool(chain[-1].probe_sha256)
    proof = prove(lm, chain, cache, proven) if provable else None
    if proof is not None and on_proof is not None:
        on_proof(proof)
    dec = prompt_and_decode(
        lm.model,
        cache,
        prompt_ids,
        start,
        max_new_tokens,
        is_stop=_stopper(lm, raw, form, stop),
        eos_ids=_eos(lm),
        on_token=on_token,
        steps=steps,
        choose=None if sampling is None else chooser(sampling),
        keep_prompt_rows=echo,
    )
    completion = lm.tokenizer.decode(dec.token_ids, skip_special_tokens=True)
    top = logprobs or 0
    read = logprobs is not None or echo
    out_lp = tuple(of_rows(dec.step_rows, dec.token_ids, top)) if read else ()
    prompt_lp = tuple(of_prompt(dec.prompt_rows, prompt_ids, top)) if echo else ()
    if proof is None:
        proof = no_proof(why_no_proof(chain, relocated) if probe else "proof turned off by the caller")
    served = (lm, chain, prompt_ids, dec.token_ids, dec.step_rows)
    exactness = full_check(*served) if (run_check and chain and not relocated) else None
    grafted = start
    return Answer(
        text=templates.answer_text(completion, raw, form, stop, templates.of(lm.tokenizer)),
        completion=completion,
        prompt_ids=tuple(prompt_ids),
        token_ids=tuple(dec.token_ids),
        tier=tier,
        artifact_ids=tuple(a.key for a in chain),
        restore_s=restore_s,
        prompt_s=dec.prompt_s,
        ttft_s=read_s + restore_s + proof.proof_s + dec.first_token_s,
        total_s=read_s + restore_s + proof.proof_s + dec.total_s,
        savings=savings(lm.info, grafted, len(prompt_ids), len(dec.token_ids), baseline_decode_tokens),
        output_sha256=tokens_sha256(dec.token_ids),
        logits_sha256=logits_sha256(dec.step_rows),
        stopped=dec.stopped,
        check=exactness,
        proof=proof,
        output_logprobs=out_lp,
        prompt_logprobs=prompt_lp,
    )


@dataclass(frozen=True)
class Baseline:
    """The no-graft run over the same context: prefix + prompt prefilled, then the same decoding."""

    prefill_tokens: int
    decode_tokens: int
    ttft_s: float
    total_s: float
    text: str
    output_sha256: str
    token_ids: tuple[int, ...] = ()


def baseline(
    lm: LoadedModel, chain: list[KVArtifact], question: str, max_new_tokens: int = 32, raw: bool = False, form: str = "answer"
) -> Baseline:
    """Recompute the grafted prefix and the prompt in one prefill (logits_to_keep=1), then decode."""
    prefix = [t for a in chain for t in a.token_ids.tolist()]
    prompt_ids = encode_prompt(lm, question, grafted=bool(chain), raw=raw, form=form)
    ids = prefix + prompt_ids
    _bound(lm, 0, len(ids), max_new_tokens)
    dec = prompt_and_decode(
        lm.model, new_cache(lm.model), ids, 0, max_new_tokens, is_stop=_stopper(lm, raw, form), eos_ids=_eos(lm)
    )
    completion = lm.tokenizer.decode(dec.token_ids, skip_special_tokens=True)
    return Baseline(
        prefill_tokens=len(ids),
        decode_tokens=len(dec.token_ids),
        ttft_s=dec.first_token_s,
        total_s=dec.total_s,
        text=completion if raw else templates.cut_answer(completion, form, templates.of(lm.tokenizer)),
        output_sha256=tokens_sha256(dec.token_ids),
        token_ids=tuple(dec.token_ids),
    )

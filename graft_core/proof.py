"""What a grafted answer carries as proof of what was served: the cheap probe proof on every answer,
and the full fresh recomputation of the served logits rows on request.

Both read the state that produced the served tokens, never a second graft made for the check. The
engine's own prompt schedule lives here too (`probe_head`): a prompt that starts with the probe
tokens runs them as their own chunk, so the probe row comes out of the serving cache itself.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from .artifact import KVArtifact
from .capture import logits_sha256, probe_ids
from .forward import forward_chunk, new_cache
from .model import LoadedModel
from .verify import ExactnessCheck, divergence, fresh_cache

PROVES = (
    "the grafted cache that served this answer, run on the probe tokens that open the prompt, gave a logits row "
    "whose SHA-256 equals the one recorded when the artifact was deposited: the restored state reproduces the "
    "deposit-time state bit for bit wherever that row can see it (every layer, every position the probe attends to)"
)
DOES_NOT_PROVE = (
    "it does not recompute the prefix from its text (the full check does); it trusts the deposit-time hash, "
    "which is as good as the deposit; rows outside a sliding layer's window are not read by the probe"
)


@dataclass(frozen=True)
class Proof:
    """The cheap proof of one answer. `passed` is None when no proof applies (`note` says why)."""

    kind: str  # "probe" | "none"
    passed: bool | None
    expected_sha256: str  # recorded at deposit (the leaf's probe_sha256)
    observed_sha256: str  # the probe row of the serving cache
    proof_s: float  # probe chunk forward + hashing (an upper bound on its cost: those tokens are computed anyway)
    note: str  # what it proves (passed), what failed, or why no proof applies
    limits: str = ""  # what it does not prove

    def as_dict(self) -> dict:
        return asdict(self)


def probe_head(lm: LoadedModel, chain: list[KVArtifact], prompt_ids: list[int], relocated: bool = False) -> int:
    """How many leading prompt tokens run as the probe chunk (0: no probe proof for this prompt)."""
    if not chain or relocated or not chain[-1].probe_sha256:
        return 0
    probe = probe_ids(lm)
    return len(probe) if list(prompt_ids[: len(probe)]) == probe else 0


def no_proof(note: str) -> Proof:
    return Proof(kind="none", passed=None, expected_sha256="", observed_sha256="", proof_s=0.0, note=note)


def why_no_proof(chain: list[KVArtifact], relocated: bool) -> str:
    if not chain:
        return "nothing grafted: nothing to prove"
    if relocated:
        return "relocated graft: approximate by design, no deposit-time hash applies (measure it with the full check)"
    if not chain[-1].probe_sha256:
        return "the artifact records no probe hash: run the full check"
    return "the prompt does not start with the probe tokens (raw prompt): run the full check"


def probe_proof(leaf: KVArtifact, head_row: torch.Tensor, head_s: float) -> Proof:
    """Compare the serving cache's probe row with the leaf's deposit-time probe hash, byte for byte."""
    t0 = time.perf_counter()
    observed = logits_sha256(head_row)
    passed = observed == leaf.probe_sha256
    return Proof(
        kind="probe",
        passed=passed,
        expected_sha256=leaf.probe_sha256,
        observed_sha256=observed,
        proof_s=head_s + time.perf_counter() - t0,
        note=PROVES if passed else "the serving cache's probe row differs from the deposit-time hash: the graft is not exact",
        limits=DOES_NOT_PROVE,
    )


@torch.inference_mode()
def full_check(
    lm: LoadedModel,
    chain: list[KVArtifact],
    prompt_ids: list[int],
    head: int,
    served_tokens: list[int],
    served_rows: list[torch.Tensor],
    monolithic: bool = True,
) -> ExactnessCheck:
    """Recompute the chain from its tokens and compare the rows that chose the served tokens, byte for byte.

    Same schedule as the served answer: one chunk per artifact, the probe head, the rest of the prompt,
    then one forward per served token (teacher-forced, so a divergent step is compared on equal inputs).
    The grafted hash is the served one (the ledger's `logits_sha256`).
    """
    assert served_tokens and len(served_tokens) == len(served_rows), "one served row per served token"
    cache, pos = fresh_cache(lm, chain)
    if 0 < head < len(prompt_ids):
        forward_chunk(lm.model, cache, prompt_ids[:head], pos)
        rows = [forward_chunk(lm.model, cache, prompt_ids[head:], pos + head)[-1]]
    else:  # one chunk (a head that is the whole prompt is that chunk)
        rows = [forward_chunk(lm.model, cache, prompt_ids, pos)[-1]]
    at = pos + len(prompt_ids)
    for tok in served_tokens[:-1]:
        rows.append(forward_chunk(lm.model, cache, [tok], at)[-1])
        at += 1
    fresh, served = torch.stack(rows), torch.stack([r.float() for r in served_rows])
    f_sha, s_sha = logits_sha256(fresh), logits_sha256(served)
    d = divergence(fresh, served)
    mono = {}
    if monolithic:
        ids = [t for a in chain for t in a.token_ids.tolist()] + list(prompt_ids)
        whole = forward_chunk(lm.model, new_cache(lm.model), ids, 0)
        m = divergence(fresh[:1], whole[-1:])
        mono = {
            "monolithic_max_abs_diff": m.max_abs_diff,
            "monolithic_kl": m.kl,
            "monolithic_argmax_agreement": m.argmax_agreement,
        }
    return ExactnessCheck(
        exact=f_sha == s_sha,
        tier="exact",
        fresh_sha256=f_sha,
        grafted_sha256=s_sha,
        kl=d.kl,
        argmax_agreement=d.argmax_agreement,
        max_abs_diff=d.max_abs_diff,
        rows=d.rows,
        decode_steps=len(served_tokens) - 1,
        tokens_equal=[int(t) for t in fresh.argmax(-1).tolist()] == list(served_tokens),
        **mono,
    )

"""What a grafted answer carries as proof of what was served: a per-answer proof that costs one hash
of the served state, and the full fresh recomputation of the served logits rows on request.

The first time a process serves an artifact, its restored state runs the probe tokens and must
reproduce the probe logits hash recorded at deposit byte for byte (the `probe` proof); the BLAKE3 of
that restored state is kept (`ProvenState`). A serving process runs that same check ahead of the
questions for its newest artifacts once it is up (`Library.warm_proofs`). Every later answer hashes
the state it is served from and must match (the `state` proof): the same bytes in the same process
give the same rows the probe read.
The prompt itself always runs as one chunk, so an answer's bytes never depend on which proof it got.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from .artifact import KVArtifact
from .exactness import ExactnessCheck, divergence, fresh_cache
from .forward import forward_chunk, new_cache
from .graft import restore
from .layers import state_digest
from .model import LoadedModel
from .probe import logits_sha256, probe_sha256

PROVES_PROBE = (
    "the restored state, run on the probe tokens, gave a logits row whose SHA-256 equals the one recorded when the "
    "artifact was deposited, and the state that served this answer is byte-identical to it (BLAKE3 of every layer's "
    "keys and values): it reproduces the deposit-time state bit for bit wherever the probe row can see it"
)
PROVES_STATE = (
    "the keys and values that served this answer hash (BLAKE3, every layer, shapes and token counts included) to the "
    "state on which this process reproduced the deposit-time probe logits hash byte for byte at its first use of the "
    "artifact (its first answer from it, or the start-up's warm-up): the same bytes under the same weights and kernels, so the same rows"
)
DOES_NOT_PROVE = (
    "it does not recompute the prefix from its text (the full check does); it trusts the deposit-time probe hash, "
    "which is as good as the deposit; rows outside a sliding layer's window are not read by the probe"
)


@dataclass(frozen=True)
class ProvenState:
    """A restored state whose probe reproduced the deposit-time hash in this process."""

    digest: str  # BLAKE3 of the restored state (layers.state_digest)
    probe_sha256: str  # the deposit-time probe logits hash it reproduced


@dataclass(frozen=True)
class Proof:
    """The per-answer proof. `passed` is None when no proof applies (`note` says why).

    kind "probe": expected/observed are SHA-256 of the probe logits row (deposit time / now);
    kind "state": expected/observed are BLAKE3 of the restored state (first use / this answer)."""

    kind: str  # "probe" | "state" | "none"
    passed: bool | None
    expected: str
    observed: str
    state_digest: str  # BLAKE3 of the state that served the answer ("" when none)
    probe_sha256: str  # the deposit-time probe hash the state was proved against
    proof_s: float  # what the proof cost: the state hash (+ the probe forward on first use)
    note: str  # what it proves (passed), what failed, or why no proof applies
    limits: str = ""  # what it does not prove

    def as_dict(self) -> dict:
        return asdict(self)


def no_proof(note: str) -> Proof:
    return Proof(kind="none", passed=None, expected="", observed="", state_digest="", probe_sha256="", proof_s=0.0, note=note)


def why_no_proof(chain: list[KVArtifact], relocated: bool) -> str:
    if not chain:
        return "nothing grafted: nothing to prove"
    if relocated:
        return "relocated graft: approximate by design, no deposit-time hash applies (measure it with the full check)"
    return "the artifact records no probe hash: run the full check"


def probe_state(lm: LoadedModel, chain: list[KVArtifact]) -> tuple[str, str]:
    """Restore `chain`, hash the state, then run the probe tokens on it: (digest, probe row SHA-256)."""
    cache = restore(lm, chain)
    digest = state_digest(cache)
    return digest, probe_sha256(lm, cache, chain[-1].end)


def check_probe(lm: LoadedModel, chain: list[KVArtifact], recorded: str | None = None) -> tuple[str | None, ProvenState | None]:
    """(why the restored `chain` fails its leaf's probe check or None, and the proven state when it passes):
    the probe logits of the restored state must hash to the header's `probe_sha256`, and that to
    `recorded` (the hash the catalog kept at deposit) when given."""
    leaf = chain[-1]
    if recorded is not None and recorded != leaf.probe_sha256:
        return f"the catalog records probe hash {recorded[:16]}… but the artifact file says {leaf.probe_sha256[:16]}…", None
    digest, got = probe_state(lm, chain)
    if got != leaf.probe_sha256:
        return f"the restored state's probe logits hash to {got[:16]}…, the artifact records {leaf.probe_sha256[:16]}…", None
    return None, ProvenState(digest=digest, probe_sha256=got)


def prove(lm: LoadedModel, chain: list[KVArtifact], served, known: ProvenState | None) -> Proof:
    """The proof of the served cache `served` (restored from `chain`, nothing run on it yet).

    With `known` (this process proved this artifact before): compare the served state's BLAKE3 with it.
    Without: restore a second cache, run the probe on it and compare with the leaf's
    deposit-time hash, and require the served state to hash like the probed one."""
    t0 = time.perf_counter()
    leaf = chain[-1]
    observed_state = state_digest(served)
    if known is not None:
        passed = observed_state == known.digest and known.probe_sha256 == leaf.probe_sha256
        return Proof(
            kind="state",
            passed=passed,
            expected=known.digest,
            observed=observed_state,
            state_digest=observed_state,
            probe_sha256=leaf.probe_sha256,
            proof_s=time.perf_counter() - t0,
            note=PROVES_STATE if passed else "the served state's BLAKE3 differs from the state proved at first use: not served",
            limits=DOES_NOT_PROVE,
        )
    probed_state, probe_row = probe_state(lm, chain)
    passed = probe_row == leaf.probe_sha256 and probed_state == observed_state
    why = (
        "the restored state's probe logits differ from the deposit-time hash: the graft is not exact"
        if probe_row != leaf.probe_sha256
        else "the served state differs from the probed one"
    )
    return Proof(
        kind="probe",
        passed=passed,
        expected=leaf.probe_sha256,
        observed=probe_row,
        state_digest=observed_state,
        probe_sha256=leaf.probe_sha256,
        proof_s=time.perf_counter() - t0,
        note=PROVES_PROBE if passed else why,
        limits=DOES_NOT_PROVE,
    )


def proven(proof: Proof) -> ProvenState | None:
    """What a passing probe proof lets the process remember (None for any other proof)."""
    if proof.kind != "probe" or not proof.passed:
        return None
    return ProvenState(digest=proof.state_digest, probe_sha256=proof.probe_sha256)


@torch.inference_mode()
def full_check(
    lm: LoadedModel,
    chain: list[KVArtifact],
    prompt_ids: list[int],
    served_tokens: list[int],
    served_rows: list[torch.Tensor],
    monolithic: bool = True,
) -> ExactnessCheck:
    """Recompute the chain from its tokens and compare the rows that chose the served tokens, byte for byte.

    Same schedule as the served answer: one chunk per artifact, the prompt as one chunk, then one
    forward per served token (teacher-forced, so a divergent step is compared on equal inputs).
    The grafted hash is the served one (the ledger's `logits_sha256`).
    """
    assert served_tokens and len(served_tokens) == len(served_rows), "one served row per served token"
    cache, pos = fresh_cache(lm, chain)
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

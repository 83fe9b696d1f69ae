"""The exactness report of a Library (CLI `verify`): draw a seeded sample of (artifact, query) pairs from the
store and compare the grafted logits with a fresh recomputation byte for byte (or, with `relocate`, measure
how far a root grafted at another offset lands from the fresh computation there). Each sample takes the model
lock on its own, after any answers decoding meanwhile, so a caller may hand the model to someone else
between samples (`on_progress`) and a chat never waits behind a whole report.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from errors import ArtifactNotFound, InvalidInput

from .results import ExactnessReport, ExactnessSample

if TYPE_CHECKING:
    from graft_core.model import LoadedModel

    from .artifacts import Artifacts
    from .store import Store
    from .turns import ModelTurns

QUESTIONS = ("What is it?", "Who built it?", "When did it happen?", "Summarise the fact.", "How many are there?", "Why?")


class ExactnessReportPipeline:
    """The exactness reports of one store and one model. It is handed the store, the artifact reads, the
    model's turns and an accessor of the model (loaded at first use)."""

    def __init__(self, store: Store, artifacts: Artifacts, turns: ModelTurns, lm: Callable[[], LoadedModel]):
        self._store = store
        self._artifacts = artifacts
        self._turns = turns
        self._lm = lm

    def exactness_report(
        self,
        samples: int = 10,
        relocate: int | None = None,
        seed: int = 0,
        on_progress: Callable[[float, str], None] | None = None,
        decode_steps: int = 4,
        monolithic: bool = True,
        max_tokens: int | None = None,
    ) -> ExactnessReport:
        """Draw `samples` (artifact, query) pairs from the store and check graft vs fresh on each, over the
        query rows and `decode_steps` greedy steps (and, with `monolithic`, the one-forward schedule beside
        it, labelled). With `max_tokens` only artifacts whose chain holds at most that many tokens are drawn
        (a sample recomputes the whole chain: this bounds its cost)."""
        from graft_core import generate  # the engine loads at the first check, not with the web page
        from graft_core.exactness import check as exact_check
        from graft_core.exactness import check_relocated

        if not 1 <= samples <= 1000:
            raise InvalidInput(f"samples must be between 1 and 1000, got {samples}")
        if not 1 <= decode_steps <= 16:
            raise InvalidInput(f"decode_steps must be between 1 and 16, got {decode_steps}")
        lm = self._lm()  # a store may hold several models' artifacts: the report draws the loaded model's own
        listed = self._store.catalog.list_artifacts(limit=10_000, fingerprints=(lm.fingerprint,))
        rows = [r for r in listed if not r.quarantine]
        if not rows:
            raise ArtifactNotFound(
                f"the store holds no artifact of this model ({lm.info.name}): deposit something first "
                "(cli.py deposit --text-file F)"
            )
        if max_tokens is not None:
            rows = [r for r in rows if r.end_pos <= max_tokens]
            if not rows:
                raise ArtifactNotFound(
                    f"no artifact in the store has a chain of at most {max_tokens:,} tokens; verifying longer ones "
                    "needs the admin token (or `cli.py verify` on your own store)"
                )
        rng = random.Random(seed)
        done: list[ExactnessSample] = []
        for i in range(samples):
            row = rng.choice(rows)
            q = rng.choice(QUESTIONS)
            with self._turns.after_answers() as between:  # answers waiting for the model go first, and again halfway
                lm = self._lm()
                chain, _ = self._artifacts.chain(row.id)
                qids = generate.encode_prompt(lm, q, grafted=True)
                if relocate is not None:
                    c = check_relocated(lm, chain[0], qids, offset=relocate, decode_steps=decode_steps, between=between)
                    done.append(ExactnessSample(chain[0].key, q, c))
                else:
                    c = exact_check(lm, chain, qids, decode_steps=decode_steps, monolithic=monolithic, between=between)
                    done.append(ExactnessSample(row.id, q, c))
            if on_progress:
                on_progress((i + 1) / samples, f"sample {i + 1}/{samples}")
        return ExactnessReport(
            samples=samples,
            byte_equal=sum(int(s.check.exact) for s in done),
            max_kl=max([0.0, *(s.check.kl for s in done)]),
            argmax_agreement=float(np.mean([s.check.argmax_agreement for s in done])),
            relocate=relocate,
            rows=tuple(done),
        )

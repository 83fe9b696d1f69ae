"""The solve pipeline of a Library (the flywheel): recall from the verified library first; otherwise let
the model work (greedy, then seeded sampled attempts) within a token budget, and deposit the first
answer the verifier accepts through the same gate as any verified deposit. Every token is counted.

Each finished solve appends one JSON line to `<home>/flywheel.jsonl`; what it deposits is also recorded in the
catalog (`record_discovery`), whose running figures (db/aggregates.py) the dashboard plots: the tokens a
discovery cost and what recalling it costs afterwards, without reading the ledger.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import verifiers
from db import aggregates
from errors import InvalidInput, VerificationFailed

from .door import AnswerOptions
from .limits import MAX_QUESTION_CHARS, bounded
from .results import Flywheel, SolveAttempt, Solved

if TYPE_CHECKING:
    from graft_core.model import LoadedModel

    from .answer import AnswerPipeline
    from .deposit import DepositPipeline
    from .store import Store
    from .turns import ModelTurns

DEFAULT_BUDGET = 4096
MAX_BUDGET = 1_000_000
DEFAULT_TEMPERATURE = 0.8
FLYWHEEL_LOG = "flywheel.jsonl"
GROWTH_POINTS = 200  # the flywheel plots the newest this many deposits,
ITEMS_SHOWN = 30  # the newest this many discovered items,
RECALL_POINTS = 500  # and the newest this many recalls (the plot says so)


class SolvePipeline:
    """The flywheel of one store and one model. It is handed the store, the model's turns, an accessor of the
    model (loaded at first use), the answer pipeline (recall) and the deposit pipeline (a passing attempt goes
    through the gate as any verified deposit)."""

    def __init__(
        self,
        store: Store,
        turns: ModelTurns,
        lm: Callable[[], LoadedModel],
        answers: AnswerPipeline,
        deposits: DepositPipeline,
    ):
        self._store = store
        self._turns = turns
        self._lm = lm
        self._answers = answers
        self._deposits = deposits

    def _from_library(self, question: str, verifier: str, reference: str, max_new_tokens: int) -> SolveAttempt:
        res = self._answers.answer(question, AnswerOptions(max_new_tokens=max_new_tokens))
        v = verifiers.judge(res.answer, verifier, reference, question)
        ok, detail = v.ok, v.detail
        mode = "library" if res.artifact_ids else "greedy"
        return SolveAttempt(
            mode=mode,
            answer=res.answer,
            passed=ok,
            detail=detail,
            tokens=res.computed_tokens + res.decode_tokens,
            artifact_ids=tuple(res.artifact_ids),
            output_sha256=res.output_sha256,
        )

    def work(self, question: str, max_new_tokens: int, temperature: float, seed: int | None) -> SolveAttempt:
        """One attempt of the model alone (greedy at temperature 0, else sampled with `seed`), not yet judged,
        in a background turn of the model (ModelTurns.background: a chat never waits behind a whole attempt)."""
        from graft_core import sampling  # the engine loads at the first solve, not with the web page
        from graft_core.generate import tokens_sha256

        with self._turns.background() as steps:
            lm = self._lm()
            if steps is None:
                a = sampling.attempt(lm, question, max_new_tokens, temperature=temperature, seed=seed)
            else:
                a = sampling.attempt(lm, question, max_new_tokens, temperature=temperature, seed=seed, steps=steps)

        return SolveAttempt(
            mode=a.mode,
            answer=a.text,
            passed=False,
            detail="",
            tokens=a.tokens_computed,
            temperature=a.temperature,
            seed=a.seed,
            output_sha256=tokens_sha256(a.token_ids),
        )

    def solve(
        self,
        question: str,
        verifier: str,
        reference: str,
        budget: int = DEFAULT_BUDGET,
        attempts: int | None = None,
        seed: int = 0,
        temperature: float = DEFAULT_TEMPERATURE,
        max_new_tokens: int = 32,
        admin: bool = False,
        library: bool = True,
        between: Callable[[], None] | None = None,
    ) -> Solved:
        """Library first, then greedy, then sampled attempts (seeds seed, seed+1, ...) until one passes the
        verifier, `attempts` tries were made or `budget` tokens (prompt + decode, every try) are spent.
        `library=False` skips the recall step (the no-graft model alone, as the eval's baseline); `between` is
        called before every attempt but the first, outside the model lock (the web app hands the model to the
        next waiting client there, so each attempt is one turn)."""
        from graft_core import sampling

        question = bounded("question", question, MAX_QUESTION_CHARS)
        if not 1 <= budget <= MAX_BUDGET:
            raise InvalidInput(f"budget must be between 1 and {MAX_BUDGET:,} tokens, got {budget}")
        if attempts is not None and attempts < 1:
            raise InvalidInput(f"attempts must be at least 1, got {attempts}")
        if not 0 < temperature <= 5:
            raise InvalidInput(f"temperature must be in (0, 5], got {temperature}")
        verifiers.judge("0", verifier, reference, question)  # an unknown verifier or a malformed reference fails before any work
        t0 = time.perf_counter()
        done: list[SolveAttempt] = []
        spent = 0
        prompt = sampling.prompt_tokens(self._lm(), question)
        while attempts is None or len(done) < attempts:
            room = budget - spent - prompt
            if room < 1:
                break
            n = min(max_new_tokens, room)
            if done and between is not None:
                between()
            if not done and library:
                a = self._from_library(question, verifier, reference, n)
            else:
                temp = 0.0 if not any(x.mode == "greedy" for x in done) else temperature
                s = None if temp == 0.0 else seed + sum(1 for x in done if x.mode == "sampled")
                a = self.work(question, n, temp, s)
                v = verifiers.judge(a.answer, verifier, reference, question)
                a = SolveAttempt(**{**a.__dict__, "passed": v.ok, "detail": v.detail})
            done.append(a)
            spent += a.tokens
            if a.passed and a.mode == "library":
                return self._finish(
                    question, Solved(True, "library", a.artifact_ids[-1], a.answer, tuple(done), spent, budget), t0
                )
            if a.passed:
                try:
                    d = self._deposits.deposit_item(question, a.answer, a.answer, verifier, reference, admin=admin)
                except VerificationFailed as e:
                    done[-1] = SolveAttempt(**{**a.__dict__, "passed": False, "detail": f"the deposit gate refused: {e}"})
                    continue
                return self._finish(question, Solved(True, "model", d.id, a.answer, tuple(done), spent, budget, d.created), t0)
        return self._finish(question, Solved(False, "none", None, "", tuple(done), spent, budget), t0)

    def _finish(self, question: str, result: Solved, t0: float) -> Solved:
        line = {
            "at": time.time(),
            "question": question,
            "solved": result.solved,
            "source": result.source,
            "id": result.id,
            "tokens_spent": result.tokens_spent,
            "attempts": len(result.attempts),
            "seconds": round(time.perf_counter() - t0, 3),
        }
        with open(self._store.home / FLYWHEEL_LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
        if result.source == "model" and result.id:
            self._store.catalog.record_discovery(result.id, result.tokens_spent)
        return result

    def flywheel(self) -> Flywheel:
        """What the dashboard plots, from the catalog's running figures in one read transaction of three
        LIMITed statements: the library's size over its newest GROWTH_POINTS deposits; per item `solve`
        found (the newest ITEMS_SHOWN) the tokens its discovery cost against what its recalls computed; and
        the cumulative tokens saved over the newest RECALL_POINTS recalls, where saved = the sum over
        recalls of (discovery - recall), i.e. against a baseline that would have had to discover it again."""
        growth, found, recalls = aggregates.read(
            self._store.catalog,
            (aggregates.growth, GROWTH_POINTS),
            (aggregates.recent_discoveries, ITEMS_SHOWN),
            (aggregates.recent_recalls, RECALL_POINTS),
        )
        items = tuple(
            (d.artifact_id, d.tokens_spent, round(d.recall_tokens / d.recalls, 1) if d.recalls else None, d.recalls)
            for d in found
        )
        return Flywheel(
            growth=tuple((t.timestamp(), n) for t, n in growth),
            items=items,
            cumulative_saved=tuple((t.timestamp(), s) for t, s in recalls),
        )

    def fill_flywheel(self) -> None:
        """Once per store: a store whose solves were logged before the catalog kept them gets its flywheel
        figures back-filled from flywheel.jsonl and one pass over the ledger (db/aggregates.py)."""
        if not (self._store.home / FLYWHEEL_LOG).exists():
            return
        found: dict[str, tuple[int, datetime]] = {}  # id -> (the latest solve's cost, the first solve's time)
        for s in self.solves():
            if s["source"] == "model" and s["id"]:
                first = found.get(s["id"], (0, datetime.fromtimestamp(s["at"], UTC)))[1]
                found[s["id"]] = (s["tokens_spent"], first)
        aggregates.fill(self._store.catalog, found)

    def solves(self) -> list[dict]:
        """Every recorded solve, oldest first (empty when nothing was solved in this store)."""
        path = self._store.home / FLYWHEEL_LOG
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]

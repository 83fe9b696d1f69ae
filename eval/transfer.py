"""Held-out transfer on GSM-Symbolic: does one routed, verified worked solution of a related problem make the model
answer a new problem better, against nothing grafted, against few-shot prompting and against an unrelated example?

The library is each template's original GSM8K problem with its worked solution, offered to the real deposit gate
(`python -m eval.gsm_run deposit`: accepted only where the model, with it grafted, reaches the reference). The
held-out problems are new instances of the same templates (new names and numbers, the package's own generator,
seeded: eval/gsm.py's `numbers` set), never deposited. Every condition asks the held-out question the same way
(the model's chat template, the answer opened by "Let's think step by step.", greedy, MAX_NEW_TOKENS, one judge):

- `zero-shot`: nothing grafted;
- `few-shot`: gsm8k-cot's eight exemplars (Wei et al. 2022) before the question, prefilled for every question and
  every token of them counted (the system turn the exemplars deposit renders to, then the question);
- `few-shot-grafted`: the same eight exemplars deposited once and grafted at their own positions: the same tokens
  as `few-shot`, so the same answer byte for byte (checked per problem), at the cost of the question alone;
- `transfer`: whatever the product's own retrieval grafts (services.Library.answer with worked examples on): the
  sibling's verified solution where it is routed there, nothing where it is not;
- `control`: an unrelated template's verified solution grafted (another template's accepted deposit, seeded):
  does any worked example help, or the related one?

Talks to the product through `services.Library` only (`answer`, `deposit_text`). Records carry what
`eval.benchmark.score` re-judges (answer, verifier, reference, question) and the token accounting of each side.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from random import Random

from eval import benchmark
from graft_core import templates
from services import AnswerOptions

FORM = "steps"  # the question as the user turn, the assistant's turn opened by "Let's think step by step."
MAX_NEW_TOKENS = 384  # every condition's answer budget (the gate's chat budget: services.gate)
CONDITIONS = ("zero-shot", "few-shot", "few-shot-grafted", "transfer", "control")
THREADS = 8  # answers at once through the product's StepGroup (each answer's own bytes)


def exemplars_text() -> str:
    """gsm8k-cot's eight exemplars as one text (the deposit the few-shot conditions graft or prefill)."""
    return "\n\n".join(f"Q: {q}\nA: {a}" for q, a in templates.COT_EXEMPLARS)


def controls(accepted: dict[int, str], templates: list[int], seed: int) -> dict[int, str]:
    """template -> the artifact of another template's accepted deposit, for every held-out template (whether its own
    original was accepted or not): drawn by a generator seeded with the seed and the template alone, so a template's
    control does not depend on the order problems are asked in. A template gets none where no other was accepted."""
    out = {}
    for t in templates:
        others = sorted(k for k in accepted if k != t)
        if others:
            out[t] = accepted[others[Random(seed * 1000 + t).randrange(len(others))]]
    return out


def _row(item: dict, condition: str, r, seconds: float) -> dict:
    return {
        **{k: item[k] for k in ("id", "set", "template", "id_orig", "seed", "question", "verifier", "reference")},
        "condition": condition,
        "form": FORM,
        "answer": r.answer,
        "output_token_ids": list(r.output_token_ids),
        "output_sha256": r.output_sha256,
        "computed_tokens": r.computed_tokens,
        "decode_tokens": r.decode_tokens,
        "grafted_tokens": r.grafted_tokens,
        "artifact_ids": list(r.artifact_ids),
        "retrieved": [
            {"id": h.id, "score": h.score, "relevant": h.relevant, "use": h.use, "reason": h.reason} for h in r.retrieved
        ],
        "note": r.note,
        "seconds": round(seconds, 2),
    }


def ask(lib, item: dict, condition: str, artifact: str | None = None) -> list[dict]:
    """The records of one held-out problem under `condition` (`few-shot` gives two: the prefilled answer and the
    grafted one, from one call whose measured baseline is the prefilled side)."""
    t0 = time.perf_counter()
    base = dict(max_new_tokens=MAX_NEW_TOKENS, record=False, form=FORM)
    if condition == "zero-shot":
        return [_row(item, condition, lib.answer(item["question"], AnswerOptions(graft=False, **base)), time.perf_counter() - t0)]
    if condition == "transfer":
        return [_row(item, condition, lib.answer(item["question"], AnswerOptions(**base)), time.perf_counter() - t0)]
    if condition == "control":
        return [
            _row(
                item, condition, lib.answer(item["question"], AnswerOptions(artifact=artifact, **base)), time.perf_counter() - t0
            )
        ]
    if condition != "few-shot":
        raise ValueError(f"condition must be one of {CONDITIONS[:2] + CONDITIONS[3:]}, got {condition!r}")
    r = lib.answer(item["question"], AnswerOptions(artifact=artifact, compare=True, **base))
    grafted = _row(item, "few-shot-grafted", r, r.total_s + r.read_s)
    b = r.baseline
    prefilled = grafted | {
        "condition": "few-shot",
        "answer": b.text,
        "output_token_ids": list(b.token_ids),
        "output_sha256": b.output_sha256,
        "computed_tokens": b.prefill_tokens,
        "decode_tokens": b.decode_tokens,
        "grafted_tokens": 0,
        "artifact_ids": [],
        "note": "the exemplars prefilled before the question (the grafted call's measured baseline)",
        "seconds": round(b.total_s, 2),
    }
    return [prefilled, grafted]


def run(
    lib,
    items: list[dict],
    condition: str,
    out: Path,
    artifacts: dict[int, str] | None = None,
    log: Callable[[str], None] = print,
) -> None:
    """Answer every item not yet in `out` under `condition` (THREADS at once), appending each record as it
    finishes; `artifacts` maps a template to the artifact grafted for it (few-shot: the exemplars; control)."""
    done = {benchmark.key(r) for r in benchmark.read_jsonl(out)}
    todo = [it for it in items if (condition, it["id"]) not in done]
    if artifacts is not None:
        todo = [it for it in todo if it["template"] in artifacts]
    benchmark.together(lib, todo, lambda it: ask(lib, it, condition, (artifacts or {}).get(it["template"])), out, log)

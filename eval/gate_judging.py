"""The deposit gate's judging, measured on the eval's own items: what the model generates in the gate's two
runs, judged by the gate's judge now and by the span-and-negation heuristic it replaced.

`collect` (needs the real model) runs the gate's two generations for every item the eval offers to the gate
(the sampled facts and deposited problems of eval/harness.py, and the recurring case's offered problems: failed,
or refused before sampling; in both forms eval/recurring.py offers) and stores the generated texts with their token-id hashes. The generations do
not depend on the judge: the eval types the dataset's answer, so the deposited text is fixed before any verdict.
`judge` (offline, the default) re-judges the stored texts with both judges and writes the acceptance figures and
every verdict into docs/bench/gate-judging.json; tests/test_gate_judging.py re-derives the committed figures.

An accepted answer is labelled by hand in LABELS (read, not computed): whether it asserts the reference. An
accepted answer not labelled "asserts" fails the run, so a judge that starts accepting a denial is caught.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import verifiers
from errors import InvalidInput
from eval import harness

OUT = harness.ROOT / "docs" / "bench" / "gate-judging.json"
FORMAT = "kvgraft-gate-judging/1"
RECURRING_IDS = harness.ROOT / "docs" / "eval" / "results.json"  # the recurring case's offered problems


# ---- the items -----------------------------------------------------------------------------------


def items() -> list[dict]:
    """Every (item, form) the eval offers to the gate, in a fixed order, with what the gate is given."""
    from eval import recurring

    knowledge, problems = harness.read_jsonl(harness.KNOWLEDGE), harness.read_jsonl(harness.PROBLEMS)
    sample = harness.draw(harness.EvalConfig(), knowledge, problems)
    out = []
    for r in sample.knowledge:
        out.append(_offer("knowledge", r, "fact", r["fact"], r["answer"]))
    for r in sample.deposited:
        out.append(_offer("problems", r, "worked solution", r["solution"], r["reference"]))
    by_id = {p["id"]: p for p in problems}
    case = json.loads(RECURRING_IDS.read_text(encoding="utf-8"))["recurring"]
    for rec in [*case["failed"], *case.get("gate_refused", [])]:  # gate first: a refused one was never sampled
        r = by_id[rec["id"]]
        out.append(_offer("recurring", r, "worked solution", r["solution"], r["reference"]))
        line = recurring.concluding_line(r["solution"])
        if line is not None:
            out.append(_offer("recurring", r, "concluding line", line, r["reference"]))
    return out


def _offer(group: str, row: dict, form: str, solution: str, reference: str) -> dict:
    return {
        "group": group,
        "item": row["id"],
        "form": form,
        "question": row["question"],
        "solution": solution,
        "answer": row["answer"],
        "verifier": row["verifier"],
        "reference": reference,
    }


# ---- collect (the real model) --------------------------------------------------------------------


def _generate(lm, chain, question: str) -> dict:
    from graft_core import generate
    from services.gate import budget

    a = generate.answer(lm, chain, question, max_new_tokens=budget(lm), probe=False)
    return {"text": a.text, "token_ids": list(a.token_ids), "sha256": generate.tokens_sha256(a.token_ids)}


def collect(limit: int | None = None, log=print) -> dict:
    """The gate's two generations for every item: the solution grafted as the fact run grafts it
    (templates.fact_run_text) and the deposited item text grafted at its own position (the graft run), greedy,
    as services/gate.py runs them."""
    from graft_core import model, templates
    from graft_core.capture import capture

    lm = model.load()
    rows = items()[:limit]
    t0 = time.perf_counter()
    for i, row in enumerate(rows):
        fact_ids = templates.deposit_ids(lm.tokenizer, templates.fact_run_text(row["question"], row["solution"]), root=True)
        fact_art, _ = capture(lm, list(fact_ids))
        row["fact_run"] = _generate(lm, [fact_art], row["question"])
        item_ids = templates.deposit_ids(
            lm.tokenizer, templates.item_text(row["question"], row["solution"], row["answer"]), root=True
        )
        item_art, _ = capture(lm, list(item_ids))
        row["graft_run"] = _generate(lm, [item_art], row["question"])
        log(f"{i + 1}/{len(rows)} {row['item']} {row['form']}: {row['fact_run']['text']!r} | {row['graft_run']['text']!r}")
    return {
        "format": FORMAT,
        "model_fingerprint": lm.fingerprint,
        "data": {
            rel: harness.file_sha256(harness.resolve(rel)) for rel in ("datasets/knowledge.jsonl", "datasets/problems.jsonl")
        },
        "collect_s": round(time.perf_counter() - t0, 1),
        "candidates": rows,
    }


# ---- judge (offline) -----------------------------------------------------------------------------

RUNS = ("fact_run", "graft_run")
# The span heuristic the claim reader replaced, kept here only to measure it: the fact run was judged whole
# and, for exact and numeric without a negation or hedge word anywhere in the answer, on each run of up to
# len(reference)+2 words; the graft run was judged whole.
_OLD_NEGATION = re.compile(r"\b(?:not|no|never|neither|nor|none|cannot|instead|rather)\b|n't\b", re.IGNORECASE)


def _old_judge(text: str, row: dict, run: str) -> verifiers.Verdict:
    item = dict(question=row["question"], solution=row["solution"], verifier=row["verifier"], reference=row["reference"])
    if not text.strip():
        return verifiers.Verdict(False, row["verifier"], "the model generated no answer")
    whole = verifiers.check(verifiers.VerifiedItem(answer=text, **item))
    if run != "fact_run" or whole.ok or row["verifier"] not in ("exact", "numeric") or _OLD_NEGATION.search(text):
        return whole
    words = text.split()
    for n in range(1, min(len(row["reference"].split()) + 2, len(words)) + 1):
        for i in range(len(words) - n + 1):
            span = " ".join(words[i : i + n]).strip(".,;:!?\"'()")
            if not span:
                continue
            try:
                v = verifiers.check(verifiers.VerifiedItem(answer=span, **item))
            except InvalidInput:
                continue
            if v.ok:
                return verifiers.Verdict(True, row["verifier"], f"{v.detail} (span of {text!r})")
    return whole


def _new_judge(text: str, row: dict, run: str) -> verifiers.Verdict:
    return verifiers.judge(text, row["verifier"], row["reference"], row["question"])


# Accepted sentences, read by hand: whether each asserts its reference. A bare value the kind accepts whole
# needs no label (it is the reference). Key: item/form/run -> (the text labelled, label).
LABELS: dict[str, tuple[str, str]] = {
    "k0007/fact/fact_run": ("The population of the river town of Thonhond is 31,059 people.", "asserts"),
    "k0011/fact/fact_run": ("The Traroll Codex was written by the monk Fonard Dantruby.", "asserts"),
    "k0026/fact/fact_run": ("The Trirnax Seed Library was founded in 1839 by the botanist Brus Luwell.", "asserts"),
    "k0027/fact/fact_run": ("1535 metres.", "asserts"),
    "k0028/fact/fact_run": ("Mount Vewak rises 3,599 metres above the sea.", "asserts"),
    "k0033/fact/fact_run": ("In February.", "asserts"),
    "k0075/fact/fact_run": ("At 559 degrees Celsius.", "asserts"),
    "k0129/fact/fact_run": ("At 157 degrees Celsius.", "asserts"),
    "k0142/fact/fact_run": ("205 km", "asserts"),
    "k0160/fact/fact_run": ("637 km", "asserts"),
    "k0177/fact/fact_run": ("In October.", "asserts"),
    "k0189/fact/fact_run": ("464 metres", "asserts"),
    "k0214/fact/fact_run": ("2079 km", "asserts"),
    "k0217/fact/fact_run": ("The lighthouse of Tuhen Isle was built by the engineer Zenric Volderley in 1789.", "asserts"),
    "k0226/fact/fact_run": ("1,743 metres", "asserts"),
    "k0249/fact/fact_run": ("In the month of June.", "asserts"),
    "k0257/fact/fact_run": ("The lanterns are made of copper.", "asserts"),
    "k0275/fact/fact_run": ("The lanterns are made of walnut shells.", "asserts"),
    "k0315/fact/fact_run": ("The Konsoll Bridge spans 629 metres across the Leball River.", "asserts"),
    "k0383/fact/fact_run": ("The lanterns are made of copper.", "asserts"),
    "k0385/fact/fact_run": ("The population of the river town of Nobek is 93,825 people.", "asserts"),
    "k0406/fact/fact_run": ("Mount Starsath rises 5,330 metres above the sea.", "asserts"),
    "k0423/fact/fact_run": ("1086 metres", "asserts"),
    "k0425/fact/fact_run": ("The Zegur Codex was written by the monk Konus Sathuford.", "asserts"),
    "k0433/fact/fact_run": ("The lighthouse of Fozak Isle was built by the engineer Belle Thehoton in 1625.", "asserts"),
    "k0453/fact/fact_run": ("At 521 degrees Celsius.", "asserts"),
    "k0458/fact/fact_run": ("The Kawand Seed Library was founded in 1810 by the botanist Gerard Thoford.", "asserts"),
    "k0479/fact/fact_run": ("The Drezand Codex was written by the monk Loric Selgruley.", "asserts"),
    "k0487/fact/fact_run": ("The lighthouse of Granthen Isle was built by the engineer Belelle Zett in 1848.", "asserts"),
    "k0496/fact/fact_run": ("Mount Denex rises 5,157 metres above the sea.", "asserts"),
    "k0507/fact/fact_run": ("Trokinane sulfate melts at 727 degrees Celsius.", "asserts"),
    "k0529/fact/fact_run": ("The population of the river town of Wagor is 67,327 people.", "asserts"),
    "p0072/worked solution/fact_run": ("48.25%", "asserts"),
    "p0107/worked solution/fact_run": ("Leona is 4 × 20 = 80 years old.", "asserts"),
    "p0028/concluding line/fact_run": ("36 + 48 = 84 minutes after the first train departs.", "asserts"),
    "p0110/concluding line/fact_run": ("Dario is 4 × 10 = 40 years old.", "asserts"),
    "p0117/worked solution/fact_run": ("Priya is 4 × 11 = 44 years old.", "asserts"),
    "p0106/concluding line/fact_run": ("Priya is 3 × 16 = 48 years old.", "asserts"),
    "p0106/worked solution/fact_run": ("3 × 16 = 48 years old", "asserts"),
    "p0109/concluding line/fact_run": ("Kofi is 3 × 17 = 51 years old.", "asserts"),
    "p0113/concluding line/fact_run": ("Ilse is 3 × 5 = 15 years old.", "asserts"),
    "p0116/concluding line/fact_run": ("Dario is 4 × 4 = 16 years old.", "asserts"),
    "p0117/concluding line/fact_run": ("Priya is 4 × 11 = 44 years old.", "asserts"),
    "p0125/concluding line/fact_run": ("Wen is 4 × 3 = 12 years old.", "asserts"),
    "p0130/concluding line/fact_run": ("72 years old", "asserts"),
    "p0249/worked solution/fact_run": ("42 km/h", "asserts"),  # 2*127/(127/30 + 127/70) = 42, in the unit asked
    "p0249/concluding line/fact_run": ("42 km/h", "asserts"),
    # the fact run with a worked solution below its question (templates.fact_run_text), read 2026-12-02
    "p0112/worked solution/fact_run": ("3 × 7 = 21", "asserts"),  # the chain holds; its last member is 21
    "p0127/worked solution/fact_run": ("4 × 14 = 56 years old", "asserts"),
    "p0124/concluding line/fact_run": ("Priya is 6 × 3 = 18 years old.", "asserts"),
    "p0110/worked solution/fact_run": ("4 × 10 = 40 years old", "asserts"),  # refused all the same: its graft run says 30
}


def label(row: dict, run: str) -> str:
    text = row[run]["text"]
    if text.strip():
        v = verifiers.judge(text, row["verifier"], row["reference"], row["question"])
        if v.ok and v.value == text.strip():  # accepted whole: the bare value is the reference
            return "asserts (the bare value)"
    key = f"{row['item']}/{row['form']}/{run}"
    if key not in LABELS:
        return "unlabelled"
    labelled, verdict = LABELS[key]
    if labelled != text:
        raise ValueError(f"{key}: the label is for {labelled!r}, the run generated {text!r}; read it again and relabel")
    return verdict


def judge(data: dict) -> dict:
    """Both judges on every stored generation; per group: offered, accepted (both runs pass), and accepted
    answers that do not assert their reference (labelled by hand: must be zero)."""
    from db.rows import token_ids_sha256

    rows, verdicts = data["candidates"], []
    for row in rows:
        for run in RUNS:
            if token_ids_sha256(row[run]["token_ids"]) != row[run]["sha256"]:
                raise ValueError(f"{row['item']}/{row['form']}/{run}: the token ids do not hash to the recorded sha256")
        rec = {"item": row["item"], "form": row["form"], "group": row["group"]}
        for name, fn in (("before", _old_judge), ("after", _new_judge)):
            runs = {run: fn(row[run]["text"], row, run) for run in RUNS}
            rec[name] = {
                "accepted": all(v.ok for v in runs.values()),
                **{run: {"ok": v.ok, "detail": v.detail} for run, v in runs.items()},
            }
        rec["labels"] = {run: label(row, run) for run in RUNS if rec["before"][run]["ok"] or rec["after"][run]["ok"]}
        verdicts.append(rec)
    return {"verdicts": verdicts, "summary": summarise(verdicts)}


def summarise(verdicts: list[dict]) -> dict:
    """Per group and judge: offered, accepted, rate, accepted answers not asserting their reference. A problem
    of the recurring case counts once: accepted when either of its forms is."""
    out: dict = {}
    for group in ("knowledge", "problems", "recurring"):
        rows = [v for v in verdicts if v["group"] == group]
        items = sorted({v["item"] for v in rows})
        out[group] = {"offered": len(items)}
        for name in ("before", "after"):
            accepted = sorted({v["item"] for v in rows if v[name]["accepted"]})
            wrong = sorted(
                f"{v['item']}/{v['form']}/{run}: {v['labels'].get(run)}"
                for v in rows
                for run in RUNS
                if v[name][run]["ok"] and not v["labels"].get(run, "").startswith("asserts")
            )
            out[group][name] = {
                "accepted": len(accepted),
                "rate": round(len(accepted) / len(items), 4) if items else None,
                "accepted_not_asserting": wrong,
            }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("command", nargs="?", choices=("judge", "collect"), default="judge")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--limit", type=int, default=None, help="collect: the first N items only")
    args = p.parse_args(argv)
    if args.command == "collect":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        data = collect(args.limit, log=lambda m: print(m, flush=True))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
        return 0
    data = json.loads(args.out.read_text(encoding="utf-8"))
    data.update(judge(data))
    args.out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps(data["summary"], indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

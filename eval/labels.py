"""The judge checked against labels: real model outputs, drawn by a seed from the stored records, each labelled
by reading it (does it assert the right answer to its question?), and the judge's agreement with the labels.

`draw` (offline) picks the outputs from the eval's records (docs/eval/results.json: outputs, the recurring
case's baseline attempts and recalls) and from the GSM-Symbolic chain-of-thought outputs when the file is there
(GSM_OUTPUTS), and assigns each to the development or the evaluation split by a seeded hash BEFORE any rule is
written on them. The judge's rules may be written on the development split only; the evaluation split is
scored once the rules are frozen. The answers the issue names were read before the split and are development
items. `report` (offline) re-judges every labelled output with the one judge and writes agreement, false
accepts (accepted, labelled wrong) and false refusals (refused, labelled right) per split into REPORT;
tests/test_labels.py recomputes it from the committed labels.

The drawn outputs are committed in DRAWN (id, source, stratum, split, answer, question, verifier, reference),
their labels in READINGS (id, `label` "right" | "wrong", `reason`), written by a person who read each output.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import re
import sys
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "eval" / "results.json"
PROBLEMS = ROOT / "datasets" / "problems.jsonl"
GSM_OUTPUTS = Path("/work/scratch/gsm-cot-outputs.jsonl")
DRAWN = ROOT / "docs" / "eval" / "labels" / "drawn.jsonl"
READINGS = ROOT / "docs" / "eval" / "labels" / "readings.jsonl"
REPORT = ROOT / "docs" / "eval" / "labels-report.json"
SEED = 40
FORMAT = "kvgraft-judge-labels/1"

# strata: how many distinct outputs each source gives (fewer when it has fewer)
DRAW = {"recurring_with_reference": 140, "recurring_any": 60, "recalls": 12, "eval_outputs": 100, "gsm_cot": 80}
# the outputs the issue names (read before the split): development items
NAMED = {
    ("p0028", "84 minutes"),
    ("p0124", "Priya is 18 years old now."),
    ("p0117", "Priya is now 44 years old."),
    ("p0130", "72 years old"),
    ("p0127", "Kofi is 56 years old"),
    ("p0249", "42 km/h"),
}
NAMED_TEXTS = ("Priya's age = (4x22) / 2 =", "Wen = 40 + 4 * 4")


def _value(reference: str) -> Fraction | None:
    """The reference's number (an arithmetic expression of numbers evaluated exactly), for the draw's strata."""
    try:
        tree = ast.parse(reference.replace("^", "**").split("±")[0], mode="eval")
    except SyntaxError:
        return None

    def ev(n: ast.AST) -> Fraction:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and type(n.value) in (int, float):
            return Fraction(str(n.value))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
            a, b = ev(n.left), ev(n.right)
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b, ast.Div: a / b}[type(n.op)]
        raise ValueError

    try:
        return ev(tree)
    except (ValueError, ZeroDivisionError):
        return None


def _mentions(text: str, value: Fraction | None) -> bool:
    if value is None:
        return False
    for m in re.finditer(r"\d[\d,]*(?:\.\d+)?", text):
        try:
            if Fraction(m.group().replace(",", "")) == value:
                return True
        except ValueError:
            continue
    return False


def split_of(seed: int, key: str) -> str:
    return "development" if int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest(), 16) % 2 == 0 else "evaluation"


def _pool(results: dict, problems: dict[str, dict], gsm: list[dict]) -> dict[str, list[dict]]:
    """Every distinct output per stratum, as records that carry what the judge needs."""
    pools: dict[str, list[dict]] = {k: [] for k in DRAW}
    seen: set[tuple[str, str]] = set()
    rec = results["recurring"]
    for r in [*rec["failed"], *rec["solved_by_sampling"]]:
        row = problems[r["id"]]
        value = _value(row["reference"])
        for k, a in enumerate(r["attempts"]):
            if (r["id"], a["answer"]) in seen:
                continue
            seen.add((r["id"], a["answer"]))
            item = {
                "id": f"recurring/{r['id']}/attempt/{k}",
                "source": "docs/eval/results.json recurring attempts",
                "answer": a["answer"],
                "question": row["question"],
                "verifier": row["verifier"],
                "reference": row["reference"],
            }
            pools["recurring_with_reference" if _mentions(a["answer"], value) else "recurring_any"].append(item)
        if "grafted" in r:
            g = r["grafted"]
            pools["recalls"].append(
                {
                    "id": f"recurring/{r['id']}/recall",
                    "source": "docs/eval/results.json recurring recalls",
                    "answer": g["answer"],
                    "question": row["question"],
                    "verifier": row["verifier"],
                    "reference": row["reference"],
                }
            )
    for i, o in enumerate(results["outputs"]):
        if (o["item"] + o["query"], o["answer"]) in seen:
            continue
        seen.add((o["item"] + o["query"], o["answer"]))
        pools["eval_outputs"].append(
            {
                "id": f"outputs/{i}/{o['item']}/{o['condition']}",
                "source": "docs/eval/results.json outputs",
                "answer": o["answer"],
                "question": o["query"],
                "verifier": o["verifier"],
                "reference": o["reference"],
            }
        )
    for o in gsm:
        pools["gsm_cot"].append(
            {
                "id": f"gsm/{o['id']}/{o.get('seed')}",
                "source": str(GSM_OUTPUTS),
                "answer": o["answer"],
                "question": o["question"],
                "verifier": o["verifier"],
                "reference": o["reference"],
            }
        )
    return pools


def draw(seed: int = SEED, results_path: Path = RESULTS, gsm_path: Path = GSM_OUTPUTS) -> list[dict]:
    """The labelled set's outputs: the named ones, then each stratum's seeded sample; each with its split."""
    results = json.loads(results_path.read_text(encoding="utf-8"))
    problems = {r["id"]: r for r in map(json.loads, PROBLEMS.read_text(encoding="utf-8").splitlines()) if r}
    gsm = [json.loads(x) for x in gsm_path.read_text(encoding="utf-8").splitlines() if x.strip()] if gsm_path.exists() else []
    pools = _pool(results, problems, gsm)
    rng = random.Random(seed)
    out: list[dict] = []
    taken: set[str] = set()
    for items in pools.values():  # the named outputs first, wherever they stand
        for it in items:
            pid = it["id"].split("/")[1]
            if (pid, it["answer"]) in NAMED or it["answer"] in NAMED_TEXTS:
                out.append({**it, "stratum": "named in the issue", "split": "development"})
                taken.add(it["id"])
    for stratum, n in DRAW.items():
        items = [it for it in pools[stratum] if it["id"] not in taken]
        for it in rng.sample(items, min(n, len(items))):
            out.append({**it, "stratum": stratum, "split": split_of(seed, it["id"])})
            taken.add(it["id"])
    return out


def read_labels(drawn_path: Path = DRAWN, readings_path: Path = READINGS) -> list[dict]:
    """The drawn outputs joined with their readings; every drawn output must be labelled, with a reason."""
    drawn = [json.loads(x) for x in drawn_path.read_text(encoding="utf-8").splitlines() if x.strip()]
    readings = {r["id"]: r for r in map(json.loads, readings_path.read_text(encoding="utf-8").splitlines()) if r}
    out = []
    for d in drawn:
        r = readings.get(d["id"])
        if r is None or r.get("label") not in ("right", "wrong") or not r.get("reason"):
            raise ValueError(f"{d['id']}: every drawn output needs a label ('right' or 'wrong') and a reason")
        out.append({**d, "label": r["label"], "reason": r["reason"]})
    if len(readings) != len(out):
        raise ValueError(f"{len(readings) - len(out)} readings name no drawn output")
    return out


def report(labels: list[dict]) -> dict:
    """The one judge on every labelled output: agreement, false accepts and false refusals per split."""
    import verifiers

    out: dict = {"format": FORMAT, "judge": verifiers.JUDGE, "labels": len(labels), "splits": {}}
    for split in ("development", "evaluation"):
        rows = [r for r in labels if r["split"] == split]
        agree, fa, fr = 0, [], []
        for r in rows:
            v = verifiers.judge(r["answer"], r["verifier"], r["reference"], r["question"])
            right = r["label"] == "right"
            if v.ok == right:
                agree += 1
            elif v.ok:
                fa.append({"id": r["id"], "answer": r["answer"], "reason": r["reason"], "why": v.detail})
            else:
                fr.append({"id": r["id"], "answer": r["answer"], "reason": r["reason"], "why": v.detail})
        out["splits"][split] = {
            "outputs": len(rows),
            "labelled_right": sum(1 for r in rows if r["label"] == "right"),
            "agreement": round(agree / len(rows), 4) if rows else None,
            "false_accepts": len(fa),
            "false_refusals": len(fr),
            "false_accept_items": fa,
            "false_refusal_items": fr,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("command", choices=("draw", "report"))
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args(argv)
    if args.command == "draw":
        items = draw(args.seed)
        DRAWN.parent.mkdir(parents=True, exist_ok=True)
        DRAWN.write_text("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items), encoding="utf-8")
        print(f"drew {len(items)} outputs into {DRAWN}")
        return 0
    rep = report(read_labels())
    REPORT.write_text(json.dumps(rep, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for split, s in rep["splits"].items():
        print(
            f"{split}: {s['outputs']} outputs, agreement {s['agreement']}, false accepts {s['false_accepts']}, false refusals {s['false_refusals']}"
        )
    print(f"wrote {REPORT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

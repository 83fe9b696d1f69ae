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
GATE_JUDGING = ROOT / "docs" / "bench" / "gate-judging.json"
GSM_OUTPUTS = Path("/work/scratch/gsm-cot-outputs.jsonl")
GSM_GRAFT_OUTPUTS = Path("/work/scratch/gsm-graft-outputs.jsonl")  # the same questions answered with a graft
DRAWN = ROOT / "docs" / "eval" / "labels" / "drawn.jsonl"
READINGS = ROOT / "docs" / "eval" / "labels" / "readings.jsonl"
REPORT = ROOT / "docs" / "eval" / "labels-report.json"
MATH_VERIFY = ROOT / "docs" / "eval" / "labels-math-verify.jsonl"  # scripts/math_verify_labels.py's verdicts
SOURCES = ROOT / "docs" / "eval" / "labels" / "sources.json"  # the sha256 of each source when a round was drawn
SEED = 40
FORMAT = "kvgraft-judge-labels/1"

# strata: how many distinct outputs each source gives (fewer when it has fewer)
DRAW = {"recurring_with_reference": 140, "recurring_any": 60, "recalls": 12, "eval_outputs": 100, "gsm_cot": 0}  # no GSM file yet
DRAW_2 = {
    "recurring_with_reference": 60,
    "recurring_any": 25,
    "recalls": 0,
    "eval_outputs": 45,
    "gsm_cot": 100,
    "gate_generations": 60,
    "gsm_graft": 60,
}
# round 3, after kvgraft-judge/3: the GSM-Symbolic run's own records (the committed results file), chiefly the
# sampled attempts of its recurring cases, where an accepted attempt decides that a problem counts as solved
DRAW_3 = {
    "gsm_sampled_accepted": 10_000,  # every attempt the judge accepts (all of them: each decides a verdict)
    "gsm_sampled_with_reference": 60,  # attempts that write the reference's number, accepted or not
    "gsm_sampled_any": 20,
    "gsm_steps": 20,  # zero-shot chain-of-thought answers (set original-steps), without and with a graft
    "gsm_qa_recalls": 20,  # the zero-shot grafted answers (set original-qa, condition graft)
}
GSM_RESULTS = ROOT / "docs" / "eval" / "gsm-results.json"
# Round 1's evaluation half was scored once (b00a7ac: 127/131, 4 false accepts) and rules were then written on
# it (81e90c6), so it is development now; round 2 is drawn fresh for the evaluation.
ROUNDS = (
    {"seed": SEED, "strata": DRAW, "drawn": DRAWN, "readings": READINGS},
    {
        "seed": SEED + 1,
        "strata": DRAW_2,
        "drawn": DRAWN.with_name("drawn-2.jsonl"),
        "readings": READINGS.with_name("readings-2.jsonl"),
    },
    {
        "seed": SEED + 2,
        "strata": DRAW_3,
        "drawn": DRAWN.with_name("drawn-3.jsonl"),
        "readings": READINGS.with_name("readings-3.jsonl"),
    },
)
FIRST_LOOK = {"round": 1, "commit": "b00a7ac", "outputs": 131, "agreement": 0.9695, "false_accepts": 4, "false_refusals": 0}
# round 3's evaluation items scored once under kvgraft-judge/3 (9dd685a), the three /3 was written on left out:
# 115/118, then rules (kvgraft-judge/4) were written on the three it got wrong, so they are development now
FIRST_LOOK_3 = {"round": 3, "commit": "9dd685a", "outputs": 118, "agreement": 0.9746, "false_accepts": 1, "false_refusals": 2}
# round 3's outputs a rule was written on: before the draw (kvgraft-judge/3, from reading the zero-shot case's
# passing attempts) and after its first look (kvgraft-judge/4); development items, whatever split they drew
WRITTEN_ON = {
    "gsm3/gsm0012-original-qa/seed/379": "kvgraft-judge/3 rule 4d: the last of lettered options",
    "gsm3/gsm0017-original-qa/seed/353": "kvgraft-judge/3: a supposition hedges",
    "gsm3/gsm0007-original-qa/seed/36": "kvgraft-judge/3: digits of a symbol are not numbers",
    "gsm3/gsm0007-original/seed/85": "kvgraft-judge/4 rule 4b: the last answer sentence decides (it asserts 2 (2) = 4 (2))",
    "gsm3/gsm0002-original/seed/287": "kvgraft-judge/4 rule 4b: the last answer sentence decides ('The answer is 25.')",
    "gsm3/gsm0017-original-qa/seed/29": "kvgraft-judge/4 rule 4c: a bare option marker carries nothing",
}
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


def split_key(seed: int, key: str) -> int:
    return int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest(), 16)


def split_of(seed: int, key: str) -> str:
    return "development" if split_key(seed, key) % 2 == 0 else "evaluation"


def _pool(
    results: dict, problems: dict[str, dict], gsm: list[dict], gate: dict, grafted: list[dict] = ()
) -> dict[str, list[dict]]:
    """Every distinct output per stratum, as records that carry what the judge needs."""
    pools: dict[str, list[dict]] = {k: [] for k in DRAW_2}
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
    seen_gate: set[tuple[str, str]] = set()
    for row in gate.get("candidates", []):
        for run in ("fact_run", "graft_run"):
            text = row[run]["text"]
            if (row["item"], text) in seen_gate or not text.strip():
                continue
            seen_gate.add((row["item"], text))
            pools["gate_generations"].append(
                {
                    "id": f"gate/{row['item']}/{row['form'].replace(' ', '-')}/{run}",
                    "source": "docs/bench/gate-judging.json candidates",
                    "answer": text,
                    "question": row["question"],
                    "verifier": row["verifier"],
                    "reference": row["reference"],
                }
            )
    for o in grafted:
        pools["gsm_graft"].append(
            {
                "id": f"gsm-graft/{o['id']}/{o.get('seed')}",
                "source": str(GSM_GRAFT_OUTPUTS),
                "answer": o["answer"],
                "question": o["question"],
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


def _gsm_pool(results: dict, earlier: set[tuple[str, str]]) -> dict[str, list[dict]]:
    """Round 3's strata from the GSM-Symbolic results file: every distinct (question, answer) not drawn before."""
    import verifiers

    pools: dict[str, list[dict]] = {k: [] for k in DRAW_3}
    seen = set(earlier)

    def add(stratum: str, rid: str, row: dict, answer: str) -> None:
        if (row["question"], answer) in seen or not answer.strip():
            return
        seen.add((row["question"], answer))
        keep = {k: row[k] for k in ("question", "verifier", "reference")}
        pools[stratum].append({"id": rid, "source": _rel(GSM_RESULTS), "answer": answer, **keep})

    for key in ("recurring", "recurring_qa", "recurring_steps"):
        for p in (results.get(key) or {}).get("problems", []):
            value = _value(p["reference"])
            for a in p["attempts"]:
                if a["mode"] != "sampled":
                    continue
                if verifiers.judge(a["answer"], p["verifier"], p["reference"], p["question"]).ok:
                    stratum = "gsm_sampled_accepted"
                else:
                    stratum = "gsm_sampled_with_reference" if _mentions(a["answer"], value) else "gsm_sampled_any"
                add(stratum, f"gsm3/{p['id']}/seed/{a['seed']}", p, a["answer"])
    for o in results["outputs"]:
        if o["set"] == "original-steps":
            add("gsm_steps", f"gsm3/{o['id']}/{o['condition']}", o, o["answer"])
        elif o["set"] == "original-qa" and o["condition"] == "graft":
            add("gsm_qa_recalls", f"gsm3/{o['id']}/{o['condition']}", o, o["answer"])
    return pools


def _earlier_texts(round_no: int) -> set[tuple[str, str]]:
    out = set()
    for rnd in ROUNDS[: round_no - 1]:
        for x in rnd["drawn"].read_text(encoding="utf-8").splitlines():
            if x.strip():
                d = json.loads(x)
                out.add((d["question"], d["answer"]))
    return out


def draw_gsm(seed: int, round_no: int, results_path: Path = GSM_RESULTS) -> list[dict]:
    """Round 3 (and later): each stratum's seeded sample from the GSM-Symbolic results file, none drawn (by its
    question and answer) in an earlier round; all in the evaluation split (drawn after the rules were frozen, and
    no rule is to be written on them)."""
    pools = _gsm_pool(json.loads(results_path.read_text(encoding="utf-8")), _earlier_texts(round_no))
    rng = random.Random(seed)
    out = []
    for stratum, n in ROUNDS[round_no - 1]["strata"].items():
        items = sorted(pools[stratum], key=lambda it: it["id"])
        for it in rng.sample(items, min(n, len(items))):
            out.append({**it, "stratum": stratum, "split": "evaluation", "round": round_no})
    return out


def draw(seed: int = SEED, results_path: Path = RESULTS, gsm_path: Path = GSM_OUTPUTS, round_no: int = 1) -> list[dict]:
    """One round's outputs: (round 1) the named ones, then each stratum's seeded sample, none drawn in an
    earlier round; each with its split (round 1: by hash; round 2: the GSM outputs by hash, the rest evaluation)."""
    results = json.loads(results_path.read_text(encoding="utf-8"))
    problems = {r["id"]: r for r in map(json.loads, PROBLEMS.read_text(encoding="utf-8").splitlines()) if r}
    gsm = [json.loads(x) for x in gsm_path.read_text(encoding="utf-8").splitlines() if x.strip()] if gsm_path.exists() else []
    gate = json.loads(GATE_JUDGING.read_text(encoding="utf-8")) if round_no > 1 else {}
    grafted = []
    if round_no > 1 and GSM_GRAFT_OUTPUTS.exists():
        grafted = [json.loads(x) for x in GSM_GRAFT_OUTPUTS.read_text(encoding="utf-8").splitlines() if x.strip()]
    pools = _pool(results, problems, gsm, gate, grafted)
    rng = random.Random(seed)
    out: list[dict] = []
    taken: set[str] = set()
    for earlier in ROUNDS[: round_no - 1]:
        taken |= {json.loads(x)["id"] for x in earlier["drawn"].read_text(encoding="utf-8").splitlines() if x.strip()}
    for items in pools.values() if round_no == 1 else ():  # the named outputs first, wherever they stand
        for it in items:
            pid = it["id"].split("/")[1]
            if (pid, it["answer"]) in NAMED or it["answer"] in NAMED_TEXTS:
                out.append({**it, "stratum": "named in the issue", "split": "development", "round": 1})
                taken.add(it["id"])
    kept = {}  # a redraw keeps the outputs already drawn in this round (the GSM file grows while it is written)
    if round_no > 1 and ROUNDS[round_no - 1]["drawn"].exists():
        kept = {json.loads(x)["id"] for x in ROUNDS[round_no - 1]["drawn"].read_text(encoding="utf-8").splitlines() if x}
    for stratum, n in ROUNDS[round_no - 1]["strata"].items():
        items = [it for it in pools[stratum] if it["id"] not in taken]
        if stratum in ("gsm_cot", "gsm_graft"):  # stable as the file grows: the outputs already drawn, then by hash
            again = [it for it in items if it["id"] in kept]
            rest = sorted((it for it in items if it["id"] not in kept), key=lambda it: split_key(seed, it["id"]))
            chosen = (again + rest)[: max(n, len(again))]
        else:
            chosen = rng.sample(items, min(n, len(items)))
        for it in chosen:
            split = split_of(seed, it["id"]) if round_no == 1 or stratum.startswith("gsm") else "evaluation"
            out.append({**it, "stratum": stratum, "split": split, "round": round_no})
            taken.add(it["id"])
    return out


def read_labels() -> list[dict]:
    """Every round's drawn outputs joined with their readings (each must be labelled, with a reason), with the
    role each plays: round 1 is development (see ROUNDS), later rounds keep the split they were drawn with, but
    an output a rule was written on (WRITTEN_ON) is development."""
    out = []
    for n, rnd in enumerate(ROUNDS, 1):
        if not rnd["drawn"].exists():
            continue
        drawn = [json.loads(x) for x in rnd["drawn"].read_text(encoding="utf-8").splitlines() if x.strip()]
        text = rnd["readings"].read_text(encoding="utf-8") if rnd["readings"].exists() else ""
        readings = {r["id"]: r for r in map(json.loads, text.splitlines()) if r}
        for d in drawn:
            r = readings.get(d["id"])
            if r is None or r.get("label") not in ("right", "wrong") or not r.get("reason"):
                raise ValueError(f"{d['id']}: every drawn output needs a label ('right' or 'wrong') and a reason")
            role = "development" if n == 1 or d["id"] in WRITTEN_ON else d["split"]
            out.append({**d, "round": n, "role": role, "label": r["label"], "reason": r["reason"]})
        if len(readings) != len(drawn):
            raise ValueError(f"round {n}: {len(readings) - len(drawn)} readings name no drawn output")
    return out


def report(labels: list[dict]) -> dict:
    """The one judge on every labelled output: agreement, false accepts and false refusals per split."""
    import verifiers

    out: dict = {
        "format": FORMAT,
        "judge": verifiers.JUDGE,
        "labels": len(labels),
        "first_look": [FIRST_LOOK, FIRST_LOOK_3],
        "splits": {},
    }
    for split in ("development", "evaluation"):
        rows = [r for r in labels if r["role"] == split]
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
            "gsm_ids": sorted({r["id"].split("/")[1] for r in rows if r["stratum"].startswith("gsm")}),
            "by_source": {k: sum(1 for r in rows if r["stratum"] == k) for k in sorted({r["stratum"] for r in rows})},
            "labelled_right": sum(1 for r in rows if r["label"] == "right"),
            "agreement": round(agree / len(rows), 4) if rows else None,
            "false_accepts": len(fa),
            "false_refusals": len(fr),
            "false_accept_items": fa,
            "false_refusal_items": fr,
        }
    mv = MATH_VERIFY
    if mv.exists():  # HF's math-verify on the same outputs (scripts/math_verify_labels.py): a measurement only
        theirs = {r["id"]: r["ok"] for r in map(json.loads, mv.read_text(encoding="utf-8").splitlines()) if r}
        out["math_verify"] = {"package": "math-verify==0.9.0", "note": "numeric and sympy items only; default extraction"}
        for split in ("development", "evaluation"):
            rows = [r for r in labels if r["role"] == split and r["id"] in theirs]
            ours = {r["id"]: verifiers.judge(r["answer"], r["verifier"], r["reference"], r["question"]).ok for r in rows}
            out["math_verify"][split] = {
                "outputs": len(rows),
                **{
                    name: {
                        "agreement": round(sum(v[r["id"]] == (r["label"] == "right") for r in rows) / len(rows), 4)
                        if rows
                        else None,
                        "false_accepts": sum(v[r["id"]] and r["label"] == "wrong" for r in rows),
                        "false_refusals": sum(not v[r["id"]] and r["label"] == "right" for r in rows),
                    }
                    for name, v in (("math_verify", theirs), ("judge", ours))
                },
            }
    return out


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("command", choices=("draw", "report"))
    p.add_argument("--round", type=int, default=len(ROUNDS), choices=range(1, len(ROUNDS) + 1))
    args = p.parse_args(argv)
    if args.command == "draw":
        rnd = ROUNDS[args.round - 1]
        items = draw(rnd["seed"], round_no=args.round) if args.round < 3 else draw_gsm(rnd["seed"], args.round)
        if rnd["readings"].exists():  # a redraw (more GSM outputs) must keep every output already read
            read = {json.loads(x)["id"] for x in rnd["readings"].read_text(encoding="utf-8").splitlines() if x.strip()}
            lost = read - {it["id"] for it in items}
            if lost:
                raise SystemExit(f"error: the redraw drops {len(lost)} outputs already labelled, e.g. {sorted(lost)[:3]}")
        sources = json.loads(SOURCES.read_text(encoding="utf-8")) if SOURCES.exists() else {}
        paths = {1: (RESULTS,), 2: (RESULTS, GATE_JUDGING, GSM_OUTPUTS, GSM_GRAFT_OUTPUTS)}.get(args.round, (GSM_RESULTS,))
        sources[str(args.round)] = {_rel(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.exists()}
        SOURCES.write_text(json.dumps(sources, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        rnd["drawn"].parent.mkdir(parents=True, exist_ok=True)
        rnd["drawn"].write_text("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items), encoding="utf-8")
        print(f"drew {len(items)} outputs into {rnd['drawn']}")
        return 0
    rep = report(read_labels())
    REPORT.write_text(json.dumps(rep, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for split, s in rep["splits"].items():
        print(
            f"{split}: {s['outputs']} outputs, agreement {s['agreement']}, false accepts {s['false_accepts']}, "
            f"false refusals {s['false_refusals']}"
        )
    print(f"wrote {REPORT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

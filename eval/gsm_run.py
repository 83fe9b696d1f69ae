"""`python -m eval.gsm_run`: the benchmark eval (eval/benchmark.py) on the real model, in phases that resume.

Each phase appends its records to a JSON-lines file in `--work` (fsynced per record) and skips what is there,
so a run that stops resumes; the store (catalog, blobs, the deposited originals) lives in `--work` too.
Phases, in the order they are worth running: `no-graft` (greedy cot answers, nothing grafted), `deposit` (each
original's worked solution through the gate), `graft` (the same answers through retrieval + relevance),
`recurring` (sampled cot attempts on the originals the greedy answer failed, eval/gsm_recurring.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import retrieval  # noqa: E402,F401  (faiss before torch)
import verifiers  # noqa: E402
from eval import benchmark, gsm  # noqa: E402
from graft_core import templates  # noqa: E402


def items(work: Path, seed: int, sets: list[str], n: int) -> dict[str, list[dict]]:
    """The first `n` templates' items of `sets`, derived from the installed package once and kept in `work`."""
    out = {}
    for s in sets:
        base_set, _, form = s.partition("-")
        if form:  # the same items asked in another query form (`qa`, `steps`: graft_core.templates)
            templates.check_form(form)
            base = items(work, seed, [base_set], n)[base_set]
            out[s] = [it | {"id": f"{it['id']}-{form}", "set": s, "form": form} for it in base]
            continue
        path = work / f"items-{s}-n{n}-seed{seed}-{gsm.version()}.json"
        if not path.exists():
            path.write_text(json.dumps(gsm.load(seed, templates_n=n, sets=(s,))[s]), encoding="utf-8")
        out[s] = json.loads(path.read_text(encoding="utf-8"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("phase", choices=("no-graft", "deposit", "graft", "recurring"))
    p.add_argument("--work", type=Path, required=True, help="folder for the store, the items and the records")
    p.add_argument("--sets", default="original,numbers,names", help="comma-separated sets, in order")
    p.add_argument("--n", type=int, default=100, help="templates per set (the first n)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=50_000, help="recurring: tokens per problem (every attempt's)")
    p.add_argument("--problems", type=int, default=8, help="recurring: greedy failures sampled, in seeded order")
    p.add_argument("--form", default="cot", choices=templates.FORMS[1:], help="recurring: the query form of attempts and recalls")
    p.add_argument("--together", type=int, default=8, help="recurring: sampled attempts a round (one prompt computation)")
    p.add_argument(
        "--resume-undecided",
        action="store_true",
        help="recurring: go on sampling the problems whose attempts stop short of the budget without one the current judge passes",
    )
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    import services

    sets = ["original"] if args.phase in ("deposit", "recurring") else args.sets.split(",")
    data = items(args.work, args.seed, sets, args.n)
    lib = services.Library(home=args.work / "store")
    from graft_core.determinism import pinned_threads

    meta = {"model": lib.lm.info.name, "model_fingerprint": lib.lm.fingerprint, "torch_threads": pinned_threads()}
    (args.work / "model.json").write_text(json.dumps(meta), encoding="utf-8")
    log = lambda m: print(m, flush=True)  # noqa: E731
    if args.phase == "deposit":
        out = args.work / "deposits.jsonl"
        done = {r["id"] for r in benchmark.read_jsonl(out) if r["verdict"] == "accepted" or r.get("judge") == verifiers.JUDGE}
        benchmark.deposit_all(lib, [it for it in data["original"][: args.n] if it["id"] not in done], out, log)
    elif args.phase == "recurring":
        _recurring(lib, args, log)
    else:
        for s in sets:
            benchmark.run(lib, data[s][: args.n], args.phase, args.work / "outputs.jsonl", log)
    lib.close()
    return 0


def recurring_file(form: str, budget: int, seed: int) -> str:
    return f"recurring-b{budget}-s{seed}.jsonl" if form == "cot" else f"recurring-{form}-b{budget}-s{seed}.jsonl"


def _recurring(lib, args, log) -> None:
    from eval import gsm_recurring
    from graft_core.batch import WIDTHS, Batcher

    cfg = gsm_recurring.CaseConfig(budget=args.budget, seed=args.seed, form=args.form, together=args.together)
    want = "original" if args.form == "cot" else f"original-{args.form}"
    rows = [r for r in benchmark.read_jsonl(args.work / "outputs.jsonl") if r["condition"] == "no-graft" and r["set"] == want]
    greedy = {r["id"]: r for r in rows}
    # the greedy failures whose worked solution the gate accepted (the gate came first, as eval/recurring's
    # gate_first: a problem without a verified solution in the store has nothing to be recalled from)
    accepted = {d["id"] for d in benchmark.read_jsonl(args.work / "deposits.jsonl") if d["verdict"] == "accepted"}
    failed = [i for i, r in greedy.items() if not benchmark.score(r)["ok"] and r["id"].split("-")[0] + "-original" in accepted]
    out = args.work / recurring_file(args.form, args.budget, args.seed)
    done = {r["id"] for r in benchmark.read_jsonl(out)}
    batcher = Batcher(lib.lm.model, widths=tuple(sorted({*WIDTHS, cfg.together})))
    if args.resume_undecided:
        _resume(lib, out, greedy, batcher, log)
        return
    for pid in gsm_recurring.order(failed, args.seed)[: args.problems]:
        if pid in done:
            continue
        rec = gsm_recurring.baseline(lib, greedy[pid], cfg, batcher)
        benchmark.append_jsonl(out, rec | {"config": cfg.as_dict()})
        log(
            f"recurring {pid}: {'solved' if rec['solved'] else 'not solved'} in {rec['attempts_n']} attempts, "
            f"{rec['baseline_tokens']} tokens, {rec['seconds']} s"
        )


def _resume(lib, out: Path, greedy: dict, batcher, log) -> None:
    """Each undecided record (no attempt the current judge passes, budget not spent) sampled on to its budget
    under its own config; the file rewritten whole (atomically) after each."""
    from eval import gsm_recurring

    rows = benchmark.read_jsonl(out)
    for i, rec in enumerate(rows):
        cfg = gsm_recurring.CaseConfig(**rec["config"])
        judged = any(gsm_recurring._passes(rec)(a["answer"]) for a in rec["attempts"])
        if judged or gsm_recurring.exhausted(rec, rec["config"]):
            continue
        new = gsm_recurring.baseline(lib, greedy[rec["id"]], cfg, batcher, earlier=rec)
        rows[i] = new | {"config": rec["config"]}
        tmp = out.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        os.replace(tmp, out)
        log(
            f"resumed {rec['id']}: {'solved' if new['solved'] else 'not solved'} in {new['attempts_n']} attempts, "
            f"{new['baseline_tokens']} tokens"
        )


if __name__ == "__main__":
    sys.exit(main())

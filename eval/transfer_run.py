"""`python -m eval.transfer_run PHASE --work W`: the held-out transfer eval (eval/transfer.py) in phases that resume.

Run `python -m eval.gsm_run deposit --work W --n N` first (the library: each template's original through the real
gate, into W's store). Then, in any order, each appending to W/transfer.jsonl and skipping what is there:
`zero-shot`, `few-shot` (deposits the eight exemplars once, then writes the prefilled and the grafted record of
each problem), `transfer`, `control`. The held-out problems are W's `numbers` items (eval/gsm_run.items).
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
from eval import benchmark, gsm_run, transfer  # noqa: E402

PHASES = ("zero-shot", "few-shot", "transfer", "control")
OUT = "transfer.jsonl"


def accepted(work: Path) -> dict[int, str]:
    """template -> the artifact of its original's accepted deposit (W/deposits.jsonl)."""
    rows = benchmark.latest_deposits(benchmark.read_jsonl(work / "deposits.jsonl"))
    return {d["template"]: d["artifact"] for d in rows if d["verdict"] == "accepted"}


def exemplars_artifact(lib, work: Path) -> str:
    """The eight exemplars deposited once (free text, as the deposit form takes it); its id kept in W."""
    path = work / "exemplars.json"
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))["artifact"]
    d = lib.deposit_text(transfer.exemplars_text(), title="gsm8k-cot exemplars", admin=True)
    path.write_text(json.dumps({"artifact": d.id, "tokens": d.tokens}), encoding="utf-8")
    return d.id


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("phase", choices=PHASES)
    p.add_argument("--work", type=Path, required=True, help="the folder of `eval.gsm_run deposit` (store, items, records)")
    p.add_argument("--n", type=int, default=100, help="templates (the first n)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import services

    held_out = gsm_run.items(args.work, args.seed, ["numbers"], args.n)["numbers"][: args.n]
    lib = services.Library(home=args.work / "store")
    out = args.work / OUT
    log = lambda m: print(m, flush=True)  # noqa: E731
    artifacts = None
    if args.phase == "few-shot":
        art = exemplars_artifact(lib, args.work)
        artifacts = {it["template"]: art for it in held_out}
    elif args.phase == "control":
        artifacts = transfer.controls(accepted(args.work), [it["template"] for it in held_out], args.seed)
    transfer.run(lib, held_out, args.phase, out, artifacts, log)
    lib.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

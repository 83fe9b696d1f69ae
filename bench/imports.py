"""What an import's proof costs: every artifact of a bundle is recomputed from its own tokens and compared
byte for byte before anything is written, so an import pays a prefill per artifact.

Run from the repository root: `.venv/bin/python -m bench.imports` (a few minutes on 2 cores, real model).
Deposits fact sheets of several lengths into a temporary store, exports them, then imports the bundle into
fresh stores `--rounds` times, with and without the model (`--no-model-check`, which recomputes nothing and
quarantines). Writes docs/bench/imports.json and prints a markdown table: seconds per 1,000 tokens imported,
beside the seconds per 1,000 tokens of the deposits' own prefills (what the proof repeats).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench" / "imports.json"
SENTENCE = "The harbour master of Quenmora in the year {} kept the tide book, the pilot roster and the lamp oil accounts. "
LENGTHS = (1, 8, 32, 96)  # sentences per fact sheet (about 22 tokens each)


def _sheets() -> list[str]:
    return [f"Fact sheet {n}: " + "".join(SENTENCE.format(1800 + i) for i in range(n)) for n in LENGTHS]


def _deposit_and_export(lm, home: Path, out: Path) -> tuple[list, float]:
    import services

    lib = services.Library(home=home, lm=lm)
    t = time.perf_counter()
    deposited = [lib.deposit_text(text, title=f"sheet {i}") for i, text in enumerate(_sheets())]
    deposit_s = time.perf_counter() - t
    services.export_bundle(lib, [d.id for d in deposited], out)
    lib.close()
    return deposited, deposit_s


def _import_once(lm, bundle: Path, home: Path, check_model: bool) -> tuple[float, object]:
    import services

    lib = services.Library(home=home, lm=lm)
    t = time.perf_counter()
    rep = services.import_bundle(lib, bundle, check_model=check_model)
    took = time.perf_counter() - t
    lib.close()
    return took, rep


def measure(rounds: int) -> dict:
    import retrieval  # noqa: F401  (faiss before torch)
    from graft_core import model

    lm = model.load()
    with tempfile.TemporaryDirectory(prefix="kvgraft-bench-imports-") as tmp:
        tmp = Path(tmp)
        bundle = tmp / "sheets.tar"
        deposited, deposit_s = _deposit_and_export(lm, tmp / "source", bundle)
        tokens = sum(d.tokens for d in deposited)
        proved, unproved = [], []
        for r in range(rounds):
            took, rep = _import_once(lm, bundle, tmp / f"proved-{r}", check_model=True)
            assert rep.probes_checked == len(deposited), rep
            proved.append(took)
            took, rep = _import_once(lm, bundle, tmp / f"unproved-{r}", check_model=False)
            assert rep.probes_checked == 0, rep
            unproved.append(took)
    per_k = lambda s: s / tokens * 1000  # noqa: E731
    return {
        "artifacts": len(deposited),
        "tokens": tokens,
        "tokens_per_artifact": [d.tokens for d in deposited],
        "rounds": rounds,
        "deposit_s": deposit_s,
        "deposit_s_per_1k_tokens": per_k(deposit_s),
        "import_proved_s": proved,
        "import_proved_s_median": statistics.median(proved),
        "import_proved_s_per_1k_tokens": per_k(statistics.median(proved)),
        "import_unproved_s": unproved,
        "import_unproved_s_median": statistics.median(unproved),
        "import_unproved_s_per_1k_tokens": per_k(statistics.median(unproved)),
        "model_fingerprint": lm.fingerprint,
    }


def table(r: dict) -> str:
    return "\n".join(
        [
            f"{r['artifacts']} artifacts, {r['tokens']:,} tokens; medians of {r['rounds']} imports into fresh stores",
            "",
            "| what | seconds | seconds per 1,000 tokens |",
            "|---|---:|---:|",
            f"| the deposits' own prefills (once) | {r['deposit_s']:.2f} | {r['deposit_s_per_1k_tokens']:.2f} |",
            f"| import, every artifact recomputed and compared | {r['import_proved_s_median']:.2f} | {r['import_proved_s_per_1k_tokens']:.2f} |",
            f"| import `--no-model-check` (quarantined, nothing recomputed) | {r['import_unproved_s_median']:.2f} | {r['import_unproved_s_per_1k_tokens']:.2f} |",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    load_before = os.getloadavg()
    result = measure(args.rounds)
    record = {
        "command": f"python -m bench.imports --rounds {args.rounds}",
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        **result,
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(table(record))


if __name__ == "__main__":
    main()

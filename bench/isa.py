"""fma16's builds side by side on the real model: one forward's layer products and the vocabulary product
at 1 and 16 rows, per variant (kernels/fma16.py VARIANTS), in ms (median, fastest); and whether they gave the same bytes.

    KVGRAFT_KERNEL_CACHE=tmp/kernels .venv/bin/python -m bench.isa [--repeats 5]

Loads the packaged model once; each variant multiplies the same weights (the GGUF blocks where the model
reads them) through `fma16.linear(..., isa=...)`. Prints one JSON object; nothing is written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows", default="1,16")
    args = ap.parse_args()

    from graft_core import model
    from kernels import build, fma16

    lm = model.load()
    ops = [fma16.product_of(m) for m in lm.model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    vocab = fma16.product_of(lm.model.lm_head)
    assert all(ops) and vocab is not None, f"fma16 did not take the products over: {lm.products}"
    gen = torch.Generator().manual_seed(0)
    out = {"threads": torch.get_num_threads(), "products": lm.products, "layer_products": len(ops), "rows": {}}
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(rows, k, generator=gen) for k in {op.k for op in ops} | {vocab.k}}
        per = {}
        for isa in build.runnable():

            def layers(isa=isa, xs=xs):
                return [fma16.linear(xs[op.k], op.source, op.fmt, op.n, isa=isa) for op in ops]

            def vocab_product(isa=isa, xs=xs):
                return fma16.linear(xs[vocab.k], vocab.source, vocab.fmt, vocab.n, isa=isa)

            digest = hashlib.sha256(b"".join(y.numpy().tobytes() for y in [*layers(), vocab_product()])).hexdigest()
            repeats = args.repeats if isa != "portable" else max(1, args.repeats // 3)
            per[isa] = {"layers_ms": _ms(layers, repeats), "vocab_ms": _ms(vocab_product, repeats), "sha256": digest[:16]}
        out["rows"][str(rows)] = per
        out["rows"][str(rows)]["same_bytes"] = len({v["sha256"] for v in per.values()}) == 1
    print(json.dumps(out, indent=1))


def _ms(fn, repeats: int) -> tuple[float, float]:
    """(median, fastest) ms of `repeats` calls: on a shared machine the fastest is the one least disturbed."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2), round(min(times), 2)


if __name__ == "__main__":
    main()

"""A/B of kvgraft-f32-v2 against the torch path (fma16 products, SDPA, ATen's norms), in one process: fresh
prefill + question, and the grafted question's time to first token, on the packaged model.

"Before" is fma16's products with SDPA attention and ATen's RMSNorm, GELU and rotary tables (the
definition's forwards taken off, the attention implementation set back to "sdpa"); rounds alternate so
both see the same machine load. Grafted and fresh logits are compared byte for byte on each path.
    .venv/bin/python -m bench.numerics [--tokens 2048] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bench.ttft import text_tokens
from graft_core import model
from graft_core.capture import capture
from graft_core.forward import forward_chunk, new_cache
from graft_core.graft import restore

QUESTION = "\nQuestion: Which ship carried the most barrels?\nAnswer:"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    lm = model.load()
    m = lm.model
    taken = {
        mod: mod.forward
        for mod in m.modules()
        if type(mod.__dict__.get("forward")).__module__ == "graft_core.numerics"  # the definition's forwards
    }
    assert taken, "kvgraft-f32-v2 is not in use here (fma16 unavailable or KVGRAFT_LINEAR=torch)"

    def use(v2: bool) -> None:
        m.config._attn_implementation = "kvgraft" if v2 else "sdpa"
        for mod, f in taken.items():
            if v2:
                mod.forward = f
            else:
                mod.__dict__.pop("forward", None)

    ids = text_tokens(lm, args.tokens)
    q = list(lm.tokenizer(QUESTION, add_special_tokens=False)["input_ids"])
    arts = {}
    for v2 in (True, False):
        use(v2)
        arts[v2], _ = capture(lm, ids)
    out = {"tokens": len(ids), "question": len(q), "kvgraft-f32-v2": {"fresh_s": [], "grafted_s": []}}
    out["before"] = {"fresh_s": [], "grafted_s": []}
    for _ in range(args.rounds):
        for v2 in (True, False):
            use(v2)
            r = out["kvgraft-f32-v2" if v2 else "before"]
            t = time.perf_counter()
            cache = new_cache(m)
            forward_chunk(m, cache, ids, 0)
            fresh = forward_chunk(m, cache, q, len(ids))
            r["fresh_s"].append(round(time.perf_counter() - t, 3))
            t = time.perf_counter()
            grafted = forward_chunk(m, restore(lm, [arts[v2]]), q, len(ids))
            r["grafted_s"].append(round(time.perf_counter() - t, 3))
            assert torch.equal(fresh, grafted), "grafted and fresh logits differ"
    use(True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()

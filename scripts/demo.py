"""A one-minute end-to-end demo on the default model, in a throwaway store:
deposit a verified item through the gate (the model must answer it with the graft), show a
contradicting one refused, ask the question with and without the graft, and print the byte-exactness
check and the measured savings.  Usage: make demo  (or .venv/bin/python -m scripts.demo)
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import retrieval  # noqa: E402,F401  (faiss before torch: services does not import it)
import services  # noqa: E402
from errors import VerificationFailed  # noqa: E402
from services import AnswerOptions

ITEM = dict(
    question="Who built the lighthouse of Varnek Isle?",
    solution="The lighthouse of Varnek Isle was built by the engineer Osric Pellamy in 1874.",
    answer="Osric Pellamy",
    verifier="exact",
    reference="Osric Pellamy",
)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kvgraft-demo-") as home:
        lib = services.Library(home=home)
        print(f"model: {lib.lm.info.name} (fingerprint {lib.lm.fingerprint[:16]}...)")
        d = lib.deposit_item(**ITEM)
        print(
            f"deposited {d.id[:16]}...: {d.tokens} tokens, {d.bytes:,} bytes, {d.provenance} by {d.verifier}, "
            f"prefill {d.prefill_s:.2f} s; gate {d.gate_s:.2f} s / {d.gate_tokens} tokens"
        )
        try:
            lib.deposit_item(**{**ITEM, "solution": "The lighthouse of Varnek Isle was built by the mason Edda Korr in 1874."})
        except VerificationFailed as e:
            print(f"a contradicting solution with the same typed answer: refused ({e})")
        plain = lib.answer(ITEM["question"], AnswerOptions(graft=False, max_new_tokens=16))
        print(f"\nwithout graft: {plain.answer!r}")
        r = lib.answer(
            "Which engineer built the Varnek Isle lighthouse?", AnswerOptions(check=True, compare=True, max_new_tokens=16)
        )
        print(f"with graft (a paraphrase, found by retrieval at similarity {r.retrieved[0].score:.3f}): {r.answer!r}")
        print(f"  grafted {r.grafted_tokens} tokens, computed {r.computed_tokens}, decoded {r.decode_tokens}")
        c = r.check
        print(
            f"  exactness: {'EXACT' if c.exact else 'NOT EXACT'}  fresh {c.fresh_sha256[:16]}  grafted {c.grafted_sha256[:16]}"
            f"  KL {c.kl}  argmax agreement {c.argmax_agreement:.0%} over {c.rows} rows"
        )
        print(f"  one-pass forward (another schedule, never 'exact'): max |diff| {c.monolithic_max_abs_diff:.2e}")
        b = r.baseline
        print(
            f"  no-graft baseline (measured): {b.prefill_tokens} prefill tokens, TTFT {b.ttft_s * 1000:.0f} ms vs "
            f"{r.ttft_s * 1000:.0f} ms grafted ({r.ttft_speedup:.1f}x); FLOPs ratio {r.savings.flops_ratio:.1f}x (estimate)"
        )
        lib.close()


if __name__ == "__main__":
    main()

"""bench/kernels.py on the tiny Gemma-3: the staged TTFT is the computation an answer serves (its row is
byte-equal to the engine's), the profiler split adds up, and every kernel figure and bit property is
measured from this process's products, not written down."""

from __future__ import annotations

from bench import kernels, peer
from tests.test_maintenance import make_lib


def test_stages_are_the_served_computation_and_ops_split_the_forward(kvgraft_home, tiny_gemma):
    lib = make_lib(kvgraft_home, tiny_gemma)
    text = (peer.PEER / "prefix_2048.txt").read_text(encoding="utf-8")[:300]
    r = kernels.stages(lib, text, repeats=2)
    assert r["staged_row_byte_equal"] is True
    assert list(r["stages_ms"]) == ["read_check", "decode", "restore", "state_proof", "layers", "vocab", "argmax"]
    assert all(v >= 0 for v in r["stages_ms"].values()) and r["stages_ms"]["layers"] > 0 and r["answer_ttft_ms"] > 0
    o = kernels.ops(lib, r["artifact_id"], repeats=2)
    layers = len(tiny_gemma.model.model.layers)
    linears_per_layer = sum(isinstance(m, type(tiny_gemma.model.lm_head)) for m in tiny_gemma.model.model.layers[0].modules())
    assert o["matrix_product_calls"] == layers * linears_per_layer  # the head is not in the 18-layer forward
    assert o["matrix_products_ms"] > 0 and o["attention_ms"] > 0 and o["rest_ms"] > 0  # each group found its ops


def test_kernels_measure_every_product_and_the_bit_properties(tiny_gemma):
    k = kernels.kernels(tiny_gemma.model, repeats=2)
    layers = tiny_gemma.model.model.layers
    assert k["products_per_forward"] == len(layers) * len(k["per_layer_shapes"])
    assert set(k["rows"]) == {"1", "8", "16"} and all(v > 0 for r in k["rows"].values() for v in r.values())
    vocab = "x".join(map(str, tiny_gemma.model.lm_head.weight.shape))
    b = k["bits"][vocab]
    assert (
        1
        <= b["mkl_1_row_distinct_results_over_4_addresses_mod_16"]
        <= b["mkl_1_row_distinct_results_over_16_addresses_mod_64"]
        <= 16
    )
    # model.load places weights (graft_core.determinism.place_weights) only for torch's products, whose 1-row
    # bits follow the address; fma16 (this fixture) reads them where they are
    assert 0 <= b["loaded_weight_address_mod_64"] < 64
    # huge pages: whether MKL's 1-row bits follow them is this CPU's property (equal on the Intel class, not
    # on an AMD Zen 3): the bench must report what a product here gives, checked by computing it again
    hp = k["vocab_mkl_huge_pages"]
    if "skipped" not in hp:
        assert isinstance(hp["same_bits"], bool) and hp["plain_ms"] > 0 and hp["huge_pages_ms"] > 0
        assert hp["same_bits"] == _huge_page_bits_equal(tiny_gemma.model.lm_head.weight)


def _huge_page_bits_equal(weight) -> bool:
    """This CPU's answer, computed here: the 1-row vocabulary product on a huge-page copy placed as the bench
    places it, byte-equal to the product on the loaded matrix, for every one of a few seeded rows."""
    import torch
    import torch.nn.functional as F

    from graft_core.determinism import WEIGHT_PLACEMENT

    huge, region = kernels.huge_page_copy(weight.detach(), WEIGHT_PLACEMENT[1])
    gen = torch.Generator().manual_seed(0)
    try:
        with torch.inference_mode():
            rows = [torch.randn(1, weight.shape[1], generator=gen) for _ in range(4)]
            return all(torch.equal(F.linear(v, weight), F.linear(v, huge)) for v in rows)
    finally:
        del huge
        region.close()

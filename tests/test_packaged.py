"""The packaged model read straight from its GGUF (graft_core.packaged): the same weights hash and the same
bytes as the float32 model its blocks expand to, without that float32 copy.

Fast tier: a tiny Gemma 3 written as a GGUF (Q8_0 blocks, norms stored as 1 + w, as llama.cpp writes them).
Integration tier: the real packaged model against its float32 conversion."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graft_core import fingerprints, numerics, packaged
from kernels import fma16

pytestmark = pytest.mark.skipif(bool(fma16.why_not()), reason=f"fma16 unavailable: {fma16.why_not()}")


def _write_gguf(ref, path) -> None:
    """`ref`'s parameters as a gemma3 GGUF: 2-D ones as Q8_0 blocks, norms as 1 + w (float32)."""
    import gguf

    names = packaged._gguf_names(ref)
    w = gguf.GGUFWriter(str(path), "gemma3")
    for pname, p in ref.named_parameters():  # the tied head is the embedding: listed once
        data = p.detach().numpy()
        if p.dim() == 2:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(names[pname], q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(names[pname], (data + np.float32(1)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _twin(folder, blocks: dict):
    """The float32 model the GGUF stands for, made independently of packaged.fill: each weight its blocks'
    expansion, each norm what the conversion reads from the file, (1 + w) - 1 in float32; on fma16 and
    kvgraft's definition, as model.load leaves it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=numerics.NAME).eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            if p.dim() == 2:
                rows, fmt = blocks[name]
                p.copy_(fma16.dequantize(rows, fmt, *p.shape))
            else:
                p.copy_((p + 1) - 1)
    model.requires_grad_(False)
    return model


@pytest.fixture(scope="module")
def tiny_gguf(tiny_dirs, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(tiny_dirs["gemma3"], dtype=torch.float32)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    _write_gguf(ref, path)
    return ref, path


def test_a_model_read_from_its_gguf_computes_the_bytes_of_its_float32_twin(tiny_gguf, tiny_dirs):
    from graft_core.forward import forward_chunk, new_cache
    from graft_core.model import _hash_weights

    ref, path = tiny_gguf  # the file's blocks are the weights: the twin expands them, the norms it reads itself
    numerics.register()
    model = packaged.skeleton(ref.config, numerics.NAME)
    blocks = packaged.fill(model, path)
    assert set(blocks) == {n for n, p in ref.named_parameters() if p.dim() == 2}
    assert all(p.device.type == "meta" for n, p in model.named_parameters() if n in blocks)  # no float32 copy
    model.requires_grad_(False)
    taken = fma16.take_over(model, blocks)
    assert taken.over_blocks == taken.products == len(blocks)  # every layer's and the tied head's, over blocks
    packaged.take_embedding(model, blocks, taken.isa)
    numerics.take_over(model, taken.isa)

    twin = _twin(tiny_dirs["gemma3"], blocks)
    assert fma16.take_over(twin).over_blocks == 0  # the twin reads its float32 weights
    numerics.take_over(twin)

    assert packaged.weights_sha256(model, blocks, taken.isa) == _hash_weights(twin)
    ids = [5, 9, 3, 17, 4, 22, 8]
    got = forward_chunk(model, new_cache(model), ids, 0, all_logits=True)
    want = forward_chunk(twin, new_cache(twin), ids, 0, all_logits=True)
    assert torch.equal(got, want), f"max |diff| {(got - want).abs().max().item()}"


def test_the_blocks_are_views_of_the_bytes_read_and_hashed_not_of_the_file(tiny_gguf, tmp_path):
    """The loader reads the file once (`Reading`), checks those bytes' SHA-256 and fills the model with views of
    them: a file changed afterwards changes nothing loaded, and bytes that do not hash to the pinned SHA-256 are
    refused naming both hashes."""
    import hashlib
    import shutil

    ref, src = tiny_gguf
    path = tmp_path / "m.gguf"
    shutil.copy2(src, path)
    want = hashlib.sha256(path.read_bytes()).hexdigest()
    data = packaged.Reading(path, want).bytes("tiny", "rebuild it")
    assert torch.equal(data, torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8))
    blocks = packaged.fill(packaged.skeleton(ref.config, "eager"), path, data)
    base, end = data.data_ptr(), data.data_ptr() + data.numel()
    assert all(base <= rows.data_ptr() and rows.data_ptr() + rows.numel() <= end for rows, _ in blocks.values())
    before = {n: rows.clone() for n, (rows, _) in blocks.items()}
    path.write_bytes(bytes(path.stat().st_size))  # the file zeroed after the read: the model keeps what was checked
    assert all(torch.equal(rows, before[n]) for n, (rows, _) in blocks.items())
    with pytest.raises(packaged.Mismatch) as e:
        packaged.Reading(path, want).bytes("tiny", "rebuild it")
    zeros = hashlib.sha256(path.read_bytes()).hexdigest()
    assert str(e.value) == f"tiny: {path} has SHA-256 {zeros[:12]}..., not the checked {want[:12]}...; rebuild it"


def test_the_hash_beside_the_read_covers_every_chunk_in_order(tmp_path, monkeypatch):
    """The SHA-256 runs in its own thread over the chunks the read hands it: over many chunks it is still the file's
    hash, and a file whose chunks are the same bytes in another order is refused."""
    import hashlib

    monkeypatch.setattr(packaged.Reading, "_CHUNK", 7)
    body = bytes(range(256)) * 5 + b"tail"
    path = tmp_path / "f.bin"
    path.write_bytes(body)
    want = hashlib.sha256(body).hexdigest()
    assert bytes(packaged.Reading(path, want).bytes("f", "fix it").numpy()) == body
    path.write_bytes(body[7:14] + body[:7] + body[14:])  # two chunks swapped: the same bytes, another order
    with pytest.raises(packaged.Mismatch, match="not the checked"):
        packaged.Reading(path, want).bytes("f", "fix it")


def test_a_file_that_is_not_gguf_is_a_mismatch(tmp_path, tiny_gguf):
    ref, _ = tiny_gguf
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(packaged.Mismatch, match="not a GGUF file"):
        packaged.fill(packaged.skeleton(ref.config, "eager"), bad)


@pytest.mark.integration
def test_the_packaged_model_loads_from_its_gguf_with_the_conversions_identity(tmp_path, monkeypatch):
    """An empty model cache: no float32 folder is written, the weights hash is computed from the blocks and
    equals the float32 conversion's (computed afresh from its float32 state dict), and so do the tokenizer
    hash, the config and the fingerprint."""
    from graft_core import model

    monkeypatch.setenv("KVGRAFT_MODEL_CACHE", str(tmp_path / "models"))
    lm = model.load()
    assert "embedding rows expanded from their blocks" in lm.products
    assert not (tmp_path / "models" / "gemma-3-270m-f32").exists()
    assert not list((tmp_path / "models").rglob("*.safetensors"))
    assert lm.info.weights_sha256 == packaged.WEIGHTS_SHA256
    monkeypatch.delenv("KVGRAFT_MODEL_CACHE")
    f32 = model.load(linear="torch")  # the float32 conversion (in the user's model cache)
    assert model._hash_weights(f32.model) == packaged.WEIGHTS_SHA256
    assert (lm.info.fingerprint, lm.info.tokenizer_sha256) == (f32.info.fingerprint, f32.info.tokenizer_sha256)
    assert model.config_sha256(lm.model.config.to_dict()) == model.config_sha256(f32.model.config.to_dict())


@pytest.mark.integration
def test_the_tokenizer_built_from_the_gguf_is_saved_checked_and_read_back(tmp_path, monkeypatch):
    """The first start builds the tokenizer from the GGUF's vocabulary and saves it beside the file; the next
    reads that file (the builder is not called) and gets the same tokenizer; a changed byte of the file or a
    record made from another GGUF is not used: the tokenizer is built afresh and the file rewritten."""
    import json

    from transformers import GemmaTokenizer

    path = packaged.gguf_file(tmp_path)
    built = packaged.tokenizer(path)
    record = json.loads((tmp_path / packaged.TOKENIZER_RECORD).read_text())
    assert (tmp_path / packaged.TOKENIZER_FILE).is_file() and record["made_from"]["gguf_sha256"] == packaged.GGUF_SHA256
    builds = []
    real = GemmaTokenizer.from_pretrained.__func__

    def counting(cls, *a, **k):
        builds.append(k.get("gguf_file"))
        return real(cls, *a, **k)

    monkeypatch.setattr(GemmaTokenizer, "from_pretrained", classmethod(counting))
    read = packaged.tokenizer(path)
    assert builds == []
    assert fingerprints.tokenizer_sha256(read) == fingerprints.tokenizer_sha256(built)
    text = "<start_of_turn>user\nWho was the harbour master of Quenmora? 3.14 Zürich<end_of_turn>\n"
    assert read(text)["input_ids"] == built(text)["input_ids"]
    # one vocabulary piece changed in the saved file: not used, built again, the file rewritten
    saved = (tmp_path / packaged.TOKENIZER_FILE).read_text()
    (tmp_path / packaged.TOKENIZER_FILE).write_text(
        saved.replace('"Quen"', '"Qxen"', 1) if '"Quen"' in saved else saved.replace('"the"', '"thx"', 1)
    )
    again = packaged.tokenizer(path)
    assert builds == [path.name] and fingerprints.tokenizer_sha256(again) == fingerprints.tokenizer_sha256(built)
    assert (tmp_path / packaged.TOKENIZER_FILE).read_text() == saved
    # a record made from another GGUF: built again
    record["made_from"]["gguf_sha256"] = "0" * 64
    (tmp_path / packaged.TOKENIZER_RECORD).write_text(json.dumps(record))
    packaged.tokenizer(path)
    assert builds == [path.name, path.name]


@pytest.mark.integration
def test_a_gemma3_gguf_given_by_path_loads_directly_with_the_packaged_models_identity(real_lm, tmp_path, monkeypatch):
    """KVGRAFT_MODEL=/path/model.gguf: config and tokenizer from the file's metadata, every product over its
    blocks, the fingerprint from its tensors. The packaged model's own file, given by path, is the packaged
    model: the same weights hash, tokenizer hash, config hash and fingerprint, and the same logits bytes."""
    from graft_core import model
    from graft_core.forward import forward_chunk, new_cache

    path = packaged.gguf_file(model._packaged_gguf_dir())
    monkeypatch.setenv("KVGRAFT_MODEL_CACHE", str(tmp_path / "models"))  # the config and tokenizer kept there
    lm = model.load(str(path))
    assert model.gguf_metadata_dir(path) is not None
    again = model.load(str(path))  # from the kept config and tokenizer: the same identity
    assert (again.info.tokenizer_sha256, again.fingerprint) == (lm.info.tokenizer_sha256, lm.fingerprint)
    assert lm.info.weights_sha256 == packaged.WEIGHTS_SHA256 and not lm.machine_bound
    assert "embedding rows expanded from their blocks" in lm.products and numerics.VERSION in lm.products
    assert (lm.info.tokenizer_sha256, lm.info.fingerprint, lm.fingerprint) == (
        real_lm.info.tokenizer_sha256,
        real_lm.info.fingerprint,
        real_lm.fingerprint,
    )
    import gguf

    field = gguf.GGUFReader(str(path)).fields.get("tokenizer.chat_template")  # this base model's file has none
    assert getattr(lm.tokenizer, "chat_template", None) == (None if field is None else bytes(field.parts[field.data[0]]).decode())
    ids = real_lm.tokenizer("The capital of France is")["input_ids"]
    a = forward_chunk(lm.model, new_cache(lm.model), ids, 0)
    b = forward_chunk(real_lm.model, new_cache(real_lm.model), ids, 0)
    assert a.numpy().tobytes() == b.numpy().tobytes()


def test_a_gguf_outside_the_family_is_refused_in_one_line(tmp_path):
    """A GGUF whose metadata is outside the definition (a tiny Qwen3, written with its metadata: its q/k norms
    are not the Llama family's) is refused at load in one line that names what it lacks."""
    import gguf

    from errors import KvgraftError
    from graft_core import model

    path = tmp_path / "tiny-qwen3.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_block_count(1)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(8)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(KvgraftError) as e:
        model.load(str(path))
    assert str(e.value) == (
        f"KVGRAFT_MODEL {path}: architecture 'qwen3' is outside the numerical definition kvgraft-f32-v2 "
        "(covers gemma3 (tanh GELU) and llama, mistral and qwen2 (SiLU) without sliding window or soft-capping, "
        "RoPE default, linear or llama3); a GGUF file loads directly only inside it "
        "(convert it to a Hugging Face folder for the machine-bound path)"
    )

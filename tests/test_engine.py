"""Fast tier: the engine on tiny random models (a Gemma-3-like one with a 4-token sliding window and
a Llama-like one). Identity is asserted as identity: byte equality, never a tolerance."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from db.blobs import BlobStore
from errors import IncompatibleArtifact, InputTooLong, IntegrityError, InvalidInput, InvalidSetting
from graft_core import codec, exactness, generate
from graft_core.artifact import KVArtifact
from graft_core.capture import capture
from graft_core.graft import restore
from graft_core.proof import check_probe

ROOT = Path(__file__).resolve().parents[1]
TEXT = "Fact: the lighthouse of Varnek Isle was built by Osric Pellamy in 1874.\n"


def ids(lm, text, bos=True):
    return lm.tokenizer(text, add_special_tokens=bos)["input_ids"]


def assert_exact(c):
    assert c.exact, f"graft differs from fresh: max |diff| {c.max_abs_diff}, KL {c.kl}"
    assert c.fresh_sha256 == c.grafted_sha256
    assert c.kl == 0.0 and c.argmax_agreement == 1.0 and c.max_abs_diff == 0.0


@pytest.mark.parametrize("kind", ["gemma", "llama"])
@pytest.mark.parametrize("text", ["Hi", TEXT * 3], ids=["shorter-than-window", "longer-than-window"])
def test_graft_is_byte_equal_to_fresh(kind, text, request):
    lm = request.getfixturevalue(f"tiny_{kind}")
    art, _ = capture(lm, ids(lm, text))
    if kind == "gemma":  # was "gemma3", which never matched the parameter: the window checks never ran
        w = lm.info.sliding_window
        sliding = [i for i, t in enumerate(art.layer_types) if t == "sliding_attention"]
        assert all(art.keys[i].shape[2] == min(art.length, w - 1) for i in sliding)
        assert all(art.seen[i] == art.length for i in sliding)
    assert_exact(exactness.check(lm, [art], ids(lm, "Question: who?\nAnswer:", bos=False), decode_steps=6))


@pytest.mark.parametrize("kind", ["gemma", "llama"])
def test_chain_restores_exactly_and_stores_only_own_rows(kind, request):
    lm = request.getfixturevalue(f"tiny_{kind}")
    a, _ = capture(lm, ids(lm, TEXT))
    b, _ = capture(lm, ids(lm, "Fact: Mira Tolland kept it.\n", bos=False), parents=[a])
    c, _ = capture(lm, ids(lm, "Fact: it burned in 1901.\n", bos=False), parents=[a, b])
    assert (b.parent, b.start, c.parent, c.start) == (a.key, a.end, b.key, b.end)
    full = [i for i, t in enumerate(c.layer_types) if t == "full_attention"]
    assert all(c.keys[i].shape[2] == c.length for i in full)
    assert_exact(exactness.check(lm, [a, b, c], ids(lm, "Question: when?\nAnswer:", bos=False)))
    assert check_probe(lm, [a, b, c])[0] is None
    with pytest.raises(IncompatibleArtifact, match="does not continue"):
        restore(lm, [a, c])
    with pytest.raises(IncompatibleArtifact, match="is not a chain root"):
        restore(lm, [b])


# Measured on these machines (torch 2.13.0 CPU): tiny gemma max |diff| 2.4e-7 .. 5.1e-7, tiny llama 1.6e-7 ..
# 2.1e-7 at offsets 1, 37, 300 (KL <= 2e-14). Without re-rotation the tiny gemma moves by ~0.26.
RELOCATION_BOUND = {"gemma": 1e-5, "llama": 1e-5}


@pytest.mark.parametrize("kind", ["gemma", "llama"])
def test_relocation_stays_under_its_measured_bound_and_is_never_called_exact(kind, request):
    lm = request.getfixturevalue(f"tiny_{kind}")
    art, _ = capture(lm, ids(lm, TEXT))
    q = ids(lm, "Question: who?\nAnswer:", bos=False)
    for offset in (1, 37, 300):
        r = exactness.check_relocated(lm, art, q, offset=offset)
        assert r.tier == "relocated" and r.offset == offset and r.rows == len(q) + r.decode_steps
        assert r.exact == (r.fresh_sha256 == r.grafted_sha256)  # measured from the bytes, the tier is only a label
        assert r.max_abs_diff <= RELOCATION_BOUND[kind], f"offset {offset}: max |diff| {r.max_abs_diff}"
        assert r.kl <= 1e-10 and r.argmax_agreement == 1.0 and r.tokens_equal, r
    # offset 0 is the artifact's own position: the relocated path must be byte-equal there
    zero = exactness.check_relocated(lm, art, q, offset=0)
    assert zero.tier == "relocated" and zero.exact and zero.fresh_sha256 == zero.grafted_sha256, zero.max_abs_diff
    # the measured divergence is real: re-rotation under float32 RoPE changes the bytes
    far = exactness.check_relocated(lm, art, q, offset=300)
    assert far.fresh_sha256 != far.grafted_sha256 and not far.exact


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5], ids=["1", "2", "window-1", "window", "window+1"])
def test_artifacts_around_the_window_are_byte_equal(tiny_gemma, n):
    lm = tiny_gemma
    w = lm.info.sliding_window
    assert w == 4, "the lengths above are 1, 2, window-1, window, window+1 for the tiny model's window"
    art, _ = capture(lm, ids(lm, TEXT)[:n])
    sliding = [i for i, t in enumerate(art.layer_types) if t == "sliding_attention"]
    assert [art.keys[i].shape[2] for i in sliding] == [min(n, w - 1)] * len(sliding)
    assert [art.seen[i] for i in sliding] == [n] * len(sliding)
    # the restored layers know how many tokens they have seen (what masks and positions derive from)
    assert [restore(lm, [art]).layers[i].get_seq_length() for i in sliding] == [n] * len(sliding)
    assert_exact(exactness.check(lm, [art], ids(lm, "Question: who?\nAnswer:", bos=False), decode_steps=3))
    ans = generate.answer(lm, [art], "who?", max_new_tokens=3, run_check=True)
    assert ans.proof.passed is True and ans.check.exact, (ans.proof, ans.check.max_abs_diff)


def test_codec_round_trip_is_byte_identical(tiny_gemma):
    lm = tiny_gemma
    a, _ = capture(lm, ids(lm, TEXT))
    b, _ = capture(lm, ids(lm, "more\n", bos=False), parents=[a])
    for art in (a, b):
        data = codec.dumps(art)
        back = codec.loads(data)
        assert codec.dumps(back) == data
        assert back.key == art.key and back.seen == art.seen and back.start == art.start
        assert all(torch.equal(x, y) for x, y in zip(back.keys + back.values, art.keys + art.values))
        # and it is a standard safetensors file
        from safetensors.torch import load as st_load

        tensors = st_load(data)
        assert torch.equal(tensors["token_ids"], art.token_ids)


def test_artifact_bytes_per_token_overhead(tiny_gemma):
    art, _ = capture(tiny_gemma, ids(tiny_gemma, TEXT * 6))
    data = codec.dumps(art)
    header = struct.unpack("<Q", data[:8])[0] + 8
    assert len(data) - header == art.kv_bytes() + art.token_ids.numel() * 8


def _golden_artifact() -> KVArtifact:
    g = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(1, 1, 3, 8) / 7
    return KVArtifact(
        keys=(g, g[:, :, :2].contiguous()),
        values=(g + 1, g[:, :, :2].contiguous() - 1),
        token_ids=torch.tensor([2, 10, 11], dtype=torch.int64),
        model_fingerprint="m" * 64,
        tokenizer_fingerprint="t" * 64,
        dtype="float32",
        start=0,
        layer_types=("full_attention", "sliding_attention"),
        seen=(3, 3),
        text_sha256="0" * 64,
        probe_sha256="1" * 64,
    )


GOLDEN_HEADER = (
    '{"__metadata__":{"dtype":"float32","format":"kvgraft/1",'
    '"id":"KEY","layer_types":"full_attention,sliding_attention","length":"3",'
    '"model_fingerprint":"' + "m" * 64 + '","parent":"","probe_sha256":"' + "1" * 64 + '","seen":"3,3","start":"0",'
    '"text_sha256":"' + "0" * 64 + '","tokenizer_fingerprint":"' + "t" * 64 + '"},'
    '"layers.0.keys":{"dtype":"F32","shape":[1,1,3,8],"data_offsets":[0,96]},'
    '"layers.0.values":{"dtype":"F32","shape":[1,1,3,8],"data_offsets":[96,192]},'
    '"layers.1.keys":{"dtype":"F32","shape":[1,1,2,8],"data_offsets":[192,256]},'
    '"layers.1.values":{"dtype":"F32","shape":[1,1,2,8],"data_offsets":[256,320]},'
    '"token_ids":{"dtype":"I64","shape":[3],"data_offsets":[320,344]}}'
)


def test_golden_header_pins_format_v1():
    art = _golden_artifact()
    data = codec.dumps(art)
    n = struct.unpack("<Q", data[:8])[0]
    assert n % 8 == 0
    assert data[8 : 8 + n].decode().rstrip(" ") == GOLDEN_HEADER.replace("KEY", art.key)
    assert art.key == "d6ed8f635b15558f437f1b0e6feed1d2d276ab7c181ddc1c16ef4aade95e35dd"
    assert hashlib.sha256(data).hexdigest() == GOLDEN_SHA256


GOLDEN_SHA256 = "f412b0a92bf1a862bba8d07649bc392d3123ab0148e942a034c9688b61bfe954"


def test_identical_bytes_across_two_processes(tiny_dirs):
    script = (
        "import hashlib,sys; from graft_core import model, codec; from graft_core.capture import capture;"
        "lm=model.load(sys.argv[1]); a,_=capture(lm, lm.tokenizer(sys.argv[2])['input_ids']);"
        "print(hashlib.sha256(codec.dumps(a)).hexdigest())"
    )
    outs = [
        subprocess.run(
            [sys.executable, "-c", script, str(tiny_dirs["gemma3"]), TEXT], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    ]
    assert len(outs[0]) == 64 and outs[0] == outs[1]


def test_tampered_blob_raises_integrity_error(tiny_gemma, tmp_path):
    store = BlobStore(tmp_path / "blobs")
    art, _ = capture(tiny_gemma, ids(tiny_gemma, TEXT))
    h = store.put(codec.dumps(art))
    assert codec.loads(store.get(h)).key == art.key
    p = store.path(h)
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    p.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match="integrity"):
        store.get(h)


@pytest.mark.parametrize("cut", [0, 7, 8, 20, -1])
def test_truncated_bytes_raise_integrity_error(tiny_gemma, cut):
    art, _ = capture(tiny_gemma, ids(tiny_gemma, "abc"))
    data = codec.dumps(art)
    n = struct.unpack("<Q", data[:8])[0]
    end = {0: 0, 7: 7, 8: 8, 20: 20, -1: len(data) - 1}[cut]
    if cut == 20:
        end = 8 + n + 3  # inside the data section
    with pytest.raises(IntegrityError, match="integrity"):
        codec.loads(data[:end])


def test_incompatible_artifacts_are_refused_naming_the_difference(tiny_gemma, tiny_llama):
    art, _ = capture(tiny_llama, ids(tiny_llama, TEXT))
    with pytest.raises(IncompatibleArtifact, match="model fingerprint") as exc:
        restore(tiny_gemma, [art])
    assert "layers" in str(exc.value)
    own, _ = capture(tiny_gemma, ids(tiny_gemma, TEXT))
    half = replace(own, keys=tuple(k.half() for k in own.keys), values=tuple(v.half() for v in own.values), dtype="float16")
    with pytest.raises(IncompatibleArtifact, match="dtype float16 != float32"):
        restore(tiny_gemma, [half])
    data = codec.dumps(own).replace(b'"format":"kvgraft/1"', b'"format":"kvgraft/9"')
    with pytest.raises(IncompatibleArtifact, match="format is 'kvgraft/9'"):
        codec.loads(data)


def test_generate_reports_accounting(tiny_gemma):
    lm = tiny_gemma
    art, _ = capture(lm, ids(lm, TEXT * 2))
    ans = generate.answer(lm, [art], "who?", max_new_tokens=5, run_check=True)
    assert ans.tier == "exact" and ans.grafted_tokens == art.length
    assert ans.computed_tokens == len(ids(lm, "Question: who?\nAnswer:", bos=False))
    assert 1 <= ans.decode_tokens <= 5 and ans.ttft_s > 0
    assert ans.savings.baseline_prefill_tokens == art.length + ans.computed_tokens
    assert ans.savings.baseline_flops_estimate > ans.savings.flops_estimate
    assert_exact(ans.check)
    plain = generate.answer(lm, [], "who?", max_new_tokens=5)
    assert plain.tier == "none" and plain.grafted_tokens == 0 and plain.prompt_ids[0] == lm.tokenizer.bos_token_id


def test_inputs_are_bounded(tiny_gemma):
    lm = tiny_gemma
    with pytest.raises(InvalidInput, match="the question is empty"):
        generate.answer(lm, [], "   ")
    with pytest.raises(InputTooLong, match="exceed the model's 512-token context"):
        generate.answer(lm, [], "x" * 600)
    with pytest.raises(InputTooLong, match="exceeds the model's 512-token context"):
        capture(lm, [5] * 513)
    with pytest.raises(InvalidInput, match="max_new_tokens must be between 1 and 1024"):
        generate.answer(lm, [], "hi", max_new_tokens=0)


def test_header_metadata_is_str_to_str_and_json(tiny_gemma):
    art, _ = capture(tiny_gemma, ids(tiny_gemma, "abc"))
    data = codec.dumps(art)
    n = struct.unpack("<Q", data[:8])[0]
    meta = json.loads(data[8 : 8 + n])["__metadata__"]
    assert all(isinstance(v, str) for v in meta.values()) and meta["format"] == "kvgraft/1"
    assert "time" not in json.dumps(meta) and "host" not in json.dumps(meta)


def test_fingerprint_ignores_the_folder_and_accepts_artifacts_from_another(tiny_dirs, tmp_path):
    """Same weights, tokenizer and config under two folders (two homes): one fingerprint, and an
    artifact made under one restores byte-exactly under the other."""
    import shutil

    from graft_core import model
    from graft_core.model import FINGERPRINT_FILE

    src = tiny_dirs["gemma3"]
    copy = shutil.copytree(src, tmp_path / "other-home" / "models" / "tiny", ignore=shutil.ignore_patterns(FINGERPRINT_FILE))
    a, b = model.load(str(src)), model.load(str(copy))
    assert a.model.config.to_dict()["_name_or_path"] != b.model.config.to_dict()["_name_or_path"]
    assert (a.info.fingerprint, a.fingerprint) == (b.info.fingerprint, b.fingerprint)
    art, _ = capture(a, ids(a, TEXT * 2))
    moved = codec.loads(codec.dumps(art))
    assert_exact(exactness.check(b, [moved], ids(b, "Question: who?\nAnswer:", bos=False)))


def test_fingerprint_covers_numeric_config_fields(tiny_dirs, tmp_path):
    import shutil

    from graft_core import model
    from graft_core.model import FINGERPRINT_FILE

    base = model.load(str(tiny_dirs["gemma3"]))
    for field, value in (("rms_norm_eps", 1e-5), ("query_pre_attn_scalar", 128)):
        d = shutil.copytree(tiny_dirs["gemma3"], tmp_path / field, ignore=shutil.ignore_patterns(FINGERPRINT_FILE))
        cfg = json.loads((d / "config.json").read_text())
        cfg[field] = value
        (d / "config.json").write_text(json.dumps(cfg))
        other = model.load(str(d))
        assert other.info.weights_sha256 == base.info.weights_sha256
        assert other.info.fingerprint != base.info.fingerprint, f"{field} changes numbers but not the fingerprint"


def test_layer_adapter_round_trips_every_layer_kind(tiny_gemma):
    """export -> import -> export is the identity per layer kind; a sliding layer keeps window-1 rows."""
    from graft_core import layers
    from graft_core.forward import forward_chunk, new_cache

    lm = tiny_gemma
    toks = ids(lm, TEXT)
    cache = new_cache(lm.model)
    forward_chunk(lm.model, cache, toks, 0)
    states = layers.export_cache(cache, 0, len(toks))
    w = lm.info.sliding_window
    for kind, st in zip(lm.info.layer_types, states):
        assert st.seen == len(toks)
        assert st.keys.shape[2] == (w - 1 if kind == "sliding_attention" else len(toks))
    fresh = new_cache(lm.model)
    long = [layers.LayerState(torch.cat([s.keys, s.keys], 2), torch.cat([s.values, s.values], 2), s.seen) for s in states]
    layers.import_cache(fresh, long)
    again = layers.export_cache(fresh, 0, len(toks))
    for kind, a, b, x in zip(lm.info.layer_types, states, again, long):
        want = a if kind == "sliding_attention" else x  # sliding: trimmed back to its last window-1 rows
        assert torch.equal(b.keys, want.keys) and torch.equal(b.values, want.values) and b.seen == a.seen


@pytest.mark.parametrize("window", [4, 40])
def test_growing_cache_serves_the_rows_transformers_cache_serves(tiny_dirs, tmp_path, window):
    """A prefill, a restore and hundreds of one-token steps (past several regrowths of the full layers and
    slides of the sliding ones): every logits row and every layer's held rows equal, byte for byte, those of
    transformers' own DynamicCache (torch.cat per step); a restored artifact's tensors are never written."""
    from transformers import DynamicCache

    from graft_core import layers, model, tiny
    from graft_core.forward import forward_chunk, new_cache

    lm = model.load(str(tiny.build("gemma3", tmp_path / "m", window=window)))
    toks = ids(lm, TEXT)
    ours, theirs = new_cache(lm.model), DynamicCache(config=lm.model.config)
    assert all(type(layer).__name__.startswith("Growing") for layer in ours.layers)
    first = forward_chunk(lm.model, theirs, toks, 0)
    assert torch.equal(forward_chunk(lm.model, ours, toks, 0), first)
    states = layers.export_cache(ours, 0, len(toks))
    before = [(s.keys.clone(), s.values.clone()) for s in states]
    restored = new_cache(lm.model)
    layers.import_cache(restored, states)  # the states' tensors go in as they are (no copy)
    row_o = row_t = row_r = first[-1]
    pos = len(toks)
    for step in range(700):
        tok = int(row_t.argmax()) if step % 3 else (step * 7919) % lm.info.vocab_size
        row_t = forward_chunk(lm.model, theirs, [tok], pos)[-1]
        row_o = forward_chunk(lm.model, ours, [tok], pos)[-1]
        row_r = forward_chunk(lm.model, restored, [tok], pos)[-1]
        assert torch.equal(row_o, row_t) and torch.equal(row_r, row_t), f"step {step}: {(row_o - row_t).abs().max()}"
        pos += 1
    for a, b, c in zip(ours.layers, theirs.layers, restored.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) and torch.equal(c.keys, b.keys)
        assert a.get_seq_length() == b.get_seq_length()
    assert all(torch.equal(s.keys, k) and torch.equal(s.values, v) for s, (k, v) in zip(states, before))
    assert layers.state_digest(ours) == layers.state_digest(theirs)


def test_the_record_names_the_definition_and_torch_kernels_their_path(tiny_dirs, tiny_gemma):
    """Under kvgraft-f32-v2 the record is the definition's name and nothing about the machine: a process
    with ATen pinned to its DEFAULT kernels (other vectorised code, measured equal bits: docs/DETERMINISM.md)
    has the same fingerprint. Torch's kernels (KVGRAFT_LINEAR=torch) change bits with the capability, so
    there it is recorded and another capability is another artifact identity."""
    import os

    script = (
        "import json,sys; from graft_core import model; a=model.load(sys.argv[1]); t=model.load(sys.argv[1], linear='torch');"
        "print(json.dumps([[m.fingerprint, m.config.as_dict()['numerics']] for m in (a, t)]))"
    )
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    out = subprocess.run(
        [sys.executable, "-c", script, str(tiny_dirs["gemma3"])], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    (fingerprint, numerics), (torch_fingerprint, torch_numerics) = json.loads(out.strip().splitlines()[-1])
    assert numerics == tiny_gemma.config.as_dict()["numerics"] == {"numerics": "kvgraft-f32-v2"}
    assert tiny_gemma.config.attn_implementation == "kvgraft"
    assert fingerprint == tiny_gemma.fingerprint  # another ATen capability, the same definition: the same identity
    assert torch_numerics["aten_capability"] == "DEFAULT"
    assert {"cpu_vendor", "cpu_isa", "blas", "mkl_cbwr", "mkldnn", "threads"} <= set(torch_numerics)
    assert torch_fingerprint != fingerprint


def test_weights_sit_where_their_bits_depend_only_on_their_values(tiny_gemma, tiny_gemma_torch):
    """MKL's one-row products compute other bits for the same weight at another address mod 16
    (`bench.kernels` measures it), and the fingerprint sees only the values: load() places every weight
    at 56 mod 64 where torch's products run, so the same values give the same row wherever a loader first
    put them. Under the definition (fma16 reads a row in one order wherever it sits) nothing is placed."""
    from graft_core.determinism import WEIGHT_PLACEMENT, copy_at, place_weights

    mod, rem = WEIGHT_PLACEMENT
    assert {p.data_ptr() % mod for p in tiny_gemma_torch.model.parameters()} == {rem}
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(4096, 640, generator=g), torch.randn(1, 640, generator=g)
    rows = set()
    for at in range(0, mod, 4):  # the same values at 16 addresses 4 bytes apart
        lin = torch.nn.Linear(640, 4096, bias=False)
        lin.weight.data = copy_at(w, at, mod)
        assert lin.weight.data_ptr() % mod == at
        assert place_weights(lin) == (0 if at == rem else 1)
        assert lin.weight.data_ptr() % mod == rem and torch.equal(lin.weight, w)
        with torch.inference_mode():
            rows.add(lin(x).numpy().tobytes())
    assert len(rows) == 1
    shared = torch.nn.Sequential(torch.nn.Embedding(64, 640), torch.nn.Linear(640, 64, bias=False))
    shared[1].weight = shared[0].weight  # tied, as Gemma's head and embedding are
    place_weights(shared)
    assert shared[1].weight.data_ptr() == shared[0].weight.data_ptr() and shared[0].weight.data_ptr() % mod == rem
    # a model other than the packaged one may compute other bits placed than unplaced: its record says so
    assert dict(tiny_gemma_torch.config.numerics)["weights_placement"] == f"{rem} mod {mod}"
    assert "weights_placement" not in dict(tiny_gemma.config.numerics)  # fma16's rows do not depend on addresses


def test_large_buffers_come_from_the_heap_once_the_model_loads():
    """glibc maps every allocation over 32 MiB afresh (an artifact read over 32 MB faulted and zeroed all
    its pages again: 62 ms for 40.9 MB); model.load keeps buffers up to 128 MiB in the heap for reuse.
    Observed through glibc's own accounting (mallinfo2: bytes in mmap'd blocks), not through time."""
    import platform

    from graft_core.model import LARGE_BUFFER_BYTES, keep_large_buffers

    script = """
import ctypes, json
from graft_core.model import LARGE_BUFFER_BYTES, keep_large_buffers
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split())]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
def mapped_by(n):
    before = libc.mallinfo2().hblkhd
    buf = bytearray(n)
    return libc.mallinfo2().hblkhd - before
n = 40_906_928  # the 4,096-token artifact's bytes
print(json.dumps([mapped_by(n), keep_large_buffers(), mapped_by(n), mapped_by(LARGE_BUFFER_BYTES + (1 << 20))]))
"""
    if platform.libc_ver()[0] != "glibc":
        assert keep_large_buffers() is False  # no mallopt: nothing changes, and it says so
        return
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    mapped_default, kept, mapped_after, mapped_over = json.loads(out.strip().splitlines()[-1])
    assert mapped_default >= 40_906_928  # glibc's default: its own fresh mapping
    assert kept is True and mapped_after == 0  # now from the heap
    assert mapped_over > LARGE_BUFFER_BYTES  # above the bound it maps (and unmaps) its own region


def test_pin_sets_the_pinned_thread_count_whatever_the_cores(monkeypatch):
    """Threads change the bits of short forwards, so every process computes with KVGRAFT_THREADS (default 2)."""
    import torch

    from graft_core import determinism

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("KVGRAFT_THREADS", raising=False)
        torch.set_num_threads(1)
        assert dict(determinism.pin().numerics)["threads"] == str(determinism.DEFAULT_THREADS)
        assert torch.get_num_threads() == determinism.DEFAULT_THREADS
        monkeypatch.setenv("KVGRAFT_THREADS", "1")
        assert dict(determinism.pin().numerics)["threads"] == "1"
        for bad in ("0", "-1", "two", "1.5", "999"):
            monkeypatch.setenv("KVGRAFT_THREADS", bad)
            with pytest.raises(InvalidSetting, match="KVGRAFT_THREADS must be a whole number from 1 to 256, got "):
                determinism.pin()
    finally:
        torch.set_num_threads(before)

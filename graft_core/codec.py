"""KVArtifact <-> bytes, format kvgraft/1 (a standard safetensors file).

Pure functions on bytes; the blob store owns the disk. The writer is our own so that the bytes are a
pure function of the artifact (sorted header keys, fixed tensor order, no timestamps): the same
artifact gives identical bytes in any process on any machine. The reader is strict: every offset,
shape and dtype is checked, and anything malformed is an `IntegrityError`, never a crash.
"""

from __future__ import annotations

import json
import re
import struct

import torch

from .artifact import FORMAT, KVArtifact
from .errors import IncompatibleArtifact, IntegrityError

MAX_HEADER_BYTES = 1 << 20  # 1 MiB of JSON is far beyond any real header (18 layers: ~3 KiB)
MAX_DIM = (1 << 31) - 1  # largest tensor dimension or header integer (positions, lengths) the reader accepts
MAX_RANK = 8
_CANONICAL_INT = re.compile(r"0|[1-9][0-9]{0,18}")  # ASCII decimal, no sign, spaces, '_' or leading zeros

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
_DTYPES_BACK = {v: k for k, v in _DTYPES.items()}
_REQUIRED_META = (
    "format",
    "model_fingerprint",
    "tokenizer_fingerprint",
    "dtype",
    "start",
    "length",
    "layer_types",
    "seen",
    "parent",
    "text_sha256",
    "probe_sha256",
)


def _tensor_names(n_layers: int) -> list[str]:
    names = []
    for i in range(n_layers):
        names += [f"layers.{i}.keys", f"layers.{i}.values"]
    return names + ["token_ids"]


def dumps(artifact: KVArtifact) -> bytes:
    """Serialise to safetensors bytes. Deterministic: same artifact, same bytes."""
    artifact.validate()
    tensors = {}
    for i, (k, v) in enumerate(zip(artifact.keys, artifact.values)):
        tensors[f"layers.{i}.keys"] = k
        tensors[f"layers.{i}.values"] = v
    tensors["token_ids"] = artifact.token_ids.to(torch.int64).reshape(-1)
    meta = {
        **{str(k): str(v) for k, v in artifact.metadata.items()},
        "format": FORMAT,
        "id": artifact.key,
        "model_fingerprint": artifact.model_fingerprint,
        "tokenizer_fingerprint": artifact.tokenizer_fingerprint,
        "dtype": artifact.dtype,
        "start": str(artifact.start),
        "length": str(artifact.length),
        "layer_types": ",".join(artifact.layer_types),
        "seen": ",".join(str(s) for s in artifact.seen),
        "parent": artifact.parent,
        "text_sha256": artifact.text_sha256,
        "probe_sha256": artifact.probe_sha256,
    }
    header: dict = {"__metadata__": dict(sorted(meta.items()))}
    payload = []
    offset = 0
    for name in _tensor_names(len(artifact.layer_types)):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in _DTYPES:
            raise IncompatibleArtifact(f"dtype {t.dtype} is not supported by format {FORMAT}")
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        payload.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()
    head += b" " * (-len(head) % 8)  # safetensors aligns the data section to 8 bytes
    return struct.pack("<Q", len(head)) + head + b"".join(payload)


def read_header(data: bytes | memoryview) -> tuple[dict, dict, int]:
    """Parse and bound-check the header: (metadata, tensor entries, data start offset)."""
    if len(data) < 8:
        raise IntegrityError("artifact integrity check failed: file is shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if n > MAX_HEADER_BYTES:
        raise IntegrityError(f"artifact integrity check failed: header claims {n} bytes (limit {MAX_HEADER_BYTES})")
    if 8 + n > len(data):
        raise IntegrityError("artifact integrity check failed: file is truncated inside the header")
    try:
        header = json.loads(bytes(data[8 : 8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: deeply nested arrays
        raise IntegrityError(f"artifact integrity check failed: header is not valid JSON ({exc.__class__.__name__})") from None
    if not isinstance(header, dict):
        raise IntegrityError("artifact integrity check failed: header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise IntegrityError("artifact integrity check failed: header metadata missing or not str -> str")
    return meta, header, 8 + n


def check_format(meta: dict) -> None:
    if meta.get("format") != FORMAT:
        raise IncompatibleArtifact(
            f"artifact format is {meta.get('format')!r}, this kvgraft reads {FORMAT!r}; rebuild the artifact with `cli.py rebuild`"
        )
    missing = [k for k in _REQUIRED_META if k not in meta]
    if missing:
        raise IntegrityError(f"artifact integrity check failed: header metadata lacks {', '.join(missing)}")


def _json_int(x) -> int:
    """A JSON integer, exactly: floats (1.5, 1e400 -> inf, NaN), booleans and strings are refused."""
    if type(x) is not int:
        raise TypeError(f"expected a JSON integer, got {type(x).__name__}")
    return x


def _meta_int(text: str) -> int:
    """A header integer written as `dumps` writes it: canonical decimal in [0, MAX_DIM]; ValueError otherwise."""
    if not _CANONICAL_INT.fullmatch(text) or int(text) > MAX_DIM:
        raise ValueError(f"not a canonical integer: {text[:40]!r}")
    return int(text)


def loads(data: bytes | bytearray) -> KVArtifact:
    """Parse bytes written by `dumps`. Malformed input raises IntegrityError/IncompatibleArtifact.

    Given a `bytearray` the tensors are zero-copy views into it (the caller hands it over); given
    `bytes` the data is copied once into a private buffer.
    """
    meta, entries, base = read_header(data)
    buf = data if isinstance(data, bytearray) else bytearray(data)
    check_format(meta)
    try:
        start, length = _meta_int(meta["start"]), _meta_int(meta["length"])
        layer_types = tuple(meta["layer_types"].split(",")) if meta["layer_types"] else ()
        seen = tuple(_meta_int(s) for s in meta["seen"].split(",")) if meta["seen"] else ()
    except ValueError:
        raise IntegrityError(
            "artifact integrity check failed: start/length/seen are not canonical non-negative integers"
        ) from None
    if start < 0 or length < 0 or len(seen) != len(layer_types) or any(s < 0 for s in seen):
        raise IntegrityError("artifact integrity check failed: inconsistent start/length/seen")
    names = _tensor_names(len(layer_types))
    if sorted(entries) != sorted(names):
        raise IntegrityError("artifact integrity check failed: tensor names do not match the layer list")
    body = len(data) - base
    tensors = {}
    expected_offset = 0
    for name in names:
        e = entries[name]
        try:
            dtype = _DTYPES_BACK[e["dtype"]]
            if not isinstance(e, dict) or not isinstance(e["shape"], list) or not isinstance(e["data_offsets"], list):
                raise TypeError("entry, shape and data_offsets must be an object and two lists")
            shape = [_json_int(s) for s in e["shape"]]
            lo, hi = (_json_int(x) for x in e["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise IntegrityError(f"artifact integrity check failed: tensor {name} entry is malformed") from None
        if len(shape) > MAX_RANK:
            raise IntegrityError(f"artifact integrity check failed: tensor {name} has {len(shape)} dimensions (limit {MAX_RANK})")
        numel, span = 1, 1  # span: the product of the non-zero dimensions, which torch must hold even when numel is 0
        for s in shape:
            if s < 0:
                raise IntegrityError(f"artifact integrity check failed: tensor {name} has a negative dimension")
            if s > MAX_DIM:
                raise IntegrityError(f"artifact integrity check failed: tensor {name} has a dimension over {MAX_DIM:,}")
            numel, span = numel * s, span * max(s, 1)
        if span > MAX_DIM:
            raise IntegrityError(f"artifact integrity check failed: tensor {name} has more than {MAX_DIM:,} elements")
        itemsize = torch.empty((), dtype=dtype).element_size()
        if lo != expected_offset or hi - lo != numel * itemsize or hi > body:
            raise IntegrityError(
                f"artifact integrity check failed: tensor {name} offsets do not match its shape or the file size"
            )
        expected_offset = hi
        if numel:
            t = torch.frombuffer(buf, dtype=dtype, count=numel, offset=base + lo)
        else:
            t = torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(shape)
    if expected_offset != body:
        raise IntegrityError("artifact integrity check failed: trailing bytes after the last tensor")
    token_ids = tensors["token_ids"]
    if token_ids.dtype != torch.int64:
        raise IntegrityError(f"artifact integrity check failed: token_ids are {token_ids.dtype}, format {FORMAT} stores int64")
    if token_ids.dim() != 1 or token_ids.numel() != length:
        raise IntegrityError("artifact integrity check failed: token_ids length differs from the header")
    n = len(layer_types)
    keys = tuple(tensors[f"layers.{i}.keys"] for i in range(n))
    values = tuple(tensors[f"layers.{i}.values"] for i in range(n))
    for i, (k, v) in enumerate(zip(keys, values)):
        if k.dim() != 4 or k.shape != v.shape or k.shape[0] != 1:
            raise IntegrityError(f"artifact integrity check failed: layer {i} keys/values shapes are inconsistent")
        if layer_types[i] == "full_attention" and k.shape[2] != length:
            raise IntegrityError(f"artifact integrity check failed: full layer {i} holds {k.shape[2]} rows, header says {length}")
        if seen[i] != start + length:  # every layer has seen each token up to the artifact's end, no more
            raise IntegrityError(
                f"artifact integrity check failed: layer {i} claims {seen[i]:,} tokens seen, the artifact ends at position {start + length:,}"
            )
        if k.shape[2] > seen[i]:
            raise IntegrityError(f"artifact integrity check failed: layer {i} holds {k.shape[2]} rows of {seen[i]} tokens seen")
        if str(k.dtype).removeprefix("torch.") != meta["dtype"]:
            raise IntegrityError(f"artifact integrity check failed: layer {i} dtype differs from the header dtype")
    known = set(_REQUIRED_META) | {"id"}
    art = KVArtifact(
        keys=keys,
        values=values,
        token_ids=token_ids,
        model_fingerprint=meta["model_fingerprint"],
        tokenizer_fingerprint=meta["tokenizer_fingerprint"],
        dtype=meta["dtype"],
        start=start,
        layer_types=layer_types,
        seen=seen,
        parent=meta["parent"],
        text_sha256=meta["text_sha256"],
        probe_sha256=meta["probe_sha256"],
        metadata={k: v for k, v in meta.items() if k not in known},
    )
    if "id" in meta and meta["id"] != art.key:
        raise IntegrityError("artifact integrity check failed: header id does not match sha256(model | parent | token ids)")
    return art

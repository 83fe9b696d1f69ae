"""The tokenizer of a kept GGUF metadata folder (graft_core.model.gguf_metadata_dir), read in a fraction of the time
transformers takes. It owns two files in that folder and knows nothing about models or weights.

transformers' `AutoTokenizer.from_pretrained(folder)` decodes the folder's tokenizer.json in Python and rebuilds the
backend from its vocabulary and merges (~1.1 s of CPU for Qwen's 151,936 tokens; the class adds its own normaliser,
so the result is not the file's tokenizer). The first load saves what it built, the backend's own serialisation, as
KEPT_FILE, with a record (RECORD_FILE) of what it was made from (the folder's tokenizer files' SHA-256, the class,
its arguments, the chat template, the library versions), the serialisation's SHA-256 and the tokenizer's
fingerprint (`fingerprints.tokenizer_sha256`); both are kept only where the tokenizer read back from the file is the
built one (the same serialisation, fingerprint, special tokens and chat template). A later load reads the file with
tokenizers' own reader (~0.4 s) when the record matches, from the very bytes it hashed (the open file), and takes the
record's fingerprint; anything else (no record, another version, a changed byte) reads the folder as transformers
does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

KEPT_FILE = "kvgraft-tokenizer.json"
RECORD_FILE = "kvgraft-tokenizer-record.json"
_RECORD_VERSION = "1"
_SOURCES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
# what tokenizer_config.json holds for transformers' loader, not for the class (the record gives the template itself)
_LOADER_KEYS = frozenset(
    {"tokenizer_class", "backend", "is_local", "local_files_only", "auto_map", "chat_template", "name_or_path"}
)


def load(folder: Path) -> tuple[object, str]:
    """(tokenizer, its fingerprint) of the kept metadata folder `folder`: from KEPT_FILE where its record matches,
    else as transformers reads the folder (then kept for the next load where it can be)."""
    from .fingerprints import tokenizer_sha256

    made_from = _made_from(folder)
    kept = _read_kept(folder, made_from)
    if kept is not None:
        return kept
    from transformers import AutoTokenizer

    built = AutoTokenizer.from_pretrained(folder)
    fingerprint = tokenizer_sha256(built)
    try:
        _keep(built, fingerprint, folder, made_from)
    except Exception:  # a read-only cache, a full disk, a class that ignores the file: read the folder each time
        log.warning("the tokenizer of %s could not be kept; it is read from the folder at every load", folder, exc_info=True)
    return built, fingerprint


def _made_from(folder: Path) -> dict:
    """What a kept tokenizer stands for: the folder's tokenizer files (by SHA-256) and the libraries that read them."""
    import tokenizers
    import transformers

    files = {}
    for name in _SOURCES:
        try:
            files[name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        except FileNotFoundError:
            continue
    return {"files": files, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


def _tokenizer_class(name: str):
    """The transformers tokenizer class named `name`, where it reads a tokenizers file; None otherwise."""
    import transformers
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    cls = getattr(transformers, name, None) if name.isidentifier() else None
    return cls if isinstance(cls, type) and issubclass(cls, TokenizersBackend) else None


def _construct(record: dict, file: str, folder: Path):
    cls = _tokenizer_class(str(record.get("class", "")))
    if cls is None:
        return None
    return cls(tokenizer_file=file, chat_template=record.get("chat_template"), name_or_path=str(folder), **record["kwargs"])


def _read_kept(folder: Path, made_from: dict) -> tuple[object, str] | None:
    """The kept tokenizer and its recorded fingerprint, or None where the record does not match `made_from` or the
    file's bytes do not hash to the record. tokenizers reads the file through the descriptor whose bytes were hashed
    (/proc/self/fd), so what is used is what was checked; where that path does not exist, the loaded tokenizer's
    own serialisation is hashed instead."""
    record = read_record(folder / RECORD_FILE)
    if (
        record is None
        or record.get("version") != _RECORD_VERSION
        or record.get("made_from") != made_from
        or not isinstance(record.get("kwargs"), dict)
    ):
        return None
    try:
        fd = os.open(folder / KEPT_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        with os.fdopen(os.dup(fd), "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != record.get("sha256"):
                return None
        by_fd = Path(f"/proc/self/fd/{fd}")
        try:
            out = _construct(record, str(by_fd) if by_fd.is_file() else str(folder / KEPT_FILE), folder)
        except Exception:  # a damaged file: read the folder
            return None
        if out is None:
            return None
        if not by_fd.is_file():
            if hashlib.sha256(out.backend_tokenizer.to_str().encode()).hexdigest() != record.get("sha256"):
                return None
    finally:
        os.close(fd)
    return out, str(record["fingerprint"])


def _keep(built, fingerprint: str, folder: Path, made_from: dict) -> None:
    """`built`'s serialisation and record in `folder`, written beside and renamed; kept only where the tokenizer read
    back from the file is `built` (serialisation, fingerprint, special tokens, chat template)."""
    from .fingerprints import tokenizer_sha256

    config = json.loads((folder / "tokenizer_config.json").read_text())
    kwargs = {k: v for k, v in config.items() if k not in _LOADER_KEYS}
    data = built.backend_tokenizer.to_str().encode()
    record = {
        "version": _RECORD_VERSION,
        "made_from": made_from,
        "class": type(built).__name__,
        "kwargs": kwargs,
        "chat_template": built.chat_template,
        "sha256": hashlib.sha256(data).hexdigest(),
        "fingerprint": fingerprint,
    }

    def same(path: Path) -> bool:
        back = _construct(record, str(path), folder)
        return (
            back is not None
            and back.backend_tokenizer.to_str().encode() == data
            and tokenizer_sha256(back) == fingerprint
            and back.special_tokens_map == built.special_tokens_map
            and back.chat_template == built.chat_template
        )

    if not keep_checked(folder, KEPT_FILE, RECORD_FILE, data, record, same):
        log.info("the tokenizer of %s read back from its file differs from the built one: not kept", folder)


def read_record(path: Path) -> dict | None:
    """A kept tokenizer's record (a JSON object), or None where it is missing, unreadable or not an object."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def keep_checked(folder: Path, name: str, record_name: str, data: bytes, record: dict, same) -> bool:
    """`data` as `folder`/`name` and `record` as `folder`/`record_name`, each written beside and renamed, where
    `same(path)` says the tokenizer read back from the written file is the built one; False (nothing kept) where not."""
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    tmp.write_bytes(data)
    try:
        if not same(tmp):
            return False
        os.replace(tmp, folder / name)
        rec_tmp = folder / f".{record_name}.{os.getpid()}.tmp"
        rec_tmp.write_text(json.dumps(record))
        os.replace(rec_tmp, folder / record_name)
        return True
    finally:
        tmp.unlink(missing_ok=True)

"""Where the config and tokenizer that transformers reads from a GGUF file's metadata are kept (reading them from
the file takes tens of seconds at 1.5B): a folder under the model cache named by the file's path, size and
modification time and transformers' version. `graft_core.model` reads and fills it; `graft_core.tokenizer_cache`
keeps the tokenizer's own file inside it."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

import settings

log = logging.getLogger(__name__)


def stamp_dir(path: Path) -> Path:
    """Where the config and tokenizer read from the GGUF at `path` are kept: named by the file's path, size and
    modification time and transformers' version (what they were read by)."""
    import transformers

    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}"
    return settings.get("KVGRAFT_MODEL_CACHE") / "gguf-metadata" / hashlib.sha256(key.encode()).hexdigest()[:32]


def gguf_metadata_dir(path: Path) -> Path | None:
    """The kept config and tokenizer of the GGUF at `path` (reading them from the file's metadata took minutes
    here), or None. They enter the fingerprint as read, so a changed folder gives another fingerprint."""
    folder = stamp_dir(path)
    return folder if (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file() else None


def remember(path: Path, hf_config, tokenizer) -> None:
    """Keep `hf_config` and `tokenizer` (as read from the GGUF at `path`) for the next load, written beside and
    renamed; a cache that cannot be written keeps nothing (they are read from the file again)."""
    folder = stamp_dir(path)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".read-") as tmp:
            out = Path(tmp) / "read"
            hf_config.save_pretrained(out)
            tokenizer.save_pretrained(out)
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(out, folder)
    except OSError as e:
        log.warning("the GGUF's config and tokenizer could not be kept (%s); they are read from the file at every load", e)

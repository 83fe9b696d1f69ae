"""The built-in library (library_seed/: verified items and attested fact sheets) deposited into a store,
each item through the same gate as any verified deposit. Used by `cli.py seed`, by `cli.py verify` on an
empty store, and by the eval; a repeated seed costs nothing (deposits are named before any work).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from errors import VerificationFailed

log = logging.getLogger("kvgraft.seed")

SEED_DIR = Path(__file__).resolve().parent.parent / "library_seed"


def seed_items(folder: Path = SEED_DIR) -> tuple[list[dict], list[tuple[str, str]]]:
    """The verified items (items.jsonl) and the fact sheets (*.txt: (title, text)) of a seed folder."""
    items = [json.loads(line) for line in (folder / "items.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    sheets = [(p.stem, p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.txt"))]
    return items, sheets


def seed_library(library, folder: Path = SEED_DIR, on_progress: Callable[[float, str], None] | None = None) -> int:
    """Deposit the built-in library into `library`, each item through the deposit gate: an item the model
    does not answer correctly with its graft is refused, logged and left out (the rest still seed).
    Returns how many artifacts were new."""
    progress = on_progress or (lambda f, m: None)
    items, sheets = seed_items(folder)
    total, created = len(items) + len(sheets), 0
    for i, it in enumerate(items):
        progress(i / total, f"seeding the built-in library: {i + 1}/{total} {it['question']}")
        try:
            created += library.deposit_item(**it).created
        except VerificationFailed as e:
            log.warning("seed item refused by the gate: %s", e)
    for j, (title, text) in enumerate(sheets, start=len(items)):
        progress(j / total, f"seeding the built-in library: {j + 1}/{total} fact sheet '{title}'")
        created += library.deposit_text(text, title=title, attested_by="kvgraft built-in library", admin=True).created
    progress(1.0, f"built-in library ready: {total} artifacts ({created} new)")
    return created

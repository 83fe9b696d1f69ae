"""Which models a store's artifacts were made by: the names each model fingerprint was opened under here.

An artifact is bound to its model by the fingerprint it records (and its key hashes); this table only lets a
reader name a model (`list --model packaged:smollm2-135m-instruct`, the dashboard) without loading it. It is
written when a Library's model is known (`note`), read by name or by fingerprint prefix (`fingerprints_of`).
It knows nothing about how a model computes.
"""

from __future__ import annotations

import re

from sqlalchemy import exc as sa_exc
from sqlalchemy import func, insert, select

from db import connection as dbconn
from db.rows import utcnow
from db.schema import artifacts, models
from errors import InvalidInput

_HEX_PREFIX = re.compile(r"[0-9a-f]{8,64}")
MAX_NAME_CHARS = 4096


def note(catalog, fingerprint: str, name: str) -> None:
    """Record that `fingerprint` was opened under `name` (once; a concurrent note of the same pair is the same)."""
    name = str(name)[:MAX_NAME_CHARS]
    with dbconn.read(catalog._engine) as conn:
        if conn.scalar(
            select(func.count()).select_from(models).where(models.c.fingerprint == fingerprint, models.c.name == name)
        ):
            return
    try:
        with dbconn.write(catalog._engine) as conn:
            conn.execute(insert(models).values(fingerprint=fingerprint, name=name, first_seen=utcnow()))
    except sa_exc.IntegrityError:
        pass  # another opener noted it first


def names(catalog) -> dict[str, tuple[str, ...]]:
    """fingerprint -> the names it was opened under, oldest first, for every fingerprint the table knows."""
    out: dict[str, list[str]] = {}
    with dbconn.read(catalog._engine) as conn:
        for fp, name in conn.execute(select(models.c.fingerprint, models.c.name).order_by(models.c.first_seen, models.c.name)):
            out.setdefault(fp, []).append(name)
    return {fp: tuple(v) for fp, v in out.items()}


def only(catalog, fingerprint: str) -> bool:
    """Whether every artifact in the store (if any) was made by `fingerprint`: two index reads, whatever the size."""
    with dbconn.read(catalog._engine) as conn:
        low, high = conn.execute(select(func.min(artifacts.c.model_fingerprint), func.max(artifacts.c.model_fingerprint))).one()
    return low is None or low == high == fingerprint


def made_by(catalog) -> dict[str, int]:
    """fingerprint -> how many artifacts of the store it made (one grouped read)."""
    with dbconn.read(catalog._engine) as conn:
        stmt = select(artifacts.c.model_fingerprint, func.count()).group_by(artifacts.c.model_fingerprint)
        return {fp: int(n) for fp, n in conn.execute(stmt)}


def artifact_ids(catalog, fingerprint: str) -> frozenset[str]:
    """The ids of the artifacts `fingerprint` made: all that retrieval may offer that model."""
    with dbconn.read(catalog._engine) as conn:
        return frozenset(conn.scalars(select(artifacts.c.id).where(artifacts.c.model_fingerprint == fingerprint)))


def fingerprints_of(catalog, model: str) -> tuple[str, ...]:
    """The fingerprints `model` names in this store: a name a Library opened it under, or a fingerprint's hex
    prefix (at least 8 characters) of a model whose artifacts the store holds. Raises InvalidInput naming the
    store's models when it names none."""
    model = (model or "").strip()
    if len(model) > MAX_NAME_CHARS:
        raise InvalidInput(f"a model name is at most {MAX_NAME_CHARS} characters, got {len(model)}")
    known = names(catalog)
    found = {fp for fp, ns in known.items() if model in ns}
    if _HEX_PREFIX.fullmatch(model):
        found |= {fp for fp in {*known, *made_by(catalog)} if fp.startswith(model)}
    if not found:
        listed = "; ".join(f"{', '.join(ns)} ({fp[:12]})" for fp, ns in known.items()) or "none named yet"
        raise InvalidInput(f"no model {model!r} in this store; its models: {listed} (or give a fingerprint prefix)")
    return tuple(sorted(found))

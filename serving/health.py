"""A replica's health: model loaded, catalog reachable, blob root readable, index current, and the model
able to use the store's artifacts (fingerprint). Pure checks over one `services.Library`; Ray calls
them through the deployment's `check_health`, clients through GET /health.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import services
from errors import InvalidInput, KvgraftError

FINGERPRINT_SAMPLE = 50  # newest artifacts whose model fingerprints a refusal names


class Unhealthy(KvgraftError):
    """This replica must not serve: the message lists what failed and what to do."""


@dataclass(frozen=True)
class Health:
    replica: str
    model_loaded: bool
    model_fingerprint: str
    catalog_reachable: bool
    catalog_version: int | None
    blob_root_readable: bool
    index_current: bool
    index_artifacts: int
    store_artifacts: int
    fingerprint_ok: bool  # False: the store holds artifacts and none of the newest was made by this model
    problems: tuple[str, ...]

    @property
    def healthy(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return asdict(self) | {"problems": list(self.problems), "healthy": self.healthy}


def check(lib: services.Library, blob_root: Path, replica: str, fingerprint: str) -> Health:
    """Every check, each independent of the others (a dead catalog still reports on the blob root).

    `fingerprint` is the loaded model's (empty: not loaded), read once by the caller: asking `lib.lm`
    here would wait for the model lock behind a long request and time the health check out."""
    problems: list[str] = []
    fp = fingerprint
    if not fp:
        problems.append("model not loaded: the replica is still starting or its load failed; see the replica's log")
    version, count, indexed, current, fp_ok = None, 0, 0, False, True
    try:
        version = lib.catalog_version()
        count = lib.count()
        for _ in range(2):  # a deposit elsewhere between the refresh and the read is not staleness: refresh again
            idx = lib.index()  # brings the index up to the catalog version (the same refresh answers use)
            current = not idx.is_stale(lib.catalog_version(), lib.embedder.embedder_id)
            if current:
                break
        indexed = len(idx)
        if not current:
            problems.append(
                f"index not current: built at another catalog version than {version}; it refreshes on the next answer"
            )
        newest = lib.entries(limit=FINGERPRINT_SAMPLE) if count else []
        if newest and not lib.show(newest[0].row.id).blob_present:
            problems.append(
                f"blob root {blob_root} lacks the newest artifact's file: mount the shared blob folder (KVGRAFT_BLOB_ROOT)"
            )
        if fp and newest:  # a store may hold several models' artifacts: this one must have made some of them
            try:
                fp_ok = bool(lib.entries(limit=1, model=fp))
            except InvalidInput:  # a fingerprint the store has never seen
                fp_ok = False
            if not fp_ok:
                made_by = {e.row.model_fingerprint for e in newest}
                problems.append(
                    f"model fingerprint {fp[:16]} made none of the store's artifacts (its newest made by "
                    f"{', '.join(sorted(f[:16] for f in made_by))}); this replica would refuse them all: start it with the "
                    "store's model and thread count (KVGRAFT_MODEL, KVGRAFT_THREADS)"
                )
    except KvgraftError as e:
        problems.append(f"catalog unreachable or unreadable: {e}")
    except Exception as e:  # the driver's own error types (OperationalError and friends) on a dropped connection
        problems.append(f"catalog unreachable: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    readable = blob_root.is_dir() and os.access(blob_root, os.R_OK | os.X_OK)
    if not readable:
        problems.append(f"blob root {blob_root} is missing or unreadable: mount the shared blob folder (KVGRAFT_BLOB_ROOT)")
    return Health(
        replica=replica,
        model_loaded=bool(fp),
        model_fingerprint=fp,
        catalog_reachable=version is not None,
        catalog_version=version,
        blob_root_readable=readable,
        index_current=current,
        index_artifacts=indexed,
        store_artifacts=count,
        fingerprint_ok=fp_ok,
        problems=tuple(problems),
    )

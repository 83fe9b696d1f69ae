"""Upkeep of a store, the names front ends and scripts use: export/import bundles, rebuild-and-compare,
fsck and ledger replay. Each function takes a `services.Library` and returns a frozen report with
`to_json()`; they live in `services.exchange` and `services.checks`, inside the service layer that owns
the catalog and the blobs. Listing, showing and deleting are `Library.entries`, `.show` and `.delete`.
"""

from services.checks import (
    ORPHAN_GRACE_S,
    BlobProblem,
    FsckReport,
    IndexStatus,
    RebuildReport,
    Repaired,
    ReplayEntry,
    ReplayReport,
    fsck,
    rebuild_verify,
    replay,
)
from services.exchange import BUNDLE_FORMAT, ExportReport, ImportReport, export_bundle, import_bundle

__all__ = [
    "BUNDLE_FORMAT",
    "ORPHAN_GRACE_S",
    "BlobProblem",
    "ExportReport",
    "FsckReport",
    "ImportReport",
    "IndexStatus",
    "RebuildReport",
    "ReplayEntry",
    "Repaired",
    "ReplayReport",
    "export_bundle",
    "fsck",
    "import_bundle",
    "rebuild_verify",
    "replay",
]

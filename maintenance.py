"""Upkeep of a store, the names front ends and scripts use: export/import bundles, rebuild-and-compare,
fsck and ledger replay. Each function takes a `services.Library` and returns a frozen report with
`to_json()`; they live in `services.exchange`, `services.checks` and `services.replay`, inside the
service layer that owns the catalog and the blobs. Listing, showing and deleting are `Library.entries`,
`.show` and `.delete`.
"""

from services.checks import (
    ORPHAN_GRACE_S,
    BlobProblem,
    FsckReport,
    IndexStatus,
    RebuildReport,
    Repaired,
    fsck,
    rebuild_verify,
)
from services.exchange import BUNDLE_FORMAT, ExportReport, ImportReport, export_bundle, import_bundle
from services.replay import ReplayEntry, ReplayReport, replay

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

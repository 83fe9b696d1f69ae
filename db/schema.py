"""The catalog's tables as they stand after the last migration: what queries are written against.

This module only declares; it never creates anything. Tables are created and changed by the named
steps in `migrations.py` (which keep their own frozen definitions), and a test checks that a freshly
migrated database has exactly the tables and columns declared here.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

Hash = String(64)  # a SHA-256 in lowercase hex
When = DateTime(timezone=True)  # always written as UTC

artifacts = Table(
    "artifacts",
    metadata,
    Column("id", Hash, primary_key=True),  # the artifact key: sha256(model fingerprint | parent | token ids)
    Column("content_sha256", Hash, nullable=False, index=True),  # sha256 of the blob file's bytes
    Column("model_fingerprint", Text, nullable=False),
    Column("tokens", Integer, nullable=False),  # own tokens (not counting the parent chain)
    Column("start", Integer, nullable=False),
    Column("end_pos", Integer, nullable=False),  # start + tokens
    Column("parent_id", Hash, ForeignKey("artifacts.id"), nullable=True, index=True),
    Column("root_id", Hash, nullable=False, index=True),
    Column("depth", Integer, nullable=False),
    Column("title", Text, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("bytes", BigInteger, nullable=False),  # blob file size
    Column("created_at", When, nullable=False),
    Column("probe_sha256", Hash, nullable=True),  # m003: the probe logits hash recorded at deposit
    Column("quarantine", Text, nullable=True),  # m003: why it is never grafted (None: usable)
    Column("origin", Text, nullable=True),  # m005: None deposited here; "imported" or "rebuilt: ..." (see m005)
    Index("ix_artifacts_created_at", "created_at"),  # m004_aggregates: newest-first listings stop at their LIMIT
    Index("ix_artifacts_model_fingerprint", "model_fingerprint"),  # m006_models: one model's artifacts, in a store of several
)

sources = Table(
    "sources",
    metadata,
    Column("artifact_id", Hash, ForeignKey("artifacts.id"), primary_key=True),
    Column("text", Text, nullable=False),
    Column("question", Text, nullable=True),
    Column("solution", Text, nullable=True),
    Column("answer", Text, nullable=True),
)

verifications = Table(
    "verifications",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("artifact_id", Hash, ForeignKey("artifacts.id"), nullable=True, index=True),
    Column("item_sha256", Hash, nullable=False),
    Column("verifier", String(16), nullable=False),
    Column("reference", Text, nullable=True),
    Column("verdict", String(16), nullable=False),
    Column("detail", Text, nullable=False),
    Column("created_at", When, nullable=False),
    # m003_verification_record: what makes the gate's run replayable
    Column("question_token_ids", Text, nullable=True),  # JSON list of the prompt's token ids
    Column("question_sha256", Hash, nullable=True),
    Column("generated_token_ids", Text, nullable=True),  # JSON list of what the model generated with the graft
    Column("generated_sha256", Hash, nullable=True),
    Column("generated_answer", Text, nullable=True),  # the answer cut from the generation, as the verifier saw it
    Column("provenance", String(32), nullable=True),  # verified | imported, not re-verified | attested | not gated
)

embeddings = Table(
    "embeddings",
    metadata,
    Column("artifact_id", Hash, ForeignKey("artifacts.id"), primary_key=True),
    Column("embedder_id", String(200), primary_key=True, index=True),
    Column("dim", Integer, nullable=False),
    Column("vector", LargeBinary, nullable=False),  # float32 little-endian, 4 * dim bytes
    Column("text_sha256", Hash, nullable=False),  # sha256 of the exact text that was embedded
)

ledger = Table(
    "ledger",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("created_at", When, nullable=False),
    Column("query_sha256", Hash, nullable=False),
    Column("query", Text, nullable=False),
    Column("prompt_sha256", Hash, nullable=False),
    Column("artifact_ids", Text, nullable=False),  # JSON list of artifact ids, root first
    Column("tier", String(16), nullable=False),
    Column("model_fingerprint", Text, nullable=False),
    Column("output_token_ids", Text, nullable=False),  # JSON list of ints
    Column("output_sha256", Hash, nullable=False),
    Column("logits_sha256", Hash, nullable=True),
    Column("grafted_tokens", Integer, nullable=False),
    Column("computed_tokens", Integer, nullable=False),
    Column("decode_tokens", Integer, nullable=False),
    Column("baseline_tokens", Integer, nullable=False),
    Column("baseline_measured", Boolean, nullable=False),
    Column("ttft_s", Float, nullable=False),
    Column("baseline_ttft_s", Float, nullable=True),
    Column("total_s", Float, nullable=False),
    Column("exact", Boolean, nullable=True),
    Column("check_json", Text, nullable=True),
    Column("flops", BigInteger, nullable=False),
    Column("baseline_flops", BigInteger, nullable=False),
    Column("query_chars", Integer, nullable=True),  # m002_ledger_bounds
    Index("ix_ledger_created_at", "created_at"),  # m002_ledger_bounds: retention deletes by age
)

# m004_aggregates: one row (id = 1) of running totals, changed in the same transaction as the rows they
# sum (db/aggregates.py); pruning the ledger leaves them as they were.
totals = Table(
    "totals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    *(
        Column(name, BigInteger, nullable=False)
        for name in (
            "answers",
            "grafted_tokens",
            "computed_tokens",
            "decode_tokens",
            "baseline_tokens",
            "tokens_saved",
            "flops",
            "baseline_flops",
            "checks_passed",
            "checks_failed",
            "artifacts",
            "store_tokens",
            "recall_saved",  # tokens saved by recalls of items solve found (the flywheel)
        )
    ),
    Column("flywheel_filled", Boolean, nullable=False),  # discoveries back-filled from flywheel.jsonl, or kept since
)

# m004_aggregates: per item `solve` found, what finding it cost and what its recalls computed and saved.
discoveries = Table(
    "discoveries",
    metadata,
    Column("artifact_id", Hash, primary_key=True),  # no foreign key: a deleted item's figures stay
    Column("tokens_spent", BigInteger, nullable=False),
    Column("recalls", BigInteger, nullable=False),
    Column("recall_tokens", BigInteger, nullable=False),
    Column("saved", BigInteger, nullable=False),
    Column("created_at", When, nullable=False, index=True),
)

# m004_aggregates: the flywheel's cumulative tokens saved, one point per recall (the newest are kept).
recall_points = Table(
    "recall_points",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("created_at", When, nullable=False),
    Column("saved_total", BigInteger, nullable=False),
)

# One row (id = 1). `version` is bumped in the same transaction as any change to artifacts or
# embeddings, so a replica that polls it knows when its FAISS index is stale.
meta = Table(
    "meta",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("version", BigInteger, nullable=False),
)

# m006_models: the names a model was opened under in this store, by fingerprint (an artifact records only
# the fingerprint; `list --model NAME` and the dashboard read names here). One fingerprint may have several
# names (the packaged Gemma and its GGUF given by path are the same model).
models = Table(
    "models",
    metadata,
    Column("fingerprint", Hash, primary_key=True),  # LoadedModel.fingerprint (model identity + configuration)
    Column("name", Text, primary_key=True),  # KVGRAFT_MODEL as given: packaged:..., a folder, a .gguf path
    Column("first_seen", When, nullable=False),
)

schema_migrations = Table(
    "schema_migrations",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("applied_at", When, nullable=False),
)

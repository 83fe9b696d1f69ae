"""The benchmarks: each module measures one claim and writes its figures under docs/bench/ (bench.ttft's
as engine.json). None of this is installed with the product; run each from the repository root as a module
(`make bench` runs the first eight, `make bench-verify` the samples):

    .venv/bin/python -m bench.ttft        # time to first token grafted vs fresh, restore vs read, bytes per token
    .venv/bin/python -m bench.retrieval   # FAISS flat vs HNSW search latency and the embedder's query latency
    .venv/bin/python -m bench.serving     # concurrent users against the running web app (bench.users is their process)
    .venv/bin/python -m bench.batch       # decode and prompt throughput of sessions stepped together vs alone
    .venv/bin/python -m bench.scale       # a store far past the model's window, with flat memory
    .venv/bin/python -m bench.kernels     # where the grafted TTFT goes, and what other CPU kernels would do
    .venv/bin/python -m bench.imports     # what an import's proof costs: every artifact recomputed from its tokens
    .venv/bin/python -m bench.peer        # the grafted path against llama.cpp's prompt-state save/restore
    .venv/bin/python -m bench.exactness   # the deposit gate's acceptance and the N-sample exactness reports
    .venv/bin/python -m bench.relevance   # paraphrase top-1 and false grafts on near misses
    .venv/bin/python -m bench.proof       # the per-answer proof's share of an answer's wall time
    .venv/bin/python -m bench.abuse       # a user's chat latency while anonymous clients hammer the app
    .venv/bin/python -m bench.faults      # full disks, I/O errors, a killed database and 100 kills: nothing lost

Each takes `--help`; bench/llamacpp/ holds the peer's build script, its measuring script and the prefix texts.
"""

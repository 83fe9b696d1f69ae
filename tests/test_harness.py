"""lm-evaluation-harness itself (pinned in requirements-dev.txt) against a real server on loopback: its
`local-completions` model runs a generate_until task and a loglikelihood (multiple choice) task on a local file
(tests/data/harness/), sending what it always sends (token-id prompts, echo with logprobs, stop sequences), and
the same run twice gives the same scores and the same per-item answers and log-likelihoods."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import services
from retrieval import HashEmbedder

pytest.importorskip("lm_eval")

TASKS = Path(__file__).resolve().parent / "data" / "harness"


@pytest.fixture(scope="module")
def harness_server(tmp_path_factory, tiny_gemma):
    import server
    from serving.openai_shapes import model_id
    from tests.served import serve

    folder = tmp_path_factory.mktemp("harness")
    lib = services.Library(home=folder / "home", lm=tiny_gemma, embedder=HashEmbedder())  # empty: nothing grafted
    tiny_gemma.tokenizer.save_pretrained(folder / "tokenizer")  # the harness tokenises with the model's own tokenizer
    demo = server.build(lib, admin_token="harness-admin")
    serve(demo)
    yield demo.local_url.rstrip("/") + "/v1/completions", model_id(lib), folder
    demo.close()
    lib.close()


def _run(url: str, model: str, folder: Path, out: Path) -> dict:
    args = ",".join(
        [
            f"model={model}",
            f"base_url={url}",
            "tokenizer_backend=huggingface",
            f"tokenizer={folder / 'tokenizer'}",
            "tokenized_requests=True",
            "num_concurrent=1",
            "max_retries=1",
            "max_length=256",
        ]
    )
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", args]
    cmd += ["--tasks", "kv_generate,kv_choice", "--include_path", str(TASKS), "--output_path", str(out), "--log_samples"]
    env = os.environ | {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OPENAI_API_KEY": ""}
    done = subprocess.run(cmd, cwd=TASKS, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    results = sorted(out.rglob("results_*.json"))
    assert results, done.stderr[-2000:]
    samples = {  # samples_<task>_<timestamp>.jsonl
        p.name.removeprefix("samples_").rsplit("_", 1)[0]: [json.loads(x) for x in p.read_text().splitlines()]
        for p in out.rglob("samples_*.jsonl")
    }
    return {"results": json.loads(results[-1].read_text())["results"], "samples": samples}


def test_the_harness_runs_a_generate_and_a_loglikelihood_task_with_the_same_scores_twice(harness_server, tmp_path):
    url, model, folder = harness_server
    first = _run(url, model, folder, tmp_path / "one")
    second = _run(url, model, folder, tmp_path / "two")
    gen, choice = first["results"]["kv_generate"], first["results"]["kv_choice"]
    assert 0.0 <= gen["exact_match,strip"] <= 1.0 and 0.0 <= choice["acc,none"] <= 1.0
    assert first["results"] == second["results"]

    def answers(run: dict, task: str) -> list:
        rows = sorted(run["samples"][task], key=lambda r: r["doc_id"])
        return [r["resps"] for r in rows]

    for task in ("kv_generate", "kv_choice"):
        assert len(answers(first, task)) == 6 and answers(first, task) == answers(second, task), task
    loglik = [x for resp in answers(first, "kv_choice") for pair in resp for x in pair]
    assert all(float(v[0]) < 0 and v[1] in ("True", "False") for v in loglik), loglik[:4]  # each choice scored: a log-probability

"""Ray Serve replicas over one shared store (serving/): a local Ray instance, 2 replicas of the tiny model,
a real PostgreSQL catalog and a temporary shared blob root. Replicas answer byte-identically (and
identically to an in-process Library), a deposit through one is retrieved and grafted by the other
without a restart, and a replica killed under a request costs the client one retry and loses nothing.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("ray", reason="ray[serve] is not installed (pip install -r requirements.txt)")

import services  # noqa: E402
from errors import InvalidInput  # noqa: E402
from retrieval import HashEmbedder  # noqa: E402
from services import (
    AnswerOptions,
    fsck,  # noqa: E402
)
from serving import ServeSettings, health, launch  # noqa: E402
from serving.client import BackendRefused, Client  # noqa: E402

TOKEN = "serve-admin-token"
SEEDED = (
    "The Quendel tower of Marrowby is 4242 metres tall and built from blue basalt.",
    "Snow owls of the Tarn valley nest in hollow larch trunks every second winter.",
)
QUESTION = "How tall is the Quendel tower of Marrowby?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local(settings: ServeSettings, home, lm) -> services.Library:
    """An in-process Library over the same shared store as the replicas (for seeding, fsck, comparison)."""
    return services.Library(home=home, db_url=settings.db_url, lm=lm, embedder=HashEmbedder(), blob_root=settings.blob_root)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, postgres_url, tiny_dirs, tiny_gemma):
    root = tmp_path_factory.mktemp("serve")
    settings = ServeSettings(
        db_url=postgres_url,
        blob_root=root / "shared-blobs",
        state_root=root / "replica-state",
        model=str(tiny_dirs["gemma3"]),
        admin_token=TOKEN,
        embedder="hash",
        replicas=2,
        max_ongoing_requests=1,  # one request per replica at a time: concurrent requests spread over both
        replica_cpus=0.5,
        health_check_period_s=2.0,
        graceful_shutdown_timeout_s=5.0,
        body_read_s=5.0,  # short, for the half-sent body below
        port=_free_port(),
    )
    settings.blob_root.mkdir(parents=True)
    seeder = _local(settings, root / "seeder", tiny_gemma)
    seeded = [seeder.deposit_text(t, title=t[:20]).id for t in SEEDED]
    seeder.close()
    url = launch.start(settings, num_cpus=2)
    try:
        yield settings, Client(url, admin_token=TOKEN, timeout_s=300, retries=3), seeded
    finally:
        launch.stop()


def _concurrently(n: int, fn):
    with ThreadPoolExecutor(n) as pool:
        return [f.result(timeout=600) for f in [pool.submit(fn, i) for i in range(n)]]


@pytest.mark.ray
@pytest.mark.postgres
def test_two_replicas_answer_concurrently_and_byte_identically(deployment, tmp_path, tiny_gemma):
    settings, client, seeded = deployment
    replies = _concurrently(6, lambda i: client.answer(QUESTION, max_new_tokens=8))
    served_by = {r.replica for r in replies}
    assert len(served_by) == 2, f"both replicas should have answered, got {served_by}"
    hashes = {r.payload["output_sha256"] for r in replies}
    assert len(hashes) == 1, f"replicas disagree on the output tokens: {hashes}"
    assert all(seeded[0] in r.payload["artifact_ids"] for r in replies), "the tower fact should be retrieved and grafted"
    # each replica probe-proved the seeded artifacts at start: even its first answer carries the one-hash state proof
    assert {(r.payload["proof"]["kind"], r.payload["proof"]["passed"]) for r in replies} == {("state", True)}
    local = _local(settings, tmp_path / "local", tiny_gemma).answer(QUESTION, AnswerOptions(max_new_tokens=8))
    assert local.output_sha256 == hashes.pop(), "a replica's answer differs from the same answer computed in this process"


@pytest.mark.ray
@pytest.mark.postgres
def test_health_reports_every_check_from_each_replica(deployment):
    settings, client, seeded = deployment
    seen = {}
    for _ in range(20):
        for r in _concurrently(2, lambda i: client.health()):
            seen[r.replica] = r.payload
        if len(seen) == 2:
            break
    assert len(seen) == 2, f"health answered by {sorted(seen)} only"
    for rid, h in seen.items():
        assert h["healthy"] and not h["problems"], h
        assert h["replica"] == rid and h["actor_name"].endswith(rid)
        assert h["model_loaded"] and h["catalog_reachable"] and h["blob_root_readable"] and h["index_current"]
        assert h["store_artifacts"] >= len(seeded) and h["index_artifacts"] == h["store_artifacts"]
        assert re.match(rf"probe-proved {len(seeded)} artifacts ahead of their first answers", h["warm_proofs"]), h


@pytest.mark.ray
@pytest.mark.postgres
def test_deposit_through_one_replica_is_grafted_by_the_other_and_bytes_match(deployment, tmp_path, tiny_gemma):
    settings, client, _ = deployment
    fact = "The glass bridge of Ostrava Minor spans 917 metres over the Vell gorge."
    dep = client.deposit_text(fact, title="glass bridge")
    assert dep.payload["created"], dep.payload
    depositor = dep.replica
    others = []
    for _ in range(10):  # until the other replica has served it: both are busy under two concurrent requests
        for r in _concurrently(2, lambda i: client.answer(fact, max_new_tokens=4)):
            assert dep.payload["id"] in r.payload["artifact_ids"], f"replica {r.replica} did not graft the new deposit"
            if r.replica != depositor:
                others.append(r)
        if others:
            break
    assert others, "no other replica answered"
    again = client.deposit_text(fact, title="glass bridge")
    assert not again.payload["created"] and again.payload["content_sha256"] == dep.payload["content_sha256"]
    fresh = services.Library(home=tmp_path / "solo", lm=tiny_gemma, embedder=HashEmbedder()).deposit_text(fact, title="x")
    assert fresh.content_sha256 == dep.payload["content_sha256"], "the replica's artifact bytes differ from a local deposit"


@pytest.mark.ray
@pytest.mark.postgres
def test_deposit_needs_the_admin_token(deployment):
    settings, client, _ = deployment
    anonymous = Client(client.base_url, admin_token="", retries=0)
    with pytest.raises(BackendRefused) as e:
        anonymous.deposit_text("Anyone may not deposit this.")
    assert e.value.status == 403 and "admin token" in str(e.value)
    wrong = Client(client.base_url, admin_token="guess", retries=0)
    with pytest.raises(BackendRefused) as e:
        wrong.deposit_text("Nor this.")
    assert e.value.status == 403 and str(e.value).startswith("admin token refused")


def _replica_actor_names(settings) -> list[str]:
    """The Ray actor names of the running replicas (what `ray.kill` or `ray.get_actor(..., namespace="serve")` takes)."""
    import ray

    prefix = f"SERVE_REPLICA::{settings.app_name}#"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix))


@pytest.mark.ray
@pytest.mark.postgres
def test_replica_killed_mid_request_costs_a_retry_and_loses_nothing(deployment, tmp_path, tiny_gemma):
    """Two long requests (60-sample exactness checks: 15 finished within the second on a Zen 5 host) keep
    both replicas busy; one replica is killed. Its request is retried on a live replica and completes;
    the store loses nothing; fsck is clean."""
    import ray

    settings, client, _ = deployment
    kept = client.deposit_text("The Vell gorge ferry carries 12 carts an hour.", title="ferry").payload["id"]
    before = {e["id"] for e in client.library(limit=1000).payload}
    names = _replica_actor_names(settings)
    assert len(names) == 2 and kept in before, names
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(lambda seed: client.request("POST", "/verify", {"samples": 60, "seed": seed}), s) for s in (1, 2)]
        time.sleep(1.0)  # both replicas are busy now: one request each (max_ongoing_requests=1)
        assert not any(f.done() for f in futures), "the requests finished before the kill: make them longer"
        ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
        reports = [f.result(timeout=900) for f in futures]
    assert sorted(r.attempts for r in reports)[-1] >= 2, "neither request noticed the killed replica"
    assert all(r.payload["byte_equal"] == r.payload["samples"] == 60 for r in reports), [r.payload["byte_equal"] for r in reports]
    after = {e["id"] for e in client.library(limit=1000).payload}
    assert after == before, f"lost {before - after}, appeared {after - before}"
    lib = _local(settings, tmp_path / "fsck", tiny_gemma)
    lib.index()
    report = fsck(lib)
    assert report.consistent, report.to_json()
    again = client.deposit_text("The Vell gorge ferry carries 12 carts an hour.", title="ferry").payload
    assert again["id"] == kept and not again["created"], "the surviving replicas must see the deposit made before the kill"


@pytest.mark.ray
@pytest.mark.postgres
def test_gradio_app_fronts_the_deployment(deployment, tmp_path, tiny_gemma):
    """`python app.py` with KVGRAFT_BACKEND_URL: no engine in its process, the answer is the in-process
    answer byte for byte (output_sha256), an anonymous deposit is refused and the store is unchanged."""
    gradio_client = pytest.importorskip("gradio_client")
    from gradio_client.exceptions import AppError

    settings, client, _ = deployment
    port = _free_port()
    env = os.environ | {
        "KVGRAFT_BACKEND_URL": client.base_url,
        "KVGRAFT_ADMIN_TOKEN": TOKEN,
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "GRADIO_SERVER_PORT": str(port),
        "KVGRAFT_HOME": str(tmp_path / "front-home"),  # must stay empty: the front end opens no store
    }
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    app = subprocess.Popen(
        [sys.executable, "app.py"], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        for line in app.stdout:  # "page served at ..." once Gradio listens
            if "page served" in line or app.poll() is not None:
                break
        assert app.poll() is None, f"app.py exited with {app.returncode}"
        front = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
        for _ in range(60):  # the connecting stage: GET /health until healthy (NotReady until then)
            try:
                r = front.predict(QUESTION, max_new_tokens=8, api_name="/answer")
                break
            except AppError as e:
                assert "Still starting" in str(e), e
                time.sleep(0.5)
        local = _local(settings, tmp_path / "local", tiny_gemma).answer(QUESTION, AnswerOptions(max_new_tokens=8))
        assert r["output_sha256"] == local.output_sha256, "the front end's answer differs from the in-process answer"
        assert r["artifact_ids"] == list(local.artifact_ids) and r["answer"] == local.answer
        before = client.library(limit=1000).payload
        with pytest.raises(AppError, match="Admin token refused"):
            front.predict("", text="Anonymous visitors may not deposit this.", api_name="/deposit")
        assert client.library(limit=1000).payload == before, "an anonymous deposit changed the store"
        maps = open(f"/proc/{app.pid}/maps").read() if os.path.exists(f"/proc/{app.pid}/maps") else ""
        assert "libtorch" not in maps, "the front end loaded torch"
        assert not (tmp_path / "front-home").exists(), "the front end created a local store"
    finally:
        app.terminate()
        app.wait(timeout=30)


# ---- without Ray: the health rules and the settings a deployment is built from ----------------------


def test_health_refuses_a_foreign_model_and_a_missing_blob_root(tmp_path, tiny_gemma, tiny_llama):
    blobs = tmp_path / "shared-blobs"
    url = f"sqlite:///{tmp_path / 'catalog.sqlite3'}"

    def lib(name, lm):
        return services.Library(home=tmp_path / name, db_url=url, lm=lm, embedder=HashEmbedder(), blob_root=blobs)

    gemma = lib("gemma", tiny_gemma)
    gemma.deposit_text(SEEDED[0])
    ok = health.check(gemma, blobs, "r1", tiny_gemma.fingerprint)
    assert ok.healthy and ok.index_current and ok.index_artifacts == ok.store_artifacts == 1, ok.problems
    foreign = health.check(lib("llama", tiny_llama), blobs, "r2", tiny_llama.fingerprint)
    assert not foreign.healthy and not foreign.fingerprint_ok
    assert "made none of the store's artifacts" in foreign.problems[0] and tiny_gemma.fingerprint[:16] in foreign.problems[0]
    blobs.rename(tmp_path / "unmounted")
    gone = health.check(gemma, blobs, "r1", tiny_gemma.fingerprint)
    assert not gone.blob_root_readable and any(str(blobs) in p and "KVGRAFT_BLOB_ROOT" in p for p in gone.problems), gone.problems


def test_settings_give_a_fixed_count_or_autoscaling_bounds(tmp_path, monkeypatch):
    monkeypatch.setenv("KVGRAFT_SERVE_MIN_REPLICAS", "2")
    monkeypatch.setenv("KVGRAFT_SERVE_MAX_REPLICAS", "6")
    monkeypatch.setenv("KVGRAFT_SERVE_DRAIN_S", "30")
    auto = ServeSettings.from_env().deployment_options()
    assert auto["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 6, "target_ongoing_requests": 1.0}
    assert "num_replicas" not in auto and auto["graceful_shutdown_timeout_s"] == 30.0
    fixed = ServeSettings.from_env(replicas=3).deployment_options()
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    monkeypatch.setenv("KVGRAFT_SERVE_MAX_REPLICAS", "1")
    with pytest.raises(InvalidInput, match="min_replicas <= max_replicas, got 2 and 1"):
        ServeSettings.from_env()
    monkeypatch.setenv("KVGRAFT_DB_URL", "postgresql+psycopg://kv:secret@db/kv")
    monkeypatch.setenv("KVGRAFT_SERVE_MAX_REPLICAS", "4")
    assert "secret" not in str(ServeSettings.from_env().public())


def test_anonymous_verify_on_a_replica_gets_the_web_apps_bounds(kvgraft_home, tiny_gemma):
    """The replica's /verify bounds an anonymous caller as the web app does (few steps, short chains, no
    monolithic recomputation, relocation inside the context); the admin gets the full check."""
    from serving import replica

    lib = services.Library(home=kvgraft_home, lm=tiny_gemma, embedder=HashEmbedder())
    try:
        lib.deposit_text("The harbour master of Quenmora was Osric Pellamy.\n")
        r = object.__new__(replica.Replica.func_or_class)  # the class Serve deploys, without Ray
        r.lib = lib
        anon = r._verify({"samples": 1, "rows": True}, admin=False)["rows"][0]
        full = r._verify({"samples": 1, "rows": True}, admin=True)["rows"][0]
        assert (anon["decode_steps"], full["decode_steps"]) == (2, 4)  # 2 compared steps for anonymous callers
        assert anon.get("monolithic_kl") is None and full["monolithic_kl"] is not None
        with pytest.raises(InvalidInput, match="relocate"):
            r._verify({"samples": 1, "relocate": tiny_gemma.info.max_positions}, admin=False)
    finally:
        lib.close()


@pytest.mark.ray
@pytest.mark.postgres
def test_the_openai_client_against_kvgraft_serve(deployment):
    """`kvgraft serve`'s replicas speak the OpenAI API: chat and completions, whole and streamed (the same bytes),
    the proof and cached tokens in each, the admin's deposits refused without the token, metrics per replica."""
    openai = pytest.importorskip("openai")
    from prometheus_client.parser import text_string_to_metric_families

    settings, client, seeded = deployment
    api = openai.OpenAI(base_url=client.base_url + "/v1", api_key="anonymous", max_retries=2, timeout=300)
    (model,) = [m.id for m in api.models.list()]
    messages = [{"role": "user", "content": QUESTION}]
    whole = api.chat.completions.create(model=model, messages=messages, max_tokens=8)
    k = whole.model_extra["kvgraft"]
    assert seeded[0] in k["artifact_ids"] and k["state_proof"]["passed"] is True
    assert whole.usage.prompt_tokens_details.cached_tokens == k["grafted_tokens"] > 0
    chunks = list(api.chat.completions.create(model=model, messages=messages, max_tokens=8, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks).encode() == whole.choices[0].message.content.encode()
    assert chunks[-1].model_extra["kvgraft"]["output_token_ids"] == k["output_token_ids"]
    done = api.completions.create(model=model, prompt="The Quendel tower", max_tokens=6, temperature=0.8, seed=1)
    again = list(
        api.completions.create(model=model, prompt="The Quendel tower", max_tokens=6, temperature=0.8, seed=1, stream=True)
    )
    assert "".join(c.choices[0].text for c in again) == done.choices[0].text
    assert again[-1].model_extra["kvgraft"]["output_token_ids"] == done.model_extra["kvgraft"]["output_token_ids"]
    with pytest.raises(openai.AuthenticationError):
        api.post("/kvgraft/deposits", body={"text": "x"}, cast_to=object)
    import urllib.request

    with urllib.request.urlopen(client.base_url + "/metrics", timeout=60) as r:
        metrics = r.read().decode()
    assert "kvgraft_requests" in {f.name for f in text_string_to_metric_families(metrics)}


@pytest.mark.ray
@pytest.mark.postgres
def test_a_half_sent_body_is_cut_at_the_replicas_deadline_and_the_replicas_go_on(deployment):
    """A client that sends 10 of the 100 bytes its Content-Length promises is answered 408 in OpenAI's shape once
    body_read_s has passed (Ray's proxy streams the body to the replica, whose BodyDeadline times it), and the
    replicas answer the next request."""
    settings, client, _seeded = deployment
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", settings.port), timeout=60) as sock:
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"model": ')
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
    waited = time.monotonic() - t0
    assert got.startswith(b"HTTP/1.1 408"), got[:300]
    assert b'"type":"timeout_error"' in got.replace(b" ", b"") and 4.5 < waited < 45, (waited, got[-300:])
    assert "output_sha256" in client.answer(QUESTION, max_new_tokens=2).payload

"""The simulated users of `bench.serving`, in a process of their own: the server's process then holds the
server alone, as it would in a deployment, instead of sharing one interpreter lock with its clients.

Reads one JSON line on stdin: {"url", "users", "per_user", "questions", "max_new_tokens"}; builds one
`gradio_client.Client` per user (not timed), prints "ready", waits for a "go" line, then runs every user's
requests at once (a thread per user) and prints one JSON line: the wall time from "go" to the last
answer and, per request, [seconds, ok, question, output_sha256, logits_sha256]. The caller compares the
hashes with the same questions answered alone.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def main() -> None:
    from gradio_client import Client

    spec = json.loads(sys.stdin.readline())
    clients = [Client(spec["url"], verbose=False) for _ in range(spec["users"])]
    questions, per_user = spec["questions"], spec["per_user"]

    def user(u: int) -> list[list]:
        out = []
        for j in range(per_user):
            q = questions[(u * per_user + j) % len(questions)]
            t = time.perf_counter()
            try:
                r = clients[u].predict(q, check=False, max_new_tokens=spec["max_new_tokens"], api_name="/answer")
                row = [r["tier"] == "exact" and bool(r["answer"]), q, r["output_sha256"], r["logits_sha256"]]
            except Exception as e:  # counted as an error by the caller
                print(f"error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                row = [False, q, "", ""]
            out.append([time.perf_counter() - t, *row])
        return out

    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(clients)) as pool:
        results = [x for f in [pool.submit(user, u) for u in range(len(clients))] for x in f.result()]
    print(json.dumps({"wall_s": time.perf_counter() - t0, "requests": results}), flush=True)


if __name__ == "__main__":
    main()

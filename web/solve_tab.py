"""The web app's "Solve and learn" tab: anyone may solve a problem from the trusted problem set (its
reference comes from datasets/, never from the user; the budget, the attempts and each attempt's decode steps
are bounded, and every attempt is its own model turn of about one chat); an admin (token) may solve any
question against any reference. Formatting lives in web/views.py; the work in services.solve.
"""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

import services
from access.guard import Guard
from errors import KvgraftError
from services.limits import ANON_SOLVE_ATTEMPTS, MAX_SEED, anon_max_new_tokens, whole
from web.handlers import call, model_turn
from web.refusal import Refusal, require_text
from web.views import input_problem, solve_summary

PUBLIC_SOLVE_BUDGET = 1024  # tokens an anonymous solve may spend (the admin may spend more)
ADMIN_SOLVE_BUDGET = 16384


def trusted_problems(path: Path) -> dict[str, dict]:
    """The trusted problem set (datasets/problems.jsonl): an anonymous solve takes its reference from here."""
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()] if path.exists() else []
    return {f"{r['id']}: {r['question'][:90]}": r for r in rows}


def solve_tab(library: services.LibraryDoor, guard: Guard, problems_path: Path) -> gr.Tab:
    """The tab; `guard` checks the admin token of the free-question form and holds the model fairly."""
    problems = trusted_problems(problems_path)

    def numbers(budget, seed, top: int) -> tuple[int, int]:
        try:
            return whole("budget", budget, 1, top), whole("seed", seed, 0, MAX_SEED)
        except KvgraftError as exc:
            raise Refusal(str(exc)) from None

    def run(request, question, verifier, reference, budget, seed, progress, **bounds):
        progress(0.1, desc="library first, then the model works")
        with model_turn(guard, request) as turn:
            r = call(library.solve, question, verifier, reference, budget=budget, seed=seed, between=turn.pause, **bounds)
        return solve_summary(r)

    def solve_public(choice, budget, seed, request: gr.Request, progress=gr.Progress()):
        require_text(choice)
        row = problems.get(choice) if isinstance(choice, str) else None
        if row is None:
            raise Refusal("Pick a problem from the trusted problem set.")
        budget, seed = numbers(budget, seed, PUBLIC_SOLVE_BUDGET)
        anonymous = {"attempts": ANON_SOLVE_ATTEMPTS, "max_new_tokens": anon_max_new_tokens()}
        return run(request, row["question"], row["verifier"], row["reference"], budget, seed, progress, **anonymous)

    def solve_admin(admin_token, question, verifier, reference, budget, seed, request: gr.Request, progress=gr.Progress()):
        require_text(admin_token, question, verifier, reference)
        call(guard.admin, admin_token, request)
        problem = input_problem(question)
        if problem:
            raise Refusal(problem)
        budget, seed = numbers(budget, seed, ADMIN_SOLVE_BUDGET)
        return run(request, question, verifier, reference, budget, seed, progress)

    with gr.Tab("Solve and learn", id="solve") as tab:
        gr.Markdown(
            "The flywheel: the library is tried first (a verified artifact grafted, the verifier checks the answer); "
            "otherwise the model works (greedy, then seeded samples) until the verifier accepts an answer or the token "
            "budget is spent. A passing answer is deposited through the verification gate and recalled for a handful "
            "of decode tokens afterwards. Every token computed is counted."
        )
        with gr.Row():
            sb = gr.Slider(64, PUBLIC_SOLVE_BUDGET, 512, step=64, label="budget (tokens)")
            # a float reaches the handler (precision=0 would round nan or 1e300 in Gradio, which fails there)
            ss = gr.Number(0, minimum=0, step=1, label="seed")
        with gr.Tab("trusted problem set (anyone)"):
            sp = gr.Dropdown(list(problems), label="problem (the reference comes from datasets/, never from you)")
            pbtn = gr.Button("Solve", variant="primary")
        with gr.Tab("any question (admin)"):
            stok = gr.Textbox(label="admin token", type="password")
            sq = gr.Textbox(label="question")
            with gr.Row():
                sv = gr.Dropdown(["exact", "numeric", "sympy"], value="numeric", label="verifier")
                sr = gr.Textbox(label="reference")
            abtn = gr.Button("Solve", variant="primary")
        sout = gr.Markdown()
        stbl = gr.Dataframe(
            headers=["#", "mode", "temperature", "seed", "answer", "verdict", "tokens", "detail"], interactive=False
        )
        pbtn.click(solve_public, [sp, sb, ss], [sout, stbl], concurrency_id="model", api_visibility="private")
        abtn.click(solve_admin, [stok, sq, sv, sr, sb, ss], [sout, stbl], concurrency_id="model", api_visibility="private")
    return tab

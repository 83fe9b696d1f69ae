"""The web app's Dashboard tab: the store's figures (stats panel, tokens, speedup, store size, the flywheel),
drawn from `Library.stats()` and `flywheel()` (running totals, never a scan of the ledger) and shared by every
open dashboard for its refresh period (`SharedRender`). Formatting lives in `web.views`.
"""

from __future__ import annotations

import gradio as gr

import services
from web.handlers import SharedRender
from web.handlers import call as _call
from web.views import flywheel_plot, speedup_plot, stats_html, store_plot, tokens_plot


def figures(library: services.LibraryDoor):
    s = _call(library.stats)
    plots = (tokens_plot(s.recent), speedup_plot(s.recent), store_plot(s.store_tokens, s.window))
    return stats_html(s), *plots, flywheel_plot(_call(library.flywheel))


def dashboard_tab(library: services.LibraryDoor, other_tabs: list[gr.Tab], reads: dict) -> None:
    with gr.Tab("Dashboard", id="dashboard") as tab:
        stats = gr.HTML(elem_id="kv-stats")
        with gr.Row():
            p_tokens = gr.Plot(label="computed vs baseline tokens", show_label=False, elem_id="kv-plot-tokens")
            p_speed = gr.Plot(label="time-to-first-token speedup", show_label=False, elem_id="kv-plot-ttft")
        p_store = gr.Plot(label="store size vs context window", show_label=False, elem_id="kv-plot-store")
        p_fly = gr.Plot(label="the flywheel: learning and recall", show_label=False, elem_id="kv-plot-flywheel")
        plots = (p_tokens, p_speed, p_store, p_fly)

        def encoded() -> tuple:  # the figures drawn once and encoded once, for every session within the period
            html, *drawn = figures(library)
            return html, *(plot.postprocess(f) for plot, f in zip(plots, drawn, strict=True))

        dashboard = SharedRender(encoded)
        # Ticks only while the dashboard is open: rendering plots beside an answer would skew its timings.
        timer = gr.Timer(5.0, active=False)
        outputs = [stats, p_tokens, p_speed, p_store, p_fly]
        timer.tick(dashboard, None, outputs, show_progress="hidden", **reads)
        tab.select(lambda: (*dashboard(), gr.Timer(active=True)), None, [*outputs, timer], show_progress="hidden", **reads)
        for other in other_tabs:
            other.select(lambda: gr.Timer(active=False), None, timer, queue=False, api_visibility="private")

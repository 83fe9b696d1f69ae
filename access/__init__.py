"""The edge: who may ask what, and how much, below both front ends (the page in `web/`, the API in `serving/`).

Modules: `guard` (the admin token and its lockout, the fair turns on the model per address and session, `Guard`
over both), `admission` (model requests counted when they join a queue), `limiter` (the per-address rate of work
requests, 429 held a second), `bounds` (one answer's bounds by who asks), `bodies` (what a request body may hold:
text that encodes, no file by URL, a size), `uploads` (the upload gate: the admin's only, by token header or
signed session cookie, within budgets and a disk floor). It imports neither front end, no torch and no Gradio
(the upload gate reads Gradio's upload folder only when it is first used), so importing it costs nothing.
"""

"""`python app.py`: the app's entry point, what `make run` and a Hugging Face Space start (server.py: the page, /v1, /metrics).

A placeholder page answers on the app's port at once, while Gradio and the app import (~5 s); then the
app takes the port over and its start-up stages run behind the page.
"""

import time

T0 = time.perf_counter()  # "page served after N s" counts from here

if __name__ == "__main__":
    from web.placeholder import serve_while_starting

    boot = serve_while_starting(T0)
    from server import main

    main(boot, T0)

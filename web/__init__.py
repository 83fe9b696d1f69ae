"""kvgraft's web front end: the Gradio app and its tabs (`app`, `solve_tab`, `views`), the handlers' glue to
the model's fair turns (`handlers`, `guard`), the start-up stages behind the page (`startup`), the page
before the page (`placeholder`), where it runs (`hosting`) and the adapter to a Ray deployment (`remote`).
Importing the package loads nothing: `placeholder` must serve in a fraction of a second."""

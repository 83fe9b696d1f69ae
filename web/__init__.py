"""kvgraft's page: the Gradio app and its tabs (`app`, `solve_tab`, `views`), the handlers' glue to the model's fair
turns (`handlers`) and to the queue (`joins`), the start-up stages behind the page (`startup`, `connecting`), the page
before the page (`placeholder`) and where it runs (`hosting`). Who may ask what is the edge's (`access`); the API on
the same port is `serving`'s, put beside the page by `server.py`. Importing the package loads nothing: `placeholder`
must serve in a fraction of a second."""

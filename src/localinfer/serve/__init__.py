"""`localinfer serve`: an OpenAI-compatible HTTP server on the continuous-batching engine.

The pipeline, one module each: ``protocol`` (request bodies in, validated) -> ``engine`` (one thread
owns the model and runs every request through one ``BatchDecoder``) -> ``bridge`` (the engine's text
pieces handed to the event loop) -> ``responses`` (OpenAI JSON and SSE chunks out). ``app`` holds the
HTTP routes and nothing of the model; ``server`` starts uvicorn, loads the model and handles signals.
Starlette and uvicorn are imported only here (the ``serve`` extra).
"""

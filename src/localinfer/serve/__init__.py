"""`localinfer serve`: an OpenAI-, Anthropic-, Responses- and Ollama-compatible HTTP server on the
continuous-batching engine.

One path for every protocol, one folder per idea: ``http`` (the server, the routes, the one
exchange: accept -> parse -> pick the model -> queue -> write), ``wires`` (each protocol's parser
and writer side by side), ``scheduler`` (a request prepared, run by the thread that owns a model,
its answer bridged back to the event loop), ``models`` (which models are served, loaded and kept).
Starlette and uvicorn are imported only here (the ``serve`` extra).
"""

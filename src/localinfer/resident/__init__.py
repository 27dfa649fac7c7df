"""A model that stays loaded between commands (``--keep-alive`` / LOCALINFER_KEEP_ALIVE): a resident
server for this user on a private Unix socket, started by the first command and found by the next.

``place`` (where its socket, lock and log live; the keep-alive value), ``client`` (find or start the
server, talk to it over the socket with the stdlib: the client path stays light), ``backend`` (the
server's model as a Backend: answers as a local run's), ``pool`` (which models are loaded, when to
reload or unload: plain logic), ``server`` (the process: our serve app per model, behind a router).
"""

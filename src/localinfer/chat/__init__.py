"""A conversation with a model: its turns, settings and session logic (the REPL's terminal I/O is in cli/)."""

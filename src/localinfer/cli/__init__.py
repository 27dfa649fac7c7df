"""The command line: one module per command (flags in, a call to the core, exit codes), the Typer app
and its option groups (`main.py`, `options.py`), and the one table of errors to messages (`common.py`)."""

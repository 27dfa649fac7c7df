"""`python -m localinfer`: the same entry point as the `localinfer` command."""

from localinfer.cli.main import entry, main  # noqa: F401 - main: what this module has always offered

if __name__ == "__main__":
    entry()

"""`localinfer pull`: fetch a model into the store, verified (or register a local file in place)."""


from typing import Annotated, Optional

import typer

from localinfer.cli.common import handle_errors


def pull(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL",
            help="Registry name (smollm2:135m), owner/repo[:QUANT] (default Q4_K_M), owner/repo/file.gguf, "
            "hf://owner/repo/file.gguf (each with optional @revision), or a local .gguf path.",
            show_default=False,
        ),
    ],
    name: Annotated[
        Optional[str],
        typer.Option("--name", help="Name to register the model under (Hub models and local files).", show_default=False),
    ] = None,
    revision: Annotated[
        Optional[str], typer.Option("--revision", help="Hub branch, tag or commit (same as @revision).", show_default=False)
    ] = None,
    offline: Annotated[
        bool, typer.Option("--offline", help="Never download: only verify what is installed; also HF_HUB_OFFLINE=1.")
    ] = False,
    mmproj: Annotated[
        Optional[str], typer.Option("--mmproj", metavar="FILE", help="The model's multimodal projector (images in), kept beside it: for a local model a local mmproj .gguf; for a Hub model a file in its repo, 'auto' (the default where the repo has mmproj files: the one of the model's quantization, else F16/BF16/F32) or 'none'.", show_default=False)
    ] = None,
    no_mmproj: Annotated[
        bool, typer.Option("--no-mmproj", help="Pull a Hub model without its projector (text only); same as --mmproj none.")
    ] = False,
) -> None:
    """Download a model (resuming, sha256-verified) or register a local GGUF file without copying it."""
    with handle_errors():
        from localinfer.render.progress import make_progress
        from localinfer.store.pull import pull_model

        import sys

        from localinfer.units import human_bytes

        if no_mmproj and mmproj not in (None, "none"):
            from localinfer.errors import UsageError

            raise UsageError(f"--no-mmproj and --mmproj {mmproj} ask for opposite things: give one")
        mmproj = "none" if no_mmproj else mmproj
        entry = pull_model(model, name=name, revision=revision, offline=offline, progress=make_progress(), mmproj=mmproj)
        size = f" ({human_bytes(entry['size'])})" if entry.get("size") else ""
        size += " with its projector (images in)" if entry.get("mmproj") else ""
        # Whatever the path (downloaded, verified again, registered in place), it ends the same way.
        sys.stderr.write(f"ready: {entry['name']}{size} · localinfer run -m {entry['name']}\n")


def register(app: typer.Typer) -> None:
    app.command(name="pull")(pull)

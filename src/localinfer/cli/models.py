"""`localinfer list | show | rm | verify`: inspect and manage installed models.

What the user asked for (the table, the details, the JSON) goes to stdout; progress and errors to stderr.
"""


import sys
from typing import Annotated, Any, Optional

import typer

from localinfer.cli.common import handle_errors



def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


def _short_source(source: str | None) -> str:
    if not source:
        return "-"
    if source.startswith("hf://"):
        body, _, commit = source[len("hf://") :].rpartition("@")
        repo = "/".join(body.split("/")[:2])
        return f"hf:{repo}@{commit[:7]}" if commit else f"hf:{repo}"
    if source.startswith("local:"):
        return "local (in place)"
    return source


def list_cmd(
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    available: Annotated[bool, typer.Option("--available", help="List the registry's model names instead.")] = False,
) -> None:
    """List installed models (name, size, quant, params, arch, context, source, last used) and disk use."""
    with handle_errors():
        from localinfer.store.fsutil import human_count, human_size
        from localinfer.store.manage import available_models, list_models, relative_time

        if available:
            avail = available_models()
            if json_out:
                import json
                _out(json.dumps(avail, indent=2))
                return
            rows = [
                [
                    a["name"] + (" (default)" if a["default"] else ""),
                    "installed" if a["installed"] else ("shipped" if a["shipped"] else "-"),
                    human_size(a["size"]) if a["size"] else (f"~{human_size(a['estimated_size'])}" if a["estimated_size"] else "-"),
                    a["description"] or "",
                ]
                for a in avail
            ]
            _out(_table(["NAME", "STATUS", "SIZE", "DESCRIPTION"], rows))
            _out("SIZE: the download; ~ estimated from the parameters and quantization in the name.")
            return
        data = list_models()
        installed = {m["name"] for m in data["models"]}
        # Models a package ships are usable at once (verified on first use): a fresh home lists them.
        shipped = [a for a in available_models() if a["shipped"] and a["name"] not in installed]
        default = next((a["name"] for a in available_models() if a["default"]), None)
        if json_out:
            import json
            _out(json.dumps({**data, "shipped": shipped, "default": default}, indent=2))
            return
        models = data["models"]
        if not models and not shipped:
            _out("No models installed. Try 'localinfer pull smollm2:135m' or 'localinfer list --available'.")
            return
        mark = {default: " (default)"} if default else {}
        rows = [
            [name + mark.get(name, ""), human_size(a["size"]) if a["size"] else "-", "-", "-", "-", "-",
             f"package {a['source'].removeprefix('package:')}", "never (verified on first use)"]
            for a in shipped
            for name in [a["name"]]
        ] + [
            [
                m["name"] + mark.get(m["name"], ""),
                human_size(m["size"]),
                m["quant"] or "-",
                human_count(m["parameters"]),
                (m["architecture"] or "-") + (" +vision" if m.get("vision") else ""),
                str(m["context_length"] or "-"),
                _short_source(m["source"]),
                relative_time(m["last_used"]),
            ]
            for m in models
        ]
        _out(_table(["NAME", "SIZE", "QUANT", "PARAMS", "ARCH", "CONTEXT", "SOURCE", "LAST USED"], rows))
        total = f"{len(models)} installed" + (f", {len(shipped)} shipped by packages" if shipped else "")
        total += f"; {human_size(data['store_bytes'])} on disk in the store"
        if data["in_place_bytes"]:
            total += f", {human_size(data['in_place_bytes'])} used in place"
        _out(total)


def show(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="Installed model name, or a path to a .gguf file.", show_default=False)],
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    template: Annotated[bool, typer.Option("--template", help="Print only the model's chat template.")] = False,
) -> None:
    """Show a model's architecture, parameters, quantization, context, layers, template, license, path, sha256."""
    with handle_errors():
        from localinfer.store.fsutil import human_count, human_size
        from localinfer.store.manage import show_model

        d = show_model(model)
        if template:
            if not d["chat_template"]:
                from localinfer.errors import UsageError

                raise UsageError(f"{d['name']} has no chat template", hint="it runs as plain completion (--raw)")
            sys.stdout.write(d["chat_template"].rstrip("\n") + "\n")
            return
        if json_out:
            import json
            _out(json.dumps(d, indent=2))
            return
        params = d["parameters"]
        fields: list[tuple[str, Any]] = [
            ("name", d["name"]),
            ("architecture", d["architecture"]),
            ("parameters", f"{human_count(params)} ({params})" if params else "-"),
            ("quantization", d["quantization"]),
            ("context length", d["context_length"]),
            ("layers", d["layers"]),
            ("chat template", f"yes, {len(d['chat_template'].splitlines())} lines (`show --template` prints it all)" if d["chat_template"]
             else f"no{' (chat format: ' + d['chat_format'] + ')' if d['chat_format'] else ''}"),
            ("license", d["license"]),
            ("size", human_size(d["size"])),
            ("path", d["path"]),
            ("sha256", d["sha256"] or "- (not registered; not hashed)"),
            ("source", d["source"]),
            ("vision", f"yes, projector {d['projector']}" if d.get("vision") else "no"),
        ]
        if d.get("split_count") and d["split_count"] > 1:
            fields.append(("files", f"{d['split_count']} shards"))
        width = max(len(k) for k, _ in fields)
        for key, value in fields:
            _out(f"{key.ljust(width)}  {value if value not in (None, '') else '-'}")
            if key == "chat template" and d["chat_template_head"]:
                for line in d["chat_template_head"].splitlines():
                    _out(f"{''.ljust(width)}    {line}")


def rm(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="Installed model name.", show_default=False)],
) -> None:
    """Remove a model: frees its disk space; files used in place (packages, local files) are only unregistered."""
    with handle_errors():
        from localinfer.store.fsutil import human_size
        from localinfer.store.manage import remove_model

        r = remove_model(model)
        if r.kept:
            _out(f"unregistered {r.name}; its file stays where it is: {', '.join(r.kept)}")
        else:
            _out(f"removed {r.name}, freed {human_size(r.freed_bytes)}")


def verify(
    model: Annotated[Optional[str], typer.Argument(metavar="[MODEL]", help="One installed model (default: all).", show_default=False)] = None,
) -> None:
    """Re-hash installed models against their recorded sha256; exit 4 if any is corrupt."""
    with handle_errors():
        from localinfer.errors import ChecksumError
        from localinfer.render.progress import make_progress
        from localinfer.store.manage import verify_models

        results = verify_models(model, progress=make_progress())
        if not results:
            _out("No models installed.")
            return
        for r in results:
            if r.ok:
                _out(f"ok       {r.name}")
            else:
                for problem in r.problems:
                    _out(f"CORRUPT  {r.name}: {problem}")
        bad = [r.name for r in results if not r.ok]
        if bad:
            sys.stdout.flush()
            raise ChecksumError(
                f"{len(bad)} of {len(results)} model{'s' if len(results) != 1 else ''} failed verification: {', '.join(bad)}",
                hint=f"'localinfer pull {bad[0]}' downloads a corrupt model again" if len(bad) == 1 else "'localinfer pull NAME' downloads a corrupt model again",
            )


def register(app: typer.Typer) -> None:
    app.command(name="list")(list_cmd)
    app.command(name="show")(show)
    app.command(name="rm")(rm)
    app.command(name="verify")(verify)

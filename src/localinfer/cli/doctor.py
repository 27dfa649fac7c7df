"""`localinfer doctor`: what this machine has, what llama.cpp was built with, and what to do about it.

The report is what the user asked for, so it goes to stdout (plain text, or one JSON object with --json).
"""


import sys
from typing import Annotated, Any, Optional

import typer

from localinfer.cli.common import handle_errors


def _human(n: float | None) -> str:
    from localinfer.system.advice import _human as h

    return h(n)


def render(report: dict[str, Any], width: int | None = None) -> str:
    """The report as aligned plain text; lines wrapped at word boundaries to ``width`` if given."""
    from localinfer.render.term import wrap, wrap_command

    rows: list[tuple[str, str]] = []
    osi, cpu, mem, llama = report["os"], report["cpu"], report["memory"], report["llama_cpp"]
    rows.append(("OS", f"{osi['system']} {osi['release']} ({osi['machine']})"))
    rows.append(("CPU", f"{cpu['model']} · {cpu['physical_cores']} physical / {cpu['logical_cores']} logical cores"))
    ram = f"{_human(mem['total_bytes'])} total · {_human(mem['available_bytes'])} available"
    if mem.get("swap_free_bytes"):
        ram += f" · {_human(mem['swap_free_bytes'])} swap free"
    if mem.get("cgroup_room_bytes") is not None:
        ram += f" · {_human(mem['cgroup_room_bytes'])} left under the container limit"
    rows.append(("RAM", ram))
    gpus = report["gpus"]
    if not gpus:
        rows.append(("GPU", "none found"))
    for g in gpus:
        text = g["name"]
        if g.get("memory_total_bytes"):
            text += f" · {_human(g['memory_total_bytes'])}"
            if g.get("memory_free_bytes") is not None:
                text += f" ({_human(g['memory_free_bytes'])} free)"
        if g.get("unified"):
            text += " · unified memory"
        if g.get("driver"):
            text += f" · driver {g['driver']}"
        rows.append(("GPU", text + f" [{g['source']}]"))
    store = report["store"]
    rows.append(("model store", f"{store['path']} · {_human(store['free_bytes'])} free"))
    if "error" in llama:
        rows.append(("llama.cpp", f"does not load: {llama['error']}"))
    else:
        rows.append(("llama.cpp", f"llama-cpp-python {llama['version']} · backends: {', '.join(llama['backends']) or '?'}"))
        rows.append(("GPU offload", "yes" if llama["gpu_offload"] else "no (CPU-only build)"))
        rows.append(("SIMD", " ".join(llama["simd"]) or "-"))
        rows.append(("build features", " ".join(llama["build_features"]) or "-"))
        rows.append(("weight repack", "on" if llama["cpu_repack"] else "off" + (" (AMX CPU)" if llama["amx"] else "")))
        for d in llama["devices"]:
            kind = "RPC" if d.get("backend") == "RPC" else d["type"]  # an RPC device's description is its server
            free = f" ({_human(d['free_bytes'])} free)" if d.get("free_bytes") else ""
            rows.append(("device", f"{d['name']} ({kind}): {d['description']} · {_human(d['total_bytes'])}{free}"))
    v = report["versions"]
    rows.append(("versions", " · ".join(f"{k} {val}" for k, val in v.items() if val)))
    key_width = max(len(k) for k, _ in rows)
    lines = [wrap(f"{k:<{key_width}}  {val}", width) for k, val in rows]
    lines.append("")
    lines.append("Advice:")
    for item in report["advice"]:
        lines.append(wrap(f"  - {item['message']}", width))
        if item.get("command"):
            lines.append(wrap_command(item["command"], width, 6))
    return "\n".join(lines)


def doctor(
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
    rpc: Annotated[Optional[str], typer.Option("--rpc", metavar="HOST:PORT[,...]", envvar="LOCALINFER_RPC", help="Also list the devices of these ggml-rpc-servers.")] = None,
) -> None:
    """Check this machine: CPU, RAM, GPUs, the llama.cpp build, disk; advice on what to fix and what fits."""
    with handle_errors():
        from localinfer.system.advice import report

        if rpc:  # the servers' devices are listed with the local ones
            from localinfer.engine.rpc import add_servers, parse_endpoints

            add_servers(parse_endpoints(rpc))

        data = report()
        if json_out:
            import json
            sys.stdout.write(json.dumps(data, indent=2) + "\n")
        else:
            from localinfer.render.term import terminal_width

            sys.stdout.write(render(data, terminal_width(sys.stdout)) + "\n")
        sys.stdout.flush()


def register(app: typer.Typer) -> None:
    app.command(name="doctor")(doctor)

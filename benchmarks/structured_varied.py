#!/usr/bin/env python3
"""Constrained serve against llama-server on a varied schema set, one shape at a time (issue 40).

structured_serve_vs_native.py measures one mix of nested schemas; a ratio there says little about a
schema of another shape. Here each shape is its own measurement: --clients threads each send
--requests streaming chat requests with that shape's ``response_format`` json_schema (each client
its own variant of the shape: a property renamed, so no two clients share a compiled grammar and a
shape is new to both servers in each round), greedy, at most --tokens answer tokens; aggregate
completion tok/s = completion tokens / wall time from the first request to the last chunk. Both
servers run the same model, threads, slots (-np) and context per slot; they alternate per shape and
per round. Reported: the ratio per shape (median over rounds) and overall (the geometric mean of the
shapes' ratios, and total tokens / total seconds), answers that fail their schema, answers cut at
the cap. The floor: overall >= 1.0 x llama-server. Beside it, answers per second: llama-server's
grammar lets the model write free whitespace, so its documents take more tokens (up to 2x on short
answers), which raises its tok/s for the same documents; answers/s compares the documents.

The shapes: enums only (short answer); flat object with optional fields; bounded and unbounded
numbers; string formats and patterns; nested objects; array of objects; long free-text strings
(long answer); nullable unions (anyOf).

    PYTHONPATH=src .venv/bin/python benchmarks/structured_varied.py                 # 4 clients, 2 rounds
    PYTHONPATH=src .venv/bin/python benchmarks/structured_varied.py --shapes enums,numbers --rounds 1 -n 48
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import math
import os
import signal
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from serve_vs_native import concurrently, default_model, server_args, servers  # noqa: E402
from structured_serve_vs_native import ask  # noqa: E402 - one streamed, validated request

_S = {"type": "string"}
SHAPES: dict[str, tuple[str, dict]] = {
    "enums": ("Classify: 'The parcel arrived broken and nobody answers the phone.' Answer as JSON.",
              {"type": "object", "properties": {"sentiment": {"enum": ["positive", "neutral", "negative"]},
               "topic": {"enum": ["delivery", "billing", "product", "support", "other"]},
               "urgent": {"type": "boolean"}}, "required": ["sentiment", "topic", "urgent"],
               "additionalProperties": False}),
    "optional": ("Describe a user profile for a music app as JSON.",
                 {"type": "object", "properties": {"username": {**_S, "maxLength": 20}, "bio": {**_S, "maxLength": 60},
                  "favourite_genre": _S, "country": {**_S, "maxLength": 20}, "premium": {"type": "boolean"}},
                  "required": ["username"]}),
    "numbers": ("Give the statistics of a small city as JSON.",
                {"type": "object", "properties": {"population": {"type": "integer"}, "area_km2": {"type": "number"},
                 "founded": {"type": "integer", "minimum": 800, "maximum": 2025},
                 "growth_pct": {"type": "number", "minimum": -10, "maximum": 10},
                 "districts": {"type": "integer", "minimum": 1}}, "required": ["population", "area_km2", "founded",
                 "growth_pct", "districts"], "additionalProperties": False}),
    "formats": ("Register a meeting as JSON: who organises it, when, and a reference code.",
                {"type": "object", "properties": {"organiser_email": {**_S, "format": "email"},
                 "date": {**_S, "format": "date"}, "start": {**_S, "format": "time"},
                 "ref": {**_S, "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "room": {**_S, "pattern": "^[A-D][0-9]{2}$"}},
                 "required": ["organiser_email", "date", "start", "ref", "room"], "additionalProperties": False}),
    "nested": ("Describe a company with its headquarters and its CEO as JSON.",
               {"type": "object", "properties": {"name": {**_S, "maxLength": 30}, "hq": {"type": "object", "properties": {
                "city": {**_S, "maxLength": 24}, "country": {**_S, "maxLength": 24}, "geo": {"type": "object",
                "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                "lon": {"type": "number", "minimum": -180, "maximum": 180}}, "required": ["lat", "lon"]}},
                "required": ["city", "country", "geo"]}, "ceo": {"type": "object", "properties": {
                "name": {**_S, "maxLength": 30}, "since": {"type": "integer", "minimum": 1950, "maximum": 2025}},
                "required": ["name", "since"]}}, "required": ["name", "hq", "ceo"]}),
    "array_of_objects": ("List the products in a small bakery's window as JSON.",
                         {"type": "object", "properties": {"products": {"type": "array", "minItems": 2, "maxItems": 6,
                          "items": {"type": "object", "properties": {"name": {**_S, "maxLength": 24},
                          "price": {"type": "number", "minimum": 0, "maximum": 100},
                          "vegan": {"type": "boolean"}}, "required": ["name", "price", "vegan"],
                          "additionalProperties": False}}}, "required": ["products"], "additionalProperties": False}),
    "long_text": ("Write a short story about a lighthouse keeper as JSON with a title and the story.",
                  {"type": "object", "properties": {"title": {**_S, "maxLength": 60}, "story": {**_S, "minLength": 200}},
                   "required": ["title", "story"], "additionalProperties": False}),
    "nullable": ("Give a book's details as JSON; unknown fields are null.",
                 {"type": "object", "properties": {"title": _S, "subtitle": {"anyOf": [{**_S, "maxLength": 40},
                  {"type": "null"}]}, "pages": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
                  "tags": {"type": "array", "items": {**_S, "maxLength": 16}, "maxItems": 4}},
                  "required": ["title", "subtitle", "pages", "tags"], "additionalProperties": False}),
}  # fmt: skip


def variant(schema: dict, tag: str) -> dict:
    """The schema with its first property renamed (``tag``): new to both servers' grammar caches."""
    s = copy.deepcopy(schema)
    first = next(iter(s["properties"]))
    s["properties"] = {(f"{first}_{tag}" if k == first else k): v for k, v in s["properties"].items()}
    s["required"] = [f"{first}_{tag}" if k == first else k for k in s.get("required", [])]
    return s


def one_shape(server, shape: str, clients: int, requests: int, n: int, rnd: int) -> dict:  # type: ignore[no-untyped-def]
    question, schema = SHAPES[shape]
    results, t0 = concurrently(clients, requests, lambda c, r: ask(server, shape, question, variant(schema, f"r{rnd}c{c}"), n))
    wall = max(r["end"] for r in results) - t0
    tokens = sum(r["tokens"] for r in results)
    return {"server": server.name, "shape": shape, "round": rnd, "tokens": tokens, "wall_s": wall, "tps": tokens / wall,
            "dps": len(results) / wall,
            "invalid": sum(r["valid"] is False and r["finish"] != "length" for r in results),
            "cut": sum(r["finish"] == "length" for r in results)}  # fmt: skip


def report(rows: list[dict], shapes: list[str]) -> list[str]:
    lines = [f"{'shape':<18}{'localinfer tok/s':>17}{'llama-server tok/s':>20}{'ratio':>8}{'tokens ours/theirs':>20}"
             f"{'invalid':>9}{'cut':>9}{'answers/s ratio':>17}"]  # fmt: skip
    ratios, totals = [], {"localinfer": [0.0, 0.0], "llama-server": [0.0, 0.0]}
    for shape in shapes:
        by = {name: [r for r in rows if r["shape"] == shape and r["server"] == name] for name in totals}
        if not all(by.values()):
            continue
        per_round = [a["tps"] / b["tps"] for a, b in zip(by["localinfer"], by["llama-server"])]
        ratio = statistics.median(per_round)
        ratios.append(ratio)
        answers = statistics.median(a["dps"] / b["dps"] for a, b in zip(by["localinfer"], by["llama-server"]))
        for name, rs in by.items():
            totals[name][0] += sum(r["tokens"] for r in rs)
            totals[name][1] += sum(r["wall_s"] for r in rs)
        med = {name: statistics.median(r["tps"] for r in rs) for name, rs in by.items()}
        toks = {name: sum(r["tokens"] for r in rs) for name, rs in by.items()}
        lines.append(f"{shape:<18}{med['localinfer']:>17.1f}{med['llama-server']:>20.1f}{ratio:>8.3f}"
                     f"{toks['localinfer']:>11}/{toks['llama-server']:<8}"
                     f"{sum(r['invalid'] for r in by['localinfer']):>4}/{sum(r['invalid'] for r in by['llama-server']):<4}"
                     f"{sum(r['cut'] for r in by['localinfer']):>4}/{sum(r['cut'] for r in by['llama-server']):<4}"
                     f"{answers:>13.3f}")  # fmt: skip
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        ours, theirs = (t[0] / t[1] for t in (totals["localinfer"], totals["llama-server"]))
        lines.append(f"overall: geometric mean of the shapes' ratios {geo:.3f}; total tokens / total seconds "
                     f"{ours:.1f} vs {theirs:.1f} tok/s = {ours / theirs:.3f} (floor >= 1.0: "
                     f"{'PASS' if min(geo, ours / theirs) >= 1.0 else 'MISS'})")  # fmt: skip
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    server_args(ap, parallel=4, ctx=1024)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=1, help="requests per client, back to back")
    ap.add_argument("-n", "--tokens", type=int, default=128, help="answer tokens at most")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", default=None, help="also write the report here")
    args = ap.parse_args()
    args.model = args.model or default_model()
    args.llama_cpp_python = False
    shapes = args.shapes.split(",")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the servers
    logs = HERE / ".build" / "serve-logs"
    logs.mkdir(parents=True, exist_ok=True)
    head = [f"# structured_varied {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC: {args.model.name}, -t {args.threads}, "
            f"-np {args.parallel} x {args.ctx} tokens; {args.clients} clients x {args.requests} request(s) x <= {args.tokens} "
            f"tokens, greedy; {args.rounds} round(s); load average {os.getloadavg()[0]:.2f} at start"]  # fmt: skip
    print(head[0], flush=True)
    order = servers(args)
    rows: list[dict] = []
    try:
        for server in order:
            server.start(logs / f"varied-{server.name}.log")
            ask(server, "warm", *SHAPES["enums"], 8)  # warm-up (our tokenizer for the constraint, built once per model)
        k = 0
        for rnd in range(args.rounds):
            for shape in shapes:
                for server in order if k % 2 == 0 else order[::-1]:
                    row = one_shape(server, shape, args.clients, args.requests, args.tokens, rnd)
                    rows.append(row)
                    line = (f"# {shape:<17} {server.name:<13} {row['tps']:6.1f} tok/s ({row['tokens']} tokens, "
                            f"{row['wall_s']:.1f} s), {row['invalid']} invalid, {row['cut']} cut, load {os.getloadavg()[0]:.2f}")
                    head.append(line)
                    print(line, flush=True)
                k += 1
    finally:
        for server in order:
            server.stop()
        text = "\n".join([*head, f"# load average {os.getloadavg()[0]:.2f} at the end", *report(rows, shapes)])
        print(text.split("\n# load average", 1)[1].split("\n", 1)[1] if rows else "no rows")
        if args.out:
            Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Structured output under load: `localinfer serve --parallel N` against llama.cpp's `llama-server -np N`
with the same nested JSON schemas, same model, threads and context per sequence (issue 27's floors).

Two measurements, each on one server after the other in an order that alternates per round:

* **throughput**: --clients threads each send --requests streaming chat requests back to back, each
  with ``response_format`` json_schema (client c's request r uses schema c + r x clients of the
  --schemas set, so different schemas decode in the same batch and every schema of the set is used:
  the four nested ones tuned on, ``seen``; shapes not tried on them, ``held-out``: a long enum, nested
  arrays of objects, optional properties, string formats, a long answer; or ``all``, the default);
  greedy, at most --tokens answer tokens. Aggregate completion
  tok/s = the completion tokens of all requests (usage, else timings.predicted_n) / wall time from
  the first request sent to the last chunk received. Floor: ours >= 0.9 x llama-server's.
  The two servers' answers differ in length (llama-server's grammar lets the model emit whitespace
  freely, so more of its answers run to the cap), and shorter answers mean more prompts to evaluate
  per answer token and batches that empty sooner. So the same run also gives an **equal-work**
  figure: completion tok/s over the periods when all --clients requests are generating (each between
  its first and last text chunk; the chunks received in them, weighted by the request's tokens per
  chunk): what --clients constrained sequences decode per second together, with no prompt
  evaluation and no partly empty batch in it. Reported beside the floor's figure, not instead.
* **TTFT with a new schema**: one client, --ttft-requests requests one at a time, each with a schema
  never seen before (a property renamed), so compiling it is part of the time to the first text
  chunk. Floor: our p50 <= 1.2 x llama-server's.

Every answer is parsed and validated with ``jsonschema`` (when installed); invalid and cut answers
are counted per server. The constrained answers of the two servers differ in length and layout
(llama-server's grammar allows free whitespace, ours is compact JSON): rates are per token.

    .venv/bin/python benchmarks/structured_serve_vs_native.py                  # the floors' settings
    .venv/bin/python benchmarks/structured_serve_vs_native.py --clients 2 --requests 1 --tokens 32 \\
        --ttft-requests 2 -np 2                                                 # a quick check
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import signal
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from serve_vs_native import Server, concurrently, default_model, pct, server_args, servers, sse_events  # noqa: E402 - the same servers, started alike

_LINE = {"type": "object", "properties": {"item": {"type": "string", "maxLength": 24},
         "qty": {"type": "integer", "minimum": 1, "maximum": 99},
         "price": {"type": "number", "minimum": 0, "maximum": 10000}},
         "required": ["item", "qty", "price"], "additionalProperties": False}  # fmt: skip
_ADDRESS = {"type": "object", "properties": {"street": {"type": "string", "maxLength": 40},
            "city": {"type": "string", "maxLength": 24}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["street", "city", "zip"], "additionalProperties": False}  # fmt: skip
# Nested schemas, as an application sends them: objects in arrays in objects, enums, bounds, nullables.
SCHEMAS = [
    ("invoice", "Write an invoice for a small office supply order, as JSON.",
     {"type": "object", "properties": {"number": {"type": "string", "maxLength": 12}, "customer": {"type": "object",
      "properties": {"name": {"type": "string", "maxLength": 30}, "address": _ADDRESS}, "required": ["name", "address"],
      "additionalProperties": False}, "lines": {"type": "array", "items": _LINE, "minItems": 1, "maxItems": 4},
      "paid": {"type": "boolean"}}, "required": ["number", "customer", "lines", "paid"], "additionalProperties": False}),
    ("people", "List two fictional people with their addresses and hobbies, as JSON.",
     {"type": "object", "properties": {"people": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object",
      "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
      "address": _ADDRESS, "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
      "required": ["name", "age", "address", "hobbies"], "additionalProperties": False}}},
      "required": ["people"], "additionalProperties": False}),
    ("ticket", "Classify this support ticket as JSON: 'My laptop will not turn on since the update.'",
     {"type": "object", "properties": {"category": {"enum": ["hardware", "software", "billing", "other"]},
      "priority": {"enum": ["low", "medium", "high"]}, "summary": {"type": "string", "maxLength": 80},
      "steps": {"type": "array", "maxItems": 4, "items": {"type": "object", "properties": {
       "order": {"type": "integer", "minimum": 1, "maximum": 9}, "action": {"type": "string", "maxLength": 40}},
       "required": ["order", "action"], "additionalProperties": False}},
      "assignee": {"type": ["string", "null"], "maxLength": 20}},
      "required": ["category", "priority", "summary", "steps", "assignee"], "additionalProperties": False}),
    ("recipe", "Give a simple pancake recipe as JSON.",
     {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40}, "servings": {"type": "integer",
      "minimum": 1, "maximum": 12}, "ingredients": {"type": "array", "minItems": 2, "maxItems": 6, "items": {"type": "object",
      "properties": {"name": {"type": "string", "maxLength": 24}, "amount": {"type": "string", "maxLength": 16}},
      "required": ["name", "amount"], "additionalProperties": False}}, "steps": {"type": "array", "maxItems": 5,
      "items": {"type": "string", "maxLength": 60}}}, "required": ["title", "servings", "ingredients", "steps"],
      "additionalProperties": False}),
]  # fmt: skip
_COUNTRIES = ["Argentina", "Australia", "Austria", "Belgium", "Brazil", "Canada", "Chile", "China", "Denmark", "Egypt",
              "Finland", "France", "Germany", "Greece", "India", "Ireland", "Italy", "Japan", "Kenya", "Mexico", "Norway",
              "Peru", "Poland", "Portugal", "Spain", "Sweden", "Turkey", "Vietnam", "Zambia"]  # fmt: skip
# Shapes the four above had not tried (issue 52): a long enum, nested arrays of objects, optional
# properties, string formats, a long answer.
HELD_OUT = [
    ("travel", "Plan a trip to three countries, as JSON.",
     {"type": "object", "properties": {"traveller": {"type": "string", "maxLength": 30}, "stops": {"type": "array",
      "minItems": 2, "maxItems": 4, "items": {"type": "object", "properties": {"country": {"enum": _COUNTRIES},
       "nights": {"type": "integer", "minimum": 1, "maximum": 30},
       "transport": {"enum": ["plane", "train", "bus", "car", "boat", "bicycle", "on foot"]}},
       "required": ["country", "nights", "transport"], "additionalProperties": False}}},
      "required": ["traveller", "stops"], "additionalProperties": False}),
    ("orders", "List two customer orders with their items and tags, as JSON.",
     {"type": "object", "properties": {"orders": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object",
      "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9999}, "items": {"type": "array", "minItems": 1,
       "maxItems": 3, "items": {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 12},
        "qty": {"type": "integer", "minimum": 1, "maximum": 50},
        "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 12}}},
        "required": ["sku", "qty", "tags"], "additionalProperties": False}}},
      "required": ["id", "items"], "additionalProperties": False}}}, "required": ["orders"], "additionalProperties": False}),
    ("profile", "Describe a fictional user profile as JSON; include only the fields you know.",
     {"type": "object", "properties": {"username": {"type": "string", "maxLength": 20},
      "display_name": {"type": "string", "maxLength": 40}, "bio": {"type": "string", "maxLength": 120},
      "age": {"type": "integer", "minimum": 13, "maximum": 120}, "location": {"type": "string", "maxLength": 40},
      "verified": {"type": "boolean"}, "followers": {"type": "integer", "minimum": 0, "maximum": 10000000},
      "languages": {"type": "array", "maxItems": 4, "items": {"type": "string", "maxLength": 16}},
      "theme": {"enum": ["light", "dark", "system"]}}, "required": ["username", "bio"], "additionalProperties": False}),
    ("event", "Create a calendar event for a team meeting next week, as JSON.",
     {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}, "title": {"type": "string", "maxLength": 60},
      "date": {"type": "string", "format": "date"}, "organizer": {"type": "string", "format": "email"},
      "attendees": {"type": "array", "maxItems": 3, "items": {"type": "string", "format": "email"}}},
      "required": ["id", "title", "date", "organizer", "attendees"], "additionalProperties": False}),
    ("report", "Write a detailed product review report with several sections, as JSON.",
     {"type": "object", "properties": {"product": {"type": "string", "maxLength": 40}, "sections": {"type": "array",
      "minItems": 4, "maxItems": 8, "items": {"type": "object", "properties": {"heading": {"type": "string", "maxLength": 40},
       "body": {"type": "string", "maxLength": 300}, "score": {"type": "integer", "minimum": 1, "maximum": 10}},
       "required": ["heading", "body", "score"], "additionalProperties": False}}, "verdict": {"type": "string", "maxLength": 200}},
      "required": ["product", "sections", "verdict"], "additionalProperties": False}),
]  # fmt: skip
SETS = {"seen": SCHEMAS, "held-out": HELD_OUT, "all": SCHEMAS + HELD_OUT}


def fresh(schema: dict, n: int) -> dict:
    """The schema with its first property renamed: a schema no server has compiled yet."""
    s = copy.deepcopy(schema)
    first = next(iter(s["properties"]))
    s["properties"] = {(f"{first}_{n}" if k == first else k): v for k, v in s["properties"].items()}
    s["required"] = [f"{first}_{n}" if k == first else k for k in s["required"]]
    return s


def ask(server: Server, name: str, question: str, schema: dict, n: int) -> dict:
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": n, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}}  # fmt: skip
    events = sse_events(server, "/v1/chat/completions", body)
    next(events)
    t0 = time.perf_counter()
    first = last = None
    text, tokens, finish, times = [], None, None, []
    for obj in events:
        tokens = (obj.get("usage") or {}).get("completion_tokens") or (obj.get("timings") or {}).get("predicted_n") or tokens
        for c in obj.get("choices") or ():
            finish = c.get("finish_reason") or finish
            piece = (c.get("delta") or {}).get("content")
            if piece:
                last = time.perf_counter()
                first = first or last
                text.append(piece)
                times.append(last)
    return {"t0": t0, "ttft": (first or t0) - t0, "end": last or t0, "tokens": tokens or len(times),
            "finish": finish, "valid": valid("".join(text), schema), "times": times}  # fmt: skip


def valid(text: str, schema: dict) -> bool | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    try:
        import jsonschema
    except ImportError:
        return None
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError:
        return False
    return True


def throughput(server: Server, clients: int, requests: int, n: int, schemas: list = SCHEMAS) -> dict:
    """Client c's request r uses schema (c + r * clients) of ``schemas``: every schema of the set in turn."""
    results, t0 = concurrently(clients, requests, lambda c, r: ask(server, *schemas[(c + r * clients) % len(schemas)], n))
    wall = max(r["end"] for r in results) - t0
    tokens = sum(r["tokens"] for r in results)
    full_s, full_tokens = all_generating(results, clients)
    return {"server": server.name, "test": "throughput", "clients": clients, "requests": len(results), "wall_s": wall,
            "tokens": tokens, "agg_tps": tokens / wall, "full_s": full_s,
            "full_tps": full_tokens / full_s if full_s > 0 else None, **_answers(results)}  # fmt: skip


def all_generating(results: list[dict], clients: int) -> tuple[float, float]:
    """The seconds during which ``clients`` requests were all generating (each between its first and
    last chunk), and the tokens received in them (each chunk weighted by its request's tokens per chunk)."""
    edges = sorted({t for r in results if r["times"] for t in (r["times"][0], r["times"][-1])})
    spans = [(r["times"][0], r["times"][-1]) for r in results if r["times"]]
    full = [(a, b) for a, b in zip(edges, edges[1:]) if sum(s <= a and b <= e for s, e in spans) >= clients]
    tokens = 0.0
    for r in results:
        weight = r["tokens"] / len(r["times"]) if r["times"] else 0.0
        tokens += weight * sum(any(a < t <= b for a, b in full) for t in r["times"])
    return sum(b - a for a, b in full), tokens


def new_schema_ttft(server: Server, requests: int, n: int, salt: int, schemas: list = SCHEMAS) -> dict:
    results = []
    for i in range(requests):
        name, question, schema = schemas[i % len(schemas)]
        results.append(ask(server, name, question, fresh(schema, salt + i), n))
    ttfts = sorted(r["ttft"] for r in results)
    return {"server": server.name, "test": "ttft", "requests": len(results), "ttft_p50_ms": 1000 * pct(ttfts, 50),
            "ttft_p95_ms": 1000 * pct(ttfts, 95), **_answers(results)}  # fmt: skip


def _answers(results: list[dict]) -> dict:
    return {"invalid": sum(r["valid"] is False and r["finish"] != "length" for r in results),
            "cut": sum(r["finish"] == "length" for r in results)}  # fmt: skip


def report(rows: list[dict]) -> list[str]:
    def med(name: str, test: str, key: str) -> float | None:
        values = [r[key] for r in rows if r["server"] == name and r["test"] == test]
        return statistics.median(values) if values else None

    lines = [f"{'server':<14}{'agg tok/s':>11}{'all-active tok/s':>18}{'TTFT new schema p50':>21}{'p95':>9}"
             f"{'invalid':>9}{'cut':>5}"]  # fmt: skip
    for name in ("localinfer", "llama-server"):
        bad = sum(r["invalid"] for r in rows if r["server"] == name)
        cut = sum(r["cut"] for r in rows if r["server"] == name)
        lines.append(f"{name:<14}{med(name, 'throughput', 'agg_tps') or 0:>11.1f}{med(name, 'throughput', 'full_tps') or 0:>18.1f}"
                     f"{med(name, 'ttft', 'ttft_p50_ms') or 0:>19.0f}ms{med(name, 'ttft', 'ttft_p95_ms') or 0:>7.0f}ms"
                     f"{bad:>9}{cut:>5}")  # fmt: skip
    for what, key, test, floor, higher in (("aggregate completion tok/s", "agg_tps", "throughput", 0.9, True),
                                           ("TTFT p50 with a new schema", "ttft_p50_ms", "ttft", 1.2, False)):  # fmt: skip
        ours, theirs = med("localinfer", test, key), med("llama-server", test, key)
        if ours and theirs:
            r = ours / theirs
            ok = r >= floor if higher else r <= floor
            lines.append(f"{what + ' / llama-server':<46} {r:6.3f}  (floor {'>=' if higher else '<='} {floor})  {'PASS' if ok else 'MISS'}")
    ours, theirs = med("localinfer", "throughput", "full_tps"), med("llama-server", "throughput", "full_tps")
    if ours and theirs:  # the equal-work figure: no floor of its own, beside the floor's
        lines.append(f"{'all-active tok/s (equal work) / llama-server':<46} {ours / theirs:6.3f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    server_args(ap, parallel=4, ctx=1024)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=3, help="requests per client, back to back")
    ap.add_argument("-n", "--tokens", type=int, default=192, help="answer tokens at most")
    ap.add_argument("--ttft-requests", type=int, default=8, help="requests with a new schema each, one at a time")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--schemas", choices=sorted(SETS), default="all",
                    help="the four schemas tuned on (seen), shapes not tried on them (held-out), or both")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="also print every measurement as a JSON line")
    args = ap.parse_args()
    args.model = args.model or default_model()
    args.llama_cpp_python = False
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the servers
    logs = HERE / ".build" / "serve-logs"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"# structured_serve_vs_native: {args.model.name}, -t {args.threads}, {args.parallel} sequences x {args.ctx} "
          f"tokens; {args.clients} clients x {args.requests} requests x <= {args.tokens} tokens; {args.ttft_requests} "
          f"new-schema requests; {args.rounds} round(s); schemas: {args.schemas}")  # fmt: skip
    print(f"# host: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    order = servers(args)
    rows: list[dict] = []
    try:
        for server in order:  # all up at once (idle, they take no CPU)
            server.start(logs / f"structured-{server.name}.log")
            ask(server, *SCHEMAS[0], 16)  # warm-up (and our tokenizer for the constraint, built once per model)
        for rnd in range(args.rounds):
            for server in order if rnd % 2 == 0 else order[::-1]:
                for row in (throughput(server, args.clients, args.requests, args.tokens, SETS[args.schemas]),
                            new_schema_ttft(server, args.ttft_requests, args.tokens, 1000 * (rnd + 1), SETS[args.schemas])):  # fmt: skip
                    rows.append(row)
                    if args.json:
                        print(json.dumps(row), flush=True)
                    figure = (f"{row['agg_tps']:.1f} tok/s (all-active {row['full_tps'] or 0:.1f} over {row['full_s']:.1f} s)"
                              if row["test"] == "throughput" else f"TTFT p50 {row['ttft_p50_ms']:.0f} ms")  # fmt: skip
                    print(f"# {server.name:<13} {row['test']:<10} {figure}, {row['invalid']} invalid, {row['cut']} cut, "
                          f"load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    finally:
        for server in order:
            server.stop()
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")
    print("\n".join(report(rows)))


if __name__ == "__main__":
    main()

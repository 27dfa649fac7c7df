"""Which bound on a schema's unbounded numbers gives valid answers more often (issue 40): SmolLM2-135M,
schemas whose integers and numbers have no minimum/maximum, greedy and sampled, each answer checked
(finish "stop", JSON, valid against the schema). Variants of engine/numbers.py:

  none      no bound (the schema as given: digits until max_tokens are possible)
  digits16  16 integral digits, as llama.cpp's grammar, 10 fraction digits (what ships)
  int64     the 64-bit integer range (±9e18: 19 digits), 10 fraction digits
  frac6     16 integral digits, 6 fraction digits (not in the committed figures: time)

Run: PYTHONPATH=src python benchmarks/number_bounds.py [variants...] (each variant in its own process,
so the compiled-format cache starts empty); writes benchmarks/results/number_bounds.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

SCHEMAS = {
    "population": ({"type": "object", "properties": {"population": {"type": "integer"}}, "required": ["population"]},
                   "What is the population of France? Answer in JSON."),
    "city": ({"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer"},
              "area_km2": {"type": "number"}}, "required": ["city", "population", "area_km2"], "additionalProperties": False},
             "Describe Paris: its population and its area in square kilometres, as JSON."),
    "product": ({"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}, "price": {"type": "number"},
                 "stock": {"type": "integer"}}, "required": ["name", "price", "stock"], "additionalProperties": False},
                "A keyboard costs 49.90 EUR and 120 are in stock. Give it as JSON."),
    "coords": ({"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat", "lon"], "additionalProperties": False},
               "Give the latitude and longitude of Berlin as JSON."),
    "readings": ({"type": "object", "properties": {"readings": {"type": "array", "items": {"type": "number"}, "minItems": 3,
                  "maxItems": 5}}, "required": ["readings"], "additionalProperties": False},
                 "List three to five temperature readings in Celsius as JSON."),
    "year_count": ({"type": "object", "properties": {"year": {"type": "integer"}, "count": {"type": "integer"},
                    "ratio": {"type": "number"}}, "required": ["year", "count", "ratio"], "additionalProperties": False},
                   "In 1969, 3 astronauts flew to the Moon; what share of the crew walked on it? Answer as JSON."),
}  # fmt: skip
RUNS = [(0.0, 1), (0.8, 1), (0.8, 2), (1.0, 3)]
MAX_TOKENS = 120


def one_variant(variant: str) -> dict:
    import jsonschema

    import localinfer
    from localinfer.engine import numbers

    if variant == "none":
        numbers.bounded = lambda schema, merged=False: schema  # type: ignore[assignment]
    elif variant == "int64":
        # 2^63 - 1 itself does not compile in llguidance (its bounds pass through a float): the
        # 64-bit range as close as it takes, 19 digits
        numbers._edge = lambda given: 9 * 10**18  # type: ignore[assignment]
    elif variant == "frac6":
        numbers.FRACTION_DIGITS = 6
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from models import smollm2_path

    out = {"valid": 0, "length": 0, "invalid": 0, "tokens": 0, "n": 0, "t": 0.0}
    with localinfer.load(str(smollm2_path()), n_ctx=1024, n_threads=1) as model:
        for name, (schema, prompt) in SCHEMAS.items():
            for temperature, seed in RUNS:
                t0 = time.perf_counter()
                r = model.generate(prompt, json_schema=schema, temperature=temperature, seed=seed, max_tokens=MAX_TOKENS)
                out["t"] += time.perf_counter() - t0
                out["n"] += 1
                out["tokens"] += r.stats.completion_tokens
                if r.finish_reason != "stop":
                    out["length"] += 1
                    continue
                try:
                    jsonschema.validate(json.loads(r.text), schema)
                    out["valid"] += 1
                except (ValueError, jsonschema.ValidationError):
                    out["invalid"] += 1
    return out


def main() -> None:
    variants = sys.argv[1:] or ["none", "digits16", "int64", "frac6"]
    if len(variants) == 1 and variants[0].startswith("--one="):
        print(json.dumps(one_variant(variants[0][6:])))
        return
    rows = []
    for v in variants:
        res = subprocess.run([sys.executable, __file__, f"--one={v}"], capture_output=True, text=True, check=True)
        r = json.loads(res.stdout.strip().splitlines()[-1])
        rows.append((v, r))
        print(v, r, flush=True)
    lines = ["# Bounding unbounded numbers: valid answers per variant (benchmarks/number_bounds.py)", "",
             f"SmolLM2-135M Q4_1, {len(SCHEMAS)} schemas x {len(RUNS)} (temperature, seed) runs, max_tokens {MAX_TOKENS}.", "",
             "| variant | valid | cut at max_tokens | invalid | tokens (all answers) |", "|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {v} | {r['valid']}/{r['n']} | {r['length']} | {r['invalid']} | {r['tokens']} |" for v, r in rows]
    out = Path(__file__).parent / "results" / "number_bounds.md"
    out.write_text("\n".join(lines) + "\n")
    print(out)


if __name__ == "__main__":
    main()

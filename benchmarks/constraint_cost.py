#!/usr/bin/env python3
"""Which constrained-decoding mechanism: llguidance (engine/constrain.py's sampler) against
llama.cpp's native grammar sampler (``llama_sampler_init_grammar`` on the GBNF that llama-cpp-python's
``json_schema_to_gbnf`` writes), and xgrammar where it is installed.

Three measures, with no decoding (the model is loaded for its vocabulary only):

* coverage: for each JSON-Schema feature of issue 27, a schema, a document that satisfies it and
  one that breaks only that feature. A mechanism covers the feature if it compiles the schema,
  lets every token of the good document through (and end-of-generation after it) and stops the bad
  one somewhere (a token masked, or no end after it). "refused" = it does not compile.
* per-token cost: the mask step as the engine runs it, on the whole vocabulary (a
  ``llama_token_data_array`` of n_vocab candidates): apply + accept, over the tokens of a valid
  document, median of --reps passes. SmolLM2 (49k tokens) and Gemma 3 (262k) show how it scales.
* compile time per schema (the tokenizer build for llguidance is once per loaded model: shown apart).

    .venv/bin/python benchmarks/constraint_cost.py                 # both test models
    .venv/bin/python benchmarks/constraint_cost.py --models smollm2 --reps 1   # a quick check
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

OBJ = {"type": "object", "additionalProperties": False}


def _obj(props: dict, **kw) -> dict:
    return {**OBJ, "properties": props, "required": list(props), **kw}


# feature: (schema, good document, bad document)
FEATURES: dict[str, tuple[dict, str, str]] = {
    "type+required": (_obj({"a": {"type": "string"}}), '{"a":"x"}', '{"a":1}'),
    "nullable union": (_obj({"a": {"type": ["integer", "null"]}}), '{"a":null}', '{"a":"x"}'),
    "additionalProperties:false": (_obj({"a": {"type": "integer"}}), '{"a":1}', '{"a":1,"b":2}'),
    "additionalProperties:schema": (
        {"type": "object", "additionalProperties": {"type": "integer"}}, '{"k":1}', '{"k":"v"}'),
    "enum": (_obj({"a": {"enum": ["red", "green"]}}), '{"a":"red"}', '{"a":"blue"}'),
    "const": (_obj({"a": {"const": "v1"}}), '{"a":"v1"}', '{"a":"v2"}'),
    "anyOf": (_obj({"a": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}}), '{"a":true}', '{"a":"x"}'),
    "oneOf": (_obj({"a": {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}}), '{"a":3}', '{"a":"x"}'),
    "allOf": ({"allOf": [_obj({"a": {"type": "integer"}}), {"properties": {"a": {"minimum": 5}}}]}, '{"a":6}', '{"a":3}'),
    "$ref": ({"$defs": {"p": {"type": "integer"}}, **_obj({"a": {"$ref": "#/$defs/p"}})}, '{"a":1}', '{"a":"x"}'),
    "$ref recursive": (
        {"$defs": {"n": _obj({"k": {"type": "array", "items": {"$ref": "#/$defs/n"}}})}, "$ref": "#/$defs/n"},
        '{"k":[{"k":[]}]}', '{"k":[{"k":[1]}]}'),
    "prefixItems": (
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
        '[1,"a"]', '["a",1]'),
    "minItems": ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, "[1,2]", "[1]"),
    "maxItems": ({"type": "array", "items": {"type": "integer"}, "maxItems": 2}, "[1,2]", "[1,2,3]"),
    "minLength": (_obj({"a": {"type": "string", "minLength": 3}}), '{"a":"abc"}', '{"a":"ab"}'),
    "maxLength": (_obj({"a": {"type": "string", "maxLength": 3}}), '{"a":"abc"}', '{"a":"abcd"}'),
    "pattern": (_obj({"a": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}}), '{"a":"AB-123"}', '{"a":"AB-12x"}'),
    "integer minimum": (_obj({"a": {"type": "integer", "minimum": 10}}), '{"a":12}', '{"a":9}'),
    "integer maximum": (_obj({"a": {"type": "integer", "maximum": 10}}), '{"a":7}', '{"a":11}'),
    "exclusiveMaximum": (_obj({"a": {"type": "integer", "exclusiveMaximum": 10}}), '{"a":9}', '{"a":10}'),
    "number minimum": (_obj({"a": {"type": "number", "minimum": 0.5}}), '{"a":0.75}', '{"a":0.25}'),
    "format date": (_obj({"a": {"type": "string", "format": "date"}}), '{"a":"2026-01-31"}', '{"a":"2026-13-01"}'),
    "format time": (_obj({"a": {"type": "string", "format": "time"}}), '{"a":"09:30:00Z"}', '{"a":"9h30"}'),
    "format date-time": (
        _obj({"a": {"type": "string", "format": "date-time"}}), '{"a":"2026-01-31T09:30:00Z"}', '{"a":"yesterday"}'),
    "format uuid": (
        _obj({"a": {"type": "string", "format": "uuid"}}),
        '{"a":"123e4567-e89b-12d3-a456-426614174000"}', '{"a":"123e4567"}'),
    "key order": (_obj({"a": {"type": "integer"}, "b": {"type": "integer"}}), '{"a":1,"b":2}', '{"b":2,"a":1}'),
    "unknown keyword refused": ({"type": "array", "uniqueItems": True}, "", ""),  # refusal is the pass
}  # fmt: skip

# an invoice with line items: what both mechanisms compile (the native converter fails on recursion)
COST_SCHEMA = _obj({
    "number": {"type": "string"},
    "customer": _obj({"name": {"type": "string"}, "vip": {"type": "boolean"}}),
    "lines": {"type": "array", "items": _obj({"item": {"type": "string"}, "qty": {"type": "integer"},
                                              "price": {"type": "number"}})},
    "status": {"enum": ["draft", "sent", "paid"]},
})  # fmt: skip
COST_DOC = json.dumps({"number": "INV-0042", "customer": {"name": "Marie Curie", "vip": True},
                       "lines": [{"item": "keyboard", "qty": 2, "price": 49.9}, {"item": "mouse", "qty": 1, "price": 19.0}],
                       "status": "sent"}, separators=(",", ":"))  # fmt: skip
COMPILE_SCHEMAS = {"invoice": COST_SCHEMA, **{n: FEATURES[n][0] for n in ("$ref recursive", "pattern", "format date-time")}}


class LLGuidance:
    name = "llguidance"

    def __init__(self, model) -> None:
        from localinfer.engine import constrain

        t = time.perf_counter()
        self.compiler = constrain.Compiler(model)
        self.setup_s = time.perf_counter() - t
        self.model = model

    def sampler(self, schema: dict):
        from localinfer.engine.constrain import ConstraintSampler
        from localinfer.request.structured import Format

        fmt = Format("json_schema", json.dumps(schema))
        compiled = self.compiler.compile(fmt)
        self.compiler._cache.clear()  # every call compiles (measured)
        keep = ConstraintSampler(compiled)  # the caller holds it: it keeps the callbacks alive
        return keep.sampler, keep


class Native:
    name = "llama.cpp grammar"

    def __init__(self, model) -> None:
        self.model = model
        self.setup_s = 0.0

    def sampler(self, schema: dict):
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        from localinfer.engine.backend import llama_cpp

        gbnf = json_schema_to_gbnf(json.dumps(schema))
        smpl = llama_cpp.llama_sampler_init_grammar(self.model._vocab, gbnf.encode(), b"root")
        if not smpl:
            raise ValueError("grammar rejected")
        return smpl, gbnf


class Harness:
    """A full-vocabulary candidate array, as llama_sampler_sample builds it."""

    def __init__(self, model) -> None:
        from localinfer.engine.backend import llama_cpp

        self.ll = llama_cpp
        self.model = model
        self.n = model.n_vocab
        self.data = (llama_cpp.llama_token_data * self.n)()
        self.view = np.ctypeslib.as_array(ctypes.cast(self.data, ctypes.POINTER(ctypes.c_uint8)),
                                          (self.n * 12,)).view([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # fmt: skip
        self.arr = llama_cpp.llama_token_data_array(self.data, self.n, -1, False)
        self.eos = [t for t in (llama_cpp.llama_vocab_eos(model._vocab), llama_cpp.llama_vocab_eot(model._vocab)) if t >= 0]

    def apply(self, smpl) -> np.ndarray:
        self.view["id"] = np.arange(self.n, dtype=np.int32)
        self.view["logit"] = 0.0
        self.arr.size, self.arr.selected, self.arr.sorted = self.n, -1, False
        self.ll.llama_sampler_apply(smpl, ctypes.byref(self.arr))
        return self.view["logit"]

    def walk(self, smpl, doc: str) -> bool:
        """True if every token of ``doc`` and then an end-of-generation token are allowed."""
        for tok in self.model.tokenize(doc, add_special=False):
            if not np.isfinite(self.apply(smpl)[tok]):
                return False
            self.ll.llama_sampler_accept(smpl, tok)
        logits = self.apply(smpl)
        return any(np.isfinite(logits[e]) for e in self.eos)

    def cost(self, smpl, doc: str) -> tuple[float, int]:
        toks = self.model.tokenize(doc, add_special=False)
        total = 0.0
        for tok in toks:
            self.view["id"] = np.arange(self.n, dtype=np.int32)  # the reset is not timed
            self.view["logit"] = 0.0
            self.arr.size = self.n
            t = time.perf_counter()
            self.ll.llama_sampler_apply(smpl, ctypes.byref(self.arr))
            self.ll.llama_sampler_accept(smpl, tok)
            total += time.perf_counter() - t
        return total / len(toks), len(toks)


def coverage(mech, h: Harness) -> dict[str, str]:
    out = {}
    for feature, (schema, good, bad) in FEATURES.items():
        try:
            smpl, keep = mech.sampler(schema)
        except Exception:
            out[feature] = "pass (refused)" if feature == "unknown keyword refused" else "refused"
            continue
        if feature == "unknown keyword refused":
            out[feature] = "FAIL (ignored)"
            h.ll.llama_sampler_free(smpl)
            continue
        ok_good = h.walk(smpl, good)
        h.ll.llama_sampler_free(smpl)
        smpl, keep = mech.sampler(schema)
        ok_bad = h.walk(smpl, bad)
        h.ll.llama_sampler_free(smpl)
        out[feature] = "pass" if ok_good and not ok_bad else ("FAIL (not enforced)" if ok_bad else "FAIL (good refused)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,gemma")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    import models as test_models

    from localinfer.engine.model import LlamaModel
    from localinfer.engine.types import LoadOptions

    paths = {"smollm2": test_models.smollm2_path, "gemma": lambda: test_models.gemma_path()}
    results = {}
    for name in args.models.split(","):
        model = LlamaModel(str(paths[name]()), LoadOptions(n_ctx=256))
        h = Harness(model)
        row: dict = {"n_vocab": model.n_vocab}
        for mech in (LLGuidance(model), Native(model)):
            cov = coverage(mech, h) if name == args.models.split(",")[0] else None
            per_tok = []
            for _ in range(args.reps):
                smpl, keep = mech.sampler(COST_SCHEMA)
                per_tok.append(h.cost(smpl, COST_DOC)[0])
                h.ll.llama_sampler_free(smpl)
            compile_ms: dict = {}
            for sname, schema in COMPILE_SCHEMAS.items():
                ts = []
                for _ in range(args.reps):
                    t = time.perf_counter()
                    try:
                        smpl, keep = mech.sampler(schema)
                    except Exception:
                        break
                    ts.append(time.perf_counter() - t)
                    h.ll.llama_sampler_free(smpl)
                compile_ms[sname] = round(statistics.median(ts) * 1e3, 2) if ts else "refused"
            row[mech.name] = {"coverage": cov, "per_token_us": round(statistics.median(per_tok) * 1e6, 1),
                              "compile_ms": compile_ms, "setup_s": round(mech.setup_s, 3)}  # fmt: skip
        results[name] = row
        model.close()
    print(json.dumps(results, indent=1))
    _table(results)


def _table(results: dict) -> None:
    first = next(iter(results.values()))
    mechs = [k for k in first if k != "n_vocab"]
    print("\n| feature | " + " | ".join(mechs) + " |\n|---|" + "---|" * len(mechs))
    for feature in FEATURES:
        print(f"| {feature} | " + " | ".join(first[m]["coverage"][feature] for m in mechs) + " |")
    print("\n| model (n_vocab) | mechanism | per token (us) | compile ms (" + ", ".join(COMPILE_SCHEMAS) + ") | setup s |")
    print("|---|---|---|---|---|")
    for name, row in results.items():
        for m in mechs:
            r = row[m]
            print(f"| {name} ({row['n_vocab']}) | {m} | {r['per_token_us']} | "
                  f"{', '.join(str(v) for v in r['compile_ms'].values())} | {r['setup_s']} |")  # fmt: skip


if __name__ == "__main__":
    main()

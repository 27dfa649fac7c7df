"""The helper process of request/checker.py: schemas and grammars checked one after another, each
request and answer a length-prefixed JSON message on stdin and stdout."""

from __future__ import annotations

import json
import sys

from localinfer.request.checker import read_message
from localinfer.request.structured import FormatError, check_schema, gbnf_to_lark


def answer(kind: str, text: str) -> dict[str, str]:
    try:
        if kind == "schema":
            check_schema(json.loads(text))
            return {"ok": ""}
        return {"ok": gbnf_to_lark(text)}
    except FormatError as exc:
        return {"error": str(exc)}


def main() -> None:
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            request = json.loads(read_message(inp))
        except ValueError:
            return
        reply = json.dumps(answer(request["kind"], request["text"])).encode("ascii")
        out.write(len(reply).to_bytes(4, "big") + reply)
        out.flush()


if __name__ == "__main__":
    main()

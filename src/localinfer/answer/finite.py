"""JSON of model output with no NaN or Infinity: JSON has no such numbers (``json.dumps`` would write
``NaN``, which strict parsers refuse), so a non-finite float - a logprob, an embedding's component -
is written as ``null``, everywhere we write model output as JSON (docs/security.md)."""

from __future__ import annotations

import json
import math
from typing import Any


def dumps(obj: Any, **kw: Any) -> str:
    """``json.dumps(obj, **kw)``, non-finite floats as null (walked only when there is one)."""
    try:
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:  # "Out of range float values are not JSON compliant"
        return json.dumps(finite(obj), allow_nan=False, **kw)


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float (in dicts, lists, tuples) replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj

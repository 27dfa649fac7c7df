"""How a prompt is cut into batches so that its logits do not depend on what the cache held."""

from __future__ import annotations

# llama.cpp evaluates a query row otherwise when fewer rows of its sequence share its ubatch: its CPU flash
# attention goes row by row under 64 and by tiles of 64 from there (GPU kernels switch likewise for small
# batches), and the logits differ in their last bits - enough to change a greedy answer. So a prompt is
# evaluated in pieces of at least this many rows (all of it, if shorter), a prompt found in the cache has
# at least its last this many tokens evaluated again, and only prompt cells are reused (an answer's were
# decoded a row at a time): the answer is the one an empty cache gives (``cache_prompt: false``).
EXACT_ROWS = 64


def prompt_chunk(left: int, room: int, n_ubatch: int, rows: int = EXACT_ROWS) -> int:
    """How many of a prompt's ``left`` tokens go in a batch with ``room`` rows free, so that each is
    evaluated in a ubatch (llama.cpp cuts a batch every ``n_ubatch`` rows) of at least ``rows`` of them,
    as when the whole prompt is evaluated from the start; 0: wait for a batch with more room."""
    k = min(left, room)
    if rows <= 1 or n_ubatch < 2 * rows:  # no room for the rule: as it comes
        return k
    if k == left and (k <= n_ubatch or k % n_ubatch == 0 or k % n_ubatch >= rows):
        return k
    most = min(k, left - rows)  # leaving a last piece of ``rows``
    if most < rows:
        return 0
    return most // n_ubatch * n_ubatch or most  # whole ubatches, else one

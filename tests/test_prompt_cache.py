"""Serve's sequences keep what they held: a cancelled request's retry finds what it evaluated."""

from __future__ import annotations

import threading

import pytest
from test_serve_model import _loaded

from localinfer.engine.batch import BatchDecoder, SeqJob
from localinfer.request.sampling import SamplingOptions

pytestmark = pytest.mark.slow
GREEDY = SamplingOptions(temperature=0.0)


def test_a_cancelled_requests_retry_finds_what_it_evaluated(smollm2_path):
    # Claude Code drops a stream silent for 300 s and retries at once: the retry used to be admitted to
    # another (empty) sequence before the cancelled one was freed, and evaluated everything again
    loaded = _loaded(smollm2_path, 2, 1024)
    try:
        model = loaded.model
        prompt = model.tokenize("Once upon a time, in a land far away, there lived a")
        cancel, pieces = threading.Event(), []
        retry_ready = threading.Event()

        def on_text(text: str) -> None:
            pieces.append(text)
            if len(pieces) == 2:
                cancel.set()  # the client went away...
                retry_ready.set()  # ...and its retry arrives in the same step

        def source():
            yield SeqJob("cancelled", prompt, GREEDY, max_tokens=200, ignore_eos=True, on_text=on_text, cancel=cancel)
            while not retry_ready.is_set():
                yield None
            yield SeqJob("retry", prompt, GREEDY, max_tokens=4, ignore_eos=True)

        with BatchDecoder(model, 2, keep_cache=True) as decoder:
            results = {r.key: r for r in decoder.run(source())}
    finally:
        loaded.close()
    assert results["cancelled"].stats.finish_reason == "interrupted"
    assert results["retry"].stats.cached_tokens == len(prompt) - 1, "the retry found the cancelled request's cells"

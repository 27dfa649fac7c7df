"""From a parsed request to an answer: prepared off the engine thread, queued, run by the thread that owns a model, bridged back."""

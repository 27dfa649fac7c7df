"""What comes back: one answer record with its JSON shapes (`answer/answer.py`), and model output
written as JSON without NaN or Infinity (`answer/finite.py`)."""

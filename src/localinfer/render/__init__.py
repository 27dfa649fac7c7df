"""Everything users see on stderr: progress, stats, warnings (stdout carries only the answer)."""

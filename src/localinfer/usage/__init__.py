"""The usage history (SQLite), its summaries and what the tokens would have cost."""

"""Which models serve has, loads and routes to, and the cores and memory they share."""

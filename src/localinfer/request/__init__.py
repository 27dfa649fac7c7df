"""What is asked and whether it is allowed: the one request (`request/request.py`), the rule
table for its fields (`request/rules.py`), the input limits, the answer's format (`request/structured.py`, GBNF in
`request/grammar.py`), the sampling options and their defaults, the tools offered and how each model
family writes calls and thinking (`request/toolcalls/`, `request/reasoning.py`). Plain Python: no engine import."""

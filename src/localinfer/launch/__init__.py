"""`localinfer launch AGENT`: a coding agent (Claude Code, Codex, OpenCode, Qwen Code,
Crush, Continue) on a local `serve`.

``agents``: what each agent is told (environment variables, flags, a private config in our data
folder; never the user's own files). ``server``: the `serve` launch finds or starts, left running
for the next launch, and stopped by `localinfer stop`.
"""

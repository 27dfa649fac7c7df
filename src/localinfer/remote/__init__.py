"""Talking to an OpenAI-compatible server (``--endpoint``): the HTTP client, batch over HTTP, chat, and
the load test with its metrics. Nothing here is imported until a command is given ``--endpoint``."""

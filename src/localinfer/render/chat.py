"""What `localinfer chat` shows besides the answers: the dim stats line, notices, /help, /show, /stats.

Dim (ANSI SGR 2) only on a terminal and without NO_COLOR; plain text otherwise, so piped chat stays
clean. No Rich here: the REPL prints a line per turn and must not pay Rich's import on every one.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, TextIO

from localinfer.render.term import styled, terminal_width, wrap
from localinfer.units import human_bytes
from localinfer.units import human_duration as ms
from localinfer.units import human_rate as tps

if TYPE_CHECKING:
    from localinfer.answer.answer import Answer
    from localinfer.chat.conversation import Conversation

HELP = '''Commands:
  /help                this list (also /?)
  /exit                leave (also /quit, /bye, or Ctrl-D)
  /clear               start a new conversation (same system prompt; empties the KV cache)
  /system [TEXT]       show or set the system prompt (/system "" removes it)
  /set [KEY VALUE]     show or change a setting: temperature, top_p, top_k, min_p, repeat_penalty,
                       repeat_last_n, seed (N or random), max_tokens (N or none), stop (TEXT or none),
                       format (json, schema FILE, grammar FILE or off: each answer is that JSON)
  /show                the model, the context and the current settings
  /stats               the last turn in detail and the session's totals
  /retry               regenerate the last answer
  /image FILE          attach an image to your next message (a vision model: see docs/vision.md)
  /save FILE           save the conversation (OpenAI-style messages JSON)
  /load FILE           load a saved conversation
  /model [NAME]        switch to another model, keeping the conversation
  /think on|off        ask a reasoning model to think first or not (enable_thinking)
Input:
  """ starts a multi-line message and """ ends it; Alt+Enter (Esc, Enter) inserts a newline;
  pasted text keeps its lines. //text sends a message that starts with "/".
  Ctrl-C stops an answer (what was written is kept) or clears the line.'''



def dim(text: str, stream: TextIO) -> str:
    return f"\x1b[2m{text}\x1b[0m" if styled(stream) else text


def print_dim(text: str, stream: TextIO) -> None:
    """``text`` dim on a terminal, wrapped at word boundaries to its width (as is on a pipe)."""
    stream.write(dim(wrap(text, terminal_width(stream)), stream) + "\n")
    stream.flush()



def turn_line(result: Answer) -> str:
    """One line per answer: tokens, TTFT, decode rate, prompt evaluated vs cached, context used."""
    s = result.stats
    if s is None:  # a server's answer: what it reported
        from localinfer.render.remote import turn_line as remote_line

        return remote_line(result)
    parts = [
        f"{s.completion_tokens} tokens",
        f"TTFT {ms(result.ttft_s)}",
        f"decode {tps(s.decode_tps)}",
        f"prompt {s.evaluated_tokens} evaluated, {s.cached_tokens} cached",
        f"context {s.context_used}/{s.n_ctx}",
    ]
    if s.draft:  # --draft: how much of what was guessed the model kept
        from localinfer.engine.draft import acceptance

        parts.insert(3, acceptance(s.draft_tokens, s.draft_accepted))
    if s.finish_reason in ("length", "interrupted"):
        parts.append(s.finish_reason)
    return " · ".join(parts)


def banner(conv: Conversation) -> str:
    if conv.endpoint:  # chat --endpoint: the server holds the context
        return f"{conv.name} @ {conv.endpoint} · /help for commands, /exit or Ctrl-D to quit"
    t = conv.loaded.template
    fmt = "the model's chat template" if t is not None and t.source == "gguf" else (t.source if t else "-")
    return (
        f"{conv.loaded.name} · context {conv.n_ctx} tokens · {fmt} · "
        "/help for commands, /exit or Ctrl-D to quit"
    )


def _description(desc: str) -> str:
    """llama.cpp's "llama 256M Q4_1" without its size class, a guess from the layer count that
    contradicted the parameter count beside it (135 M): the architecture and the file type."""
    words = desc.split()
    if len(words) >= 3 and re.fullmatch(r"(\d+(\.\d+)?|\?)[KMBT]", words[1]):
        del words[1]
    return " ".join(words)


def table(rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in rows)
    return [f"  {k:<{width}}  {v}" for k, v in rows]


def switched_line(conv: Conversation) -> str:
    """After `/model NAME`."""
    if conv.endpoint:
        return f"Switched to {conv.name} on {conv.endpoint}; {len(conv.history)} messages kept."
    return f"Switched to {conv.name} (context {conv.n_ctx} tokens); {len(conv.history)} messages kept."


def show_lines(conv: Conversation) -> list[str]:
    """`/show`: the model, where it came from, the context, the system prompt and the settings."""
    if conv.endpoint:
        rows = [("model", conv.name), ("endpoint", conv.endpoint),
                ("system prompt", repr(conv.system) if conv.system else "(none)"),
                ("messages", str(len(conv.history)))]  # fmt: skip
        return ["Model:", *table(rows), "Settings:", *table(conv.settings.items())]
    lm, m = conv.loaded, conv.model
    resolved = lm.resolved
    t = lm.template
    rows = [
        ("model", lm.name),
        ("file", str(m.path)),
        ("source", resolved.source if resolved is not None else "-"),
        ("description", _description(m.description)),
        ("parameters", f"{m.n_params / 1e6:.0f} M" if m.n_params < 1e9 else f"{m.n_params / 1e9:.2f} B"),
        ("size", human_bytes(m.size_bytes)),
        ("chat format", "GGUF chat template" if t is not None and t.source == "gguf" else (t.source if t else "-")),
        ("context", f"{m.n_ctx} tokens (trained on {m.n_ctx_train}), {len(m.cached_tokens)} in the KV cache"),
        ("threads", f"{m.n_threads} (prompt: {m.n_threads_batch})"),
        ("GPU layers", str(m.options.n_gpu_layers if m.options.n_gpu_layers >= 0 else "all")),
        ("system prompt", repr(conv.system) if conv.system else "(none)"),
        (
            "messages",
            f"{len(conv.history) - conv.start} in the context"
            + (f", {conv.start} older ones dropped to fit" if conv.start else ""),
        ),
    ]
    return ["Model:", *table(rows), "Settings:", *table(conv.settings.items())]


def stats_lines(conv: Conversation) -> list[str]:
    """`/stats`: the last turn in detail, then the whole session."""
    if conv.endpoint:
        return _remote_stats_lines(conv)
    out: list[str] = []
    r = conv.last
    if r is None:
        out.append("Last turn: none yet")
    else:
        s = r.stats
        out.append("Last turn:")
        out += table(
            [
                ("finish reason", s.finish_reason or "-"),
                ("TTFT", ms(r.ttft_s)),
                ("prompt tokens", f"{s.prompt_tokens} ({s.evaluated_tokens} evaluated, {s.cached_tokens} reused from the KV cache)"),
                ("prefill", f"{ms(s.prefill_s)} · {tps(s.prefill_tps)}"),
                ("completion tokens", str(s.completion_tokens)),
                ("decode", f"{ms(s.decode_s)} · {tps(s.decode_tps)} (tokens after the first)"),
                ("end to end", ms(r.total_s)),
                ("context", f"{s.context_used} / {s.n_ctx} tokens"),
                ("seed", str(s.extra.get("seed", "-"))),
                ("peak RSS", human_bytes(r.peak_rss)),
            ]
        )
    t = conv.totals
    reuse = f" ({100 * t.cached_tokens / t.prompt_tokens:.0f}% reused)" if t.prompt_tokens else ""
    mean_ttft = sum(t.ttft_s) / len(t.ttft_s) if t.ttft_s else None
    out.append("Session:")
    out += table(
        [
            ("turns", f"{t.turns}" + (f" ({t.interrupted} interrupted)" if t.interrupted else "")),
            ("prompt tokens", f"{t.prompt_tokens}: {t.evaluated_tokens} evaluated, {t.cached_tokens} cached{reuse}"),
            ("completion tokens", str(t.completion_tokens)),
            ("mean TTFT", ms(mean_ttft)),
            ("prefill", tps(t.prefill_tps)),
            ("decode", tps(t.decode_tps)),
            ("time answering", ms(t.total_s)),
            ("dropped to fit", f"{t.dropped_turns} messages"),
        ]
    )
    return out


def _remote_stats_lines(conv: Conversation) -> list[str]:
    """`/stats` on a server: the client's measurements and what the server reported ("unknown" where
    it said nothing), summed over the session's answers."""
    from localinfer.render.remote import rows as answer_rows

    r = conv.last
    out = ["Last turn: none yet"] if r is None else ["Last turn:", *table(answer_rows(r)[3:])]
    rs = conv.answers
    prompt = [a.prompt_tokens for a in rs]
    done = [a.completion_tokens for a in rs]
    ttfts = [a.ttft_s for a in rs if a.ttft_s is not None]
    decode_n = sum((a.completion_tokens or 1) - 1 for a in rs if a.decode_tps)
    decode_s = sum(a.decode_s or 0.0 for a in rs if a.decode_tps)
    return out + ["Session:", *table([
        ("turns", str(len(rs))),
        ("prompt tokens", "unknown" if None in prompt else str(sum(p or 0 for p in prompt))),
        ("completion tokens", "unknown" if None in done else str(sum(d or 0 for d in done))),
        ("mean TTFT", ms(sum(ttfts) / len(ttfts) if ttfts else None)),
        ("decode", tps(decode_n / decode_s) if decode_s > 0 else "unknown"),
        ("time answering", ms(sum(a.total_s for a in rs))),
    ])]  # fmt: skip

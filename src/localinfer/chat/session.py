"""A chat session's logic: slash commands, turns, and what is printed and recorded for them.

The conversation itself (history, cache reuse, trimming, files) is ``chat.conversation``; the input
loops (the REPL on a terminal, lines when piped) are ``cli.chat_repl``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from localinfer.chat.conversation import Conversation
    from localinfer.engine.types import LoadOptions
    from localinfer.generate import Result
    from localinfer.usage.history import UsageRecord

_EXIT = ("exit", "quit", "bye")


def split_command(line: str) -> tuple[str, str]:
    """``"/set temperature 0"`` -> ``("set", "temperature 0")``."""
    body = line.strip()[1:]
    name, _, arg = body.partition(" ")
    return name.strip().lower(), arg.strip()


def block_open(text: str) -> bool:
    """Whether ``text`` starts a \"\"\" multi-line block that is not closed yet."""
    t = text.strip()
    return t.startswith('"""') and (len(t) < 6 or not t.endswith('"""'))


def unwrap_block(text: str) -> str:
    """The text inside a \"\"\" block (an unclosed one too); other text as it is."""
    t = text.strip()
    if not t.startswith('"""'):
        return text
    inner = t[3:-3] if len(t) >= 6 and t.endswith('"""') else t[3:]
    return inner.strip("\n")



@dataclass
class ChatSession:
    """The CLI side of a chat: how it loads models, where it prints, what it records."""

    load_opts: LoadOptions
    offline: bool
    force: bool
    quiet: bool
    verbose: bool
    no_log: bool
    interactive: bool
    conv: Conversation | None = None
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)

    # -- output ------------------------------------------------------------------------------------
    @property
    def info(self) -> TextIO:
        """Command output: the terminal in the REPL; stderr when piped (stdout is for answers)."""
        return self.out if self.interactive else self.err

    def say(self, text: str) -> None:
        from localinfer.render.chat import print_dim

        if not self.quiet:
            print_dim(text, self.err)

    def tell(self, text: str) -> None:
        from localinfer.render.term import write_wrapped

        write_wrapped(self.info, text)

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    # -- models ------------------------------------------------------------------------------------
    def _load(self, name: str | None) -> tuple[Any, float]:
        from localinfer import generate
        from localinfer.chat.conversation import no_template_error
        from localinfer.render.progress import make_progress
        from localinfer.store import resolve_model, touch

        resolved = resolve_model(name, offline=self.offline, pull_progress=make_progress())
        if not (resolved.info.chat_template or resolved.chat_format):
            raise no_template_error(resolved.name)  # before spending time loading it
        t0 = time.perf_counter()
        loaded = generate.load(resolved, self.load_opts, force=self.force)
        load_s = time.perf_counter() - t0
        if loaded.template is None:
            loaded.close()
            raise no_template_error(resolved.name)
        touch(resolved.name)  # `list`'s "last used"
        for note in loaded.plan.notes if getattr(loaded, "plan", None) else ():
            self.say(note)
        return loaded, load_s

    def open(self, name: str | None, system: str | None, settings: Any) -> None:
        from localinfer.chat.conversation import Conversation

        loaded, load_s = self._load(name)
        self.conv = Conversation(loaded, system=system, settings=settings, notify=self.say, load_s=load_s)

    def close(self) -> None:
        if self.conv is not None:
            self.conv.close()
            self.conv = None

    # -- turns -------------------------------------------------------------------------------------
    def turn(self, text: str, *, retry: bool = False) -> Result:
        conv = self.conv
        assert conv is not None
        result = conv.retry(self._write) if retry else conv.ask(text, self._write)
        if result.text and not result.text.endswith("\n"):
            self._write("\n")
        interrupted = result.finish_reason == "interrupted"
        if interrupted and self.interactive:
            from localinfer.render.chat import print_dim

            kept = "the partial answer is kept" if result.text else "nothing was written; the message was dropped"
            print_dim(f"[interrupted: {kept}]", self.out)
        if not self.quiet:
            self._print_stats(result)
        self._record(result, text)
        if interrupted and not self.interactive:
            raise KeyboardInterrupt
        return result

    def _print_stats(self, result: Result) -> None:
        from localinfer.render.chat import print_dim

        if self.verbose:
            self._print_table(result)
        else:
            print_dim(self._turn_line(result), self.err)
        if self.interactive:
            self.err.write("\n")
            self.err.flush()

    def _print_table(self, result: Result) -> None:
        from localinfer.render.stats import print_table

        print_table(result, self.err)

    def _turn_line(self, result: Result) -> str:
        from localinfer.render.chat import turn_line

        return turn_line(result)

    def _record(self, result: Result, text: str) -> None:
        from localinfer.render.stats import warn
        from localinfer.usage import history

        if not history.logging_enabled(self.no_log):
            return
        status = 130 if result.finish_reason == "interrupted" else 0
        history.append(self._usage_record(result, status, text), warn=warn)

    def _usage_record(self, result: Result, status: int, text: str) -> UsageRecord:
        from localinfer.usage import history

        resolved = self.conv.loaded.resolved if self.conv else None
        return history.record_from_result("chat", result, resolved, exit_status=status, prompt_text=text)

    # -- slash commands --------------------------------------------------------------------------
    def command(self, line: str) -> bool:
        """Run one slash command; False means leave the chat."""
        from localinfer.chat.settings import unquote
        from localinfer.errors import UsageError
        from localinfer.render.chat import HELP, show_lines, stats_lines

        conv = self.conv
        assert conv is not None
        name, arg = split_command(line)
        if name in _EXIT:
            return False
        if name in ("help", "?", "h"):
            self.tell(HELP)
        elif name == "clear":
            conv.clear()
            self.tell("New conversation (the KV cache is empty; the system prompt and settings are kept).")
        elif name == "system":
            if not arg:
                self.tell(f"System prompt: {conv.system!r}" if conv.system else "No system prompt.")
            else:
                conv.set_system(unquote(arg))
                self.tell("System prompt set." if conv.system else "System prompt removed.")
        elif name == "set":
            self._set(arg)
        elif name == "show":
            self.tell("\n".join(show_lines(conv)))
        elif name == "stats":
            self.tell("\n".join(stats_lines(conv)))
        elif name == "retry":
            s = conv.settings.sampling
            if not conv.history:
                raise UsageError("nothing to retry: ask something first")
            if s.seed is not None:
                self.say(f"the seed is fixed ({s.seed}), so the answer will be the same; /set seed random to vary it")
            elif s.greedy:
                self.say("temperature is 0 (greedy), so the answer will be the same; /set temperature 0.8 to vary it")
            last_user = next((m["content"] for m in reversed(conv.history) if m["role"] == "user"), "")
            self.turn(last_user, retry=True)
        elif name == "save":
            if not arg:
                raise UsageError("/save needs a file name", hint="/save chat.json")
            path = conv.save(unquote(arg))
            self.tell(f"Saved {len(conv.context_messages(0))} messages to {path}.")
        elif name == "load":
            if not arg:
                raise UsageError("/load needs a file name", hint="/load chat.json")
            n = conv.load(unquote(arg))
            self.tell(f"Loaded {n} messages from {arg}.")
        elif name == "model":
            if not arg:
                self.tell(f"Model: {conv.loaded.name}")
            else:
                self.say(f"loading {arg}…")
                loaded, load_s = self._load(arg)
                conv.switch_model(loaded, load_s=load_s)
                self.tell(
                    f"Switched to {loaded.name} (context {conv.n_ctx} tokens); "
                    f"{len(conv.history)} messages kept."
                )
        else:
            from localinfer.fuzzy import did_you_mean

            known = ("help", "clear", "system", "set", "show", "stats", "retry", "save", "load", "model", *_EXIT)
            hint = did_you_mean(name, known, "/") or "type /help for the commands"
            raise UsageError(f"unknown command /{name}", hint=f"{hint}; //text sends a message starting with /")
        return True

    def _set(self, arg: str) -> None:
        from localinfer.chat.settings import canonical_key, unquote

        conv = self.conv
        assert conv is not None
        if not arg:
            from localinfer.render.chat import table

            self.tell("\n".join(["Settings:", *table(conv.settings.items())]))
            return
        key, _, value = arg.partition(" ")
        if key.lower() == "system":
            conv.set_system(unquote(value.strip()))
            self.tell("System prompt set." if conv.system else "System prompt removed.")
            return
        conv.set(key, value)
        name = canonical_key(key)
        self.tell(f"Set {name} = {dict(conv.settings.items())[name]}.")

    # -- one line of input -----------------------------------------------------------------------
    def handle(self, text: str) -> bool:
        """A message or a command; False means leave."""
        stripped = text.strip()
        if not stripped:
            return True
        if stripped.startswith("//"):
            text = text.lstrip()[1:]
        elif stripped.startswith("/"):
            return self.command(stripped)
        self.turn(text)
        return True

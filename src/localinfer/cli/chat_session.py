"""A chat session, the terminal side of `localinfer chat`: turns and slash commands, what is printed
for them and what is recorded. The same session runs on a model here or on a server (``--endpoint``):
only the backend differs (``cli.backend.open_backend``).

The conversation itself (history, cache reuse, trimming, files) is ``chat.conversation``; the input
loops (the REPL on a terminal, lines when piped) are ``cli.chat_repl``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from localinfer.chat.session import split_command

if TYPE_CHECKING:
    from localinfer.answer.answer import Answer
    from localinfer.backends import Backend
    from localinfer.chat.conversation import Conversation
    from localinfer.engine.types import LoadOptions
    from localinfer.remote.connection import Endpoint

_EXIT = ("exit", "quit", "bye")


@dataclass
class ChatSession:
    """The CLI side of a chat: how it gets its models, where it prints, what it records."""

    load_opts: LoadOptions | None  # the load flags (None with --endpoint: nothing is loaded here)
    offline: bool
    force: bool
    quiet: bool
    verbose: bool
    no_log: bool
    interactive: bool
    endpoint: Endpoint | None = None  # a server to chat with (--endpoint), with its key and timeout
    keep_alive: Any = None  # --keep-alive (resident.place.KeepAlive): the model stays loaded between chats
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
    def _open(self, name: str | None) -> Backend:
        """A model that can chat: loaded here (refused before loading when it has no chat format),
        or on the server."""
        from localinfer.cli.backend import open_backend

        load_opts = self.load_opts
        return open_backend(endpoint=self.endpoint, model=name,
                            load_options=lambda _resolved: load_opts, offline=self.offline, force=self.force,
                            on_note=self.say, chat_only=True, keep_alive=self.keep_alive)  # fmt: skip

    def open(self, name: str | None, system: str | None, settings: Any) -> None:
        from localinfer.chat.conversation import Conversation

        backend = self._open(name)
        try:
            self.conv = Conversation(backend, system=system, settings=settings, notify=self.say)
        except BaseException:
            backend.close()
            raise

    def close(self) -> None:
        if self.conv is not None:
            self.conv.close()
            self.conv = None

    # -- turns -------------------------------------------------------------------------------------
    def turn(self, text: str, *, retry: bool = False) -> Answer:
        conv = self.conv
        assert conv is not None
        from localinfer.render.thinking import ThinkingWriter, shows_thinking

        thinking = ThinkingWriter(self.err) if shows_thinking(self.quiet, self.err) else None
        conv.on_reasoning = thinking.write if thinking is not None else None

        def write(piece: str) -> None:
            if thinking is not None:
                thinking.end()
            self._write(piece)

        try:
            result = conv.retry(write) if retry else conv.ask(text, write)
        finally:
            if thinking is not None:
                thinking.end()
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

    def _print_stats(self, result: Answer) -> None:
        from localinfer.render.chat import print_dim, turn_line

        if not self.verbose:
            print_dim(turn_line(result), self.err)
        elif result.backend is not None:
            from localinfer.render.remote import print_summary

            print_summary(result, verbose=True, stream=self.err)
        else:
            from localinfer.render.stats import print_table

            print_table(result, self.err)
        if self.interactive:
            self.err.write("\n")
            self.err.flush()

    def _record(self, result: Answer, text: str) -> None:
        from localinfer.render.stats import warn
        from localinfer.usage import history
        from localinfer.usage.recorder import record_of

        if not history.logging_enabled(self.no_log):
            return
        status = 130 if result.finish_reason == "interrupted" else 0
        backend = self.conv.backend if self.conv else None
        history.append(record_of("chat", result, backend, exit_status=status, prompt_text=text), warn=warn)

    # -- slash commands --------------------------------------------------------------------------
    def command(self, line: str) -> bool:
        """Run one slash command; False means leave the chat."""
        from localinfer.chat.settings import unquote
        from localinfer.errors import UsageError
        from localinfer.render.chat import HELP, show_lines, stats_lines, switched_line

        conv = self.conv
        assert conv is not None
        name, arg = split_command(line)
        if name in _EXIT:
            return False
        if name in ("help", "?", "h"):
            self.tell(HELP)
        elif name == "clear":
            conv.clear()
            emptied = "" if conv.endpoint else "the KV cache is empty; "
            self.tell(f"New conversation ({emptied}the system prompt and settings are kept).")
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
        elif name == "image":  # attached to the next message (localinfer.request.images)
            from localinfer.request.images import check_count, check_request, from_file

            if not arg:
                raise UsageError("/image needs a file name", hint="/image photo.png")
            check_count(len(conv.images) + 1)
            image = from_file(unquote(arg))  # its header: decoded when the message is sent
            check_request([*conv.images, image])
            conv.images.append(image)
            self.tell(f"Image {arg} ({conv.images[-1].width}x{conv.images[-1].height}) goes with your next message.")
        elif name == "think":
            on = {"on": True, "off": False}.get(arg.strip().lower())
            if on is None:
                raise UsageError("/think takes on or off", hint="/think off: ask a reasoning model to answer without thinking")
            conv.settings = conv.settings.with_thinking(on)
            self.tell(f"Thinking {'on' if on else 'off'} (enable_thinking, for templates that read it).")
        elif name == "model":
            if not arg:
                self.tell(f"Model: {conv.name}")
            else:
                remote = getattr(conv.backend, "switch", None)  # a server: another of its models
                if remote is None:
                    self.say(f"loading {arg}…")
                conv.switch_model(remote(arg) if remote is not None else self._open(arg))
                self.tell(switched_line(conv))
        else:
            from localinfer.fuzzy import did_you_mean

            known = ("help", "clear", "system", "set", "show", "stats", "retry", "save", "load", "model", "think", "image", *_EXIT)
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

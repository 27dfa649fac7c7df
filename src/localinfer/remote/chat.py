"""`chat --endpoint`: the same session (slash commands, history, /save and /load) over a server.

The server keeps its own cache and context, so there is no splicing or trimming here: each turn
sends the whole conversation, and a conversation that outgrows the server's context is the
server's error (exit 6 when it says so), shown like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localinfer.chat.conversation import Conversation
from localinfer.chat.session import ChatSession
from localinfer.chat.settings import ChatSettings
from localinfer.errors import UsageError

if TYPE_CHECKING:
    from localinfer.remote.client import Client
    from localinfer.remote.results import RemoteResult

Write = Any  # Callable[[str], None]


@dataclass
class RemoteModel:
    """What a conversation needs to know of a model it does not hold: its name on the server."""

    name: str
    endpoint: str
    template: None = None
    resolved: None = None


@dataclass
class RemoteTotals:
    """The session's figures (/stats); sums over what the server reported."""

    results: list[RemoteResult] = field(default_factory=list)

    def add(self, result: RemoteResult) -> None:
        self.results.append(result)

    def lines(self) -> list[tuple[str, str]]:
        from localinfer.units import human_duration, human_rate

        rs = self.results
        prompt = [r.outcome.prompt_tokens for r in rs]
        done = [r.outcome.completion_tokens for r in rs]
        ttfts = [r.ttft_s for r in rs if r.ttft_s is not None]
        decode_n = sum((r.outcome.completion_tokens or 1) - 1 for r in rs if r.outcome.decode_tps)
        decode_s = sum(r.outcome.decode_s or 0.0 for r in rs if r.outcome.decode_tps)
        return [
            ("turns", str(len(rs))),
            ("prompt tokens", "unknown" if None in prompt else str(sum(p or 0 for p in prompt))),
            ("completion tokens", "unknown" if None in done else str(sum(d or 0 for d in done))),
            ("mean TTFT", human_duration(sum(ttfts) / len(ttfts) if ttfts else None)),
            ("decode", human_rate(decode_n / decode_s) if decode_s > 0 else "unknown"),
            ("time answering", human_duration(sum(r.total_s for r in rs))),
        ]


class RemoteConversation(Conversation):
    """A Conversation whose answers come from a server: the history, settings and files are the
    local ones (inherited); answering, /clear and /model are the server's."""

    def __init__(self, client: Client, name: str, *, system: str | None = None,
                 settings: ChatSettings = ChatSettings(), notify: Any = None) -> None:  # fmt: skip
        # Conversation.__init__ wants a loaded model: set its fields here instead.
        self.client = client
        self.loaded = RemoteModel(name, client.ep.display)  # type: ignore[assignment]
        self.system = system or None
        self.settings = settings
        self.notify = notify or (lambda _msg: None)
        self.history: list[dict[str, Any]] = []
        self.start = 0
        self.last: RemoteResult | None = None  # type: ignore[assignment]
        self.remote_totals = RemoteTotals()

    @property
    def endpoint(self) -> str:
        return self.client.ep.display

    @property
    def model(self) -> Any:
        raise UsageError("this chat runs on a server: there is no local model")

    @property
    def n_ctx(self) -> int:
        return 0  # the server's; unknown here

    def _answer(self, write: Write) -> RemoteResult:  # type: ignore[override]
        from localinfer.remote.client import request_body
        from localinfer.remote.results import RemoteResult

        s = self.settings
        body = request_body(self.loaded.name, messages=self.context_messages(), sampling=s.sampling,
                            max_tokens=s.max_tokens, stop=s.stop)  # fmt: skip
        try:
            outcome = self.client.stream(body, on_text=write)
        except KeyboardInterrupt as exc:
            outcome = getattr(exc, "partial_outcome", None)
            if outcome is None:
                self.history.pop()
                raise
        except BaseException:
            self.history.pop()
            raise
        result = RemoteResult(outcome, self.loaded.name, self.endpoint, seed=s.sampling.seed)
        self._keep_answer(outcome.text, outcome.finish_reason)
        self.last = result
        self.remote_totals.add(result)
        return result

    def clear(self) -> None:
        self.history, self.start, self.last = [], 0, None

    def switch_model(self, name: str, *, load_s: float = 0.0) -> None:  # type: ignore[override]
        self.loaded = RemoteModel(self.client.pick_model(name), self.endpoint)  # type: ignore[assignment]

    def close(self) -> None:
        self.client.close()


class RemoteChatSession(ChatSession):
    """ChatSession with the server's model: what differs is opening, /show, /stats, /model, and
    what is printed and recorded per turn."""

    client: Client | None = None

    def open(self, name: str | None, system: str | None, settings: Any) -> None:  # type: ignore[override]
        assert self.client is not None
        model = self.client.pick_model(name)
        self.conv = RemoteConversation(self.client, model, system=system, settings=settings, notify=self.say)  # type: ignore[assignment]

    def command(self, line: str) -> bool:
        from localinfer.chat.session import split_command
        from localinfer.render.chat import table

        conv: RemoteConversation = self.conv  # type: ignore[assignment]
        name, arg = split_command(line)
        if name == "show":
            rows = [("model", conv.loaded.name), ("endpoint", conv.endpoint),
                    ("system prompt", repr(conv.system) if conv.system else "(none)"),
                    ("messages", str(len(conv.history)))]  # fmt: skip
            self.tell("\n".join(["Model:", *table(rows), "Settings:", *table(conv.settings.items())]))
        elif name == "stats":
            self.tell("\n".join(self._stats_lines(conv)))
        elif name == "model" and arg:
            conv.switch_model(arg)
            self.tell(f"Switched to {conv.loaded.name} on {conv.endpoint}; {len(conv.history)} messages kept.")
        elif name == "clear":
            conv.clear()
            self.tell("New conversation (the system prompt and settings are kept).")
        else:
            return super().command(line)
        return True

    @staticmethod
    def _stats_lines(conv: RemoteConversation) -> list[str]:
        from localinfer.render.chat import table
        from localinfer.render.remote import rows

        out = ["Last turn: none yet"] if conv.last is None else ["Last turn:", *table(rows(conv.last)[3:])]
        return out + ["Session:", *table(conv.remote_totals.lines())]

    def _print_table(self, result: Any) -> None:
        from localinfer.render.remote import print_summary

        print_summary(result, verbose=True, stream=self.err)

    def _turn_line(self, result: Any) -> str:
        from localinfer.render.remote import turn_line

        return turn_line(result)

    def _usage_record(self, result: Any, status: int, text: str) -> Any:
        from localinfer.remote.results import usage_record

        return usage_record("chat", result, model=result.model, endpoint=result.endpoint, exit_status=status, prompt_text=text)

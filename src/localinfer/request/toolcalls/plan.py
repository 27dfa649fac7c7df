"""One request's tools, planned for one template: the messages and variables its template gets, what
a forced answer starts with, the constraint that guarantees the call, and the parser for the answer.
Pure: the prompt builder and the server's answer each make the same plan from the same request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.request.toolcalls import families, spec
from localinfer.request.toolcalls.families import Family
from localinfer.request.toolcalls.parser import CallParser, parse
from localinfer.request.toolcalls.spec import Tool, ToolChoice

if TYPE_CHECKING:
    from localinfer.request.structured import Format


@dataclass(frozen=True)
class ToolPlan:
    family: Family
    tools: tuple[Tool, ...]
    choice: ToolChoice
    parallel: bool = True

    @property
    def offered(self) -> bool:
        """Whether the tools reach the model at all (``none``: they do not, and no call is parsed)."""
        return bool(self.tools) and self.choice.mode != "none"

    @property
    def names(self) -> frozenset[str]:
        """The tools a call may name: the offered ones (the chosen one, when a function is chosen)."""
        return frozenset(t.name for t in self.tools if self.choice.name is None or t.name == self.choice.name)

    def messages(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return families.template_messages(self.family, list(messages), self.tools, self.choice)

    def variables(self) -> dict[str, Any]:
        """What the template's render gets besides the messages (``tools``, as transformers passes it)."""
        if self.family.native and self.offered:
            return {"tools": [t.to_openai() for t in self.tools]}
        return {}

    @property
    def opening(self) -> str:
        """Written into the prompt after the generation prompt: a forced answer opens with its marker."""
        return self.family.opening if self.offered and self.choice.forced else ""

    def constraint(self) -> tuple[Format, str | None] | None:
        """The format the answer must follow and the marker after which it applies (None: from the
        first token); None: no constraint (``none``, or ``auto`` in a family without a marker).
        A forced call is the whole answer (after ``opening``): its arguments are ``parameters``."""
        if "_constraint" not in self.__dict__:  # made once: where the request is prepared, off the engine thread
            object.__setattr__(self, "_constraint", self._make_constraint())
        return self.__dict__["_constraint"]

    def _make_constraint(self) -> tuple[Format, str | None] | None:
        from localinfer.request.structured import from_schema

        if not self.offered:
            return None
        fmt = from_schema(families.schema(self.family, self.tools, self.choice, self.parallel), name="tool_calls")
        if self.choice.forced or not self.family.native:
            return fmt, None
        start = self.family.starts[0] if self.family.starts else None
        return (fmt, start) if start else None

    def parser(self) -> CallParser | None:
        """A parser for the streamed answer (None with ``none``: the answer is all text)."""
        if not self.offered:
            return None
        p = CallParser(self.family, self.parallel, self.names)
        p.feed(self.opening)
        return p

    def parse(self, text: str) -> tuple[str, list[spec.ToolCall]]:
        """A whole answer's content and calls."""
        if not self.offered:
            return text, []
        p = parse(self.family, text, opening=self.opening, parallel=self.parallel, names=self.names)
        return p.content, p.calls


def finish_reason(calls: Sequence[Any], reason: str | None) -> str | None:
    """OpenAI's: ``tool_calls`` when an answer that ended by itself made calls; a call cut short by
    the token limit stays ``length`` (its arguments are not whole)."""
    from localinfer.request.toolcalls.parser import is_object

    whole = all(is_object(c.arguments) for c in calls)  # a call cut short by the answer's end is not
    return "tool_calls" if calls and whole and reason == "stop" else reason


def plan_for(tools: tuple[Tool, ...], choice: ToolChoice | None, parallel: bool, template: str | None) -> ToolPlan | None:
    """The plan for a request's tools with this chat template's source (None: it has none)."""
    if not tools and choice is None:
        return None
    return ToolPlan(families.detect(template), tools, choice or ToolChoice(), parallel)

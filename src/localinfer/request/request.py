"""One request, whoever asks (the API, `run`, `chat`, a batch line, serve) and whoever answers (the
engine here, or a server with ``--endpoint``).

A new capability of a request (response_format, tools, logprobs, chat_template_kwargs) is one more
field of :class:`Request`, one more argument of :func:`build`, and what each backend does with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.request.sampling import SamplingOptions

if TYPE_CHECKING:
    from localinfer.request.toolcalls.spec import Tool, ToolChoice
    from localinfer.request.structured import Format

Messages = Sequence[dict[str, Any]]


@dataclass(frozen=True)
class Request:
    """One completion: a conversation (chat) or a plain text (raw)."""

    messages: tuple[dict[str, Any], ...] = ()
    raw_text: str | None = None  # set for plain completion
    max_tokens: int | None = None  # None: until end of generation or the context is full
    default_max_tokens: int | None = None  # the limit when max_tokens is None; the prompt may use its room
    stop: tuple[str, ...] = ()
    sampling: SamplingOptions = SamplingOptions()
    on_overflow: str = "error"  # error | truncate
    ignore_eos: bool = False
    response_format: Format | None = None  # None: free text; else the answer is this JSON or grammar
    tools: tuple[Tool, ...] = ()  # functions the model may call (localinfer.request.toolcalls)
    tool_choice: ToolChoice | None = None  # None: auto when tools are given
    parallel_tool_calls: bool = True
    logprobs: int | None = None  # None: off; N: each answer token's log probability and the top N (0-20)
    chat_template_kwargs: dict[str, Any] | None = None  # variables for the chat template (enable_thinking...)
    reasoning_format: str | None = None  # None/auto: thinking apart from the answer; "none": inline

    @property
    def mode(self) -> str:
        return "raw" if self.raw_text is not None else "chat"

    @property
    def template_variables(self) -> dict[str, Any]:
        """What the chat template's render receives besides the messages."""
        return dict(self.chat_template_kwargs or {})

    @property
    def splits_reasoning(self) -> bool:
        return self.raw_text is None and self.reasoning_format != "none"


def messages_for(prompt: str, system: str | None, history: Messages = ()) -> tuple[dict[str, Any], ...]:
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    out.extend(history)
    out.append({"role": "user", "content": prompt})
    return tuple(out)


def build(
    prompt: str | None = None,
    *,
    messages: Messages | None = None,
    system: str | None = None,
    raw: bool = False,
    max_tokens: int | None = None,
    default_max_tokens: int | None = None,
    sampling: SamplingOptions = SamplingOptions(),
    stop: Sequence[str] = (),
    on_overflow: str = "error",
    ignore_eos: bool = False,
    response_format: Any = None,
    json_schema: Any = None,
    grammar: str | None = None,
    tools: Sequence[Any] | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool = True,
    logprobs: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    reasoning_format: str | None = None,
) -> Request:
    """``messages`` are used as given (``system`` is for a prompt); a ``prompt`` becomes a user
    message after the system prompt, or, with ``raw`` (plain completion: the caller's choice, or a
    model without a chat template), the text after the system prompt and a blank line.
    ``default_max_tokens`` applies to plain completion only. Text that is not UTF-8 is a usage error,
    and so is a ``logprobs`` out of request/rules.py's bounds. ``chat_template_kwargs``: the template's
    variables (checked by ``rules.chat_template_kwargs``); ``reasoning_format``: "none" keeps a
    reasoning model's thinking in the text.
    At most one of ``response_format`` (a Format, OpenAI's object, or "json"), ``json_schema`` (a
    schema or its text) and ``grammar`` (GBNF) constrains the answer (localinfer.request.structured.pick).
    ``tools``: OpenAI's tool objects (or ``Tool``s), ``tool_choice`` its choice (or a ``ToolChoice``);
    a bad one is a usage error."""
    from localinfer.request import format_rules, rules
    from localinfer.errors import UsageError
    from localinfer.request.limits import require_utf8
    from localinfer.request.structured import pick

    for text, what in ((prompt, "the prompt"), (system, "the system prompt")):
        if isinstance(text, str):
            require_utf8(text, what)
    try:
        n_top = rules.top_logprobs(logprobs, name="logprobs")
        chat_template_kwargs = rules.chat_template_kwargs("chat_template_kwargs", chat_template_kwargs)
        if reasoning_format is not None:
            rules.reasoning_format("reasoning_format", reasoning_format)
    except rules.RuleError as exc:
        raise UsageError(str(exc)) from None
    common: dict[str, Any] = dict(max_tokens=max_tokens, stop=tuple(stop), sampling=sampling, on_overflow=on_overflow,
                                  ignore_eos=ignore_eos, logprobs=n_top, chat_template_kwargs=chat_template_kwargs,
                                  reasoning_format=reasoning_format,
                                  response_format=pick(response_format, json_schema, grammar))  # fmt: skip
    if tools or tool_choice is not None:
        from localinfer.request.toolcalls.spec import checked

        offered, choice = checked(tools, tool_choice)
        common.update(tools=offered, tool_choice=choice, parallel_tool_calls=parallel_tool_calls)
        given = next((n for n, v in (("response_format", response_format), ("json_schema", json_schema), ("grammar", grammar))
                      if v is not None), None)  # fmt: skip
        try:
            format_rules.tools_with_format(given if common["response_format"] is not None else None, bool(offered), choice.mode)
        except rules.RuleError as exc:
            raise UsageError(str(exc)) from None
    if messages is not None:
        if any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in messages):
            from localinfer.request.toolcalls.spec import checked_messages

            messages = checked_messages(messages)  # the API's tool turns, as serve reads them
        return Request(messages=tuple(messages), **common)
    text = prompt or ""
    if raw:
        return Request(raw_text=f"{system}\n\n{text}" if system else text, default_max_tokens=default_max_tokens, **common)
    return Request(messages=messages_for(text, system), **common)


# A batch line's request, as batch.io parses it; here, below both the batch job and the backends
# that run it, so that neither imports the other's package.
@dataclass(frozen=True)
class BatchRequest:
    """One request. ``None`` options take the command's defaults."""

    id: Any  # str or int, as given (a line number for text input)
    line: int
    prompt: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    logprobs: int | None = None  # the line's top N (its logprobs/top_logprobs fields); None: the command's
    ignore_eos: bool = False  # not settable from the input; for benchmarks
    sampling: tuple[tuple[str, Any], ...] = ()  # the line's other sampling fields: (name, value)
    response_format: Any = None  # a structured.Format; None: the command's; False: free text
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True

    def sampling_over(self, base: SamplingOptions) -> SamplingOptions:
        """``base`` (the command's settings) with what this line sets."""
        given = dict(self.sampling)
        if self.temperature is not None:
            given["temperature"] = self.temperature
        if self.seed is not None:
            given["seed"] = self.seed
        return dataclasses.replace(base, **given) if given else base


@dataclass(frozen=True)
class InputError:
    """A line that is not a valid request; ``id`` is None when it could not be read."""

    line: int
    reason: str
    id: Any = None

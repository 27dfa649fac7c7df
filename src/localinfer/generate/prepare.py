"""A request made ready for the engine, once for every entry (`run`, `chat`, the API, batch, serve):
its prompt built (the chat template, the tokens, the context window), its tool plan, thinking
splitter and constraint - one ``Prepared`` that gives the engine's ``SeqJob`` (one sequence or a
batch alike) and the ``Finish`` its answer is finished by.

The engine module is imported inside functions so that importing this module stays cheap.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.errors import ContextOverflowError
from localinfer.request.request import Request

if TYPE_CHECKING:
    from localinfer.engine.types import SeqJob
    from localinfer.generate.finish import Finish
    from localinfer.generate.loading import LoadedModel
    from localinfer.request.reasoning import Splitter
    from localinfer.request.structured import Format
    from localinfer.request.toolcalls.plan import ToolPlan


@dataclass(frozen=True)
class Prepared:
    """A request turned into what the engine runs: its prompt tokens, the template's stop strings,
    how its thinking and tool calls come out of the answer, and the tokens dropped to fit."""

    # what the entry was given: the Request, or a surface's envelope holding it as ``.request``
    # (serve's wire Envelope: cache_prompt, the draft sizes, where the format was asked)
    asked: Any
    tokens: Sequence[int]
    stop: tuple[str, ...]  # the template's (``job`` adds the request's own)
    splitter: Splitter | None = None  # a reasoning model's thinking, apart from the answer
    tools: ToolPlan | None = None  # how the answer's tool calls are parsed (and constrained)
    dropped: int = 0  # prompt tokens --on-overflow truncate dropped

    @property
    def request(self) -> Request:
        asked = self.asked
        return asked if isinstance(asked, Request) else asked.request

    @functools.cached_property
    def constraint(self) -> tuple[Format | None, str | None]:
        """What the answer must follow, and the text after which (``constraint_for``)."""
        return constraint_for(self.tools, self.request.response_format, self.splitter)

    def capped(self, max_tokens: int) -> Prepared:
        """The same, its request's max_tokens set to ``max_tokens`` (a limit of the entry's: serve's clamp, -n)."""
        lowered = dataclasses.replace(self.request, max_tokens=max_tokens)
        asked = lowered if isinstance(self.asked, Request) else dataclasses.replace(self.asked, request=lowered)
        return dataclasses.replace(self, asked=asked)

    def job(self, key: Any = 0, **engine: Any) -> SeqJob:
        """The engine's job (``engine``: what only the entry knows - streaming callbacks, cancel,
        cache and draft settings, the fields of ``SeqJob`` after the request's)."""
        from localinfer.engine.types import SeqJob

        r = self.request
        constraint, after = self.constraint
        return SeqJob(key, self.tokens, r.sampling, r.max_tokens or r.default_max_tokens,
                      tuple(dict.fromkeys((*r.stop, *self.stop))), r.ignore_eos, constraint=constraint,
                      constraint_after=after, logprobs=r.logprobs, **engine)  # fmt: skip

    def finish(self, *, split: bool = True) -> Finish:
        """How the answer is finished (``localinfer.generate.finish``); ``split``: its thinking apart
        (False: inline, as a stream of logprobs keeps it)."""
        from localinfer.generate.finish import Finish

        return Finish(self.splitter if split else None, self.tools)


def prepare(loaded: LoadedModel, request: Request, *, n_ctx: int | None = None,
            prompt: tuple[Sequence[int], tuple[str, ...], int] | None = None) -> Prepared:  # fmt: skip
    """``request`` made ready on ``loaded``: its prompt built within ``n_ctx`` (one sequence's where
    several share the model's; default the model's) with room for its max_tokens, or ``prompt``
    (tokens, stops and dropped count built already: chat splices its turns onto the cached tokens).
    The tool plan is made once, here."""
    if prompt is None:
        tokens, stops, dropped, tools = _built(loaded, request, n_ctx)
    else:
        (tokens, stops, dropped), tools = prompt, tool_plan(loaded, request)
    return Prepared(request, tokens, stops, reasoning_splitter(loaded, request, tokens), tools, dropped)


def _window(n_ctx: int, asked: int | None) -> str:
    """The context window as the user should read it: the size they got, and the one they asked for."""
    rounded = f"; llama.cpp rounded --ctx-size {asked} up" if asked and asked != n_ctx else ""
    return f"the context window ({n_ctx} tokens{rounded})"


def overflow_error(
    n_prompt: int, max_tokens: int | None, n_ctx: int, n_train: int, asked: int | None = None
) -> ContextOverflowError:
    if n_prompt == 0:  # refused before the prompt was built: the answer alone cannot fit
        return ContextOverflowError(
            f"--max-tokens ({max_tokens}) leaves no room for a prompt in {_window(n_ctx, asked)}",
            hint="lower --max-tokens, or raise --ctx-size" + (f" (this model was trained on {n_train})" if n_train else ""),
        )
    wanted = f"the prompt ({n_prompt} tokens)"
    if max_tokens:
        wanted += f" + --max-tokens ({max_tokens})"
    need = n_prompt + (max_tokens or 1)
    hint = "shorten the prompt, "
    if max_tokens:
        hint += "lower --max-tokens, "
    if need <= n_train:
        hint += f"raise --ctx-size (this model was trained on {n_train}), "
    elif n_train:
        hint = f"this model was trained on {n_train} tokens, fewer than that needs: " + hint
    hint += "or pass --on-overflow truncate to keep the end of the prompt"
    verb = "exceed" if max_tokens else "exceeds"
    return ContextOverflowError(f"{wanted} {verb} {_window(n_ctx, asked)}", hint=hint, prompt_tokens=n_prompt)


def build_prompt(loaded: LoadedModel, request: Request, *, n_ctx: int | None = None) -> tuple[list[int], tuple[str, ...], int]:
    """Tokens to evaluate, stop strings from the format, and tokens dropped to fit the context
    (``n_ctx``: one sequence's, where several share the model's; default the model's)."""
    return _built(loaded, request, n_ctx)[:3]


def _built(loaded: LoadedModel, request: Request, n_ctx: int | None) -> tuple[list[int], tuple[str, ...], int, ToolPlan | None]:
    """``build_prompt``'s, and the tool plan it rendered the tools by (``tool_plan``, made once)."""
    model = loaded.model
    asked = loaded.plan.n_ctx if loaded.plan and n_ctx is None else None  # what --ctx-size asked of the model's
    n_ctx = n_ctx or model.n_ctx
    budget = n_ctx - (request.max_tokens if request.max_tokens else 1)
    if request.on_overflow == "truncate" and not request.max_tokens:
        budget = n_ctx - max(1, min(512, n_ctx // 4))  # leave room for an answer
    if budget <= 0:
        raise overflow_error(0, request.max_tokens, n_ctx, model.n_ctx_train, asked)

    tools = tool_plan(loaded, request)
    from localinfer.request.images import for_model

    images = for_model(loaded, request)

    def render(text_override: str | None) -> tuple[list[int], tuple[str, ...]]:
        if request.raw_text is not None:
            text = request.raw_text if text_override is None else text_override
            return model.tokenize(text, add_special=True, parse_special=False), ()
        assert loaded.template is not None
        messages = [{k: v for k, v in m.items() if k != "images"} if "images" in m else m for m in request.messages]
        if text_override is not None:
            messages[-1] = {**messages[-1], "content": text_override}
        if tools is None:
            prompt = loaded.template.render(messages, **request.template_variables)
        else:  # the tools through the template; a forced call's opening after it
            prompt = loaded.template.render(tools.messages(messages), **{**request.template_variables, **tools.variables()})
            prompt = dataclasses.replace(prompt, text=prompt.text + tools.opening)
        if images:  # engine.vision.MediaPrompt: the images' positions among the tokens
            assert loaded.projector is not None
            return loaded.projector.prompt(prompt.text, images, add_special=prompt.add_special), prompt.stop
        return model.tokenize(prompt.text, add_special=prompt.add_special, parse_special=True), prompt.stop

    tokens, stops = render(None)
    if len(tokens) <= budget:
        return tokens, stops, 0, tools
    if request.on_overflow != "truncate" or images:  # an image is not cut
        raise overflow_error(len(tokens), request.max_tokens, n_ctx, model.n_ctx_train, asked)
    # Keep the end of the user's text (the system prompt and template stay whole).
    original = request.raw_text if request.raw_text is not None else str(request.messages[-1].get("content", ""))
    text_tokens = model.tokenize(original, add_special=False, parse_special=False)
    dropped = 0
    for _ in range(6):
        excess = len(tokens) - budget
        if excess <= 0:
            return tokens, stops, dropped, tools
        dropped += excess
        if dropped >= len(text_tokens):
            break
        tokens, stops = render(model.detokenize(text_tokens[dropped:]))
    raise ContextOverflowError(
        f"even truncated, the prompt does not fit the context window ({n_ctx} tokens)",
        hint="shorten the system prompt or raise --ctx-size",
    )


def rendered_prompt(loaded: LoadedModel, request: Request) -> tuple[str, int]:
    """The exact text the model is given for ``request`` (the chat template's render, special tokens
    written out, BOS included where tokenization adds it) and its length in tokens (`--show-prompt`)."""
    tokens, _, _ = build_prompt(loaded, request)
    model = loaded.model
    return "".join(model.token_text(t) if t >= 0 else "<image>" for t in tokens), len(tokens)


def reasoning_splitter(loaded: LoadedModel, request: Request, tokens: Sequence[int]) -> Splitter | None:
    """A splitter for the answer to ``tokens`` when the model's template marks thinking (None: the
    text is all answer); started inside the thinking where the prompt opened it."""
    from localinfer.request import reasoning

    template = loaded.template
    markers = reasoning.detect(template.template if template is not None else None)
    if markers is None or not request.splits_reasoning:
        return None
    tail = "".join(loaded.model.token_text(t) for t in getattr(tokens, "history", tokens)[-8:])
    return reasoning.Splitter(markers, opened=reasoning.opened_by(markers, tail))


def tool_plan(loaded: LoadedModel, request: Request) -> ToolPlan | None:
    """How ``request``'s tools go through this model's template and come back out of its answer."""
    if request.raw_text is not None or (not request.tools and request.tool_choice is None):
        return None
    from localinfer.request.toolcalls.plan import plan_for

    template = loaded.template.template if loaded.template is not None else None
    return plan_for(request.tools, request.tool_choice, request.parallel_tool_calls, template)


def constraint_for(
    tools: ToolPlan | None, fmt: Format | None, splitter: Splitter | None
) -> tuple[Format | None, str | None]:
    """What an answer must follow, and the text after which (None: from its start): a request's tool
    calls (``tool_choice``: the call is the constraint) before its format ``fmt``. Where the prompt opened a reasoning model's thinking (``splitter``), the format applies
    after its close marker: the thinking stays free, the answer is the document."""
    planned = tools.constraint() if tools is not None else None
    if planned is not None:
        return planned
    after = splitter.markers.close if fmt is not None and splitter is not None and splitter.opened else None
    return fmt, after

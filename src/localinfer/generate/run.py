"""The core of `run` (and the base of `chat`): build the prompt, enforce the context window, stream
the answer and measure it, on a model generate.loading loaded. Takes plain values, never Typer objects.

The engine module is imported inside functions so that importing this module stays cheap.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
import dataclasses
from typing import TYPE_CHECKING

from localinfer.answer.answer import Answer
from localinfer.engine.types import GenerationStats
from localinfer.errors import ContextOverflowError, Interrupted, UsageError
from localinfer.request.request import Request

if TYPE_CHECKING:
    from localinfer.generate.finish import Step
    from localinfer.generate.loading import LoadedModel
    from localinfer.request.reasoning import Splitter
    from localinfer.request.structured import Format
    from localinfer.request.toolcalls.plan import ToolPlan

def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (the model's mmapped pages included)."""
    try:
        import resource  # POSIX only
    except ImportError:  # Windows: psutil gives the peak working set there
        import psutil

        info = psutil.Process().memory_info()
        return int(getattr(info, "peak_wset", 0) or info.rss)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


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
        return tokens, stops, 0
    if request.on_overflow != "truncate" or images:  # an image is not cut
        raise overflow_error(len(tokens), request.max_tokens, n_ctx, model.n_ctx_train, asked)
    # Keep the end of the user's text (the system prompt and template stay whole).
    original = request.raw_text if request.raw_text is not None else str(request.messages[-1].get("content", ""))
    text_tokens = model.tokenize(original, add_special=False, parse_special=False)
    dropped = 0
    for _ in range(6):
        excess = len(tokens) - budget
        if excess <= 0:
            return tokens, stops, dropped
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


class Generation:
    """One answer, streamed: iterate for its text pieces; ``result`` is complete once the iteration
    ends, however it ends (the last piece, an exception, or the consumer closing it early).

    TTFT runs from this object's creation (the request's arrival, after loading, before its prompt is
    built) to the first answer text (docs/metrics.md). ``prompt``: tokens, stops and dropped count
    already built (as build_prompt returns them; chat splices its turns onto the cached tokens).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        request: Request,
        *,
        load_s: float = 0.0,
        prompt: tuple[Sequence[int], tuple[str, ...], int] | None = None,
    ) -> None:
        self._t_request = time.perf_counter()
        stats = GenerationStats()
        tokens, stops, dropped = prompt if prompt is not None else build_prompt(loaded, request)
        stats.truncated_tokens = dropped
        # what was measured so far; the finished answer replaces it when the iteration ends (``parts``)
        self.result = Answer("", loaded.name, stats, load_s, mode=request.mode, plan=loaded.plan, buffers=loaded.buffers)
        self._splitter = reasoning_splitter(loaded, request, tokens)
        self.on_reasoning: Callable[[str], None] | None = None  # each piece of thinking, as it comes
        self._tools = tool_plan(loaded, request)
        constraint, after = constraint_for(self._tools, request.response_format, self._splitter)
        self._steps = loaded.model.generate(
            tokens, request.sampling, stats, max_tokens=request.max_tokens or request.default_max_tokens,
            stop=tuple(dict.fromkeys((*request.stop, *stops))), ignore_eos=request.ignore_eos,
            constraint=constraint, constraint_after=after, logprobs=request.logprobs,
        )  # fmt: skip

    def __iter__(self) -> Iterator[str]:
        """The answer's text; thinking goes to ``on_reasoning``."""
        for kind, text in self.parts():
            if kind == "text":
                yield text
            elif self.on_reasoning is not None:
                self.on_reasoning(text)

    def parts(self) -> Iterator[tuple[str, str]]:
        """``("reasoning" | "text", piece)`` as they come (a model whose template marks no thinking
        gives text alone). The answer is finished by ``localinfer.generate.finish`` (thinking split,
        tool calls parsed out, its finish reason, TTFT from this object's creation), as on every
        surface; the text and thinking kept are what the consumer took."""
        from localinfer.generate.finish import Finish

        pieces: list[str] = []
        thoughts: list[str] = []
        finish = Finish(self._splitter, self._tools)
        try:
            for step in self._steps:
                if step.text:
                    yield from self._hand(finish.feed(step.text), pieces, thoughts)
            yield from self._hand(finish.close(), pieces, thoughts)
        finally:
            self._steps.close()  # a consumer that stopped early: the engine finishes its stats and cache now
            r = self.result
            done = finish.result(stats=r.stats, t0=self._t_request, t_end=time.perf_counter(),
                                 taken=("".join(pieces), "".join(thoughts) or None))  # fmt: skip
            self.result = Answer.of_finished(done, r.model, load_s=r.load_s, mode=r.mode, plan=r.plan, buffers=r.buffers,
                                             peak_rss=peak_rss_bytes())  # fmt: skip

    @staticmethod
    def _hand(steps: list[Step], pieces: list[str], thoughts: list[str]) -> Iterator[tuple[str, str]]:
        """The finished steps' thinking and text, kept once the consumer took them (calls stay in the finish)."""
        from localinfer.generate.finish import Text, Thought

        for step in steps:
            if isinstance(step, Thought) and step.text:
                yield "reasoning", step.text
                thoughts.append(step.text)  # only once the consumer took it (it may raise instead)
            elif isinstance(step, Text) and step.text:
                yield "text", step.text
                pieces.append(step.text)


def generate(
    loaded: LoadedModel,
    request: Request,
    write: Callable[[str], None],
    *,
    load_s: float = 0.0,
    prompt: tuple[Sequence[int], tuple[str, ...], int] | None = None,
    on_reasoning: Callable[[str], None] | None = None,
) -> Answer:
    """Stream one answer through ``write`` (its thinking through ``on_reasoning``) and return what
    was measured (``Generation``). If ``write`` or the user interrupts, the stats stay correct for
    what was produced; Ctrl-C raises ``Interrupted`` carrying the partial Answer."""
    gen = Generation(loaded, request, load_s=load_s, prompt=prompt)
    gen.on_reasoning = on_reasoning
    pieces = iter(gen)
    try:
        for text in pieces:
            write(text)
    except KeyboardInterrupt as exc:
        pieces.close()
        raise Interrupted(gen.result) from exc  # chat keeps an interrupted answer
    finally:
        pieces.close()
    return gen.result


def combine_stdin_and_prompt(stdin_text: str | None, prompt: str | None) -> str:
    """Piped text becomes context before the prompt, as Ollama does."""
    parts = [p for p in (stdin_text, prompt) if p and p.strip()]
    if not parts:
        raise UsageError("no prompt given", hint="pass --prompt TEXT, or pipe text on stdin")
    return "\n\n".join(p.rstrip("\n") if i == 0 and len(parts) > 1 else p for i, p in enumerate(parts))

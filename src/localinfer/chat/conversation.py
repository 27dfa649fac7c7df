"""A chat over one backend: system prompt, history, settings, cache-friendly prompts, trimming.

The core of `localinfer chat` (the command is cli/chat.py, its session cli/chat_session.py, its input
loop cli/chat_repl.py, the settings chat/settings.py); plain values in and out. With a model here the
prompt is fitted to the context and spliced onto the KV cache (below); a server (``--endpoint``)
keeps its own cache and context, so each turn sends it the whole conversation.

KV-cache reuse. The engine keeps the longest common token prefix of a new prompt with what its KV
cache holds, so turn N+1 only pays for its new tokens if its prompt starts with the exact tokens of
turn N's prompt and answer. Re-tokenizing the rendered history is not enough: a sampled answer is
often not in the tokenizer's canonical form (at temperature 1 most answers have a token the
tokenizer would have merged differently), which would make the cache diverge inside the previous
answer. So, like llama.cpp's llama-cli, the prompt of turn N+1 is the tokens already in the cache
(turn N's prompt plus the answer as sampled) followed by the tokens of the text rendered after them,
when that text lines up with the canonical tokenization at that boundary; otherwise we fall back on
the canonical tokens and the engine reuses what prefix it can.

Context window. When system prompt + history + the new message + room for an answer would not fit,
the oldest turns are dropped (never the system prompt), from the front, and stay dropped (so the
next turns reuse the cache again); ``notify`` tells the user. A message that cannot fit even alone
raises ContextOverflowError and leaves the conversation as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer.chat.settings import ChatSettings, Totals
from localinfer.errors import ContextOverflowError, Interrupted, UsageError

if TYPE_CHECKING:
    from localinfer.answer.answer import Answer
    from localinfer.backends import Backend
    from localinfer.engine.templates import ChatPrompt
    from localinfer.generate.loading import LoadedModel


Write = Callable[[str], None]
Notify = Callable[[str], None]



# -- the conversation ------------------------------------------------------------------------------


def _chat_backend(model: Backend | LoadedModel, load_s: float | None) -> Backend:
    """``model`` as a backend that can chat (a LoadedModel is the engine's); ``load_s``: the load
    time to report with its first answer, when the caller timed it."""
    from localinfer.backends import Backend, no_template_error
    from localinfer.backends.local import LocalBackend

    backend = model if isinstance(model, Backend) else LocalBackend(model)
    if not backend.can_chat:
        raise no_template_error(backend.name)
    if load_s is not None and isinstance(backend, LocalBackend):
        backend.load_s = load_s
    return backend


class Conversation:
    """A system prompt, the message history and settings over one backend (which it owns)."""

    def __init__(
        self,
        model: Backend | LoadedModel,
        *,
        system: str | None = None,
        settings: ChatSettings = ChatSettings(),
        notify: Notify | None = None,
        load_s: float | None = None,
    ) -> None:
        self.backend = _chat_backend(model, load_s)
        self.system = system or None
        self.settings = settings
        self.notify: Notify = notify or (lambda _msg: None)
        self.history: list[dict[str, Any]] = []  # user/assistant (and loaded) messages, never the system prompt
        self.start = 0  # history[start:] is what the model sees; older turns were dropped to fit
        self.last: Answer | None = None
        self.totals = Totals()  # the engine's figures, summed (a server's answers are kept in ``answers``)
        self.answers: list[Answer] = []  # a server's answers, for /stats (its counts may be unknown)
        self._anchor: tuple[str, list[int]] | None = None  # last prompt's text and tokens (splicing)
        self.images: list[Any] = []  # /image's, attached to the next message (localinfer.request.images)
        self._replay: tuple[str, list[int], int] | None = None  # the same, and how many came from the cache
        self._replaying = False  # set by retry for the next _answer
        self.on_reasoning: Write | None = None  # a reasoning model's thinking, as it streams (not kept)

    # -- what the model sees ---------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def endpoint(self) -> str | None:
        """The server that answers (``--endpoint``); None: a model loaded here."""
        return self.backend.endpoint

    @property
    def loaded(self) -> LoadedModel:
        loaded = getattr(self.backend, "loaded", None)
        if loaded is None:
            raise UsageError("this chat runs on a server: there is no local model")
        return loaded

    @property
    def _engine_here(self) -> bool:
        """Whether the model is loaded here: then the prompt is fitted and spliced onto its cache."""
        return getattr(self.backend, "loaded", None) is not None

    @property
    def model(self):
        return self.loaded.model

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx if self._engine_here else 0  # a server's is its own, unknown here

    def context_messages(self, start: int | None = None) -> list[dict[str, Any]]:
        """The messages rendered for the model: the system prompt, then history[start:] (role and content)."""
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        first = self.start if start is None else start
        keep = ("role", "content", "reasoning_content", "images")
        msgs.extend({k: m[k] for k in keep if k in m} for m in self.history[first:])
        return msgs

    @property
    def _keeps_reasoning(self) -> bool:
        """Whether the template renders past thinking (``reasoning_content``): only then is it kept."""
        template = self.loaded.template if self._engine_here else None
        return template is not None and "reasoning_content" in (template.template or "")

    def reserve(self) -> int:
        """Tokens kept free for the answer when fitting the prompt into the context."""
        if self.settings.max_tokens:
            return min(self.settings.max_tokens, self.n_ctx // 2)
        return max(1, min(512, self.n_ctx // 4))

    def _render(self, messages: list[dict[str, Any]]) -> ChatPrompt:
        assert self.loaded.template is not None
        try:
            return self.loaded.template.render(messages, **(self.settings.template_vars or {}))
        except ValueError as exc:  # the template's raise_exception(), e.g. "roles must alternate"
            raise UsageError(f"the model's chat template refused this conversation: {exc}") from None

    def _tokenize(self, prompt: ChatPrompt) -> list[int]:
        return self.model.tokenize(prompt.text, add_special=prompt.add_special, parse_special=True)

    def _fit(self) -> tuple[ChatPrompt, list[int]]:
        """Render the context, dropping the oldest turns until prompt + reserve fit (system prompt kept).

        The kept context starts at the first candidate (the current start, then each later user
        message) whose prompt fits. Dropping turns from the front never makes the prompt longer, so
        that candidate is found by bisection: O(log n) renders, not one per dropped turn (a /load of
        thousands of messages would otherwise render and tokenize them quadratically).
        """
        budget = self.n_ctx - self.reserve()
        starts = [self.start] + [i for i in range(self.start + 1, len(self.history)) if self.history[i]["role"] == "user"]
        tried: dict[int, tuple[ChatPrompt, list[int]]] = {}

        def fits(k: int) -> bool:
            if k not in tried:
                prompt = self._render(self.context_messages(starts[k]))
                tried[k] = (prompt, self._tokenize(prompt))
            return len(tried[k][1]) <= budget

        k = 0
        if not fits(0):
            last = len(starts) - 1
            if last == 0 or not fits(last):
                what, verb = ("your message and the system prompt", "leave") if self.system else ("your message", "leaves")
                raise ContextOverflowError(
                    f"{what} ({len(tried[last][1])} tokens) {verb} no room for an answer in the {self.n_ctx}-token context",
                    hint="shorten the message, lower max_tokens, or restart chat with a larger --ctx-size",
                )
            lo, k = 0, last  # starts[lo] does not fit, starts[k] does
            while k - lo > 1:
                mid = (lo + k) // 2
                lo, k = (lo, mid) if fits(mid) else (mid, k)
        prompt, tokens = tried[k]
        if k:
            dropped = starts[k] - self.start
            self.totals.dropped_turns += dropped
            kept = "; the system prompt is kept" if self.system else ""
            self.notify(
                f"context full: dropped the {dropped} oldest message{'s' if dropped != 1 else ''} "
                f"({len(tried[0][1]) - len(tokens)} tokens) to fit the {self.n_ctx}-token context{kept}"
            )
            self.start = starts[k]
        return prompt, tokens

    def _splice(self, prompt: ChatPrompt, full: list[int]) -> list[int]:
        """The cached tokens + the tokens of the new text, when they line up (see the module docstring)."""
        cache = self.model.cached_tokens
        if not cache or full[: len(cache)] == cache or self._anchor is None:
            return full
        text0, tokens0 = self._anchor
        if cache[: len(tokens0)] != tokens0:
            return full
        cached_text = text0 + self.model.detokenize(cache[len(tokens0) :])
        if len(cached_text) >= len(prompt.text) or not prompt.text.startswith(cached_text):
            return full
        rest = self.model.tokenize(prompt.text[len(cached_text) :], add_special=False, parse_special=True)
        if not rest or len(rest) >= len(full) or full[len(full) - len(rest) :] != rest:
            return full
        return cache + rest

    # -- turns -------------------------------------------------------------------------------------
    def ask(self, text: str, write: Write) -> Answer:
        """Add a user message, stream the answer through ``write`` and keep it in the history.

        Ctrl-C (KeyboardInterrupt) while answering stops the answer: the partial answer stays in the
        history marked ``interrupted`` and the Answer has finish_reason "interrupted" (an answer
        interrupted before its first word is dropped with its message). Errors leave the history as
        it was.
        """
        pending, self.images = self.images, []  # /image's, for this message
        if pending:
            from localinfer.request.images import message

            self.history.append(message("user", text, pending))
        else:
            self.history.append({"role": "user", "content": text})
        return self._answer(write)

    def _answer(self, write: Write) -> Answer:
        """Answer the history's last (user) message."""
        from localinfer.request import request as rq

        s = self.settings
        prompt = None
        replay, self._replaying = self._replay if self._replaying else None, False
        try:
            pictured = any(m.get("images") for m in self.history[self.start :])  # built whole (generate.prepare)
            if self._engine_here and not pictured:  # fit the context, reuse the cache
                fitted, full = self._fit()
                if replay is not None and replay[0] == fitted.text:
                    # /retry: the very tokens of the first answer's prompt, evaluated from where it
                    # began, in the same batches. Evaluating only the last token (all the rest is
                    # cached) gives other logits (another batch shape), and greedy decoding another
                    # answer on near-ties.
                    tokens = list(replay[1])
                    self.model.keep_prefix(replay[2])
                else:
                    tokens = self._splice(fitted, full)
                prompt = (tokens, fitted.stop, 0)
                self._anchor = (fitted.text, list(tokens))
            # here the prompt is already tokens; a backend without an engine gets the conversation
            request = rq.build(messages=() if prompt else self.context_messages(), max_tokens=s.max_tokens,
                               stop=s.stop, sampling=s.sampling, response_format=s.response_format,
                               chat_template_kwargs=s.template_vars)  # fmt: skip
        except BaseException:
            self.history.pop()
            raise
        answer: Any = self.backend.answer  # here, with the prompt already built
        try:
            more = {"prompt": prompt} if prompt else {}
            result = answer(request, write, on_reasoning=self.on_reasoning, **more)
        except KeyboardInterrupt as exc:
            result = exc.partial if isinstance(exc, Interrupted) else None
            if result is None:
                self.history.pop()
                raise
            result.interrupted()
        except BaseException:
            self.history.pop()
            raise
        self._keep_answer(result.text, result.finish_reason, result.reasoning)
        if prompt is not None and self._anchor is not None and result.stats is not None:
            self._replay = (self._anchor[0], list(prompt[0]), result.stats.cached_tokens)
        self.last = result
        if result.stats is not None:
            self.totals.add(result)
        else:
            self.answers.append(result)
        return result

    def _keep_answer(self, text: str, finish_reason: str | None, reasoning: str | None = None) -> None:
        """The answer joins the history (marked when interrupted; its thinking only where the template
        renders it); an interrupted turn that wrote nothing takes its user message back out."""
        if finish_reason == "interrupted" and not text:
            self.history.pop()
            return
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning and self._keeps_reasoning:
            message["reasoning_content"] = reasoning
        if finish_reason == "interrupted":
            message["interrupted"] = True
        self.history.append(message)

    def retry(self, write: Write) -> Answer:
        """Regenerate the last answer (or answer a trailing user message, e.g. after /load).

        If the new answer fails or is interrupted before its first word, the old one is kept.
        """
        answer = self.history.pop() if self.history and self.history[-1]["role"] == "assistant" else None
        if not self.history or self.history[-1]["role"] != "user" or len(self.history) <= self.start:
            if answer is not None:
                self.history.append(answer)
            raise UsageError("nothing to retry: ask something first")
        user, n = self.history[-1], len(self.history)
        # Greedy or seeded, the retry is promised to give the same answer: replay the first one's
        # evaluation. Otherwise a new answer is wanted anyway, and the cached prompt is reused.
        sampling = self.settings.sampling
        self._replaying = answer is not None and (sampling.greedy or sampling.seed is not None)
        try:
            result = self._answer(write)
        except BaseException:
            self._replaying = False
            if answer is not None:
                self.history.extend([user, answer])
            raise
        if len(self.history) < n and answer is not None:
            self.history.extend([user, answer])
        return result

    # -- commands ----------------------------------------------------------------------------------
    def clear(self) -> None:
        """A new conversation (same system prompt and settings); the KV cache is emptied."""
        self.history = []
        self.start = 0
        self.last = None
        self._anchor = self._replay = None
        self.backend.reset()

    def set_system(self, text: str | None) -> None:
        self.system = text or None

    def set(self, key: str, value: str) -> None:
        self.settings = self.settings.with_value(key, value)

    def switch_model(self, model: Backend | LoadedModel, *, load_s: float | None = None) -> None:
        """Chat on with another model, keeping the conversation; the old one is closed."""
        backend = _chat_backend(model, load_s)
        old, self.backend = self.backend, backend
        self.start = 0  # a new context size: fit again from the whole history
        self._anchor = self._replay = None
        if old is not backend and getattr(old, "loaded", None) is not getattr(backend, "loaded", None):
            old.close()  # (a server's backends share their connections: ``RemoteBackend.switch``)

    def close(self) -> None:
        self.backend.close()

    # -- files -------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The conversation as an OpenAI-style chat request body (``model`` and ``messages``)."""
        from localinfer.request.images import openai_message

        messages = [openai_message(m) for m in self.context_messages(0)]
        offset = 1 if self.system else 0
        data: dict[str, Any] = {"model": self.name, "messages": messages}
        interrupted = [i + offset for i, m in enumerate(self.history) if m.get("interrupted")]
        if interrupted:
            data["interrupted"] = interrupted  # indexes into messages of answers cut short by Ctrl-C
        return data

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the whole conversation (dropped turns included) as JSON; returns the path written."""
        from localinfer.chat.files import write_chat_file

        return write_chat_file(Path(path).expanduser(), self.to_json())

    def load(self, path: str | os.PathLike[str]) -> int:
        """Replace the conversation with a saved one (a messages list, or an object with ``messages``).

        A leading system message becomes the system prompt. Returns the number of messages loaded.
        The KV cache is kept: whatever prefix the loaded conversation shares with it is reused.
        """
        from localinfer.chat.files import parse_messages, read_chat_file

        source = Path(path).expanduser()
        data = read_chat_file(source)
        messages, interrupted = parse_messages(data, str(source))
        system = None
        if messages and messages[0]["role"] == "system":
            system = messages[0]["content"]
            messages = messages[1:]
            interrupted = {i - 1 for i in interrupted}
        for i in interrupted:
            if 0 <= i < len(messages) and messages[i]["role"] == "assistant":
                messages[i]["interrupted"] = True
        self.system = system or None
        self.history = messages
        self.start = 0
        self.last = None
        self._replay = None
        return len(messages) + (1 if system else 0)


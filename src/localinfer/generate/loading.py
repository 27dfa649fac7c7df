"""The one loader, for every command and the library API: pre-flight a resolved model, load it, and
pick its chat format (the GGUF's template, else the registry's). Takes plain values.

The engine module is imported inside functions so that importing this module stays cheap.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.engine.types import LoadOptions

if TYPE_CHECKING:
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.templates import ChatTemplate
    from localinfer.engine.vision import Projector
    from localinfer.store import ResolvedModel
    from localinfer.system.estimate import BufferReport
    from localinfer.system.hardware import MemoryBudget
    from localinfer.system.preflight import LoadPlan

Warn = Callable[[str], None]


@dataclass
class LoadedModel:
    """A model ready to answer: the engine's LlamaModel, how to format chats, and where it came from."""

    name: str
    model: LlamaModel
    template: ChatTemplate | None
    resolved: ResolvedModel | None = None
    plan: LoadPlan | None = None  # the pre-flight's context size, GPU layers and memory estimate
    buffers: BufferReport | None = None  # what llama.cpp reported allocating
    load_s: float = 0.0  # pre-flight and load, as :func:`load` timed them
    projector: Projector | None = None  # images in (engine.vision), when the model has its mmproj

    def close(self) -> None:
        if self.projector is not None:
            self.projector.close()  # before the model it was made on
        self.model.close()


def load(
    resolved: ResolvedModel,
    options: LoadOptions,
    *,
    force: bool = False,
    budget: MemoryBudget | None = None,
    on_note: Warn | None = None,
    chat: bool = True,
) -> LoadedModel:
    """Pre-flight, load the model and pick its chat format (the GGUF's template, else the registry's):
    the one loader, for every command and the library API. Timed (``load_s``); the pre-flight's notes
    (a context made smaller to fit...) go to ``on_note``; the store's "last used" is updated.

    The pre-flight (localinfer.system.preflight.plan_load) sizes the context and the GPU layers and raises
    ResourceError when the memory estimate exceeds what is available, unless ``force``.

    ``chat``: prompts will go through the chat template (False: plain completions only, `run --raw`),
    so it is compiled while the model loads. Ctrl-C stops the load (engine.backend.interruptible).
    """
    from localinfer.store import touch

    t0 = time.perf_counter()
    loaded = _load(resolved, options, force=force, budget=budget, chat=chat)
    loaded.load_s = time.perf_counter() - t0
    if loaded.plan is not None and on_note is not None:
        for note in loaded.plan.notes:
            on_note(note)
    touch(resolved.name)  # `list`'s "last used"
    return loaded


def _load(resolved: ResolvedModel, options: LoadOptions, *, force: bool, budget: MemoryBudget | None,
          chat: bool = True) -> LoadedModel:
    from localinfer.engine.model import LlamaModel
    from localinfer.engine.templates import ChatTemplate, compile_template
    from localinfer.system.estimate import parse_buffer_report
    from localinfer.system.hardware import available_cpus
    from localinfer.system.preflight import plan_load

    if options.rpc_servers:  # the one registration: the pre-flight plans with the remote devices' memory
        from localinfer.engine.rpc import add_servers

        add_servers(options.rpc_servers)
    if resolved.mmproj is not None:  # the projector comes out of the same memory (store.projector)
        from localinfer.system.hardware import memory_budget
        from localinfer.system.preflight import less_projector

        budget = less_projector(budget or memory_budget(), resolved.mmproj.stat().st_size)
    draft = None
    if options.draft_model is not None:  # a second model guesses: planned first, loaded after
        from localinfer.generate.drafting import plan_draft

        draft, budget = plan_draft(resolved, options, budget, force=force)
    plan = plan_load(resolved.info, options, budget=budget, name=resolved.name, force=force)
    load_options = plan.apply(options)
    # While llama.cpp loads (releasing the GIL), a helper thread compiles the chat template the first
    # answer renders: jinja2's import and the cached code, ~20 ms on a 2-core EPYC, beside the load
    # instead of after it (a template that does not compile is refused at its render). Not without
    # a core to spare, nor for plain completions: the load's log lines would only wait for the GIL.
    source = resolved.info.chat_template if chat and available_cpus() > 1 else None  # as the store read it
    model = LlamaModel(resolved.path, load_options, meanwhile=(lambda: compile_template(source)) if source else None)
    if draft is not None:
        draft.attach(model, resolved.name)  # closes the target where the draft cannot be loaded
    template: ChatTemplate | None = None
    gguf_template = model.chat_template
    if gguf_template:
        template = ChatTemplate(source="gguf", template=gguf_template, bos_text=model.bos_text, eos_text=model.eos_text)
    elif resolved.chat_format:
        template = ChatTemplate(source=f"registry:{resolved.chat_format}", format_name=resolved.chat_format)
    buffers = parse_buffer_report(getattr(model, "memory_log", ()))
    if plan.n_ctx and model.n_ctx != plan.n_ctx:
        # llama.cpp pads the context to a multiple of 256: say so, or later figures would surprise
        note = f"the context is {model.n_ctx} tokens: llama.cpp rounded {plan.n_ctx} up to a multiple of 256"
        plan = dataclasses.replace(plan, notes=(*plan.notes, note))
    loaded = LoadedModel(name=resolved.name, model=model, template=template, resolved=resolved, plan=plan, buffers=buffers)
    if resolved.mmproj is not None:
        from localinfer.engine.vision import Projector

        try:
            loaded.projector = Projector(model, resolved.mmproj, use_gpu=bool(plan.n_gpu_layers), verbose=bool(options.verbose))
        except BaseException:
            model.close()
            raise
    return loaded

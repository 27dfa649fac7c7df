"""The draft model of a load (--draft-model NAME, ``load(..., draft_model=NAME)``): resolved as -m
resolves a model, but only among what is installed (a registry model its package ships, one in
the store, a .gguf file: never a download); planned in the pre-flight before the target, whose
budget it leaves less; loaded with the target's threads and context once the target is, and
refused with one line where its vocabulary is not the target's (engine.draft_model.vocab_mismatch).

Single-sequence only for now: run, chat and the API. serve and batch refuse it (cli.draft_options.Draft).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.engine.types import DEFAULT_CTX_CEILING, LoadOptions
from localinfer.errors import ModelNotFoundError, UsageError

if TYPE_CHECKING:
    from localinfer.engine.model import LlamaModel
    from localinfer.store import ResolvedModel
    from localinfer.system.hardware import MemoryBudget
    from localinfer.system.preflight import LoadPlan


@dataclass(frozen=True)
class DraftPlan:
    """The draft model to load and how: its options are the target's (threads, batch, cache types,
    GPU layers as the pre-flight placed them), with its own context."""

    resolved: ResolvedModel
    plan: LoadPlan
    options: LoadOptions

    def attach(self, model: LlamaModel, target_name: str) -> None:
        """Load the draft model next to ``model`` (its context no larger than the target's) and make
        it the target's source of guesses. Where that fails ``model`` is closed too (the load failed):
        UsageError naming the difference where the vocabularies differ."""
        from localinfer.engine.draft_model import DraftModel, vocab_mismatch
        from localinfer.engine.model import LlamaModel

        try:
            n_ctx = min(self.options.n_ctx or model.n_ctx, model.n_ctx)
            second = LlamaModel(self.resolved.path, dataclasses.replace(self.options, n_ctx=n_ctx))
            why = vocab_mismatch(model, second)
            if why is not None:
                second.close()
                raise UsageError(
                    f"the draft model {self.resolved.name} does not share {target_name}'s vocabulary: {why}",
                    hint="a draft model must be a smaller model of the target's family, with the same tokenizer",
                )
            model.draft_model = DraftModel(second, model.n_vocab)
        except BaseException:
            model.close()
            raise


def resolve_draft(name: str) -> ResolvedModel:
    """The installed model ``name`` names (ModelNotFoundError, saying it is the draft, otherwise)."""
    from localinfer.store import resolve_model

    try:
        return resolve_model(name, auto_pull=False)
    except ModelNotFoundError as e:
        raise ModelNotFoundError(f"--draft-model {name}: {e}", hint=e.hint or "pull it first: localinfer pull NAME") from None


def plan_draft(target: ResolvedModel, options: LoadOptions, budget: MemoryBudget | None, *, force: bool) -> tuple[DraftPlan, MemoryBudget]:
    """The draft's plan (its memory checked as any load's), and ``budget`` less what it takes: the
    target is planned in what is left. Its context is the target's (the default one where none was
    asked), at most what the draft was trained on: past it, the draft just stops guessing."""
    from localinfer.system.hardware import memory_budget
    from localinfer.system.preflight import less, plan_load

    assert options.draft_model is not None
    resolved = resolve_draft(options.draft_model)
    budget = budget or memory_budget()
    n_ctx = options.n_ctx or min(target.info.context_length or DEFAULT_CTX_CEILING, DEFAULT_CTX_CEILING)
    if resolved.info.context_length:
        n_ctx = min(n_ctx, resolved.info.context_length)
    own = dataclasses.replace(options, n_ctx=n_ctx, n_seq_max=1, draft=None, draft_max=None, draft_model=None)
    plan = plan_load(resolved.info, own, budget=budget, name=f"the draft model {resolved.name}", force=force)
    rest = budget
    if plan.estimate is not None:
        e = plan.estimate
        rest = less(budget, f"the draft model {resolved.name} takes about {e.total >> 20} MiB of it", ram=e.cpu_bytes,
                    vram=e.gpu_bytes)  # fmt: skip
    return DraftPlan(resolved, plan, plan.apply(own)), rest

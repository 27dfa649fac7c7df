"""The speculative-decoding option group (--draft, --draft-max, --draft-model): what run, chat, batch,
bench and serve take as one checked ``Draft`` value (engine.draft is imported only when one is given)."""

import dataclasses
from typing import TYPE_CHECKING, Annotated, NamedTuple, Optional

import typer

from localinfer.cli.groups import OptionGroup
from localinfer.errors import UsageError

if TYPE_CHECKING:
    from localinfer.engine.types import LoadOptions

_DRAFT = "Speculative decoding"


def _draft(
    draft: Annotated[Optional[str], typer.Option("--draft", metavar="ngram", help="Guess the next tokens and have the model check them in one batch: ngram looks them up in the prompt and the answer so far (fast where the answer copies; the same text either way).", rich_help_panel=_DRAFT)] = None,
    draft_max: Annotated[Optional[int], typer.Option("--draft-max", metavar="N", help="Tokens guessed per step at most. [default: 8]", rich_help_panel=_DRAFT, show_default=False)] = None,
    draft_model: Annotated[Optional[str], typer.Option("--draft-model", metavar="NAME", help="An installed small model with the target's vocabulary guesses the next tokens (run and chat; the same text either way).", rich_help_panel=_DRAFT)] = None,
) -> "Draft":
    if draft is None and draft_max is None and draft_model is None:  # no drafting: engine.draft is not needed
        return Draft(None, None)
    from localinfer.engine.draft import check

    kind = draft.strip().lower() if draft is not None else None
    if draft_max is not None and kind is None and draft_model is None:
        raise UsageError("--draft-max needs --draft ngram")
    check(kind, draft_max, draft_model)
    return Draft(kind, draft_max, draft_model.strip() if draft_model is not None else None)


class Draft(NamedTuple):
    """What the draft group gives a command: --draft, --draft-max and --draft-model, checked."""
    kind: "str | None"
    max: "int | None"
    model: "str | None" = None

    def single_sequence(self, command: str) -> None:
        if self.model is not None:  # several sequences share a context: run and chat only, for now
            raise UsageError(f"{command} does not take --draft-model yet: a draft model serves one sequence (run, chat)", hint="use --draft ngram")  # fmt: skip

    def apply(self, load: "LoadOptions | None") -> "LoadOptions | None":
        """``load`` with these settings (None: with --endpoint, nothing is loaded here)."""
        if load is None or (self.kind is None and self.model is None):
            return load
        return dataclasses.replace(load, draft=self.kind, draft_max=self.max, draft_model=self.model)


DRAFT = OptionGroup(_draft, local_only=True)  # -> Draft (None with --endpoint): speculative decoding

"""Option groups: flags that several commands take, declared once as the parameters of the function
that turns them into the one value a command receives (as simonw/llm's option decorators do). The
groups themselves are declared in cli/options.py."""

import copy
import functools
import inspect
from collections.abc import Callable
from typing import Any


class OptionGroup:
    """Flags declared once (the parameters of ``declare``) that a command takes as one value: a
    parameter whose default is the group (``load_opts: o.Load = o.LOAD``), under :func:`grouped`.

    A plain class, not a dataclass: building one is part of every ``--help``."""

    __slots__ = ("declare", "flags", "defaults", "reads", "local_only")

    def __init__(self, declare: Callable[..., Any], *, local_only: bool = False) -> None:
        params = [_resolved(p, declare.__globals__) for p in inspect.signature(declare).parameters.values()]
        self.declare = declare
        self.flags = tuple(p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)  # what a command shows, in order
        self.defaults = {p.name: p.default for p in self.flags}  # for the flags a command leaves out
        self.reads = tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY)  # other flags of the command, e.g. verbose
        self.local_only = local_only  # with --endpoint nothing is loaded here: no value, the flags unread

    def _with(self, flags: tuple[inspect.Parameter, ...]) -> "OptionGroup":
        part = copy.copy(self)
        part.flags = flags
        return part

    def only(self, *names: str) -> "OptionGroup":
        """These flags alone, in this order (the command declares its own variant of the others)."""
        by_name = {p.name: p for p in self.flags}
        return self._with(tuple(by_name[n] for n in names))

    def without(self, *names: str) -> "OptionGroup":
        return self._with(tuple(p for p in self.flags if p.name not in names))

    def value(self, given: dict[str, Any], command: dict[str, Any]) -> Any:
        """The group's value from its ``given`` flags; ``command``: all the command's flags as given,
        whatever group declares them (what ``reads`` names is taken from there)."""
        if self.local_only and command.get("endpoint"):
            return None
        return self.declare(**{**self.defaults, **given}, **{k: command[k] for k in self.reads if k in command})


def _resolved(param: inspect.Parameter, namespace: dict[str, Any]) -> inspect.Parameter:
    """The parameter with its annotation evaluated (postponed by ``from __future__ import annotations``),
    as ``inspect.signature(eval_str=True)`` would, but for this one parameter."""
    if isinstance(param.annotation, str):
        return param.replace(annotation=eval(param.annotation, namespace))  # our own source
    return param


def grouped(command: Callable[..., Any]) -> Callable[..., Any]:
    """The command with each group parameter replaced by the group's flags in its signature (Typer
    builds the options from ``inspect.signature``), and called with the group's value in their place."""
    signature = inspect.signature(command)
    groups = {p.name: p.default for p in signature.parameters.values() if isinstance(p.default, OptionGroup)}
    params: list[inspect.Parameter] = []
    for p in signature.parameters.values():
        params.extend(groups[p.name].flags if p.name in groups else (_resolved(p, command.__globals__),))

    @functools.wraps(command)
    def with_groups(**kwargs: Any) -> Any:
        from localinfer.cli.common import handle_errors

        flags = dict(kwargs)  # what a group reads of the others' (verbose, endpoint), in any order
        with handle_errors():  # a bad value in a group is one line, as any other usage error
            for name, group in groups.items():
                given = {p.name: kwargs.pop(p.name) for p in group.flags}
                kwargs[name] = group.value(given, flags)
        return command(**kwargs)

    setattr(with_groups, "__signature__", signature.replace(parameters=params))  # what Typer reads
    with_groups.__annotations__ = {p.name: p.annotation for p in params if p.annotation is not p.empty}
    return with_groups

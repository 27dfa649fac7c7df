"""GBNF (llama.cpp's grammar syntax) to Lark (llguidance's), in time linear in the grammar.

llguidance's own converter (``llguidance.gbnf_to_lark``) parses linearly but finds which rules are
terminals by repeating a pass over every rule until nothing changes: one pass per link of a chain of
rules, quadratic (2,000 chained rules took 26 s; issue 40). This uses its parser and its node classes,
and finds the same terminals by propagation (a rule is a terminal when every rule it names is one:
each rule is visited once per rule that names it); the text it writes is the same as llguidance's.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from typing import Any

# How deep rules may nest, counted in syntax-tree levels along chains of rules: llguidance's compiler
# recurses along them and overflows its stack (a crash of the whole process) at about 10,000 here.
MAX_DEPTH = 2048


class TooDeep(ValueError):
    """A grammar valid as GBNF that nests deeper than MAX_DEPTH."""


def convert(text: str) -> str:
    """``text`` (GBNF) as Lark; an exception (llguidance's) when it is not valid GBNF."""
    from llguidance import gbnf_to_lark as g

    rules: dict[str, Any] = g.GrammarParser().parse(text)
    for i, rule in enumerate(rules.values()):
        rule.order = i
        rule.alternatives = rule.alternatives.simplify()
    named_by: dict[str, set[str]] = defaultdict(set)  # rule -> the rules whose body names it
    waiting: dict[str, int] = {}  # rule -> how many rules it names are not known to be terminals yet
    names: dict[str, set[str]] = {}  # rule -> the rules it names
    nest: dict[str, int] = {}  # rule -> the depth of its own syntax tree
    for rule in rules.values():
        nest[rule.name], refs = _tree(rule.alternatives, g.RuleRefNode)
        names[rule.name] = set()
        for node in refs:
            if node.name not in rules:
                raise ValueError(f"Rule '{node.name}' not found")
            node.target = rules[node.name]
            names[rule.name].add(node.name)
        waiting[rule.name] = len(names[rule.name])
        for name in names[rule.name]:
            named_by[name].add(rule.name)
    depth = _depth(names, nest)
    if depth > MAX_DEPTH:
        raise TooDeep(f"the grammar's rules nest {depth} levels deep; at most {MAX_DEPTH} are taken")
    if "root" not in rules:
        raise ValueError("No 'root' rule found")
    _rename(rules, rules["root"], "start")
    waiting["start"] = waiting.pop("root")
    named_by = {("start" if k == "root" else k): {"start" if n == "root" else n for n in v} for k, v in named_by.items()}
    ready = deque(name for name, n in waiting.items() if n == 0 and name != "start")
    while ready:
        name = ready.popleft()
        rules[name].rule_is_terminal = True
        for user in named_by.get(name, ()):
            waiting[user] -= 1
            if waiting[user] == 0 and user != "start":
                ready.append(user)
    for rule in list(rules.values()):  # llguidance's names: snake_case, terminals in upper case
        new = re.sub(r"([a-z])([A-Z])", r"\1_\2", rule.name.replace("-", "_")).lower()
        new = new.upper() if rule.rule_is_terminal else new
        if rule.name != new:
            _rename(rules, rule, new)
    out, prev_nl = ["%llguidance {}\n\n"], True
    for rule in sorted(rules.values(), key=lambda r: r.order):
        s = str(rule)
        if not prev_nl and "\n" in s:
            out.append("\n")
        out.append(s + "\n")
        prev_nl = "\n" in s
        if prev_nl:
            out.append("\n")
    return "".join(out)


def _tree(root: Any, kind: type) -> tuple[int, list[Any]]:
    """The depth of the tree under ``root`` and its nodes of ``kind`` (iterative: no recursion)."""
    found, stack, deepest = [], [(root, 1)], 0
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(node, kind):
            found.append(node)
        stack.extend((child, level + 1) for child in node.children())
    return deepest, found


def _depth(names: dict[str, set[str]], nest: dict[str, int]) -> int:
    """The deepest chain of rules, each counted by its own tree's depth (a rule already on the chain,
    recursion, ends it); each rule is measured once (iterative depth-first search)."""
    memo: dict[str, int] = {}
    for top in names:
        if top in memo:
            continue
        stack, on_chain = [(top, iter(names[top]), 0)], {top}
        while stack:
            name, it, best = stack[-1]
            pushed = False
            for child in it:
                if child in memo:
                    best = max(best, memo[child])
                elif child not in on_chain:
                    stack[-1] = (name, it, best)
                    stack.append((child, iter(names[child]), 0))
                    on_chain.add(child)
                    pushed = True
                    break
            if pushed:
                continue
            stack.pop()
            on_chain.discard(name)
            memo[name] = nest[name] + best
            if stack:
                parent, pit, pbest = stack[-1]
                stack[-1] = (parent, pit, max(pbest, memo[name]))
    return max(memo.values(), default=0)


def _rename(rules: dict[str, Any], rule: Any, name: str) -> None:
    if name in rules:
        raise ValueError(f"Rule '{name}' already exists")
    del rules[rule.name]
    rule.name = name
    rules[name] = rule

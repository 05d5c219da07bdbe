"""The SA-MoE study's three text domains as a seeded generator (SAMOE §3.2): **prose** is the
workspace's embedded prose (SVA, Plural and filler sentences), **code** its quote-assignment
documents, half of them extended by a seeded Python function, and **math** lines of
arithmetic and one-variable algebra. It lives in the core because more than one study reads
it (the SA-MoE corpus and pools, the edit atlas's scoring corpora); the seeds' stream names
are the SA-MoE study's, so its documents do not change.
"""

from __future__ import annotations

import random

from headgeom.data import lexicon as lx
from headgeom.data.corpus import DemoText

DOMAINS = ("prose", "code", "math")
#: [CHOICE] SAMOE §3.3: the share of code documents extended by a Python function.
PYTHON_SHARE = 0.5

_NAMES = tuple(v.strip() for v in lx.QUOTE_FIRST_VARS + lx.QUOTE_SECOND_VARS)
_NUMBERS = lx.CODE_NUMBER_VARS


def python_function(rng: random.Random) -> str:
    """A small seeded Python function over lexicon names: def, if, for, return."""
    fn, a, b = rng.sample(_NAMES, 3)
    v, n = rng.choice(_NUMBERS), rng.randrange(2, 20)
    body = [f"def {fn}({a}, {b}):"]
    if rng.random() < 0.5:
        body += [f"    if {a} > {n}:", f"        return {a} - {b}"]
    body += [f"    for {v} in range({n}):", f"        {b} = {b} + {v}"]
    body.append(f"    return {rng.choice((a, b))}")
    return "\n".join(body)


def math_line(rng: random.Random) -> str:
    """``37 + 45 = 82`` or ``let x = 7 ; 3 * x = 21`` (results exact)."""
    if rng.random() < 0.3:
        x, k = rng.randrange(1, 20), rng.randrange(2, 10)
        var = rng.choice("xyzn")
        return f"let {var} = {x} ; {k} * {var} = {k * x}"
    a, b = rng.randrange(1, 100), rng.randrange(1, 100)
    op = rng.choice("+-*")
    if op == "*":
        a, b = a % 13, b % 13
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"{a} {op} {b} = {value}"


class DomainText:
    """Seeded documents of each domain for one (seed, stream)."""

    def __init__(self, seed: int, stream: str):
        # one generator per domain: a domain's documents do not depend on the sampling
        self._rng = {
            d: random.Random(f"headgeom.samoe.domains:{seed}:{stream}:{d}") for d in DOMAINS
        }
        self._demo = {
            d: DemoText(random.Random(f"headgeom.samoe.demo:{seed}:{stream}:{d}"))
            for d in ("prose", "code")
        }

    def document(self, domain: str) -> str:
        if domain == "prose":
            return self._demo["prose"].prose_document()
        if domain == "code":
            doc = self._demo["code"].code_document()
            rng = self._rng["code"]
            return doc + "\n" + python_function(rng) if rng.random() < PYTHON_SHARE else doc
        if domain == "math":
            rng = self._rng["math"]
            return "\n".join(math_line(rng) for _ in range(rng.randint(3, 8)))
        raise ValueError(f"unknown domain {domain!r}; known: {list(DOMAINS)}")

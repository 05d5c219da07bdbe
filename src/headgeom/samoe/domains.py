"""The toy study's three domains and its held-out pools (SAMOE §3.2–§3.3).

A domain-labelled generator stands in for the paper's FineWeb-Edu / Stack-Python /
FineMath-4+ mixture: **prose** is the workspace's embedded prose (SVA, Plural and filler
sentences), **code** its quote-assignment documents, half of them extended by a seeded
Python function, and **math** lines of arithmetic and one-variable algebra. A document's
domain is drawn with the config's sampling probabilities (0.50 / 0.25 / 0.25: draw
probabilities before packing, not token shares).

Pools (:func:`build_pools`) are cut from a held-out stream per (role, domain) that training
never draws from, after dropping every document whose text also occurs in training or in an
earlier role's pool: one domain's documents EOS-joined and cut into sequences of T tokens,
ids ``<domain>-<NNNN>``, domain-balanced.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from headgeom.data import lexicon as lx
from headgeom.data.corpus import DemoText

DOMAINS = ("prose", "code", "math")
#: [CHOICE] SAMOE §3.3: the share of code documents extended by a Python function.
PYTHON_SHARE = 0.5
#: The pool roles in the order their documents are taken (each excludes the earlier ones).
ROLES = ("construction", "calibration", "final")

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


def check_sampling(sampling: Mapping[str, float]) -> None:
    if set(sampling) != set(DOMAINS) or any(not 0 <= p <= 1 for p in sampling.values()):
        raise ValueError(
            f"data.sampling: expected probabilities for {list(DOMAINS)}, got {sampling}"
        )
    if abs(sum(sampling.values()) - 1.0) > 1e-9:
        raise ValueError(f"data.sampling: probabilities sum to {sum(sampling.values())}, not 1")


def iter_documents(
    seed: int, stream: str, sampling: Mapping[str, float]
) -> Iterator[tuple[str, str]]:
    """Endless (domain, text) for a training stream, each domain drawn with ``sampling``."""
    check_sampling(sampling)
    source = DomainText(seed, stream)
    draw = random.Random(f"headgeom.samoe.sampling:{seed}:{stream}")
    domains, weights = list(DOMAINS), [sampling[d] for d in DOMAINS]
    while True:
        domain = draw.choices(domains, weights)[0]
        yield domain, source.document(domain)


def balanced(n: int) -> dict[str, int]:
    """Sequences per domain for a pool of ``n``: equal, the remainder to the first domains."""
    return {d: n // len(DOMAINS) + (i < n % len(DOMAINS)) for i, d in enumerate(DOMAINS)}


def build_pools(
    seed: int,
    sizes: Mapping[str, int],
    seq_len: int,
    encode: Callable[[str], list[int]],
    eos: int,
    training_texts: Iterable[str],
) -> pd.DataFrame:
    """The construction, calibration and final pools (``sizes``: role -> sequences), one row
    per sequence: role, domain, seq_id, tokens (``seq_len`` ids). A held-out document whose
    text occurs in ``training_texts`` or in an earlier role's pool is dropped."""
    seen = set(training_texts)
    rows = []
    for role in ROLES:
        source = DomainText(seed, f"heldout-{role}")
        for domain, n in balanced(sizes[role]).items():
            stream: list[int] = []
            while len(stream) < n * seq_len:
                text = source.document(domain)
                if text in seen:
                    continue
                seen.add(text)
                stream += [*encode(text), eos]
            for i in range(n):
                tokens = np.asarray(stream[i * seq_len : (i + 1) * seq_len], dtype=np.int64)
                rows.append({"role": role, "domain": domain, "seq_id": f"{domain}-{i:04d}",
                             "tokens": tokens})  # fmt: skip
    return pd.DataFrame(rows)


def intervention_subset(final_ids: Sequence[str], per_domain: int) -> list[str]:
    """SAMOE §3.2: ``per_domain`` final sequences of each domain, the first in SHA-256 order
    of their ids (fixed before any outcome is seen)."""
    out = []
    for domain in DOMAINS:
        ids = [i for i in final_ids if i.startswith(f"{domain}-")]
        if len(ids) < per_domain:
            raise ValueError(f"final pool has {len(ids)} {domain} sequences, need {per_domain}")
        out += sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())[:per_domain]
    return out

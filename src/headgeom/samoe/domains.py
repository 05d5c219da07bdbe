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

from headgeom.data.domains import DOMAINS as DOMAINS
from headgeom.data.domains import PYTHON_SHARE as PYTHON_SHARE
from headgeom.data.domains import DomainText
from headgeom.data.domains import math_line as math_line
from headgeom.data.domains import python_function as python_function

#: The pool roles in the order their documents are taken (each excludes the earlier ones).
ROLES = ("construction", "calibration", "final")


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

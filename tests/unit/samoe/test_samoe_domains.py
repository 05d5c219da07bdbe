"""SAMOE §3.2–§3.3: the toy domains and the held-out pools."""

from __future__ import annotations

import ast
import hashlib
import itertools
import math
import re

import pytest

from headgeom.samoe import domains as dm

SAMPLING = {"prose": 0.50, "code": 0.25, "math": 0.25}


def test_domains_are_drawn_with_the_sampling_probabilities():
    n = 20_000
    drawn = [d for d, _ in itertools.islice(dm.iter_documents(1729, "cpt-train", SAMPLING), n)]
    for domain, p in SAMPLING.items():
        share = drawn.count(domain) / n
        assert abs(share - p) < 4 * math.sqrt(p * (1 - p) / n), (domain, share)


def test_a_domains_documents_do_not_depend_on_the_sampling():
    # the same stream with other probabilities yields the same code documents, in order
    a = [t for d, t in itertools.islice(dm.iter_documents(7, "s", SAMPLING), 400) if d == "code"]
    other = {"prose": 0.2, "code": 0.6, "math": 0.2}
    b = [t for d, t in itertools.islice(dm.iter_documents(7, "s", other), 400) if d == "code"]
    n = min(len(a), len(b))
    assert n > 50 and a[:n] == b[:n]


def test_math_lines_are_exact():
    source = dm.DomainText(3, "x")
    lines = [line for _ in range(200) for line in source.document("math").split("\n")]
    assert 3 * 200 <= len(lines) <= 8 * 200
    for line in lines:
        if line.startswith("let "):
            var, x, k, var2, value = re.fullmatch(
                r"let (\w) = (\d+) ; (\d+) \* (\w) = (-?\d+)", line
            ).groups()
            assert var == var2 and int(k) * int(x) == int(value)
        else:
            a, op, b, value = re.fullmatch(r"(\d+) ([-+*]) (\d+) = (-?\d+)", line).groups()
            a, b = int(a), int(b)
            assert {"+": a + b, "-": a - b, "*": a * b}[op] == int(value)


def test_code_documents_are_python_and_half_carry_a_function():
    source = dm.DomainText(5, "x")
    docs = [source.document("code") for _ in range(400)]
    with_def = [d for d in docs if "\ndef " in d]
    assert abs(len(with_def) / len(docs) - dm.PYTHON_SHARE) < 4 * math.sqrt(0.25 / len(docs))
    for doc in docs:
        ast.parse(doc)  # assignments and the function: valid Python


def test_balanced_pools_split_the_remainder_over_the_first_domains():
    assert dm.balanced(96) == {"prose": 32, "code": 32, "math": 32}
    assert dm.balanced(32) == {"prose": 11, "code": 11, "math": 10}


def _encode(text):  # one id per character (ids ≥ 1), so a pool decodes back to its text
    return [ord(c) for c in text]


def test_pools_are_balanced_full_length_and_never_hold_a_training_text():
    sizes = {"construction": 6, "calibration": 4, "final": 6}
    # make training contain held-out documents the pools would otherwise take
    held = dm.DomainText(11, "heldout-construction")
    training = {held.document("math") for _ in range(5)} | {
        held.document("prose") for _ in range(3)
    }
    pools = dm.build_pools(11, sizes, 600, _encode, 0, training)
    for role, n in sizes.items():
        rows = pools[pools["role"] == role]
        assert rows["domain"].value_counts().to_dict() == {
            d: k for d, k in dm.balanced(n).items() if k
        }
        assert rows["seq_id"].is_unique
        assert all(len(t) == 600 for t in rows["tokens"])
    # every whole document inside a pool sequence (between two EOS) is not a training text,
    # and no document appears in two roles
    whole = {}
    for row in pools.itertuples():
        text = "".join(map(chr, row.tokens))
        for doc in text.split("\0")[1:-1]:
            assert doc not in training
            whole.setdefault(doc, set()).add(row.role)
    assert whole and all(len(roles) == 1 for roles in whole.values())
    # without the exclusion those training texts would have been taken (the test can fail)
    unfiltered = dm.build_pools(11, sizes, 600, _encode, 0, ())
    docs = {d for t in unfiltered["tokens"] for d in "".join(map(chr, t)).split("\0")[1:-1]}
    assert docs & training
    again = dm.build_pools(11, sizes, 600, _encode, 0, training)
    assert all((a == b).all() for a, b in zip(pools["tokens"], again["tokens"], strict=True))


def test_the_intervention_subset_is_first_in_sha256_order_per_domain():
    ids = [f"{d}-{i:04d}" for d in dm.DOMAINS for i in range(32)]
    subset = dm.intervention_subset(ids, 8)
    for domain in dm.DOMAINS:
        mine = sorted(i for i in ids if i.startswith(domain + "-"))
        by_hash = sorted(mine, key=lambda i: hashlib.sha256(i.encode("utf-8")).hexdigest())
        assert [i for i in subset if i.startswith(domain + "-")] == by_hash[:8]
    with pytest.raises(ValueError, match="need 8"):
        dm.intervention_subset(ids[:5], 8)


def test_bad_sampling_is_refused():
    with pytest.raises(ValueError, match="sum to"):
        next(dm.iter_documents(1, "s", {"prose": 0.5, "code": 0.5, "math": 0.5}))
    with pytest.raises(ValueError, match="expected probabilities"):
        next(dm.iter_documents(1, "s", {"prose": 1.0}))

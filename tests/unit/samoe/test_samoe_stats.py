"""Seed statistics (SAMOE §17) against hand computations: the Student-t interval with
t_{0.975,2} = 4.302653, sequence means taken before the target mean, and the paired
contrasts of samoe/stages/stats.py (log-ratio PPL with the decision, P − LWO differences)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from headgeom.samoe.stages import stats as samoe_stats
from headgeom.samoe.stats import sequence_mean, t_interval


def test_t_interval_by_hand():
    mean, low, high = t_interval([1.0, 2.0, 6.0])
    s = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 2)
    assert mean == 3.0
    assert high - mean == pytest.approx(4.302653 * s / math.sqrt(3), rel=1e-6)
    assert mean - low == pytest.approx(high - mean)
    one = t_interval([2.5])
    assert one[0] == 2.5 and math.isnan(one[1]) and math.isnan(one[2])


def test_sequence_mean_weights_sequences_equally():
    # sequence a has three targets (mean 1), b one (value 5): (1 + 5) / 2, not 8 / 4
    assert sequence_mean(np.array([0.0, 1.0, 2.0, 5.0]), ["a", "a", "a", "b"]) == 3.0
    # NaN targets are skipped; an all-NaN sequence drops out
    assert sequence_mean(np.array([np.nan, 4.0, np.nan]), ["a", "a", "b"]) == 4.0


def test_quality_contrasts_and_decisions():
    rows = []
    for seed, (o, p) in zip((42, 43, 44), ((10.0, 10.02), (11.0, 11.0), (12.0, 12.036)),
                            strict=True):  # fmt: skip
        rows += [("toy", "ordinary", seed, "ppl", "", o), ("toy", "persistent", seed, "ppl", "", p)]
    for seed, (o, p) in zip((42, 43, 44), ((0.80, 0.81), (0.70, 0.70), (0.75, 0.77)),
                            strict=True):  # fmt: skip
        rows += [
            ("toy", "ordinary", seed, "macro", "", o),
            ("toy", "persistent", seed, "macro", "", p),
        ]
    values = pd.DataFrame(rows, columns=["family", "variant", "seed", "quantity", "key", "value"])
    out = samoe_stats.contrasts(values, [42, 43, 44], {"ppl_rel": 0.01, "macro_pp": 1.0})
    ppl = out[out.quantity == "ppl"].iloc[0]
    d = np.log([10.02 / 10, 1.0, 12.036 / 12])
    assert ppl["mean"] == pytest.approx(math.expm1(d.mean()))
    half = 4.302653 * d.std(ddof=1) / math.sqrt(3)
    assert ppl["high"] == pytest.approx(math.expm1(d.mean() + half), rel=1e-6)
    assert ppl.per_seed == pytest.approx([0.002, 0.0, 0.003])
    assert ppl.decision == ("supported" if math.expm1(d.mean() + half) < 0.01 else "inconclusive")
    macro = out[out.quantity == "macro"].iloc[0]
    assert macro["mean"] == pytest.approx(100 * np.mean([0.01, 0.0, 0.02]))
    assert macro.scale == "percentage_points" and macro.bound == 1.0
    # +1 pp ± 4.30·1/√3 pp: the interval reaches below −1 pp → inconclusive
    assert macro.low < -1.0 and macro.decision == "inconclusive"

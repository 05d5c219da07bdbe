"""The paper-vs-run comparison's dynamics numbers (docs §13.2–14.5 in the registry of docs §17),
on hand-built frames: the checkpoint nearest a fraction of training on a log scale, the V-
gradient share at step 0 and at the first traced step, and the scalar-ablation count."""

from __future__ import annotations

import pandas as pd
import pytest

from headgeom.heads.paper import comparison
from headgeom.heads.paper.context import Context
from headgeom.heads.paper.recipes import dynamics as recipe_dynamics


class FakeContext(Context):
    def __init__(self, frames: dict[str, pd.DataFrame]):
        super().__init__({k: ["unused"] for k in frames})
        self._frames = dict(frames)


def timeline() -> pd.DataFrame:
    # a run of 800 steps with checkpoints 8, 32, 128, 512 and the final one
    steps = [8, 32, 128, 512, 800]
    return pd.DataFrame(
        {
            "model": "wc",
            "seed": 42,
            "step": steps,
            "is_final": [False, False, False, False, True],
            "sva_accuracy": [0.5, 0.5, 1.0, 1.0, 1.0],
            "own_best_fraction": [0.1, 0.2, 0.3, 0.4, 0.5],
            "lambda_score": [0.0, 0.1, 0.2, 0.3, 0.4],
        }
    )


def reference(metric: str) -> comparison.Reference:
    (ref,) = [r for r in comparison.REFERENCES if r.metric == metric]
    return ref


def test_the_checkpoint_nearest_a_fraction_of_training_on_a_log_scale():
    c = FakeContext({"timeline": timeline()})
    # 800/16 = 50: |log(32/50)| = 0.446 < |log(128/50)| = 0.940, so step 32
    assert recipe_dynamics._timeline_at(c, 1 / 16)["step"].tolist() == [32]
    # 800/64 = 12.5: |log(8/12.5)| = 0.446 < |log(32/12.5)| = 0.940, so step 8
    assert recipe_dynamics._timeline_at(c, 1 / 64)["step"].tolist() == [8]
    assert recipe_dynamics._timeline_at(c, None)["step"].tolist() == [800]
    ref = reference("own-best fraction at 1/16 of training (paper step 4,096)")
    assert ref.compute(c) == pytest.approx(0.2)
    assert reference("own-best fraction, final").compute(c) == pytest.approx(0.5)


def test_value_gradient_share_at_step_zero_and_the_first_traced_step():
    rows = [(s, h, own) for s, owns in ((0, [1, 0, 0, 0]), (8, [1, 1, 1, 0])) for h, own in
            enumerate(owns)]  # fmt: skip
    frame = pd.DataFrame(rows, columns=["step", "head", "own_largest"])
    frame["is_final"] = False
    final = frame[frame["step"] == 8].assign(step=800, is_final=True, own_largest=False)
    c = FakeContext({"value_gradients": pd.concat([frame, final])})
    assert reference("V-gradient own trace largest, step 0").compute(c) == pytest.approx(0.25)
    first = reference("V-gradient own trace largest, first traced step (paper 256)")
    assert first.compute(c) == pytest.approx(0.75)


def test_scalar_ablation_counts_cases_where_the_scalar_edit_hurts_more():
    rows = []
    # task a: scalar 0.3 > random mean 0.2; task b: scalar 0.1 < random mean 0.25
    for task, scalar, randoms in (("a", 0.3, (0.1, 0.3)), ("b", 0.1, (0.2, 0.3))):
        rows.append(("m", 1, task, "scalar", scalar))
        rows += [("m", 1, task, "random", r) for r in randoms]
    frame = pd.DataFrame(rows, columns=["model", "seed", "task", "kind", "drop"])
    ref = reference("scalar-part ablation hurts more than its random control (share of cases)")
    assert ref.compute(FakeContext({"scalar_ablation": frame})) == pytest.approx(0.5)
    assert not ref.within(0.5) and ref.within(13 / 15)


def test_acdc_edges_into_attention_are_counted_by_source_kind():
    frame = pd.DataFrame(
        {
            "source_kind": ["embed", "mlp", "mlp", "head", "mlp"],
            "target_kind": ["q", "v", "logits", "k", "mlp"],
        }
    )
    c = FakeContext({"acdc": frame})
    counts = {
        r.metric: r.compute(c) for r in comparison.REFERENCES if r.metric.startswith("ACDC edges")
    }
    assert counts == {
        "ACDC edges into attention (threshold 0.001)": 3,
        "ACDC edges into attention from heads (threshold 0.001)": 1,
        "ACDC edges into attention from mlps (threshold 0.001)": 1,
        "ACDC edges into attention from embeds (threshold 0.001)": 1,
    }

"""The toy dense source (SAMOE §4): the workspace GPT, trained by the workspace's own loop
(``headgeom.training.loop.train``) on the ``dense-train`` stream, once for every variant and
seed, as one public checkpoint serves the paper's.

:func:`train_config` maps ``DenseConfig``'s schedule onto the loop's ``TrainConfig``
(cosine from ``lr_max`` to ``lr_min`` after linear warmup; AdamW (0.9, 0.95), weight decay
0.1 on matrices, clip 1.0: the loop's defaults, as §4 asks).
"""

from __future__ import annotations

import numpy as np

from headgeom.model.gpt import GPT
from headgeom.run_config import TrainConfig
from headgeom.samoe.config import DenseConfig
from headgeom.training.loop import TrainResult, seed_everything, train

#: [CHOICE] Validation during dense training: every this many updates, in batches of 16.
EVAL_EVERY, EVAL_BATCH = 100, 16


def train_config(dense: DenseConfig) -> TrainConfig:
    return TrainConfig(
        steps=dense.steps,
        batch_size=dense.batch_size,
        lr_max=dense.lr_max,
        lr_min=dense.lr_min,
        warmup_steps=dense.warmup_steps,
        eval_every=min(EVAL_EVERY, dense.steps),
        eval_batch_size=EVAL_BATCH,
        precision="fp32",
        checkpoint_steps=(),
    )


def initial_dense(dense: DenseConfig, n_vocab: int) -> GPT:
    """The step-0 dense model: every RNG seeded from ``dense.seed``, then the GPT built."""
    seed_everything(dense.seed)
    return GPT(dense.model_config(n_vocab))


def train_dense(
    dense: DenseConfig,
    train_ids: np.ndarray,
    val_ids: np.ndarray,
    n_vocab: int,
    data_seed: int,
    progress: bool = False,
) -> tuple[GPT, TrainResult]:
    """Train the dense source from its seed; (model, the loop's result with its log)."""
    model = initial_dense(dense, n_vocab)
    result = train(model, train_ids, val_ids, train_config(dense), data_seed=data_seed,
                   progress=progress, device="cpu")  # fmt: skip
    return model, result

"""The toy downstream suite (SAMOE §11): the workspace's SVA, Quote and Plural tasks
(evaluation split, two single-token answers, raw accuracy) and **Arith**, a four-way choice
of the result of ``a op b =`` (distractors: the result ±1, ±10 and a random value; acc_norm),
scored as lm-evaluation-harness scores multiple choice: each choice's summed conditional
log-likelihood after the context; ``acc`` takes the argmax, ``acc_norm`` first divides by
the choice string's character length; ties go to the lowest index.

One table holds every example (:func:`examples`): task, example id, the context and each
choice as GPT-2 ids, the choice texts and the label. Choices are in a fixed order that does
not depend on the answer (token id for the single-token tasks, numeric value for Arith).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from torch.nn import functional as F

from headgeom.data import tasks as workspace_tasks
from headgeom.data.tokenizer import encode
from headgeom.runtime import module_device

#: [CHOICE] The workspace tasks' generator seeds (config/config.yaml's).
TASK_SEEDS = {"sva": 101, "quote": 102, "plural": 103}
#: The metric each toy task reports (SAMOE §11: raw accuracy; Arith acc_norm).
PRIMARY = {"sva": "acc", "quote": "acc", "plural": "acc", "arith": "acc_norm"}
TOY_TASKS = tuple(PRIMARY)


def workspace_examples(task: str, tok, n: int) -> pd.DataFrame:
    """``n`` evaluation-split examples of a workspace task as two-choice rows."""
    splits = {"discovery": 0, "validation": 0, "evaluation": n, "holdout": 0}
    frame, _ = workspace_tasks.generate_task(task, tok, {"seed": TASK_SEEDS[task],
                                                         "splits": splits})  # fmt: skip
    frame = frame[frame["split"] == "evaluation"].reset_index(drop=True)
    rows = []
    for i, ex in frame.iterrows():
        pair = sorted([(int(ex["correct_id"]), ex["correct_text"]),
                       (int(ex["incorrect_id"]), ex["incorrect_text"])])  # fmt: skip
        rows.append({"task": task, "example_id": int(i),
                     "context": [int(t) for t in ex["clean_ids"]],
                     "choices": [[pair[0][0]], [pair[1][0]]],
                     "choice_texts": [pair[0][1], pair[1][1]],
                     "label": [p[0] for p in pair].index(int(ex["correct_id"]))})  # fmt: skip
    return pd.DataFrame(rows)


def arith_examples(tok, n: int, seed: int) -> pd.DataFrame:
    """``n`` Arith items ``a op b =`` with four numeric choices (held-out stream ``seed``)."""
    rng = random.Random(f"headgeom.samoe.arith:{seed}")
    rows, seen = [], set()
    while len(rows) < n:
        a, b, op = rng.randrange(1, 100), rng.randrange(1, 100), rng.choice("+-*")
        if op == "*":
            a, b = a % 13, b % 13
        prompt = f"{a} {op} {b} ="
        if prompt in seen:
            continue
        seen.add(prompt)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        options = {value, value + rng.choice((-1, 1)), value + rng.choice((-10, 10))}
        while len(options) < 4:
            options.add(rng.randrange(-100, 200))
        values = sorted(options)
        texts = [f" {v}" for v in values]
        rows.append({"task": "arith", "example_id": len(rows), "context": encode(tok, prompt),
                     "choices": [encode(tok, t) for t in texts], "choice_texts": texts,
                     "label": values.index(value)})  # fmt: skip
    return pd.DataFrame(rows)


def examples(tok, tasks: Sequence[str], n_per_task: int, arith_n: int,
             arith_seed: int) -> pd.DataFrame:  # fmt: skip
    """Every example of the toy suite's ``tasks``."""
    unknown = [t for t in tasks if t not in PRIMARY]
    if unknown:
        raise ValueError(
            f"downstream.tasks: {unknown} are not toy tasks (known: {list(PRIMARY)}); the "
            "paper's suite runs through the harness"
        )
    parts = [arith_examples(tok, arith_n, arith_seed) if t == "arith"
             else workspace_examples(t, tok, n_per_task) for t in tasks]  # fmt: skip
    return pd.concat(parts, ignore_index=True)


def choice_logliks(model: torch.nn.Module, frame: pd.DataFrame, to_model_ids,
                   batch_size: int = 256) -> list[np.ndarray]:  # fmt: skip
    """Per example, the summed log p(choice | context) of each choice (float64). Every
    (example, choice) sequence is scored in length-sorted batches, right-padded: a causal
    model's log-likelihood of a choice never sees the padding after it. The batches are
    built and scored on the model's device."""
    seqs, spans = [], []  # spans: (start, length) of the choice tokens in its sequence
    for ex in frame.itertuples(index=False):
        ctx = list(to_model_ids(ex.context))
        for choice in ex.choices:
            c = list(to_model_ids(choice))
            seqs.append(ctx + c)
            spans.append((len(ctx), len(c)))
    ll = np.zeros(len(seqs))
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    device = module_device(model)
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            width = max(len(seqs[i]) for i in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long, device=device)
            for row, i in enumerate(chunk):
                ids[row, : len(seqs[i])] = torch.as_tensor(seqs[i])
            logp = F.log_softmax(model(ids[:, :-1]).double(), dim=-1)
            for row, i in enumerate(chunk):
                begin, n = spans[i]
                pos = torch.arange(begin - 1, begin - 1 + n, device=device)
                ll[i] = logp[row, pos, ids[row, begin : begin + n]].sum().item()
    out, k = [], 0
    for ex in frame.itertuples(index=False):
        out.append(ll[k : k + len(ex.choices)])
        k += len(ex.choices)
    return out


def score(model: torch.nn.Module, frame: pd.DataFrame, to_model_ids,
          batch_size: int = 256) -> pd.DataFrame:  # fmt: skip
    """Per example: acc and acc_norm (``to_model_ids`` maps GPT-2 ids to the model's)."""
    rows = []
    lls = choice_logliks(model, frame, to_model_ids, batch_size)
    for ex, scores in zip(frame.itertuples(index=False), lls, strict=True):
        norm = scores / np.asarray([len(t) for t in ex.choice_texts], dtype=np.float64)
        # np.argmax returns the first maximum: ties go to the lowest index
        rows.append({"task": ex.task, "example_id": ex.example_id,
                     "acc": float(np.argmax(scores) == ex.label),
                     "acc_norm": float(np.argmax(norm) == ex.label)})  # fmt: skip
    return pd.DataFrame(rows)

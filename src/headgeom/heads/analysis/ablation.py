"""Ablation modes and the block ablation atlas (docs §10.6).

Two views of "what a block contributes", both measured on held-out validation text:

* **zero ablation** deletes a block's write into the residual stream (the attention block's
  output ``blocks.{l}.hook_attn_out``, the MLP's ``blocks.{l}.hook_mlp_out``, or one head's
  z ``blocks.{l}.attn.hook_z[..., h, :]`` before W_O, so its write W_O^h z^h);
* **mean ablation** replaces that write by its mean over held-out validation positions,
  keeping the part of the write that is the same for every token.

A block whose write is (nearly) a fixed bias looks important under zero ablation and not
under mean ablation: size is not importance. The two weight-free descriptors of a write w_t
say how much of that there is:

    size           = RMS_t(w_t) / RMS_t(x_t),   x_t the residual entering the layer
    constant part  = ‖mean_t w_t‖² / mean_t ‖w_t‖²  ∈ [0, 1]   (1: a fixed bias)

Validation windows are the non-overlapping n_ctx windows of the validation file (docs §3.4);
the first ``n_mean`` windows give the means (positions t ≥ 1: position 0 attends only to
itself), the next ``n_eval`` windows are where every ablation is measured, so the means are
never estimated on the text they are judged on. The means are one artifact per run
(:func:`write_means`, safetensors, hashed): head patching in ``mean`` mode reads the same file.
The mode comparison (concentration per patching mode) is
:mod:`headgeom.heads.analysis.ablation_modes`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from headgeom.data.task_files import TaskSplits, model_inputs
from headgeom.divergence import kl_of_logp
from headgeom.hashing import canonical_json, sha256_file
from headgeom.heads.analysis.evaluation import length_groups
from headgeom.heads.analysis.patching import supports_fast
from headgeom.io import IntegrityError, atomic_path
from headgeom.model import registry
from headgeom.model.gpt import site
from headgeom.paths import rerun_hint
from headgeom.writes import constant_from
from headgeom.writes import constant_part as constant_part  # the atlas's descriptors
from headgeom.writes import size_ratio as size_ratio

#: Ablations of the atlas, in column order.
ABLATIONS = ("zero", "mean")
#: Written blocks of a layer: the attention block, the MLP block, one head.
BLOCK_KINDS = ("attn", "mlp", "head")
MEANS_HEADER_KEY = "headgeom"
#: The tensors of the means artifact: head z (L, H, d_head), block writes (L, D).
MEAN_TENSORS = {"z": "z_mean", "attn": "attn_out_mean", "mlp": "mlp_out_mean"}
#: Positions the means and descriptors average over (docs §10.6).
POSITIONS = "t >= 1 of each validation window (position 0 excluded)"


# ----------------------------------------------------------------------------- windows
def split_windows(
    val_ids: np.ndarray, n_ctx: int, n_mean: int, n_eval: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean windows (n_mean, n_ctx), evaluation windows (n_eval, n_ctx)) of model ids: the
    first n_mean non-overlapping windows of the validation file, then the next n_eval."""
    n_windows = len(val_ids) // n_ctx
    if n_mean < 1 or n_eval < 1 or n_mean + n_eval > n_windows:
        raise ValueError(
            f"the validation file ({len(val_ids):,} tokens) has {n_windows} windows of "
            f"{n_ctx}; ablation needs n_mean_windows ({n_mean}) + n_eval_windows ({n_eval}) "
            "of them, each at least 1"
        )
    ids = torch.from_numpy(np.asarray(val_ids[: n_windows * n_ctx], dtype=np.int64))
    ids = ids.view(n_windows, n_ctx)
    return ids[:n_mean], ids[n_mean : n_mean + n_eval]


def _batches(ids: torch.Tensor, batch_size: int) -> Iterator[torch.Tensor]:
    for start in range(0, len(ids), batch_size):
        yield ids[start : start + batch_size]


def has_mlp(model: torch.nn.Module) -> bool:
    """Whether the model's blocks have an MLP site (the registry's site table)."""
    arch = registry.architecture_of(model)
    return arch is not None and "hook_mlp_out" in arch.sites


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


# ----------------------------------------------------------------------------- means
@torch.no_grad()
def write_means(model, windows: torch.Tensor, batch_size: int) -> dict[str, torch.Tensor]:
    """Means over the windows' positions t ≥ 1, float64: each head's z before W_O
    (``z_mean`` (L, H, d_head)), the attention block's output (``attn_out_mean`` (L, D))
    and, when the model has MLPs, the MLP's output (``mlp_out_mean`` (L, D))."""
    n_layer = model.cfg.n_layer
    kinds = ["z", "attn"] + (["mlp"] if has_mlp(model) else [])
    names = {"z": "attn.hook_z", "attn": "hook_attn_out", "mlp": "hook_mlp_out"}
    sites = {(k, layer): site(layer, names[k]) for k in kinds for layer in range(n_layer)}
    sums = {key: 0.0 for key in sites}
    count = 0
    for ids in _batches(windows, batch_size):
        _, cache = model.run_with_cache(ids.to(_device(model)), list(sites.values()))
        for key, name in sites.items():
            sums[key] = sums[key] + cache[name][:, 1:].double().sum(dim=(0, 1)).cpu()
        count += ids.shape[0] * (ids.shape[1] - 1)
    if count == 0:
        raise ValueError("no positions t ≥ 1 to average (windows of one token)")
    return {
        MEAN_TENSORS[k]: torch.stack([sums[(k, layer)] / count for layer in range(n_layer)])
        for k in kinds
    }


#: Field of the header record holding the SHA-256 of the rest of the record and the tensors
#: (one header key: safetensors does not keep the order of several).
MEANS_DIGEST_KEY = "means_sha256"


def means_digest(tensors: Mapping[str, torch.Tensor], record_text: str) -> str:
    """SHA-256 of the record's text and every tensor's name, dtype, shape and bytes (in name
    order): what the means artifact's writer records and its reader recomputes."""
    h = hashlib.sha256(record_text.encode("utf-8"))
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(canonical_json([name, str(t.dtype), list(t.shape)]))
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_means(path: str | os.PathLike, means: Mapping[str, torch.Tensor], record: dict) -> str:
    """Write the means artifact (safetensors; ``record`` in one canonical-JSON header key,
    so equal inputs give equal bytes, beside the :func:`means_digest` its reader checks) and
    return its SHA-256."""
    tensors = {k: v.detach().double().cpu().contiguous() for k, v in means.items()}
    digest = means_digest(tensors, canonical_json(record).decode("utf-8"))
    header = {MEANS_HEADER_KEY: canonical_json({**record, MEANS_DIGEST_KEY: digest}).decode()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=header)
    return sha256_file(path)


@dataclass(frozen=True)
class Means:
    """A means artifact read back: tensors, the record it was written with, its SHA-256."""

    tensors: dict[str, torch.Tensor]
    record: dict
    sha256: str

    @property
    def z(self) -> torch.Tensor:
        return self.tensors[MEAN_TENSORS["z"]]


def read_means(path: str | os.PathLike, checkpoint_sha256: str | None = None) -> Means:
    """Read a means artifact, verified: refuse one whose record or tensors differ from the
    digest its writer stored, or computed from another checkpoint than
    ``checkpoint_sha256`` (when given), naming the file and both hashes."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: means artifact not found (rule ablation_atlas)")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as err:
        raise IntegrityError(f"{path}: not a readable safetensors file ({err}); "
                             f"{rerun_hint(path)}") from None  # fmt: skip
    try:
        record = json.loads(header.get(MEANS_HEADER_KEY, "{}"))
    except json.JSONDecodeError as err:
        raise IntegrityError(
            f"{path}: unreadable means record ({err}); {rerun_hint(path)}"
        ) from None
    recorded = record.pop(MEANS_DIGEST_KEY, None)
    text = canonical_json(record).decode("utf-8")
    if recorded is not None and recorded != (actual := means_digest(tensors, text)):
        raise IntegrityError(
            f"{path}: means SHA-256 is {actual} but its writer recorded {recorded}; the file "
            f"changed after it was written ({rerun_hint(path)})"
        )
    if MEAN_TENSORS["z"] not in tensors:
        raise ValueError(f"{path}: not a means artifact (no {MEAN_TENSORS['z']} tensor)")
    found = record.get("checkpoint_sha256")
    if checkpoint_sha256 is not None and found != checkpoint_sha256:
        raise ValueError(
            f"{path}: means of checkpoint {found} but the checkpoint given is "
            f"{checkpoint_sha256}; rerun ablation_atlas"
        )
    return Means(tensors, record, sha256_file(path))


# ----------------------------------------------------------------------------- edits
@dataclass(frozen=True)
class Edit:
    """One ablation: block kind (attn | mlp | head), layer, head (heads only), mode."""

    kind: str
    layer: int
    head: int | None
    mode: str

    @property
    def label(self) -> str:
        return f"L{self.layer}.{'H' + str(self.head) if self.kind == 'head' else self.kind}"


def atlas_edits(model, modes: Sequence[str] = ABLATIONS) -> list[Edit]:
    """Every edit of the atlas, layer by layer: attention block, MLP block, each head."""
    kinds = ["attn"] + (["mlp"] if has_mlp(model) else [])
    out = []
    for layer in range(model.cfg.n_layer):
        blocks = [(k, None) for k in kinds] + [("head", h) for h in range(model.cfg.n_head)]
        out += [Edit(k, layer, h, m) for k, h in blocks for m in modes]
    return out


def edit_hooks(edit: Edit, means: Mapping[str, torch.Tensor]) -> dict[str, Callable]:
    """The site hook of an edit: zero, or the mean from ``means`` (the artifact's tensors),
    at every position."""
    if edit.mode not in ABLATIONS:
        raise ValueError(f"ablation must be one of {ABLATIONS}, got {edit.mode!r}")
    if edit.kind == "head":
        mean = means[MEAN_TENSORS["z"]][edit.layer, edit.head]

        def swap(z):
            z = z.clone()
            z[..., edit.head, :] = 0.0 if edit.mode == "zero" else mean.to(z)
            return z

        return {site(edit.layer, "attn.hook_z"): swap}
    name = {"attn": "hook_attn_out", "mlp": "hook_mlp_out"}[edit.kind]
    mean = means[MEAN_TENSORS[edit.kind]][edit.layer]

    def replace(x):
        return torch.zeros_like(x) if edit.mode == "zero" else mean.to(x).expand_as(x)

    return {site(edit.layer, name): replace}


@torch.no_grad()
def edited_logits(model, ids: torch.Tensor, edit: Edit | None, means) -> torch.Tensor:
    """Full next-token logits (N, T, V) of ``ids`` with ``edit`` applied (None: unedited)."""
    with model.hooks({} if edit is None else edit_hooks(edit, means)):
        return model(ids.to(_device(model)))


# ----------------------------------------------------------------------------- atlas
@dataclass(frozen=True)
class TaskPrompts:
    """The evaluation prompts of one task in model ids (clean prompts, answers)."""

    name: str
    clean_ids: list
    correct: np.ndarray
    incorrect: np.ndarray


def task_prompts(task: TaskSplits, vocab: np.ndarray, n: int = 0) -> TaskPrompts:
    """The first ``n`` prompts (0: all) of a task read with its evaluation split, in model
    ids: the prompts whose retention the atlas measures."""
    inputs = model_inputs(task.frame.head(n or None), vocab)
    return TaskPrompts(task.name, inputs.clean_ids, inputs.correct, inputs.incorrect)


def means_record(checkpoint_sha256: str, val_sha256: str, n_windows: int, n_ctx: int) -> dict:
    """What the means artifact records of where its means come from (docs §10.6)."""
    return {
        "checkpoint_sha256": checkpoint_sha256,
        "val_tokens_sha256": val_sha256,
        "windows": f"validation windows 0..{n_windows - 1} of n_ctx {n_ctx}",
        "positions": POSITIONS,
        "n_positions": n_windows * (n_ctx - 1),
    }


class _Moments:
    """Streaming Σw, Σ‖w‖² and count of a write; Σ‖x‖² of the residual beside it."""

    def __init__(self) -> None:
        self.sum_w, self.sum_sq, self.resid_sq, self.n = 0.0, 0.0, 0.0, 0

    def add(self, w: torch.Tensor, resid: torch.Tensor) -> None:
        w, resid = w.double().flatten(0, -2), resid.double().flatten(0, -2)
        self.sum_w = self.sum_w + w.sum(dim=0)
        self.sum_sq += float(w.pow(2).sum())
        self.resid_sq += float(resid.pow(2).sum())
        self.n += len(w)

    def descriptors(self) -> tuple[float, float]:
        size = float(np.sqrt(self.sum_sq / self.resid_sq)) if self.resid_sq > 0 else float("nan")
        return size, constant_from(self.sum_w, self.sum_sq, self.n)


def descriptor_hooks(model, moments: dict) -> dict[str, Callable]:
    """Hooks adding one unedited forward's writes at positions t ≥ 1 to ``moments``
    ((kind, layer, head) -> :class:`_Moments`) as the forward passes each site: the
    attention block, the MLP block and each head's W_O^h z^h (no bias), each beside the
    residual entering its layer. Only one layer's residual is held at a time."""
    resid: dict[int, torch.Tensor] = {}
    mlp = has_mlp(model)

    def add(kind, layer, head, w):
        moments.setdefault((kind, layer, head), _Moments()).add(w, resid[layer])

    def hooks_of(layer: int) -> dict[str, Callable]:
        def pre(x):
            resid[layer] = x[:, 1:]

        def z_hook(z):
            z = z[:, 1:].double()  # (B, T-1, H, d)
            maps = model.blocks[layer].attn.writer.write_maps().detach().double().to(z.device)
            for h in range(model.cfg.n_head):
                add("head", layer, h, z[:, :, h] @ maps[h].T)

        def attn_out(w):
            add("attn", layer, None, w[:, 1:])
            if not mlp:
                del resid[layer]

        def mlp_out(w):
            add("mlp", layer, None, w[:, 1:])
            del resid[layer]

        out = {
            site(layer, "hook_resid_pre"): pre,
            site(layer, "attn.hook_z"): z_hook,
            site(layer, "hook_attn_out"): attn_out,
        }
        if mlp:
            out[site(layer, "hook_mlp_out")] = mlp_out
        return out

    return {name: fn for layer in range(model.cfg.n_layer) for name, fn in hooks_of(layer).items()}


def stacked_hooks(
    edits: Sequence[Edit], means: Mapping[str, torch.Tensor], n: int
) -> dict[str, Callable]:
    """Hooks applying edit g to rows g·n … g·n + n − 1 of one forward (``n`` inputs repeated
    once per edit, edit-major), so a chunk of edits runs as one stacked forward; each row
    group gets exactly :func:`edit_hooks` of its edit."""
    by_site: dict[str, list[tuple[int, Callable]]] = {}
    for g, edit in enumerate(edits):
        for name, fn in edit_hooks(edit, means).items():
            by_site.setdefault(name, []).append((g, fn))
    n_groups = len(edits)

    def make(members):
        def apply(x):
            x = x.clone()
            groups = x.view(n_groups, n, *x.shape[1:])  # a view: writes land in x
            for g, fn in members:
                groups[g] = fn(groups[g])
            return x

        return apply

    return {name: make(members) for name, members in by_site.items()}


def _chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    size = max(1, size)
    for start in range(0, len(items), size):
        yield items[start : start + size]


@torch.no_grad()
def _stacked_forward(model, ids, chunk, means, last_only=False) -> torch.Tensor:
    """Logits of ``ids`` (n, T) under each edit of ``chunk``: (G, n, T, V), or (G, n, V)."""
    rows = ids.repeat(len(chunk), 1)
    with model.hooks(stacked_hooks(chunk, means, len(ids))):
        logits = model(rows, last_only=last_only)
    return logits.view(len(chunk), len(ids), *logits.shape[1:])


# ----------------------------------------------------------------------------- memory
#: Bytes per vocabulary entry of one (row, position) while a chunk's KL is formed: the
#: logits in the model's dtype (s), then float64 log-probabilities, log p − log q and the
#: product p·(log p − log q) (3 × 8); the unedited side holds logits, log p and p (s + 16).
KL_BYTES_EDITED, KL_BYTES_BASE = 24, 16


def forward_row_bytes(cfg, n_pos: int, elem: int) -> int:
    """Activation bytes of one row of a no-grad forward over ``n_pos`` positions: the
    residual and its copies (LN, attention output, hook clones, writes: 8·D), the MLP's
    hidden layer before and after GELU (2·d_mlp) and the attention scores and
    probabilities (2·H·T), in the model's dtype (``elem`` bytes)."""
    d_mlp = getattr(cfg, "d_mlp", 0) or 0
    return elem * n_pos * (8 * cfg.d_model + 2 * d_mlp + 2 * cfg.n_head * n_pos)


@dataclass(frozen=True)
class AtlasPlan:
    """How the atlas splits its work so that its working memory stays within a budget:
    ``windows`` evaluation windows per batch, ``edits`` edits per stacked forward (rows =
    edits × windows), ``positions`` positions unembedded at a time, ``retention_rows``
    rows (edits × prompts) per stacked task forward; ``peak_bytes`` the estimate
    (:func:`atlas_plan`)."""

    windows: int
    edits: int
    positions: int
    retention_rows: int
    peak_bytes: int


def atlas_plan(
    model, n_pos: int, batch_size: int, work_bytes: int, prompt_len: int = 0, n_edits: int = 0
):
    """The :class:`AtlasPlan` for inputs of ``n_pos`` positions and a working-memory
    budget of ``work_bytes`` (the model's weights and the means are not part of it), for
    ``n_edits`` edits (0: as many per forward as the budget holds).

    With s the model dtype's bytes, V the vocabulary, f(T) = :func:`forward_row_bytes`,
    n windows, G edits and P positions, the peak is

        n·f(T) + 32·n·T·D                  unedited forward and its descriptors
      + G·n·f(T)                            one stacked forward (its final residual kept)
      + P·V·(G·n·(s + 24) + n·(s + 16))     one position chunk's logits and KL terms

    Half the budget goes to the forwards, half to the KL: with R = ⌊budget/2 ÷ f(T)⌋ rows,
    n = min(batch_size, ⌊R/4⌋) (few windows, many edits: every edit chunk re-unembeds the
    unedited windows), G = ⌊(budget/2 − n·f(T) − 32·n·T·D) ÷ (n·f(T))⌋, then
    P = ⌊budget/2 ÷ (V·(G·n·(s+24) + n·(s+16)))⌋.
    A task-retention row (prompt length T') holds its forward, the residual entering each
    layer and its final-position logits: ⌊budget/2 ÷ max(f(T') + L·T'·D·s, V·(s + 8))⌋ rows."""
    cfg = model.cfg
    elem = next(model.parameters()).element_size()
    f = forward_row_bytes(cfg, n_pos, elem)
    half = work_bytes // 2
    rows = half // f
    if rows < 2:
        raise ValueError(
            f"ablation.work_mb ({work_bytes / 2**20:,.0f} MB) is below two rows of one "
            f"{n_pos}-position forward ({2 * 2 * f / 2**20:,.0f} MB needed at least)"
        )
    # few windows, many edits: each edit chunk re-unembeds the unedited windows (1/G extra)
    n = min(batch_size, max(1, rows // 4))
    G = max(1, (half - n * f - 32 * n * n_pos * cfg.d_model) // (n * f))
    G = min(G, n_edits) if n_edits else G
    per_pos = cfg.n_vocab * (G * n * (elem + KL_BYTES_EDITED) + n * (elem + KL_BYTES_BASE))
    P = min(n_pos, half // per_pos)
    if P < 1:
        raise ValueError(
            f"ablation.work_mb ({work_bytes / 2**20:,.0f} MB) cannot hold one position's "
            f"full-vocabulary KL of {G * n} rows ({2 * per_pos / 2**20:,.0f} MB needed)"
        )
    peak = (n + G * n) * f + 32 * n * n_pos * cfg.d_model + P * per_pos
    # a retention row: its forward, the cached residual entering every layer (resumption)
    # and, unresumed, its final-position logits in the model's dtype and float64
    T = max(prompt_len, 1)
    per_row = forward_row_bytes(cfg, T, elem) + cfg.n_layer * T * cfg.d_model * elem
    retention = max(1, half // max(per_row, cfg.n_vocab * (elem + 8)))
    return AtlasPlan(n, G, P, int(retention), int(peak))


@torch.no_grad()
def atlas_steps(
    model, windows: torch.Tensor, tasks: Sequence[TaskPrompts], batch_size: int, work_bytes: int
) -> int:
    """How many times :func:`block_atlas` calls ``progress``: every edit once per batch of
    windows its :func:`atlas_plan` makes."""
    edits = atlas_edits(model)
    prompt_len = max((len(c) for t in tasks for c in t.clean_ids), default=1)
    plan = atlas_plan(model, windows.shape[1] - 1, batch_size, work_bytes, prompt_len, len(edits))
    return len(edits) * -(-windows.shape[0] // plan.windows)


def _answer_lds(model, ids, good, bad, layer_edits, means, max_rows) -> dict[Edit, torch.Tensor]:
    """LD (n,) of prompts ``ids`` (n, T) under every edit, by layer resumption when the
    registry declares the blocks functions of the residual entering them (``fast_patching``;
    then edits of layer l rerun blocks l.. from the cached clean residual and only the two
    answer logits, ``model.answer_logits``), else by full stacked forwards."""
    out = {}
    answers = torch.stack([good, bad], dim=1)
    resume = supports_fast(model)
    names = [site(layer, "hook_resid_pre") for layer in layer_edits]
    _, cache = model.run_with_cache(ids, names, last_only=True) if resume else (None, {})
    for layer, edits in layer_edits.items():
        for chunk in _chunks(edits, max_rows // len(ids)):
            G = len(chunk)
            if resume:
                x = cache[site(layer, "hook_resid_pre")].repeat(G, 1, 1)
                with model.hooks(stacked_hooks(chunk, means, len(ids))):
                    for block in model.blocks[layer:]:
                        x = block(x)
                lg = model.answer_logits(x, answers.repeat(G, 1)).double().view(G, len(ids), 2)
                ld = lg[..., 0] - lg[..., 1]
            else:
                lg = _stacked_forward(model, ids, chunk, means, last_only=True).double()
                pick = torch.arange(len(ids), device=ids.device)
                ld = lg[:, pick, good] - lg[:, pick, bad]
            out.update({edit: ld[g] for g, edit in enumerate(chunk)})
    return out


@torch.no_grad()
def _retention(model, task: TaskPrompts, edits, means, max_rows: int) -> np.ndarray:
    """(G,) share of the task's prompts right (LD > 0) unedited that stay right per edit."""
    device = _device(model)
    kept, right_total = np.zeros(len(edits)), 0
    correct = torch.as_tensor(np.asarray(task.correct, dtype=np.int64), device=device)
    incorrect = torch.as_tensor(np.asarray(task.incorrect, dtype=np.int64), device=device)
    layer_edits: dict[int, list[Edit]] = {}
    for edit in edits:
        layer_edits.setdefault(edit.layer, []).append(edit)
    for _, index in sorted(length_groups(task.clean_ids).items()):
        for part in _chunks(index, max_rows):
            ids = torch.as_tensor(np.stack([task.clean_ids[i] for i in part]), device=device)
            part_t = torch.as_tensor(part, device=device)
            good, bad = correct[part_t], incorrect[part_t]
            pick = torch.arange(len(part), device=device)
            base = model(ids, last_only=True).double()
            right = (base[pick, good] - base[pick, bad]) > 0
            right_total += int(right.sum())
            lds = _answer_lds(model, ids, good, bad, layer_edits, means, max_rows)
            kept += np.array([int(((lds[e] > 0) & right).sum()) for e in edits])
    return kept / right_total if right_total else np.full(len(edits), np.nan)


@torch.no_grad()
def block_atlas(
    model,
    means: Mapping[str, torch.Tensor],
    eval_windows: torch.Tensor,
    tasks: Sequence[TaskPrompts],
    batch_size: int,
    work_bytes: int,
    modes: Sequence[str] = ABLATIONS,
    progress: Callable[[int], object] | None = None,
    edits: Sequence[Edit] | None = None,
) -> tuple[pd.DataFrame, dict]:
    """One row per (block, layer, head, ablation) of ``edits`` (default
    :func:`atlas_edits` of ``modes``): KL(original ‖ edited) of next-token
    distributions averaged over every input position of ``eval_windows`` (nats), the change
    in top-1 next-token accuracy (edited − original), task retention per task (share of
    evaluation prompts the unedited model gets right, LD > 0, that stay right), and the
    write's size and constant part (over input positions t ≥ 1 of the same windows).

    The KL is Σ_v p_v (log p_v − log q_v) of float64 log-softmaxes of the two runs' logits
    (``headgeom.divergence.kl_of_logp``): a rounding error ε of the logits (|ε| ≲ a few
    eps·|logit| per layer) enters where the runs agree at second order, ½·Var_p(ε) (~1e-11
    in float32 at logits of ~10), elsewhere in proportion to the signal (~2|ε|·√(2·KL));
    values within the float64 summation floor (~1e-13) of 0 read 0, below it the atlas
    raises.

    Memory is bounded by ``work_bytes`` (:func:`atlas_plan`, which states the formula),
    never by windows × positions × vocabulary: windows stream in batches; per batch one
    unedited forward to the final residual (the descriptors accumulate in its hooks, one
    layer at a time), then stacked forwards of a chunk of edits (:func:`stacked_hooks`) to
    their final residuals, unembedded and compared a chunk of positions at a time.
    ``progress(k)`` after k more edits of a batch. Returns ``(rows, baseline)``, baseline
    holding the unedited top-1 accuracy and task accuracy."""
    edits = atlas_edits(model, modes) if edits is None else list(edits)
    n_pos = eval_windows.shape[1] - 1
    prompt_len = max((len(c) for t in tasks for c in t.clean_ids), default=1)
    plan = atlas_plan(model, n_pos, batch_size, work_bytes, prompt_len, len(edits))
    kl_sum, top1_sum = np.zeros(len(edits)), np.zeros(len(edits))
    base_top1, n_pos_total, moments = 0.0, 0, {}
    device = _device(model)
    for ids in _batches(eval_windows, plan.windows):
        ids = ids.to(device)
        inputs, targets = ids[:, :-1], ids[:, 1:]
        n = len(ids)
        # the unedited run on exactly the edited runs' inputs
        with model.hooks(descriptor_hooks(model, moments)):
            base_resid = model.residual(inputs)
        n_pos_total += targets.numel()
        start = 0
        for c, chunk in enumerate(_chunks(edits, plan.edits)):
            with model.hooks(stacked_hooks(chunk, means, n)):
                resid = model.residual(inputs.repeat(len(chunk), 1))
            resid = resid.view(len(chunk), n, *resid.shape[1:])
            g = slice(start, start + len(chunk))
            for p0 in range(0, n_pos, plan.positions):
                p = slice(p0, p0 + plan.positions)
                base_logp = torch.log_softmax(model.unembed(base_resid[:, p]).double(), -1)
                if c == 0:
                    base_top1 += float((base_logp.argmax(-1) == targets[:, p]).sum())
                logp = torch.log_softmax(model.unembed(resid[:, :, p]).double(), -1)
                kl_sum[g] += kl_of_logp(base_logp, logp).sum(dim=(1, 2)).cpu().numpy()
                top1_sum[g] += (logp.argmax(-1) == targets[:, p]).sum(dim=(1, 2)).cpu().numpy()
                del base_logp, logp
            del resid
            start += len(chunk)
            if progress is not None:
                progress(len(chunk))
    retention = {t.name: _retention(model, t, edits, means, plan.retention_rows) for t in tasks}
    rows = []
    for i, edit in enumerate(edits):
        rows.append({
            "block": edit.kind, "layer": edit.layer, "head": edit.head, "label": edit.label,
            "ablation": edit.mode,
            "kl": kl_sum[i] / n_pos_total,
            "top1_base": base_top1 / n_pos_total,
            "delta_top1": (top1_sum[i] - base_top1) / n_pos_total,
            **{f"retention_{name}": float(r[i]) for name, r in retention.items()},
            **dict(zip(("size", "constant_part"),
                       moments[(edit.kind, edit.layer, edit.head)].descriptors(), strict=True)),
        })  # fmt: skip
    baseline = {
        "top1_base": base_top1 / n_pos_total,
        "n_eval_positions": n_pos_total,
        "plan": {k: getattr(plan, k) for k in AtlasPlan.__dataclass_fields__},
    }
    return pd.DataFrame(rows), baseline

"""Single-head activation patching and the real patch perturbation (METHODS §10.1, §11.2).

Patching head (l, h) replaces its output z^{l,h}_t (the site ``blocks.{l}.attn.hook_z``,
axes (batch, position, head, d_head)) at **every** position t of the clean prompt by the
value it takes on the reference prompt; everything downstream recomputes. The per-example
drop is

    d_{l,h}(x) = LD_clean(x) − LD_patched(x),   LD = logit(correct) − logit(incorrect)

at the final position, correct/incorrect always those of the clean prompt.

Because the attention output is linear in z, the patch adds exactly

    δ_{l,h,t} = W_O^{l,h} (z^ref_{l,h,t} − z_{l,h,t})  ∈ Im W_O^{l,h}

to the residual stream after layer l (METHODS §11.2). :func:`perturbation_check` (check C8)
and :func:`delta_patched_ld` (the independent route for check C9) verify this.

Prompts are sequences of *model* ids; clean and reference prompts of one example have equal
length, lengths may differ between examples. Batches group equal lengths
(:func:`length_batches`), so no padding ever enters a forward pass. Forward passes run in
float32 on the model's device; logit differences and perturbations are float64.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from headgeom.evaluation import length_groups
from headgeom.io import read_parquet_metadata
from headgeom.model import GPT, site

Progress = Callable[[int], object] | None


# --------------------------------------------------------------------------- batching
def length_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Indices of examples grouped by equal length (``evaluation.length_groups``), in chunks
    of at most ``batch_size``.

    Groups come in increasing length, examples within a group in their original order, so
    the batching (and therefore every float) is a deterministic function of the inputs.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    groups = length_groups([range(n) for n in lengths])
    return [
        members[start : start + batch_size]
        for _, members in sorted(groups.items())
        for start in range(0, len(members), batch_size)
    ]


def _model_device(model: GPT) -> torch.device:
    return next(model.parameters()).device


def _stack(ids: Sequence[Sequence[int]], index: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(
        np.stack([np.asarray(ids[i], dtype=np.int64) for i in index]), device=device
    )


def _check_pairs(clean_ids: Sequence, ref_ids: Sequence, *per_example: Sequence) -> list[int]:
    n = len(clean_ids)
    if len(ref_ids) != n or any(len(a) != n for a in per_example):
        raise ValueError(
            f"clean ({n}), reference ({len(ref_ids)}) and answer arrays "
            f"({[len(a) for a in per_example]}) must have one entry per example"
        )
    lengths = []
    for i, (clean, ref) in enumerate(zip(clean_ids, ref_ids, strict=True)):
        if len(clean) != len(ref) or len(clean) == 0:
            raise ValueError(
                f"example {i}: clean and reference prompts must be non-empty and of equal "
                f"length (METHODS §8.1), got {len(clean)} and {len(ref)} tokens"
            )
        lengths.append(len(clean))
    return lengths


# --------------------------------------------------------------------------- primitives
def logit_difference(
    logits: torch.Tensor, correct: torch.Tensor, incorrect: torch.Tensor
) -> torch.Tensor:
    """LD = logit(correct) − logit(incorrect), float64, for final-position ``logits`` (B, V)."""
    gathered = logits.gather(1, torch.stack([correct, incorrect], dim=1)).double()
    return gathered[:, 0] - gathered[:, 1]


def z_sites(model: GPT) -> list[str]:
    return [site(layer, "attn.hook_z") for layer in range(model.cfg.n_layer)]


def replace_head(head: int, z_ref: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Hook for ``blocks.{l}.attn.hook_z`` that swaps head ``head`` for ``z_ref``.

    ``z_ref`` has shape (batch, position, d_head): the reference run's z of that head at
    every position.
    """

    def fn(z: torch.Tensor) -> torch.Tensor:
        z = z.clone()
        z[:, :, head] = z_ref
        return z

    return fn


def add_to(delta: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Hook that adds ``delta`` (same shape) to an activation, e.g. ``hook_attn_out``."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + delta.to(x.dtype)

    return fn


def head_perturbations(
    write_maps: torch.Tensor, z: torch.Tensor, z_ref: torch.Tensor
) -> torch.Tensor:
    """δ_{h,t} = W_O^h (z^ref_{h,t} − z_{h,t}) in float64, shape (batch, position, head, d_model).

    ``write_maps`` is ``writer.write_maps()`` (head, d_model, d_head); ``z``/``z_ref`` have
    axes (batch, position, head, d_head).
    """
    diff = z_ref.double() - z.double()
    return torch.einsum("bthk,hdk->bthd", diff, write_maps.detach().double().to(diff.device))


# --------------------------------------------------------------------------- patching
@torch.no_grad()
def patch_batch(
    model: GPT,
    clean: torch.Tensor,
    ref: torch.Tensor,
    correct: torch.Tensor,
    incorrect: torch.Tensor,
    progress: Progress = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean LD (B,) and patched LD (B, L, H) for one batch of equal-length prompts (B, T).

    One reference forward caches every head's z; then one clean forward per head, with that
    head's z replaced at all positions. ``progress(1)`` is called after each head.
    """
    names = z_sites(model)
    _, ref_cache = model.run_with_cache(ref, names, last_only=True)
    clean_ld = logit_difference(model(clean, last_only=True), correct, incorrect)
    n_layer, n_head = model.cfg.n_layer, model.cfg.n_head
    patched = torch.empty(clean.shape[0], n_layer, n_head, dtype=torch.float64, device=clean.device)
    for layer, name in enumerate(names):
        for head in range(n_head):
            with model.hooks({name: replace_head(head, ref_cache[name][:, :, head])}):
                logits = model(clean, last_only=True)
            patched[:, layer, head] = logit_difference(logits, correct, incorrect)
            if progress is not None:
                progress(1)
    return clean_ld, patched


def patch_all_heads(
    model: GPT,
    clean_ids: Sequence[Sequence[int]],
    ref_ids: Sequence[Sequence[int]],
    correct: Sequence[int],
    incorrect: Sequence[int],
    batch_size: int,
    progress: Progress = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Single-head patching of every head on every example (METHODS §10.1).

    ``clean_ids``/``ref_ids``: one sequence of model ids per example (equal length within an
    example); ``correct``/``incorrect``: model ids of the clean prompt's answers.
    Returns ``(clean_ld (N,), patched_ld (N, L, H))`` as float64, in input order; the drop is
    ``clean_ld[:, None, None] - patched_ld``. ``progress(k)`` reports k more heads done
    (``len(length_batches(...)) · L · H`` in all).
    """
    return _patch_in_batches(
        model, clean_ids, ref_ids, correct, incorrect, batch_size, progress, patch_batch
    )


def _patch_in_batches(model, clean_ids, ref_ids, correct, incorrect, batch_size, progress, run):
    """Group examples by length, run ``run(model, clean, ref, correct, incorrect, progress)``
    on each batch and scatter its ``(clean_ld, patched_ld)`` back into input order."""
    lengths = _check_pairs(clean_ids, ref_ids, correct, incorrect)
    device = _model_device(model)
    n = len(lengths)
    clean_ld = np.empty(n, dtype=np.float64)
    patched_ld = np.empty((n, model.cfg.n_layer, model.cfg.n_head), dtype=np.float64)
    correct_t = torch.as_tensor(np.asarray(correct, dtype=np.int64), device=device)
    incorrect_t = torch.as_tensor(np.asarray(incorrect, dtype=np.int64), device=device)
    for index in length_batches(lengths, batch_size):
        index_t = torch.as_tensor(index, device=device)
        ld, patched = run(
            model,
            _stack(clean_ids, index, device),
            _stack(ref_ids, index, device),
            correct_t[index_t],
            incorrect_t[index_t],
            progress,
        )
        clean_ld[index] = ld.cpu().numpy()
        patched_ld[index] = patched.cpu().numpy()
    return clean_ld, patched_ld


# --------------------------------------------------------------------------- fast engine
def _last_logit_difference(model: GPT) -> Callable | None:
    """``f(x, correct, incorrect) -> LD (R,) float64`` from the residual ``x`` (R, T, D)
    leaving the last block, computing only the two answer logits at the final position.

    Mirrors the model's own ``forward`` after its blocks: GPT (``ln_f`` then the tied
    ``wte``); multiscreen (unit-normalised tied ``wte`` scaled by ``exp(s_f)``). ``None`` for
    an unknown architecture (the caller falls back to the plain engine).
    """
    if isinstance(model, GPT) and hasattr(model, "ln_f"):

        def gpt(x, correct, incorrect):
            h = model.ln_f(model.hook_resid_final(x)[:, -1])  # (R, D)
            w = model.wte.weight[torch.stack([correct, incorrect], dim=1)]  # (R, 2, D)
            logits = torch.einsum("rd,rkd->rk", h, w).double()
            return logits[:, 0] - logits[:, 1]

        return gpt
    try:
        from headgeom.multiscreen import MultiscreenLM, unit
    except ImportError:  # pragma: no cover
        return None
    if isinstance(model, MultiscreenLM):

        def multiscreen(x, correct, incorrect):
            h = model.hook_resid_final(x)[:, -1]
            ids = torch.stack([correct, incorrect], dim=1)
            w = unit(model.wte.weight[ids], model.cfg.norm_eps)  # rows of unit(wte)
            logits = (torch.einsum("rd,rkd->rk", h, w) * torch.exp(model.s_f)).double()
            return logits[:, 0] - logits[:, 1]

        return multiscreen
    return None


def supports_fast(model: torch.nn.Module) -> bool:
    """Whether :func:`patch_all_heads_fast` runs its own path (else it falls back to plain)."""
    return _last_logit_difference(model) is not None and all(
        hasattr(b, "hook_resid_pre") and hasattr(getattr(b, "attn", None), "hook_z")
        for b in model.blocks
    )


@torch.no_grad()
def patch_batch_fast(
    model: GPT,
    clean: torch.Tensor,
    ref: torch.Tensor,
    correct: torch.Tensor,
    incorrect: torch.Tensor,
    max_rows: int = 4096,
    progress: Progress = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`patch_batch` computed by resumption and row-stacking (same results).

    One clean and one reference forward cache every layer's residual input and z. A patch
    of layer l starts from the cached clean residual entering block l (nothing before l
    depends on the patch) and runs blocks l..L−1 only. The H heads of a layer are stacked
    as row groups (row r = h·B + b patches head h of example b), at most ``max_rows`` rows
    per forward; only the two answer logits at the final position are computed.
    ``progress(H)`` is called after each layer.
    """
    ld_fn = _last_logit_difference(model)
    n_layer, n_head = model.cfg.n_layer, model.cfg.n_head
    z_names = z_sites(model)
    resid_names = [site(layer, "hook_resid_pre") for layer in range(n_layer)]
    logits, clean_cache = model.run_with_cache(clean, resid_names, last_only=True)
    clean_ld = logit_difference(logits, correct, incorrect)
    _, ref_cache = model.run_with_cache(ref, z_names, last_only=True)
    B = clean.shape[0]
    rows = torch.arange(B * n_head, device=clean.device)
    head_of_row, example_of_row = rows // B, rows % B
    patched = torch.empty(B * n_head, n_layer, dtype=torch.float64, device=clean.device)
    step = max(1, int(max_rows))
    for layer in range(n_layer):
        z_ref = ref_cache[z_names[layer]]  # (B, T, H, d)
        x_clean = clean_cache[resid_names[layer]]  # (B, T, D)
        for start in range(0, B * n_head, step):
            heads = head_of_row[start : start + step]
            examples = example_of_row[start : start + step]
            local = torch.arange(len(heads), device=clean.device)
            replacement = z_ref[examples, :, heads]  # (R, T, d)

            def swap(z, local=local, heads=heads, replacement=replacement):
                z = z.clone()
                z[local, :, heads] = replacement
                return z

            x = x_clean[examples]
            with model.hooks({z_names[layer]: swap}):
                for block in model.blocks[layer:]:
                    x = block(x)
            patched[start : start + step, layer] = ld_fn(x, correct[examples], incorrect[examples])
        if progress is not None:
            progress(n_head)
    return clean_ld, patched.view(n_head, B, n_layer).permute(1, 2, 0).contiguous()


def patch_all_heads_fast(
    model: GPT,
    clean_ids: Sequence[Sequence[int]],
    ref_ids: Sequence[Sequence[int]],
    correct: Sequence[int],
    incorrect: Sequence[int],
    batch_size: int,
    progress: Progress = None,
    max_rows: int = 4096,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`patch_all_heads` by the fast engine (:func:`patch_batch_fast`): same
    arguments, same ``(clean_ld (N,), patched_ld (N, L, H))`` and progress total, equal
    within fp32 round-off (1e-5). ``max_rows`` bounds the rows (head patches × examples)
    of one forward, hence memory. An architecture whose unembedding this module does not
    know (:func:`supports_fast`) runs the plain engine.

    Clean/reference prefix reuse (positions before the differing token) is not done: it
    would need key/value caching inside every reader, which the models do not expose.
    """
    if not supports_fast(model):
        return patch_all_heads(model, clean_ids, ref_ids, correct, incorrect, batch_size, progress)

    def run(model, clean, ref, correct, incorrect, progress):
        return patch_batch_fast(model, clean, ref, correct, incorrect, max_rows, progress)

    return _patch_in_batches(
        model, clean_ids, ref_ids, correct, incorrect, batch_size, progress, run
    )


# --------------------------------------------------------------------------- perturbations
@torch.no_grad()
def patch_perturbations(
    model: GPT, clean: torch.Tensor, ref: torch.Tensor, layer: int
) -> torch.Tensor:
    """δ_{i,t} = W_O^i (z^ref_{i,t} − z_{i,t}) for every head i of ``layer`` (METHODS §11.2).

    ``clean``/``ref``: model ids (B, T) of equal length. Returns float64
    (batch, position, head, d_model).
    """
    name = site(layer, "attn.hook_z")
    _, clean_cache = model.run_with_cache(clean, [name], last_only=True)
    _, ref_cache = model.run_with_cache(ref, [name], last_only=True)
    write_maps = model.blocks[layer].attn.writer.write_maps()
    return head_perturbations(write_maps, clean_cache[name], ref_cache[name])


@torch.no_grad()
def perturbation_check(
    model: GPT,
    clean: torch.Tensor,
    ref: torch.Tensor,
    layer: int,
    delta: torch.Tensor | None = None,
) -> float:
    """Check C8: max |(patched attn out − clean attn out) − δ_i| over heads, positions, batch.

    The patched attention output comes from the real z patch through the model's own writer
    (site ``blocks.{l}.hook_attn_out``); δ from :func:`patch_perturbations` (or ``delta``).
    Tolerance 1e-5 in float32 (METHODS §11.2, §18).
    """
    if delta is None:
        delta = patch_perturbations(model, clean, ref, layer)
    z_name, out_name = site(layer, "attn.hook_z"), site(layer, "hook_attn_out")
    _, ref_cache = model.run_with_cache(ref, [z_name], last_only=True)
    _, clean_cache = model.run_with_cache(clean, [out_name], last_only=True)
    worst = 0.0
    for head in range(model.cfg.n_head):
        with model.hooks({z_name: replace_head(head, ref_cache[z_name][:, :, head])}):
            _, patched_cache = model.run_with_cache(clean, [out_name], last_only=True)
        residual = (
            patched_cache[out_name].double() - clean_cache[out_name].double() - delta[:, :, head]
        )
        worst = max(worst, float(residual.abs().max()))
    return worst


@torch.no_grad()
def delta_patched_ld(
    model: GPT,
    clean: torch.Tensor,
    layer: int,
    delta: torch.Tensor,
    correct: torch.Tensor,
    incorrect: torch.Tensor,
) -> torch.Tensor:
    """LD (B, H) when δ_h is added to layer ``layer``'s attention output, one head at a time.

    This is the patch expressed as its residual perturbation rather than a z swap; its
    drops must reproduce the z-patch effects (check C9, METHODS §11.2).
    """
    out_name = site(layer, "hook_attn_out")
    lds = []
    for head in range(delta.shape[2]):
        with model.hooks({out_name: add_to(delta[:, :, head])}):
            lds.append(logit_difference(model(clean, last_only=True), correct, incorrect))
    return torch.stack(lds, dim=1)


@torch.no_grad()
def delta_patch_layer(
    model: GPT,
    clean: torch.Tensor,
    ref: torch.Tensor,
    correct: torch.Tensor,
    incorrect: torch.Tensor,
    layer: int,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Everything leakage needs from one batch and one layer (METHODS §11.2).

    Returns ``(delta, drops, c8)``: δ (B, T, H, D) float64 from :func:`patch_perturbations`;
    the drops LD_clean − LD_δ-patched (B, H) of :func:`delta_patched_ld` (check C9 compares
    their mean with the stored z-patch effects); and the C8 residual of
    :func:`perturbation_check`.
    """
    delta = patch_perturbations(model, clean, ref, layer)
    c8 = perturbation_check(model, clean, ref, layer, delta)
    clean_ld = logit_difference(model(clean, last_only=True), correct, incorrect)
    drops = clean_ld[:, None] - delta_patched_ld(model, clean, layer, delta, correct, incorrect)
    return delta, drops, c8


# --------------------------------------------------------------------------- task inputs
#: Columns of a task Parquet (``src/make_tasks.py``) that patching reads.
TASK_COLUMNS = (
    "example_id",
    "split",
    "condition",
    "lexical_group",
    "clean_ids",
    "ref_ids",
    "correct_id",
    "incorrect_id",
)


def metadata_text(metadata: dict[str, str], key: str, path: str | os.PathLike) -> str:
    """A string value of Parquet file metadata (raw or JSON-encoded); clear error if absent."""
    if key not in metadata:
        raise KeyError(f"{path}: Parquet file metadata has no {key!r} (keys: {sorted(metadata)})")
    raw = metadata[key]
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    return value if isinstance(value, str) else raw


@dataclass(frozen=True)
class TaskSplits:
    """Examples of the requested splits of a task file, in file order within each split."""

    frame: pd.DataFrame  # TASK_COLUMNS, one row per example
    schema: pa.Schema  # the task file's schema (column types are carried into results)
    dataset_sha256: str
    file_sha256: str


def read_task(path: str | os.PathLike, splits: Sequence[str]) -> TaskSplits:
    """Read a task Parquet, keeping ``splits`` (in that order); every split must be present."""
    from headgeom.hashing import sha256_file

    table = pq.read_table(path)
    missing = [c for c in TASK_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: task file lacks columns {missing}")
    frame = table.select(list(TASK_COLUMNS)).to_pandas()
    available = list(pd.unique(frame["split"]))
    absent = [s for s in splits if s not in available]
    if absent or not splits:
        raise ValueError(f"{path}: splits {absent or list(splits)} requested, file has {available}")
    if len(set(splits)) != len(splits):
        raise ValueError(f"splits {list(splits)} name a split twice")
    parts = [frame[frame["split"] == s] for s in splits]
    for part in parts:
        if part["example_id"].duplicated().any():
            raise ValueError(f"{path}: duplicate example_id within split {part['split'].iloc[0]!r}")
    return TaskSplits(
        frame=pd.concat(parts, ignore_index=True),
        schema=table.schema,
        dataset_sha256=metadata_text(read_parquet_metadata(path), "dataset_sha256", path),
        file_sha256=sha256_file(path),
    )


@dataclass(frozen=True)
class PatchInputs:
    """Model-id inputs of a patching run, one entry per example."""

    clean_ids: list[np.ndarray]
    ref_ids: list[np.ndarray]
    correct: np.ndarray
    incorrect: np.ndarray


def model_inputs(frame: pd.DataFrame, vocab: np.ndarray) -> PatchInputs:
    """Map a task frame's GPT-2 ids to model ids with the checkpoint's vocabulary map."""
    from headgeom.corpus import compact

    def ids(column: str) -> list[np.ndarray]:
        return [np.asarray(compact(np.asarray(x, dtype=np.int64), vocab)) for x in frame[column]]

    return PatchInputs(
        clean_ids=ids("clean_ids"),
        ref_ids=ids("ref_ids"),
        correct=np.asarray(compact(frame["correct_id"].to_numpy(np.int64), vocab)),
        incorrect=np.asarray(compact(frame["incorrect_id"].to_numpy(np.int64), vocab)),
    )


# --------------------------------------------------------------------------- effects tables
def drops_array(
    effects: pd.DataFrame, n_layers: int | None = None, n_heads: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-example drops of one split of an effects table as ``(example_ids, d (N, L, H))``.

    ``effects`` holds the rows of ``src/patch_heads.py`` for a single split (columns
    example_id, layer, head, effect). Examples keep their order of first appearance. The
    table must be complete: exactly one row per (example, layer, head).
    """
    if effects.empty:
        raise ValueError("no effect rows")
    n_layers = int(effects["layer"].max()) + 1 if n_layers is None else n_layers
    n_heads = int(effects["head"].max()) + 1 if n_heads is None else n_heads
    example_ids = pd.unique(effects["example_id"])
    if effects.duplicated(["example_id", "layer", "head"]).any():
        raise ValueError("effects name some (example, layer, head) more than once")
    if len(effects) != len(example_ids) * n_layers * n_heads:
        raise ValueError(
            f"effects are incomplete: {len(effects)} rows for {len(example_ids)} examples × "
            f"{n_layers} layers × {n_heads} heads"
        )
    layer, head = effects["layer"].to_numpy(np.int64), effects["head"].to_numpy(np.int64)
    if layer.min() < 0 or layer.max() >= n_layers or head.min() < 0 or head.max() >= n_heads:
        raise ValueError(f"effects name layers/heads outside the {n_layers}×{n_heads} model")
    example = pd.Index(example_ids).get_indexer(effects["example_id"])
    d = np.full((len(example_ids), n_layers, n_heads), np.nan)
    d[example, layer, head] = effects["effect"].to_numpy(np.float64)
    if np.isnan(d).any():
        raise ValueError("effects contain NaN drops")
    return np.asarray(example_ids), d

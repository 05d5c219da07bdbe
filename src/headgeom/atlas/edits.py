"""The atlas's edits (the article's definitions; ATLAS.md "Edits"), each a set of forward
hooks on the model's own modules, exact and undone on exit:

* **zero** — a block's write removed exactly: the write module's output is 0 (on Gemma the
  same as its post-norm weight 0, on Llama as its output projection 0);
* **average** — the write replaced by its mean over held-out tokens (:func:`write_means`) at
  every position but the first, which keeps its own write;
* **rows_mean** — an embedding table's looked-up row replaced by the table's mean row
  (:func:`table_mean`): the token embedding (``embed``), or one layer's slice of the
  per-layer-embedding table (``ple``): the branch stays, token identity is erased. The
  lookup's output is edited, not the table, so a tied unembedding is untouched;
* **skip** — all of a layer's blocks zeroed (Gemma 4's layer scalar still applies);
* **flatten_keys** — the key norm's output 0 (its weight 0 where the norm multiplies by its
  weight): every key is 0 and attention spreads evenly over the visible positions. Gemma 4's
  and Gemma 3n's KV-sharing layers reuse an earlier layer's keys, so the edit there reaches
  them; a layer without a key norm has no such edit;
* **everywhere** — ``layer=None``: the same edit in every layer at once (every layer that
  has the block or key norm; the whole per-layer-embedding row for ``rows_mean``).

An edit at layer l changes nothing before it (:attr:`Edit.start`), which is what
:mod:`headgeom.atlas.prefix` reuses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from headgeom.atlas.blocks import AtlasModel, Block

#: Edit kinds, and the targets each takes.
EDIT_TARGETS: Mapping[str, tuple[str, ...]] = {
    "zero": ("attn", "mlp", "ple"),
    "average": ("attn", "mlp", "ple"),
    "rows_mean": ("embed", "ple"),
    "skip": ("layer",),
    "flatten_keys": ("keys",),
}
EDITS = tuple(EDIT_TARGETS)
#: Positions the means average over (the article: every position but the first).
MEAN_POSITIONS = "t >= 1 of each window (position 0 excluded)"


@dataclass(frozen=True)
class Edit:
    """Edit ``kind`` (:data:`EDITS`) of ``target`` at ``layer``; ``layer=None`` is every
    layer at once (the token embedding has no layer)."""

    kind: str
    target: str
    layer: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in EDIT_TARGETS:
            raise ValueError(f"edit kind {self.kind!r}: expected one of {', '.join(EDITS)}")
        if self.target not in EDIT_TARGETS[self.kind]:
            raise ValueError(
                f"{self.kind} edits one of {', '.join(EDIT_TARGETS[self.kind])}, "
                f"not {self.target!r}"
            )
        if self.target == "embed" and self.layer is not None:
            raise ValueError("rows_mean of the token embedding has no layer (use layer=None)")

    @property
    def everywhere(self) -> bool:
        return self.layer is None and self.target != "embed"

    @property
    def start(self) -> int:
        """The first layer whose computation the edit changes."""
        return 0 if self.layer is None else self.layer

    @property
    def label(self) -> str:
        where = "all" if self.layer is None else f"L{self.layer}"
        if self.target == "embed":
            return f"{self.kind} embed"
        if self.target in ("layer", "keys"):
            return f"{self.kind} {where}"
        return f"{self.kind} {where}.{self.target}"


def atlas_edits(model: AtlasModel, kinds: Sequence[str] = EDITS, everywhere: bool = True):
    """Every edit of ``kinds`` the model has, layer by layer, then (``everywhere``) each in
    every layer at once; rows_mean of the token embedding once."""
    out: list[Edit] = []
    for kind in kinds:
        targets = [t for t in EDIT_TARGETS[kind] if t != "ple" or model.ple is not None]
        for target in targets:
            if target == "embed":
                out.append(Edit(kind, target))
                continue
            layers = range(model.n_layer)
            if target == "keys":
                layers = [ell for ell in layers if model.key_norm(ell) is not None]
            out += [Edit(kind, target, layer) for layer in layers]
            if everywhere and layers:
                out.append(Edit(kind, target, None))
    return out


# ----------------------------------------------------------------------------- means
@torch.no_grad()
def write_means(
    model: AtlasModel, windows: torch.Tensor, batch_size: int
) -> dict[Block, torch.Tensor]:
    """Each block's mean write (D,) float64 over the windows' positions t ≥ 1 (the held-out
    text of Average), from unedited forwards of ``batch_size`` windows at a time."""
    if windows.ndim != 2 or windows.shape[1] < 2:
        raise ValueError(
            f"windows {tuple(windows.shape)}: expected (n, T) with T ≥ 2 (position 0 is "
            "left out of the means)"
        )
    blocks = model.blocks()
    sums: dict[Block, torch.Tensor] = {}
    count = 0

    def adder(block: Block):
        def hook(module, args, out):
            s = out[:, 1:].double().sum(dim=(0, 1))
            sums[block] = sums[block] + s if block in sums else s

        return hook

    handles = [model.write_module(b).register_forward_hook(adder(b)) for b in blocks]
    try:
        for start in range(0, len(windows), batch_size):
            ids = windows[start : start + batch_size].to(model.device)
            model.logits(ids, last_only=True)
            count += ids.shape[0] * (ids.shape[1] - 1)
    finally:
        for handle in handles:
            handle.remove()
    return {b: (sums[b] / count).cpu() for b in blocks}


@torch.no_grad()
def table_mean(table: torch.nn.Module, chunk: int = 4096) -> torch.Tensor:
    """The mean (width,) float64 of an embedding module's output over every row it holds
    (``num_embeddings``): the table's mean row as the lookup returns it (with Gemma's
    embedding scale), summed ``chunk`` rows at a time."""
    n = int(table.num_embeddings)
    weight = next(table.parameters())
    total = torch.zeros(weight.shape[1], dtype=torch.float64, device=weight.device)
    for start in range(0, n, chunk):
        ids = torch.arange(start, min(n, start + chunk), device=weight.device)
        total += table(ids).double().sum(dim=0)
    return (total / n).cpu()


# ----------------------------------------------------------------------------- hooks
def _zero(module, args, out):
    return torch.zeros_like(out)


def _average(mean: torch.Tensor):
    def hook(module, args, out):
        out = out.clone()
        out[..., 1:, :] = mean.to(out)  # position 0 keeps its own write
        return out

    return hook


def _constant(value: torch.Tensor):
    def hook(module, args, out):
        return value.to(out).expand_as(out).clone()

    return hook


def _columns(value: torch.Tensor, cols: slice):
    def hook(module, args, out):
        out = out.clone()
        out[..., cols] = value[cols].to(out)
        return out

    return hook


def _layers(model: AtlasModel, edit: Edit) -> list[int]:
    if edit.layer is not None:
        if not 0 <= edit.layer < model.n_layer:
            raise ValueError(f"{edit.label}: the model has layers 0..{model.n_layer - 1}")
        return [edit.layer]
    return list(range(model.n_layer))


def edit_hooks(
    model: AtlasModel,
    edit: Edit,
    means: Mapping[Block, torch.Tensor] | None = None,
    tables: Mapping[str, torch.Tensor] | None = None,
) -> list[tuple[torch.nn.Module, object]]:
    """(module, forward hook) pairs that make ``edit``; ``means`` (:func:`write_means`) for
    Average, ``tables`` (``embed`` / ``ple`` -> :func:`table_mean`) for rows_mean. An edit
    the model cannot take is refused by name."""
    layers = _layers(model, edit)
    if edit.kind in ("zero", "average"):
        if edit.target == "ple" and model.ple is None:
            raise ValueError(f"{edit.label}: a {model.anatomy.name} model has no PLE branch")
        out = []
        for layer in layers:
            block = Block(layer, edit.target)
            if edit.kind == "zero":
                out.append((model.write_module(block), _zero))
                continue
            if means is None or block not in means:
                raise ValueError(f"{edit.label}: no mean write of {block.label} (write_means)")
            out.append((model.write_module(block), _average(means[block])))
        return out
    if edit.kind == "skip":
        return [(model.write_module(Block(layer, k)), _zero) for layer in layers
                for k in model.kinds]  # fmt: skip
    if edit.kind == "flatten_keys":
        norms = [(layer, model.key_norm(layer)) for layer in layers]
        missing = [layer for layer, norm in norms if norm is None]
        if edit.layer is not None and missing:
            raise ValueError(
                f"{edit.label}: layer {edit.layer} of this {model.anatomy.name} model has no "
                "key norm (no QK-norm, or it reuses an earlier layer's keys)"
            )
        found = [(norm, _zero) for _, norm in norms if norm is not None]
        if not found:
            raise ValueError(f"{edit.label}: this {model.anatomy.name} model has no key norm")
        return found
    # rows_mean
    mean = None if tables is None else tables.get(edit.target)
    if mean is None:
        raise ValueError(f"{edit.label}: no mean row of the {edit.target} table (table_mean)")
    if edit.target == "embed":
        return [(model.embedding(), _constant(mean))]
    table, width = model.ple_table(), model.ple_width
    if edit.layer is None:
        return [(table, _constant(mean))]
    return [(table, _columns(mean, slice(edit.layer * width, (edit.layer + 1) * width)))]


@contextlib.contextmanager
def applied(
    model: AtlasModel,
    edit: Edit | None,
    means: Mapping[Block, torch.Tensor] | None = None,
    tables: Mapping[str, torch.Tensor] | None = None,
) -> Iterator[None]:
    """``edit`` (None: nothing) in force for the duration; its hooks are removed on exit,
    even after an error."""
    pairs = [] if edit is None else edit_hooks(model, edit, means, tables)
    handles = []
    try:
        for module, hook in pairs:
            handles.append(module.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


def needed_tables(model: AtlasModel, edits: Sequence[Edit]) -> dict[str, torch.Tensor]:
    """The mean rows the rows_mean edits among ``edits`` need, each computed once."""
    targets = {e.target for e in edits if e.kind == "rows_mean"}
    out = {}
    if "embed" in targets:
        out["embed"] = table_mean(model.embedding())
    if "ple" in targets:
        out["ple"] = table_mean(model.ple_table())
    return out

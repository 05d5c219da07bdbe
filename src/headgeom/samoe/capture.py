"""One clean forward's record of every audit object (SAMOE §9), float32 by default.

The forward runs in the model's dtype; what the hooks see is cast to ``dtype`` (float32:
"states, logits and router weights are cast to float32 for attribution"), so the ledger
algebra is exact in float32 algebra, not bit-exact against a bf16 forward. Axes of every
field are in ``AXES``; ``layer`` runs over the N MoE layers, ``state_layer`` over the N + 1
states s_0 … s_N.

**Bounded memory** (paper-scale pools): :func:`captures` runs a pool ``batch_sequences``
sequences a forward (None: the whole pool in one, the toy's default) and ``fields`` records
only the sites an analysis reads, so peak memory is one chunk's record, not the pool's; the
analyses reduce each chunk (maxima, counts, per-token values kept) or keep a few tokens
(:func:`token_capture`: every field at the audited tokens only). A chunk's forward is the
model's own, but CPU kernels block a batch by its size, so a chunk of 1–2 sequences agrees
with the whole-pool forward to float32 rounding (~1e-6 on the logits of the test models),
not bitwise; with one chunk (the default) every result is bitwise the one-forward one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields

import torch

from headgeom.kernels import bitwise_requirement
from headgeom.samoe import checks
from headgeom.samoe.model import MoEModel, site, top_k

#: Explicit axes of each ``Capture`` field.
AXES: dict[str, tuple[str, ...]] = {
    "router_in": ("layer", "batch", "position", "d_model"),
    "logits": ("layer", "batch", "position", "expert"),
    "top_ids": ("layer", "batch", "position", "rank"),
    "top_logits": ("layer", "batch", "position", "rank"),
    "attn_out": ("layer", "batch", "position", "d_model"),
    "shared_out": ("layer", "batch", "position", "d_model"),
    "routed_out": ("layer", "batch", "position", "d_model"),
    "resid_final": ("batch", "position", "d_model"),
    "output_logits": ("batch", "position", "vocab"),
    "state": ("state_layer", "batch", "position", "state"),
    "write_proposal": ("layer", "batch", "position", "state"),
    "delta": ("layer", "batch", "position", "state"),
}
#: Clean experts kept per decision: e1, e2 (selected) and e3 (best excluded), SAMOE §0.
N_RANKED = 3


#: What ``capture(fields=…)`` may record, and the sites each needs; ``logits`` (with its Top-3)
#: is always recorded.
FIELD_SITES: dict[str, tuple[str, ...]] = {
    "router_in": ("hook_router_in",),
    "logits": ("hook_router_logits",),
    "attn_out": ("hook_attn_out",),
    "shared_out": ("hook_shared_out",),
    "routed_out": ("hook_routed_out",),
    "resid_final": (),
    "output_logits": (),
    "state": ("hook_state_in", "hook_state_out"),
    "write_proposal": ("hook_write_proposal",),
}
#: Fields whose first axis is ``batch`` (the others: ``layer`` or ``state_layer``, then batch).
_BATCH_FIRST = ("resid_final", "output_logits")


@dataclass
class Capture:
    """x_l, z_l, Top-3, block outputs and (state variants) s_0…s_N, u_l, Δ_l; see ``AXES``.
    A field not recorded (``capture(fields=…)``, or s and u of an Ordinary MoE) is None.

    A *token capture* (:func:`token_capture`, :meth:`select`) holds only some tokens: its
    batch axis runs over them (position axis of length 1) and ``tokens`` keeps each one's
    (batch, position) in the pool, so :meth:`where` maps targets onto it."""

    router_in: torch.Tensor | None
    logits: torch.Tensor
    top_ids: torch.Tensor  # int64
    top_logits: torch.Tensor
    attn_out: torch.Tensor | None = None
    shared_out: torch.Tensor | None = None
    routed_out: torch.Tensor | None = None
    resid_final: torch.Tensor | None = None
    output_logits: torch.Tensor | None = None
    state: torch.Tensor | None = None
    write_proposal: torch.Tensor | None = None
    tokens: tuple[torch.Tensor, torch.Tensor] | None = None  # (batch, position) (n,) each

    def where(
        self, batch: torch.Tensor, position: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Indices into the batch and position axes of the pool tokens (batch, position): the
        same on a pool capture; on a token capture, its own rows, which must be those tokens
        in that order (a token capture is made for one list of targets)."""
        if self.tokens is None:
            return batch, position
        b, t = self.tokens
        if not (torch.equal(b, batch.to(b.device)) and torch.equal(t, position.to(t.device))):
            raise ValueError("a token capture is indexed by the tokens it was made for, in order")
        return torch.arange(len(b), device=b.device), torch.zeros_like(t)

    def select(self, batch: torch.Tensor, position: torch.Tensor) -> Capture:
        """The token capture of the tokens (batch[i], position[i]) of this pool capture: every
        recorded field at those tokens, copied (bitwise the same values)."""

        def at(name: str, value: torch.Tensor | None) -> torch.Tensor | None:
            if value is None:
                return None
            b, t = batch.to(value.device), position.to(value.device)
            if name in _BATCH_FIRST:
                return value[b, t][:, None]
            return value[:, b, t][:, :, None]

        out = {f.name: at(f.name, getattr(self, f.name)) for f in dataclass_fields(self)
               if f.name != "tokens"}  # fmt: skip
        return Capture(**out, tokens=(batch.clone(), position.clone()))

    @property
    def delta(self) -> torch.Tensor | None:
        """Realised post-clamp writes Δ_l = s_{l+1} − s_l (layer, batch, position, state)."""
        return None if self.state is None else self.state[1:] - self.state[:-1]

    @property
    def n_layer(self) -> int:
        return self.logits.shape[0]


@torch.no_grad()
def capture(model: MoEModel, ids: torch.Tensor, dtype: torch.dtype = torch.float32,
            fields: Collection[str] | None = None) -> Capture:  # fmt: skip
    """One clean forward of ``ids`` (B, T) with every SAMOE §9 site recorded in ``dtype``, on
    the model's device (``ids`` are moved there; so is every field of the capture); only
    ``fields`` (names of ``FIELD_SITES``; the router logits always) when given."""
    N = len(model.blocks)
    ids = ids.to(model.wte.weight.device)
    if fields is None:
        fields = set(FIELD_SITES)
    elif unknown := set(fields) - set(FIELD_SITES):
        raise KeyError(f"unknown capture fields {sorted(unknown)}; known: {sorted(FIELD_SITES)}")
    fields = {*fields, "logits"}
    if not model.has_state:
        fields -= {"state", "write_proposal"}
    names = [n for f in FIELD_SITES if f in fields for n in FIELD_SITES[f]]
    cache: dict[str, torch.Tensor] = {}

    def saver(key: str):
        def save(a: torch.Tensor) -> None:
            cache[key] = a.detach().to(dtype)

        return save

    fns = {site(i, n): saver(site(i, n)) for i in range(N) for n in names}
    if "resid_final" in fields:
        fns["hook_resid_final"] = saver("hook_resid_final")
    with model.hooks(fns):
        out = model(ids)

    def stacked(name: str) -> torch.Tensor | None:
        if site(0, name) not in cache:
            return None
        return torch.stack([cache[site(i, name)] for i in range(N)])

    z = stacked("hook_router_logits")  # (N, B, T, E)
    top_ids, top_logits = top_k(z, N_RANKED)
    state = None
    if "state" in fields:
        # s_0 then s_{l+1} as each layer left it: the state the next router reads.
        state = torch.stack([cache[site(0, "hook_state_in")],
                             *(cache[site(i, "hook_state_out")] for i in range(N))])  # fmt: skip
    return Capture(
        router_in=stacked("hook_router_in"),
        logits=z,
        top_ids=top_ids,
        top_logits=top_logits,
        attn_out=stacked("hook_attn_out"),
        shared_out=stacked("hook_shared_out"),
        routed_out=stacked("hook_routed_out"),
        resid_final=cache.get("hook_resid_final"),
        output_logits=out.detach().to(dtype) if "output_logits" in fields else None,
        state=state,
        write_proposal=stacked("hook_write_proposal"),
    )


def chunks(n_sequences: int, batch_sequences: int | None) -> list[slice]:
    """The pool's sequences ``batch_sequences`` at a time (None: all of them in one)."""
    if batch_sequences is not None and batch_sequences < 1:
        raise ValueError(f"batch_sequences must be ≥ 1 or None, got {batch_sequences}")
    step = max(n_sequences, 1) if batch_sequences is None else batch_sequences
    return [slice(lo, min(lo + step, n_sequences)) for lo in range(0, n_sequences, step)]


def captures(model: MoEModel, ids: torch.Tensor, batch_sequences: int | None = None,
             fields: Collection[str] | None = None,
             dtype: torch.dtype = torch.float32) -> Iterator[tuple[slice, Capture]]:  # fmt: skip
    """(the chunk's rows of ``ids``, its capture) for each chunk of ``batch_sequences``
    sequences (:func:`chunks`): one chunk's record lives at a time."""
    for part in chunks(len(ids), batch_sequences):
        yield part, capture(model, ids[part], dtype, fields)


def token_capture(model: MoEModel, ids: torch.Tensor, batch: torch.Tensor,
                  position: torch.Tensor, batch_sequences: int | None = None,
                  fields: Collection[str] | None = None, dtype: torch.dtype = torch.float32,
                  each: Callable[[Capture], None] | None = None) -> Capture:  # fmt: skip
    """The token capture (:meth:`Capture.select`) of the tokens (batch[i], position[i]) of
    ``ids``, made chunk by chunk; ``each(chunk capture)`` sees every chunk's whole record
    first (the checks over every decision). One chunk gives bitwise ``capture(…).select(…)``."""
    # a tensor keeps its device (as_tensor would follow a default-device context)
    batch, position = (v.long() if isinstance(v, torch.Tensor) else torch.as_tensor(v).long()
                       for v in (batch, position))  # fmt: skip
    if not len(batch):
        raise ValueError("a token capture needs at least one token")
    parts, where = [], []
    for part, cap in captures(model, ids, batch_sequences, fields, dtype):
        if each is not None:
            each(cap)
        inside = ((batch >= part.start) & (batch < part.stop)).nonzero(as_tuple=True)[0]
        if len(inside):
            parts.append(cap.select(batch[inside] - part.start, position[inside]))
            where.append(inside)
        del cap
    order = torch.argsort(torch.cat(where))  # chunk order -> the tokens' order

    def joined(name: str) -> torch.Tensor | None:
        values = [getattr(p, name) for p in parts]
        if values[0] is None:
            return None
        axis = 0 if name in _BATCH_FIRST else 1
        both = torch.cat(values, axis)
        return both.index_select(axis, order.to(both.device))

    out = {f.name: joined(f.name) for f in dataclass_fields(Capture) if f.name != "tokens"}
    return Capture(**out, tokens=(batch.clone(), position.clone()))


# --------------------------------------------------------------------------- K1, K2
def check_step0(
    latest: Capture | Sequence[Capture], persistent: Capture | Sequence[Capture]
) -> dict:
    """K1 (SAMOE §5.4): at step 0 every realised write of both state variants is exactly 0
    and their router logits are bitwise equal (captures of the same ids; or lists of the
    chunk captures of the same ids, paired in order: the counts add). On the CPU bitwise
    needs MKL's reproducible mode (the kernel pin); a failure says so where it is off."""
    if isinstance(latest, Capture):
        latest, persistent = [latest], [persistent]
    nonzero = sum(int(torch.count_nonzero(c.delta)) for c in (*latest, *persistent))
    differ = sum(int((a.logits != b.logits).sum())
                 for a, b in zip(latest, persistent, strict=True))  # fmt: skip
    return {
        **checks.enforce("K1.writes", nonzero, 0, "count", what="nonzero step-0 writes"),
        **checks.enforce("K1.logits", differ, 0, "count",
                         what="step-0 router logits differing between P and LWO",
                         needs=cpu_bitwise(latest[0].logits)),
    }  # fmt: skip


def cpu_bitwise(tensor: torch.Tensor) -> str | None:
    """What a bit-for-bit comparison of ``tensor``'s forwards relies on: on the CPU, MKL's
    reproducible mode (:func:`headgeom.kernels.bitwise_requirement`); nothing to name on a
    GPU."""
    return bitwise_requirement() if tensor.device.type == "cpu" else None


#: The bound on |s| of each state variant: P's clamp; LWO's tanh.
def state_bound(variant: str, clamp: float) -> float:
    return {"persistent": float(clamp), "latest": 1.0}[variant]


def check_state_bounds(cap: Capture, variant: str, clamp: float) -> dict:
    """K2 (SAMOE §5.4): |s| ≤ c (P) and |s| ≤ 1 (LWO) at every capture; the residual is
    the largest excess over the bound (0 when inside)."""
    return _check_bound(float(cap.state.abs().max()), variant, clamp)


def _check_bound(max_abs: float, variant: str, clamp: float) -> dict:
    excess = max(max_abs - state_bound(variant, clamp), 0.0)
    return checks.enforce("K2", excess, 0.0, what=f"{variant} state beyond its bound")


# --------------------------------------------------------------------------- state geometry
def state_geometry(cap: Capture, clamp: float) -> list[dict]:
    """Per layer l (the state s_l a router reads, l = 0…N−1): mean ‖s_l‖₂ over tokens and
    the fraction of its coordinates at the clamp (|s| = c; SAMOE §18, paper App. C.5)."""
    if cap.state is None:
        raise ValueError("state geometry needs a state variant (latest or persistent)")
    pool = PoolStates(clamp)
    pool.add(cap)
    return pool.geometry()


class PoolStates:
    """K2 and the state geometry of a pool, gathered chunk by chunk (:func:`captures`): the
    largest |s|, each token's ‖s_l‖₂ (N, B, T; small beside the states) and per layer the
    count of coordinates at the clamp, so the results are those of one capture of the pool."""

    def __init__(self, clamp: float):
        self.clamp = clamp
        self.max_abs = float("-inf")
        self.norms: list[torch.Tensor] = []  # (N, b, T) per chunk
        self.at_clamp: list[int] | None = None
        self.n_coords = 0

    def add(self, cap: Capture) -> None:
        if cap.state is None:
            raise ValueError("state geometry needs a state variant (latest or persistent)")
        self.max_abs = max(self.max_abs, float(cap.state.abs().max()))
        self.norms.append(torch.stack([cap.state[layer].norm(dim=-1)
                                       for layer in range(cap.n_layer)]))  # fmt: skip
        counts = [int((cap.state[layer].abs() >= self.clamp).sum()) for layer in range(cap.n_layer)]
        self.at_clamp = counts if self.at_clamp is None else [
            a + b for a, b in zip(self.at_clamp, counts, strict=True)]  # fmt: skip
        self.n_coords += cap.state[0].numel()

    def check_bounds(self, variant: str) -> dict:
        """K2 over every chunk (the largest |s| is the pool's)."""
        return _check_bound(self.max_abs, variant, self.clamp)

    def geometry(self) -> list[dict]:
        """Per layer l: mean ‖s_l‖₂ over the pool's tokens and the fraction at the clamp."""
        norms = torch.cat(self.norms, 1)  # (N, B, T), the pool's token order
        return [{"layer": layer, "mean_norm": float(norms[layer].mean()),
                 "clamp_fraction": self.at_clamp[layer] / self.n_coords}
                for layer in range(len(norms))]  # fmt: skip

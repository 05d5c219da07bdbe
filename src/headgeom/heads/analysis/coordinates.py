"""Coordinate concentration (docs §15.2, paper App. B.2): single-direction patches at the
best head's layer l* and the final input position.

Two sites, one direction at a time, the rest of the forward clean:

* **after W_O** (``after_wo``): residual coordinate c ∈ 0..D−1 of layer l*'s attention
  output (site ``blocks.{l*}.hook_attn_out``: Σ_h W_O^h z^h + b_O, before the residual add)
  is replaced by its value on the reference prompt, a_c ← a_c^ref;
* **before W_O** (``before_wo``): internal direction r_{h,k} of head h (coordinate k of its
  z, site ``blocks.{l*}.attn.hook_z``), z_h ← z_h + r r^T (z_h^ref − z_h); with r = e_k this
  replaces coordinate k by its reference value. H·d directions (768 at paper shape).
  ``before_wo_rotated``: the same with r_{h,k} = R_h e_k, R_h one Haar-random d×d
  orthogonal matrix per head (the within-head rotation control, recorded seed).

The effect of a direction is the mean drop of the logit difference LD_clean − LD_patched.
The **top-10 share** is Σ of the drops of the 10 selected directions / Σ of all positive
drops (a share of single-direction effects, not a joint intervention). Directions are
selected on the validation split (largest mean drop) and the share is reported on the
evaluation split [CHOICE, docs §15.2]; the in-sample share is validation on validation.
The null: 1,000 random sets of 10 directions of the same site matched to the selected set
by decile of mean |patch difference| (|a_c^ref − a_c| after W_O, |r^T(z^ref − z)| before),
deciles on validation, drawn with a recorded seed from each decile *without* the selected
directions [CHOICE, docs §15.2] (a decile too small for that is merged with its neighbour:
:func:`null_strata`); Monte Carlo p = (1 + #{sets with share ≥ selected}) / (1 + n_sets).

Batching: a patch acts at the final position only, so positions < T−1 stay clean in every
layer; all directions of one site are rows (direction-major, row g·B + b) of one forward
resumed at l* on the final position, attending to the cached clean keys/values of the
prefix (``Block.after_attn``, ``Block.forward_suffix``). Architectures without the
KV-prefix forward (the registry's ``prefix_reuse``; every registered one has it, multiscreen's
tiles included) resume at l* on the whole sequence with the patched attention output set by a
hook. :func:`direction_drops_naive` is the reference: one full
hooked forward per direction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from headgeom.heads.analysis import stats
from headgeom.heads.analysis.batching import check_pairs, length_batches, model_device, stack_rows
from headgeom.heads.analysis.patching import logit_difference, supports_prefix_reuse
from headgeom.model.gpt import site
from headgeom.subspace import haar_orthogonal

SITES = ("after_wo", "before_wo", "before_wo_rotated")
TOP_K = 10
N_DECILES = 10


# --------------------------------------------------------------------------- directions
def head_rotations(n_head: int, d_head: int, seed: int) -> np.ndarray:
    """(H, d, d): one Haar matrix R_h per head, in head order, from Generator(PCG64(seed))."""
    rng = np.random.default_rng(seed)
    return np.stack([haar_orthogonal(d_head, rng) for _ in range(n_head)])


def identity_bases(n_head: int, d_head: int) -> np.ndarray:
    return np.broadcast_to(np.eye(d_head), (n_head, d_head, d_head)).copy()


def direction_attn_out(writer, z: torch.Tensor, z_ref: torch.Tensor, bases: torch.Tensor):
    """Layer attention output at the final position (G, B, D) for every internal direction
    j = h·d + k (G = H·d): head h's z moves by r r^T (z_ref − z), r = bases[h, :, k].
    ``z``/``z_ref`` (B, H, d) are the final position's; ``bases`` (H, d, d) columns are the
    directions. Also returns the magnitudes |r^T (z_ref − z)| (G, B)."""
    H, d = z.shape[1], z.shape[2]
    r = bases.permute(0, 2, 1).reshape(H * d, d).to(z.dtype)  # row j = direction (h, k)
    heads = torch.arange(H, device=z.device).repeat_interleave(d)
    dz = (z_ref - z)[:, heads]  # (B, G, d)
    coef = torch.einsum("bgd,gd->gb", dz, r)  # (G, B)
    rows = z.expand(H * d, *z.shape).clone()  # (G, B, H, d)
    rows[torch.arange(H * d), :, heads] += coef[..., None] * r[:, None, :]
    return writer(rows), coef.abs()


def coordinate_attn_out(a: torch.Tensor, a_ref: torch.Tensor):
    """Attention output (G, B, D) for every residual coordinate c (G = D): a with
    coordinate c set to a_ref's; and the magnitudes |a_ref_c − a_c| (G, B)."""
    D = a.shape[1]
    eye = torch.eye(D, dtype=a.dtype, device=a.device)
    rows = a[None] + eye[:, None, :] * (a_ref - a)[None]
    return rows, (a_ref - a).abs().T


# --------------------------------------------------------------------------- engine
@dataclass
class _Batch:
    clean_ld: torch.Tensor  # (B,)
    cache: dict
    a: torch.Tensor  # (B, D) final-position attention output, clean
    a_ref: torch.Tensor
    z: torch.Tensor  # (B, H, d)
    z_ref: torch.Tensor


def _caches(model, layer: int, clean, ref, correct, incorrect, reuse: bool) -> _Batch:
    L = model.cfg.n_layer
    names = [site(layer, n) for n in ("hook_resid_pre", "hook_attn_out", "attn.hook_z")]
    if reuse:
        names += [site(m, f"attn.hook_{x}") for m in range(layer + 1, L) for x in "kv"]
    logits, cc = model.run_with_cache(clean, names, last_only=True)
    _, rc = model.run_with_cache(ref, names[1:3], last_only=True)
    a, z = (cc[site(layer, n)][:, -1] for n in ("hook_attn_out", "attn.hook_z"))
    a_ref, z_ref = (rc[site(layer, n)][:, -1] for n in ("hook_attn_out", "attn.hook_z"))
    return _Batch(logit_difference(logits, correct, incorrect), cc, a, a_ref, z, z_ref)


def _resume_ld(model, layer, batch: _Batch, attn_out, correct, incorrect, reuse, clean):
    """LD (G·B,) with layer ``layer``'s final-position attention output set to ``attn_out``
    (G, B, D); row g·B + b continues example b."""
    G, B = attn_out.shape[:2]
    L = model.cfg.n_layer
    cc = batch.cache
    ids = torch.stack([correct, incorrect], 1).repeat(G, 1)
    if reuse:
        x = cc[site(layer, "hook_resid_pre")][:, -1:].expand(G, B, 1, -1).flatten(0, 1)
        x = model.blocks[layer].after_attn(x, attn_out.flatten(0, 1)[:, None])
        T = cc[site(layer, "hook_resid_pre")].shape[1]
        for m in range(layer + 1, L):
            past_k = cc[site(m, "attn.hook_k")][:, : T - 1]
            past_v = cc[site(m, "attn.hook_v")][:, : T - 1]
            x, _, _ = model.blocks[m].forward_suffix(x, past_k, past_v, last_only=True)
    else:
        new = attn_out.flatten(0, 1)

        def swap(t):
            t = t.clone()
            t[:, -1] = new.to(t.dtype)
            return t

        x = cc[site(layer, "hook_resid_pre")].expand(G, *clean.shape, -1).flatten(0, 1)
        with model.hooks({site(layer, "hook_attn_out"): swap}):
            for block in model.blocks[layer:]:
                x = block(x)
    logits = model.answer_logits(x, ids).double()
    return logits[:, 0] - logits[:, 1]


@torch.no_grad()
def direction_drops(
    model,
    clean_ids: Sequence,
    ref_ids: Sequence,
    correct: Sequence[int],
    incorrect: Sequence[int],
    layer: int,
    rotations: np.ndarray | None,
    batch_size: int,
    max_rows: int,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """site -> (drops (N, G), magnitudes (N, G)) float64 for every direction of every site
    of :data:`SITES` at ``layer`` (``before_wo_rotated`` only when ``rotations`` (H, d, d)
    is given). ``max_rows`` bounds the direction × example rows of one forward."""
    lengths = check_pairs(clean_ids, ref_ids, correct, incorrect)
    device = model_device(model)
    dtype = next(model.parameters()).dtype
    reuse = supports_prefix_reuse(model)
    H, d = model.cfg.n_head, model.cfg.d_head
    bases = {"before_wo": torch.as_tensor(identity_bases(H, d), device=device)}
    if rotations is not None:
        bases["before_wo_rotated"] = torch.as_tensor(np.asarray(rotations), device=device)
    writer = model.blocks[layer].attn.writer
    correct_t = torch.as_tensor(np.array(correct, dtype=np.int64), device=device)
    incorrect_t = torch.as_tensor(np.array(incorrect, dtype=np.int64), device=device)
    out: dict[str, list] = {}
    N = len(lengths)
    for index in length_batches(lengths, batch_size):
        clean, ref = stack_rows(clean_ids, index, device), stack_rows(ref_ids, index, device)
        good, bad = correct_t[index], incorrect_t[index]
        batch = _caches(model, layer, clean, ref, good, bad, reuse)
        B = len(index)
        sites = {"after_wo": coordinate_attn_out(batch.a, batch.a_ref)}
        for name, basis in bases.items():
            sites[name] = direction_attn_out(writer, batch.z, batch.z_ref, basis.to(dtype))
        per = max(1, int(max_rows) // B)
        for name, (attn_out, magnitude) in sites.items():
            G = attn_out.shape[0]
            if name not in out:
                out[name] = [np.empty((N, G)), np.empty((N, G))]
            ld = torch.cat([
                _resume_ld(model, layer, batch, attn_out[g : g + per], good, bad, reuse, clean)
                for g in range(0, G, per)
            ]).view(G, B)  # fmt: skip
            out[name][0][index] = (batch.clean_ld[None] - ld).T.cpu().numpy()
            out[name][1][index] = magnitude.T.double().cpu().numpy()
    return {k: (v[0], v[1]) for k, v in out.items()}


@torch.no_grad()
def direction_drops_naive(
    model,
    clean_ids,
    ref_ids,
    correct,
    incorrect,
    layer: int,
    bases: np.ndarray | None = None,
    limit: int | None = None,
) -> dict[str, np.ndarray]:
    """The reference: one full hooked forward per direction and example. ``after_wo``:
    a hook on ``hook_attn_out`` sets coordinate c at the final position to the reference
    run's; ``before_wo``: a hook on ``hook_z`` moves head h's final z by r r^T (z_ref − z),
    r = bases[h, :, k] (default the coordinate axes). site -> drops (N, G); with ``limit``
    only the first ``limit`` directions of each site (G = limit; for benchmarks)."""
    H, d, D = model.cfg.n_head, model.cfg.d_head, model.cfg.d_model
    bases = identity_bases(H, d) if bases is None else np.asarray(bases)
    a_site, z_site = site(layer, "hook_attn_out"), site(layer, "attn.hook_z")
    n_after, n_before = (D, H * d) if limit is None else (min(limit, D), min(limit, H * d))
    out = {
        "after_wo": np.empty((len(clean_ids), n_after)),
        "before_wo": np.empty((len(clean_ids), n_before)),
    }
    device = model_device(model)
    for i in range(len(clean_ids)):
        clean = torch.as_tensor(np.asarray(clean_ids[i])[None], device=device)
        ref = torch.as_tensor(np.asarray(ref_ids[i])[None], device=device)
        good = torch.as_tensor([int(correct[i])], device=device)
        bad = torch.as_tensor([int(incorrect[i])], device=device)
        base = float(logit_difference(model(clean, last_only=True), good, bad)[0])
        _, rc = model.run_with_cache(ref, [a_site, z_site], last_only=True)
        for c in range(n_after):

            def set_c(t, c=c, rc=rc):
                t = t.clone()
                t[:, -1, c] = rc[a_site][:, -1, c]
                return t

            with model.hooks({a_site: set_c}):
                ld = logit_difference(model(clean, last_only=True), good, bad)
            out["after_wo"][i, c] = base - float(ld[0])
        for j in range(n_before):
            h, k = divmod(j, d)
            r = torch.as_tensor(bases[h, :, k], device=device)

            def move(t, h=h, r=r, rc=rc):
                t = t.clone()
                dz = rc[z_site][:, -1, h] - t[:, -1, h]
                t[:, -1, h] += (dz @ r.to(t.dtype))[:, None] * r.to(t.dtype)
                return t

            with model.hooks({z_site: move}):
                ld = logit_difference(model(clean, last_only=True), good, bad)
            out["before_wo"][i, j] = base - float(ld[0])
    return out


# --------------------------------------------------------------------------- shares
def top_directions(effect: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """Indices of the ``k`` largest mean drops (ties by index)."""
    e = np.asarray(effect, dtype=np.float64)
    return np.lexsort((np.arange(e.size), -e))[:k]


def share(effect: np.ndarray, chosen: np.ndarray) -> float:
    """Σ_{c ∈ chosen} effect_c / Σ_c max(effect_c, 0) (NaN when no drop is positive)."""
    e = np.asarray(effect, dtype=np.float64)
    positive = e[e > 0].sum()
    return float(e[np.asarray(chosen)].sum() / positive) if positive > 0 else float("nan")


def top_share(effect: np.ndarray, k: int = TOP_K) -> float:
    """In-sample top-k share: the k largest drops over all positive drops."""
    return share(effect, top_directions(effect, k))


def deciles(magnitude: np.ndarray, n: int = N_DECILES) -> np.ndarray:
    """Decile (0 smallest .. n−1) of every entry by rank: floor(n · rank / G), ties by index."""
    m = np.asarray(magnitude, dtype=np.float64)
    rank = np.empty(m.size, dtype=np.int64)
    rank[np.lexsort((np.arange(m.size), m))] = np.arange(m.size)
    return (n * rank) // m.size


def null_strata(
    magnitude: np.ndarray, chosen: np.ndarray, site_name: str = "site"
) -> list[list[int]]:
    """The strata the matched null draws from: the magnitude deciles, each drawn from without
    the chosen directions [CHOICE, docs §15.2]. A decile with fewer unchosen directions than
    the chosen set has in it is merged with the stratum above it (larger magnitudes, the
    side that makes the selected set harder to beat), the top stratum with the one below
    (the only neighbour it has), the highest short stratum first, until every stratum can
    supply its count. At paper shape (76–77 directions per decile, 10 chosen) nothing can be
    merged; at demo shape (6–7 per decile) the top deciles may be. Lists of decile indices,
    ascending; a site with fewer than 2k directions has no such null (ValueError)."""
    q = deciles(magnitude)
    chosen = np.asarray(chosen)
    unchosen = np.ones(q.size, dtype=bool)
    unchosen[chosen] = False
    need = np.bincount(q[chosen], minlength=N_DECILES)
    spare = np.bincount(q[unchosen], minlength=N_DECILES)
    if spare.sum() < need.sum():
        raise ValueError(
            f"coordinates site {site_name}: {q.size} directions leave {spare.sum()} outside the "
            f"selected set, fewer than the {need.sum()} a matched random set needs"
        )
    strata = [[b] for b in range(N_DECILES)]
    while short := [i for i, s in enumerate(strata) if spare[s].sum() < need[s].sum()]:
        i = short[-1]
        j = i - 1 if i == len(strata) - 1 else i + 1
        lo, hi = min(i, j), max(i, j)
        strata[lo : hi + 1] = [strata[lo] + strata[hi]]
    return strata


def strata_label(strata: Sequence[Sequence[int]]) -> str:
    """The strata as text, e.g. ``0,1,2,3,4,5,6,7,8+9``: merged deciles joined by "+"."""
    return ",".join("+".join(map(str, s)) for s in strata)


def matched_random_sets(
    magnitude: np.ndarray,
    chosen: np.ndarray,
    n_sets: int,
    rng: np.random.Generator,
    include_selected: bool = False,
    site_name: str = "site",
) -> np.ndarray:
    """(n_sets, len(chosen)) random direction sets, each with as many members from every
    stratum of :func:`null_strata` as ``chosen`` has, drawn uniformly without replacement
    within a set from the stratum's directions outside ``chosen`` [CHOICE, docs §15.2].

    ``include_selected=True`` is the earlier draw, kept for comparison: strata are the plain
    deciles and the chosen directions are in the pool, so with small deciles a random set
    can be the chosen set itself and the chosen set can never beat every one."""
    q = deciles(magnitude)
    chosen = np.asarray(chosen)
    pool = np.ones(q.size, dtype=bool)
    if include_selected:
        strata = [[b] for b in range(N_DECILES)]
    else:
        strata = null_strata(magnitude, chosen, site_name)
        pool[chosen] = False
    parts = []
    for stratum in strata:
        in_stratum = np.isin(q, stratum)
        need = int(np.count_nonzero(in_stratum[chosen]))
        if need:  # the first `need` of a uniform random order of the pool, per set
            members = np.flatnonzero(in_stratum & pool)
            order = np.argsort(rng.random((n_sets, members.size)), axis=1)
            parts.append(members[order[:, :need]])
    return np.concatenate(parts, axis=1)


def null_comparison(selected: float, null: np.ndarray) -> dict:
    """The selected share against the null shares: the Monte Carlo p-value
    p = (1 + #{sets with share ≥ selected}) / (1 + n_sets) (Phipson & Smyth 2010; ties within
    :data:`stats.TIE_RTOL` relative count as ≥) and whether it beats every set
    (selected > every set's share, i.e. p = 1/(1 + n_sets)). NaN p and False when the
    share is undefined (no positive drop)."""
    null = np.asarray(null, dtype=np.float64)
    if not np.isfinite(selected):
        return {"p_value": float("nan"), "fraction_at_least": float("nan"), "beats": False}
    at_least = int(np.count_nonzero(null >= selected - stats.TIE_RTOL * abs(selected)))
    return {"p_value": (1 + at_least) / (1 + null.size),
            "fraction_at_least": at_least / null.size, "beats": at_least == 0}  # fmt: skip


def site_summary(
    drops_val: np.ndarray,
    drops_eval: np.ndarray,
    magnitude_val: np.ndarray,
    n_sets: int,
    seed: int,
    k: int = TOP_K,
    site_name: str = "site",
) -> dict:
    """The shares and the matched null of one site from per-example drops (N, G) of the
    validation and evaluation splits and validation magnitudes (N, G). The null draws with
    ``Generator(PCG64(seed))`` from the deciles without the selected directions; the earlier
    draw (selected included, ``null_incl_selected_*``) from a second generator of the same
    seed, so its numbers equal the earlier release's."""
    e_val, e_eval = drops_val.mean(0), drops_eval.mean(0)
    magnitude = magnitude_val.mean(0)
    chosen = top_directions(e_val, k)
    selected = share(e_eval, chosen)
    positive = e_eval[e_eval > 0].sum()

    # a site with fewer unselected directions than selected ones (a micro model) has no
    # matched null: its null columns are NaN and it beats nothing, rather than failing
    has_null = e_val.size - chosen.size >= chosen.size

    def shares(include_selected):
        if not has_null or positive <= 0:
            return np.full(n_sets, np.nan)
        rng = np.random.default_rng(seed)
        sets = matched_random_sets(magnitude, chosen, n_sets, rng, include_selected, site_name)
        return e_eval[sets].sum(1) / positive

    null, old = shares(False), shares(True)
    nan = np.all(np.isnan(null))
    no_test = {"p_value": float("nan"), "fraction_at_least": float("nan"), "beats": False}
    test, test_old = (
        (null_comparison(selected, null), null_comparison(selected, old)) if not nan
        else (no_test, no_test)
    )  # fmt: skip
    return {
        "n_directions": int(e_val.size),
        "k": int(k),
        "share_evaluation": selected,
        "share_in_sample": top_share(e_val, k),
        "share_evaluation_in_sample": top_share(e_eval, k),
        "positive_sum_evaluation": float(positive),
        "total_evaluation": float(e_eval.sum()),
        "top_directions": ",".join(map(str, chosen.tolist())),
        "null_mean": float("nan") if nan else float(np.mean(null)),
        "null_p95": float("nan") if nan else float(np.percentile(null, 95)),
        "null_max": float("nan") if nan else float(np.max(null)),
        "null_fraction_at_least": test["fraction_at_least"],
        "null_p_value": test["p_value"],
        "beats_every_random_set": test["beats"],
        "null_strata": (
            strata_label(null_strata(magnitude, chosen, site_name))
            if has_null
            else f"none: {e_val.size} directions, {chosen.size} selected"
        ),
        "null_incl_selected_mean": float("nan") if nan else float(np.mean(old)),
        "null_incl_selected_max": float("nan") if nan else float(np.max(old)),
        "null_incl_selected_p_value": test_old["p_value"],
        "n_random_sets": int(n_sets),
    }


# --------------------------------------------------------------------------- one run
def best_head(e: np.ndarray) -> tuple[int, int]:
    """The top head by signed evaluation effect e (L, H), ties by (layer, head)."""
    flat = np.asarray(e, dtype=np.float64).reshape(-1)
    i = int(np.lexsort((np.arange(flat.size), -flat))[0])
    return i // e.shape[1], i % e.shape[1]


def coordinate_rows(
    model,
    e: np.ndarray,
    validation,
    evaluation,
    n_sets: int,
    null_seed: int,
    rotation_seed: int,
    batch_size: int,
    max_rows: int,
) -> list[dict]:
    """The rows of one task (docs §15.2): ``e`` (L, H) its evaluation effects, ``validation``
    and ``evaluation`` ``ModelInputs`` of the two splits. (one summary row per site, one row
    per direction of every site: :func:`direction_rows`)."""
    layer, head = best_head(e)
    rot = head_rotations(model.cfg.n_head, model.cfg.d_head, rotation_seed)

    def drops(inputs):
        return direction_drops(model, inputs.clean_ids, inputs.ref_ids, inputs.correct,
                               inputs.incorrect, layer, rot, batch_size, max_rows)  # fmt: skip

    val, ev = drops(validation), drops(evaluation)
    rows, directions = [], []
    for name in SITES:
        summary = site_summary(
            val[name][0], ev[name][0], val[name][1], n_sets, null_seed, site_name=name
        )
        rows.append({
            "site": name, "best_layer": layer, "best_head": head,
            "best_effect": float(e[layer, head]), "n_validation": len(val[name][0]),
            "n_evaluation": len(ev[name][0]), **summary, "null_seed": null_seed,
            "rotation_seed": rotation_seed,
        })  # fmt: skip
        directions += direction_rows(name, val[name], ev[name], model.cfg.d_head)
    return rows, directions


def direction_rows(site_name: str, validation, evaluation, d_head: int) -> list[dict]:
    """One row per direction of one site: its mean drop on both splits, its validation
    magnitude and decile, its validation rank (1 = largest drop, ties by index, the order
    :func:`top_directions` selects in) and whether it is in the selected top-k set.
    ``validation``/``evaluation``: (drops (N, G), magnitudes (N, G))."""
    e_val, e_eval = validation[0].mean(0), evaluation[0].mean(0)
    magnitude = validation[1].mean(0)
    order = top_directions(e_val, e_val.size)
    rank = np.empty(e_val.size, dtype=np.int64)
    rank[order] = np.arange(1, e_val.size + 1)
    decile = deciles(magnitude)
    after = site_name == "after_wo"
    return [
        {"site": site_name, "direction": g, "head": None if after else g // d_head,
         "index_in_head": None if after else g % d_head,
         "drop_validation": float(e_val[g]), "drop_evaluation": float(e_eval[g]),
         "magnitude_validation": float(magnitude[g]), "magnitude_decile": int(decile[g]),
         "rank_validation": int(rank[g]), "selected": bool(rank[g] <= TOP_K)}
        for g in range(e_val.size)
    ]  # fmt: skip

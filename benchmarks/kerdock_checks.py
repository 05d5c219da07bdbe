"""Build a Kerdock ⊗ Haar basis family and print checks C2–C5 with timings (docs §5.5, §18).

python benchmarks/kerdock_checks.py                      # paper family: D=768, d=64, 24 members
python benchmarks/kerdock_checks.py --d-model 64 --d-head 16 --n-members 8   # demo size
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from headgeom.model.kerdock import (
    bent_differences,
    build_basis_family,
    haar_factor,
    kerdock_forms,
    kerdock_shape,
    mub_factor,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--n-members", type=int, default=24)
    parser.add_argument("--m", type=int, default=None, help="default: largest even m, 2^m | D")
    parser.add_argument("--pk-rel-tol", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    D, d = args.d_model, args.d_head
    m, r = kerdock_shape(D, args.m)
    n = 1 << m
    print(f"D={D} d={d} members={args.n_members}: m={m} (n={n}), r={r}, H={D // d}")

    start = time.perf_counter()
    forms = kerdock_forms(m)
    t_forms = time.perf_counter() - start
    start = time.perf_counter()
    pairs, all_bent = bent_differences(forms)
    t_bent = time.perf_counter() - start
    start = time.perf_counter()
    members = [np.kron(mub_factor(forms[i]), haar_factor(i, r)) for i in range(args.n_members)]
    t_members = time.perf_counter() - start
    del members
    start = time.perf_counter()
    family = build_basis_family(D, d, args.n_members, m=m, pk_rel_tol=args.pk_rel_tol)
    t_build = time.perf_counter() - start

    c2, c3, c5 = family.checks["C2"], family.checks["C3"], family.checks["C5"]
    print(f"C2 max |B_i^T B_i - I|      : {c2['max_abs_residual']:.3e}  (tol {c2['tolerance']:g})")
    if c3["pk_min"] is not None:
        print(
            f"C3 cross-member PK          : min {c3['pk_min']:.6f} = {c3['pk_min'] * n:.6f}/{n}, "
            f"max {c3['pk_max']:.6f} = {c3['pk_max'] * n:.6f}/{n}"
        )
        print(
            f"   d^2/D = {c3['pk_expected']:.6f}; max rel deviation "
            f"{100 * c3['max_rel_deviation']:.4f}% (rule {100 * c3['rel_tolerance']:g}%); "
            f"closed-form residual {c3['closed_form_max_abs_residual']:.2e}"
        )
    print(f"C4 Kerdock differences bent : {all_bent} ({pairs} pairs of {forms.shape[0]} forms)")
    print(
        f"C5 sharing member pairs     : {c5['sharing_member_pairs']} "
        f"(reference §5.5 item 5: {c5['matches_reference']})"
    )
    for pair in family.sharing_pairs():
        i, j = pair["members"]
        print(
            f"   ({i:2d},{j:2d}) u_i^u_j={pair['u_xor']:3d}: {pair['head_pairs']:3d} of "
            f"{(D // d) ** 2} head pairs, by shared dims {pair['head_pairs_by_shared_dims']}"
        )

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.4f}"

    print(
        "   largest unshared cosine: sharing head pairs "
        f"{fmt(c5['max_cosine_sharing_head_pairs'])}, other head pairs of sharing members "
        f"{fmt(c5['max_cosine_other_head_pairs_of_sharing_members'])}, non-sharing members "
        f"{fmt(c5['max_cosine_non_sharing_members'])}"
    )
    print(f"members_sha256 = {family.members_sha256}")
    print(f"family_hash    = {family.family_hash}")
    print(
        f"timings: forms {t_forms:.3f}s, C4 {t_bent:.3f}s, members {t_members:.3f}s, "
        f"full build with all checks {t_build:.2f}s"
    )


if __name__ == "__main__":
    main()

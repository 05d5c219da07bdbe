"""Frozen orthogonal bases: the Kerdock ⊗ Haar family B_0, B_1, ... (docs §5).

Member i is ``B_i = M_i ⊗ C_i`` (row-major ``kron``, D = n·r, n = 2^m):

* ``M_i = diag((−1)^{Q_i}) H_n / sqrt(n)``: a sign-flipped Sylvester–Hadamard basis. The
  forms ``Q_i`` come from a Kerdock set built over GF(2^t) ⊕ GF(2), t = m − 1 odd
  (docs §5.4 steps 1–6), so ``M_iᵀM_j`` has every entry of squared magnitude 1/n (i ≠ j).
* ``C_i``: an r×r Haar-random orthogonal matrix from the named stream
  ``"kerdock-haar{r}/member={i}"`` (§5.4 step 7).

Head block h of member i is columns ``d·h .. d·h + d − 1`` of ``B_i``.
:func:`build_basis_family` assembles members 0..n−1 in float64 and runs the acceptance
checks C2–C5 (docs §5.5, §18); :meth:`BasisFamily.record` is the §5.7 record whose
content hash is the manifests' ``basis_family_hash``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from headgeom.checks import record as logged_check
from headgeom.hashing import content_hash, sha256_bytes
from headgeom.subspace import SHARED_TOL

#: Primitive polynomials over GF(2) for the odd degrees t = m − 1, as bit masks (bit k is the
#: coefficient of x^k). t = 7 (x^7 + x + 1) is the paper's field (docs §5.4 step 1).
PRIMITIVE_POLYNOMIALS: dict[int, int] = {
    1: 0x3,  # x + 1: GF(2) itself (m = 2)
    3: 0xB,  # x^3 + x + 1
    5: 0x25,  # x^5 + x^2 + 1
    7: 0x83,  # x^7 + x + 1
    9: 0x211,  # x^9 + x^4 + 1
    11: 0x805,  # x^11 + x^2 + 1
}
#: Named Haar stream per member (docs §5.4 step 7); r = 3 gives "kerdock-haar3/member=i".
HAAR_STREAM_TEMPLATE = "kerdock-haar{r}/member={i}"
#: C2: max-abs entry of B_iᵀB_i − I (docs §18).
ORTHOGONALITY_TOL = 1e-12
#: Rejection rule: cross-member head-block PK within this relative distance of d²/D (§5.5.4).
PK_REL_TOL = 0.01
#: C3: numerical PK against its closed form (an algebraic identity, checked in float64).
PK_CLOSED_FORM_TOL = 1e-10
#: Decimals kept for the PK min/max in the hashed record, so the family's identity does not
#: hinge on the last bits of a BLAS reduction.
RECORD_DECIMALS = 10

#: The paper family: D = 768, d = 64, members 0..23, m = 8, r = 3, polynomial 0x83.
PAPER_SHAPE = {"d_model": 768, "d_head": 64, "m": 8, "r": 3, "polynomial": 0x83}
#: C5 (docs §5.5 item 5): member pairs sharing directions among members 0..23 and how many
#: of the 144 head pairs share exactly 3 dimensions; all other pairs share none. These are the
#: pairs with u_i XOR u_j in {1, 28}.
PAPER_SHARING: dict[tuple[int, int], int] = {
    **{(2 * k, 2 * k + 1): 64 for k in range(12)},
    **{(i, i + 4): 16 for i in (12, 13, 14, 15)},
    **{(i, i + 12): 16 for i in (8, 9, 10, 11)},
}
PAPER_SHARED_DIMS = 3
#: C3 at the paper's shape (docs §5.5 item 3): every cross-member head-block PK lies in
#: [1365/256, 1366/256] = [5.33203, 5.33594] (paper: 5.3320–5.3359).
PAPER_PK_RANGE = (1365 / 256, 1366 / 256)


class BasisCheckError(RuntimeError):
    """A constructed basis family failed an acceptance check (docs §5.5, §18)."""


# --------------------------------------------------------------------------- GF(2^t)
def polynomial_terms(polynomial: int) -> str:
    """``0x83`` -> ``"x^7+x+1"``."""
    terms = []
    for k in range(polynomial.bit_length() - 1, -1, -1):
        if polynomial >> k & 1:
            terms.append("1" if k == 0 else "x" if k == 1 else f"x^{k}")
    return "+".join(terms)


@dataclass(frozen=True)
class BinaryField:
    """GF(2^t) = F_2[α]/(p(α)) for a primitive polynomial p of degree t.

    An integer u in [0, 2^t) is the element Σ_k u_k α^k, u_k = bit k of u (polynomial basis).
    Addition is XOR; the methods below are vectorised over integer arrays.
    """

    t: int
    polynomial: int

    def __post_init__(self) -> None:
        if self.t < 1:
            raise ValueError(f"field degree t must be >= 1, got {self.t}")
        if self.polynomial >> self.t != 1:
            raise ValueError(
                f"polynomial {self.polynomial:#x} has degree {self.polynomial.bit_length() - 1}, "
                f"expected t={self.t}"
            )
        # α generates the multiplicative group iff its order is 2^t − 1 (p primitive).
        order, power = 1, self._times_alpha_int(1)
        while power != 1 and order < self.size:
            power, order = self._times_alpha_int(power), order + 1
        if order != self.size - 1:
            raise ValueError(
                f"polynomial {self.polynomial:#x} ({polynomial_terms(self.polynomial)}) is not "
                f"primitive for GF(2^{self.t}): α has order {order}, expected {self.size - 1}"
            )

    @property
    def size(self) -> int:
        return 1 << self.t

    def _times_alpha_int(self, a: int) -> int:
        a <<= 1
        return a ^ self.polynomial if a >> self.t & 1 else a

    def times_alpha(self, a: np.ndarray) -> np.ndarray:
        a = np.asarray(a, dtype=np.int64) << 1
        return np.where(a >> self.t & 1, a ^ self.polynomial, a)

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Field product, shift-and-add with reduction after every shift."""
        a, b = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
        out = np.zeros(a.shape, dtype=np.int64)
        shifted = a
        for k in range(self.t):
            out ^= np.where(b >> k & 1, shifted, 0)
            shifted = self.times_alpha(shifted)
        return out

    def trace(self, a: np.ndarray) -> np.ndarray:
        """Absolute trace Tr(ξ) = Σ_{j<t} ξ^{2^j} ∈ F_2, as 0/1 ``uint8``."""
        a = np.asarray(a, dtype=np.int64)
        acc, conjugate = a, a
        for _ in range(self.t - 1):
            conjugate = self.mul(conjugate, conjugate)
            acc = acc ^ conjugate
        if np.any(acc > 1):  # impossible in a field; guards the arithmetic
            raise AssertionError("trace left the prime field")
        return acc.astype(np.uint8)


def binary_field(t: int, polynomial: int | None = None) -> BinaryField:
    """GF(2^t) with the default primitive polynomial of :data:`PRIMITIVE_POLYNOMIALS`."""
    if polynomial is None:
        if t not in PRIMITIVE_POLYNOMIALS:
            raise ValueError(
                f"no default primitive polynomial for t={t} (have t in "
                f"{sorted(PRIMITIVE_POLYNOMIALS)}); pass polynomial= explicitly"
            )
        polynomial = PRIMITIVE_POLYNOMIALS[t]
    return BinaryField(t, polynomial)


# --------------------------------------------------------------------------- Kerdock forms
def kerdock_forms(m: int, polynomial: int | None = None) -> np.ndarray:
    """The Kerdock set on F_2^m as truth tables, shape ``(2^{m−1}, 2^m)``, 0/1 ``uint8``.

    Row u is Q_u(ξ, ε) = Q(uξ) + ε·Tr(uξ) with Q(ξ) = Σ_{j=1}^{(t−1)/2} Tr(ξ^{2^j+1}), t = m − 1
    (docs §5.4 steps 3–4); rows in index order u = 0, 1, ... (step 6), so row 0 is the zero
    form. Column a is the point ξ = a mod 2^t, ε = a >> t (step 5). For m = 2 the sum is
    empty and Q_u = ε·uξ.
    """
    if m < 2 or m % 2:
        raise ValueError(f"Kerdock sets need an even m >= 2 (t = m - 1 odd), got m={m}")
    field = binary_field(m - 1, polynomial)
    xi = np.arange(field.size, dtype=np.int64)
    u_xi = field.mul(xi[:, None], xi[None, :])  # (u, ξ)
    base = np.zeros(u_xi.shape, dtype=np.uint8)  # Q(uξ)
    conjugate = u_xi
    for _ in range((field.t - 1) // 2):
        conjugate = field.mul(conjugate, conjugate)  # (uξ)^{2^j}
        base ^= field.trace(field.mul(conjugate, u_xi))
    linear = field.trace(u_xi)  # Tr(uξ)
    return np.concatenate([base, base ^ linear], axis=1)  # ε = 0 then ε = 1


def walsh_transform(signs: np.ndarray) -> np.ndarray:
    """W[a] = Σ_x s(x)(−1)^{a·x} over the last axis (length 2^m), exact integers.

    Fast Walsh–Hadamard butterflies; equals ``signs @ sylvester_hadamard(n)``.
    """
    x = np.asarray(signs, dtype=np.int64)
    n, lead = x.shape[-1], x.shape[:-1]
    if n & (n - 1):
        raise ValueError(f"length must be a power of 2, got {n}")
    half = 1
    while half < n:
        x = x.reshape(*lead, n // (2 * half), 2, half)  # middle axis: the bit of weight `half`
        lo, hi = x[..., 0, :], x[..., 1, :]
        x = np.stack((lo + hi, lo - hi), axis=-2)
        half *= 2
    return x.reshape(*lead, n)


def walsh_magnitudes(form: np.ndarray) -> np.ndarray:
    """|Σ_x (−1)^{f(x) + a·x}| for every a; ``form`` is a 0/1 truth table (..., 2^m).

    A function on F_2^m (m even) is bent iff every magnitude equals 2^{m/2}.
    """
    return np.abs(walsh_transform(1 - 2 * np.asarray(form, dtype=np.int64)))


def non_bent_differences(forms: np.ndarray) -> tuple[int, int]:
    """C4: (number of pairs u < v, how many differences Q_u + Q_v are not bent)."""
    forms = np.asarray(forms, dtype=np.uint8)
    n_forms, n = forms.shape
    flat = math.isqrt(n)
    if flat * flat != n:
        raise ValueError(f"bent functions need an even number of variables, got 2^m = {n}")
    not_bent = 0
    for u in range(n_forms - 1):  # one row against all later rows: O(n_forms·n) memory
        magnitudes = walsh_magnitudes(forms[u] ^ forms[u + 1 :])
        not_bent += int(np.sum(np.any(magnitudes != flat, axis=-1)))
    return n_forms * (n_forms - 1) // 2, not_bent


def bent_differences(forms: np.ndarray) -> tuple[int, bool]:
    """C4: (number of pairs, whether every pairwise difference Q_u + Q_v is bent)."""
    n_pairs, not_bent = non_bent_differences(forms)
    return n_pairs, not_bent == 0


def sylvester_hadamard(n: int) -> np.ndarray:
    """H_n[a, b] = (−1)^{popcount(a & b)}, float64 (n, n); n a power of 2."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Sylvester-Hadamard order must be a power of 2, got {n}")
    idx = np.arange(n, dtype=np.int64)
    both = idx[:, None] & idx[None, :]
    parity = np.zeros_like(both)
    for k in range(n.bit_length() - 1):
        parity ^= both >> k & 1
    return 1.0 - 2.0 * parity


def mub_factor(form: np.ndarray) -> np.ndarray:
    """M_Q = diag((−1)^Q) H_n / sqrt(n), float64 (n, n) (docs §5.2)."""
    form = np.asarray(form, dtype=np.int64)
    n = form.shape[-1]
    return (1.0 - 2.0 * form)[:, None] * sylvester_hadamard(n) / math.sqrt(n)


def mub_cross_gram(form_i: np.ndarray, form_j: np.ndarray) -> np.ndarray:
    """M_iᵀM_j without a matmul: entry [b, b'] = W(b ⊕ b') / n, W the Walsh transform of
    (−1)^{Q_i + Q_j}. Every entry is ±1/sqrt(n) when Q_i + Q_j is bent; exact in float64."""
    diff = np.asarray(form_i, dtype=np.int64) ^ np.asarray(form_j, dtype=np.int64)
    n = diff.shape[-1]
    idx = np.arange(n)
    return walsh_transform(1 - 2 * diff)[idx[:, None] ^ idx[None, :]] / n


# --------------------------------------------------------------------------- Haar factors
def haar_stream_name(i: int, r: int, stream_template: str = HAAR_STREAM_TEMPLATE) -> str:
    """The named stream of member i, e.g. ``"kerdock-haar3/member=5"``."""
    return stream_template.format(i=i, r=r)


def stream_seed(name: str) -> int:
    """PCG64 seed: the first 8 bytes (big-endian) of SHA-256(name, UTF-8)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big")


def haar_factor(i: int, r: int, stream_template: str = HAAR_STREAM_TEMPLATE) -> np.ndarray:
    """C_i: an r×r Haar orthogonal matrix from member i's named stream (docs §5.4 step 7).

    Z ~ N(0, 1)^{r×r} from PCG64(stream_seed(name)); Z = QR; C = Q·diag(sign(diag R)), the
    unique orthogonal factor with a positive-diagonal triangular part.
    """
    rng = np.random.Generator(np.random.PCG64(stream_seed(haar_stream_name(i, r, stream_template))))
    q, upper = np.linalg.qr(rng.standard_normal((r, r)))
    signs = np.sign(np.diag(upper))
    if np.any(signs == 0):  # probability zero; a singular draw has no unique factor
        raise ValueError(f"singular Haar draw for member {i}")
    return q * signs  # column scaling = Q·diag(signs)


def kerdock_member(
    i: int,
    m: int,
    r: int,
    *,
    polynomial: int | None = None,
    stream_template: str = HAAR_STREAM_TEMPLATE,
) -> np.ndarray:
    """B_i = (diag((−1)^{Q_i}) H_n / sqrt(n)) ⊗ C_i, float64 (n·r, n·r) (docs §5.3)."""
    forms = kerdock_forms(m, polynomial)
    if not 0 <= i < forms.shape[0]:
        raise ValueError(f"member index {i} outside the Kerdock set of {forms.shape[0]} forms")
    return np.kron(mub_factor(forms[i]), haar_factor(i, r, stream_template))


# --------------------------------------------------------------------------- the family
def kerdock_shape(d_model: int, m: int | None = None, r: int | None = None) -> tuple[int, int]:
    """(m, r) with D = 2^m·r and m even >= 2; by default the largest such m (D=768 -> (8, 3))."""
    D = d_model
    if m is None and r is not None:
        if r < 1 or D % r or (D // r) & (D // r - 1):
            raise ValueError(f"no Kerdock family for D={D}, r={r}: D/r must be a power of 2")
        m = (D // r).bit_length() - 1
    if m is None:
        m = 0
        while D % (1 << (m + 2)) == 0:
            m += 2
        if m == 0:
            raise ValueError(
                f"no Kerdock family for D={D}: needs D = 2^m·r with m even >= 2 "
                f"(4 does not divide {D})"
            )
    if m < 2 or m % 2:
        raise ValueError(f"no Kerdock family for D={D}, m={m}: m must be even and >= 2")
    if D % (1 << m):
        raise ValueError(f"no Kerdock family for D={D}, m={m}: 2^m={1 << m} does not divide D")
    if r is not None and (1 << m) * r != D:
        raise ValueError(f"no Kerdock family for D={D}, m={m}, r={r}: 2^m·r = {(1 << m) * r}")
    return m, D >> m


def _block_residue_counts(D: int, d: int, r: int) -> np.ndarray:
    """N[h, b] = number of columns c of head block h with c mod r = b, shape (D/d, r)."""
    columns = np.arange(D).reshape(D // d, d)
    return np.stack([(columns % r == b).sum(axis=1) for b in range(r)], axis=1)


@dataclass(frozen=True, eq=False)
class BasisFamily:
    """Members ``B_0..B_{n−1}`` (float64, read-only) with their factors and check results.

    ``pk[i, j, h, k]`` = PK(B_i E_h, B_j E_k); ``shared[i, j, h, k]`` = dim of their
    intersection (principal cosines > 1 − 1e-9); ``top_cosine[i, j, h, k]`` = the largest
    principal cosine that is not shared (i ≠ j; 0 on the same-member diagonal).
    """

    d_model: int
    d_head: int
    m: int
    r: int
    polynomial: int
    stream_template: str
    pk_rel_tol: float
    forms: np.ndarray  # (n_members, 2^m) 0/1: Q_{u_i}, u_i = i
    haar: np.ndarray  # (n_members, r, r): C_i
    members: np.ndarray  # (n_members, D, D): B_i
    members_sha256: str
    pk: np.ndarray  # (n_members, n_members, H, H)
    shared: np.ndarray  # (n_members, n_members, H, H) int
    top_cosine: np.ndarray  # (n_members, n_members, H, H)
    checks: dict[str, Any]  # validation record (§2.6): residuals and tolerances, not hashed

    @property
    def n_members(self) -> int:
        return self.members.shape[0]

    @property
    def n_heads(self) -> int:
        return self.d_model // self.d_head

    @property
    def n(self) -> int:
        return 1 << self.m

    def head_block(self, i: int, h: int) -> np.ndarray:
        """B_i E_h: columns d·h .. d·h + d − 1 of member i, shape (D, d) (read-only view)."""
        if not 0 <= h < self.n_heads:
            raise IndexError(f"head {h} outside 0..{self.n_heads - 1}")
        return self.members[i][:, self.d_head * h : self.d_head * (h + 1)]

    def stream_names(self) -> list[str]:
        """The Haar stream name of every member, for the seeds registry (docs §2.5)."""
        return [haar_stream_name(i, self.r, self.stream_template) for i in range(self.n_members)]

    def sharing_pairs(self) -> list[dict[str, Any]]:
        """Member pairs i < j with a shared direction, with head-pair counts per dimension."""
        return sharing_pairs(self.shared)

    def record(self) -> dict[str, Any]:
        """The basis family record (docs §5.7); canonical-JSON-able."""
        c3 = self.checks["C3"]
        pk_range = None
        if c3["pk_min"] is not None:
            pk_range = {
                "min": round(c3["pk_min"], RECORD_DECIMALS),
                "max": round(c3["pk_max"], RECORD_DECIMALS),
            }
        return {
            # hashed identity text: kept as first recorded (METHODS = docs/methods.md)
            "construction": "kerdock-haar (METHODS §5.3-§5.4)",
            "d_model": self.d_model,
            "d_head": self.d_head,
            "n_members": self.n_members,
            "m": self.m,
            "n": self.n,
            "r": self.r,
            "field": {
                "t": self.m - 1,
                "polynomial": f"{self.polynomial:#x}",
                "polynomial_terms": polynomial_terms(self.polynomial),
                "element_bits": "u = sum_k u_k alpha^k, u_k = bit k of u",
            },
            "forms": "Q(xi) = sum_{j=1}^{(t-1)/2} Tr(xi^(2^j+1)); Q_u(xi, eps) = Q(u xi) + "
            "eps Tr(u xi); Tr absolute",
            "bit_map": "Hadamard index a <-> (xi = a mod 2^t, eps = a >> t)",
            "enumeration": "member i uses u_i = i",
            "hadamard": "Sylvester H[a, b] = (-1)^popcount(a & b); "
            "M_i = diag((-1)^Q_i) H / sqrt(n)",
            "kronecker": "row-major: (M (x) C)[r a + b, r a' + b'] = M[a, a'] C[b, b']",
            "haar": {
                "stream_template": self.stream_template,
                "generator": "numpy PCG64, seed = first 8 bytes (big-endian) of "
                "SHA-256(stream name, UTF-8)",
                "draw": "standard_normal((r, r)); Z = QR (numpy.linalg.qr); "
                "C = Q diag(sign(diag R))",
            },
            "head_block": "columns d_head h .. d_head h + d_head - 1",
            "members_bytes": "float64 little-endian, row-major, B_0..B_{n-1} concatenated",
            "members_sha256": self.members_sha256,
            "pk_cross_member": pk_range,
            "pk_rel_tolerance": self.pk_rel_tol,
            "shared_tolerance": SHARED_TOL,
            "sharing_pairs": self.sharing_pairs(),
        }

    @property
    def family_hash(self) -> str:
        """``basis_family_hash``: content hash of :meth:`record` (docs §2.3, §5.7)."""
        return content_hash(self.record())

    def check_metadata(self) -> dict[str, Any]:
        """C2–C5 in the logged format of ``headgeom.checks`` (the family was refused at
        construction if any failed). C3.range and C5 apply at the paper's shape only."""
        c3, c4, c5 = self.checks["C3"], self.checks["C4"], self.checks["C5"]
        return {
            **logged_check("C2", self.checks["C2"]["max_abs_residual"], ORTHOGONALITY_TOL,
                     note="max |B_i^T B_i - I| over the members (float64)"),
            **logged_check("C3", c3["closed_form_max_abs_residual"], PK_CLOSED_FORM_TOL,
                     note="cross-member PK - (d^2/D + delta^T (K o K) delta / n)"),
            **logged_check("C3.rejection", c3["max_rel_deviation"], self.pk_rel_tol, "rel",
                     note="max |PK - d^2/D| / (d^2/D) (rejection rule, §5.5 item 4)"),
            **logged_check("C3.range", c3["paper_range_residual"], PK_CLOSED_FORM_TOL,
                     note="distance outside [1365/256, 1366/256] (paper shape only)"),
            **logged_check("C4", c4["non_bent_pairs"], 0, "count",
                     note=f"non-bent differences among {c4['pairs']} pairs of "
                     f"{c4['forms']} forms"),
            **logged_check("C5", c5["mismatched_member_pairs"], 0, "count",
                     note="member pairs whose sharing differs from §5.5 item 5 (paper shape "
                     "only)"),
        }  # fmt: skip


def sharing_pairs(shared: np.ndarray) -> list[dict[str, Any]]:
    """Member pairs i < j of a (n, n, H, H) shared-dimension table that share a direction.

    Each entry: ``members`` [i, j], ``u_xor`` (u_i XOR u_j = i XOR j), ``head_pairs`` (how many
    of the H² head pairs share) and ``head_pairs_by_shared_dims`` {"3": 64, ...}.
    """
    pairs = []
    for i in range(shared.shape[0]):
        for j in range(i + 1, shared.shape[0]):
            dims, counts = np.unique(shared[i, j], return_counts=True)
            hist = {str(int(k)): int(c) for k, c in zip(dims, counts, strict=True) if k}
            if hist:
                pairs.append(
                    {
                        "members": [i, j],
                        "u_xor": i ^ j,
                        "head_pairs": sum(hist.values()),
                        "head_pairs_by_shared_dims": hist,
                    }
                )
    return pairs


#: How two uses of sharing members relate (docs §5.5 item 6): writes of two layers, readers
#: of two layers, a write and a later layer's reader (the only relation a write can reach a
#: reader by), a layer's write and its own reader (it reads before it writes) and a reader
#: and a later layer's write (no path).
RELATIONS = ("write-write", "read-read", "write-later-read", "write-same-layer-read",
             "read-later-write")  # fmt: skip


def sharing_consequences(
    family: BasisFamily, bases: Mapping[str, Sequence[int | str]]
) -> dict[str, Any]:
    """Where a model's frozen bases (``{"write": [member per layer], "read": [...]}``; a
    non-integer entry is the axis basis) share directions: every pair of uses whose members
    are a sharing pair of ``family`` (docs §5.5 item 6), with the relation (:data:`RELATIONS`),
    layers, members and shared head pairs, and a count per relation."""
    shared = {tuple(p["members"]): p for p in family.sharing_pairs()}
    uses = [
        (role, layer, member)
        for role in ("write", "read")
        for layer, member in enumerate(bases.get(role, []))
        if isinstance(member, int) and not isinstance(member, bool)
    ]
    pairs = []
    for a, (role_a, layer_a, member_a) in enumerate(uses):
        for role_b, layer_b, member_b in uses[a + 1 :]:
            key = (min(member_a, member_b), max(member_a, member_b))
            if key not in shared:
                continue
            if role_a == role_b:
                relation = f"{role_a}-{role_b}"
                layers = sorted((layer_a, layer_b))
            else:  # role_a is "write": uses list writes first
                relation = (
                    "write-later-read" if layer_a < layer_b
                    else "write-same-layer-read" if layer_a == layer_b
                    else "read-later-write"
                )  # fmt: skip
                layers = [layer_a, layer_b]
            pairs.append(
                {
                    "relation": relation,
                    "layers": layers,
                    "members": [member_a, member_b],
                    "head_pairs": shared[key]["head_pairs"],
                    "head_pairs_by_shared_dims": shared[key]["head_pairs_by_shared_dims"],
                }
            )
    counts = {r: sum(p["relation"] == r for p in pairs) for r in RELATIONS}
    return {"counts": counts, "pairs": pairs}


def _member_pair_geometry(
    A: np.ndarray, K: np.ndarray, d: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PK, shared dims and top unshared cosine of all head-block pairs of one member pair.

    ``G = B_iᵀB_j = (M_iᵀM_j) ⊗ (C_iᵀC_j) = A ⊗ K`` (D, D); block (h, k) of G is
    (B_i E_h)ᵀ(B_j E_k). PK is its squared Frobenius norm; principal cosines are the square
    roots of the eigenvalues of XᵀX for each block X (batched; ~5× cheaper than SVDs). They
    are accurate to ~1e-15 near 1, where sharing is decided, but only to ~1e-8 near 0.
    """
    G = np.kron(A, K)
    H = G.shape[0] // d
    blocks = np.ascontiguousarray(G.reshape(H, d, H, d).transpose(0, 2, 1, 3))  # (h, k, d, d)
    pk = np.einsum("hkab,hkab->hk", blocks, blocks)
    X = torch.from_numpy(blocks.reshape(H * H, d, d))
    eig = torch.linalg.eigvalsh(X.mT @ X).numpy()
    cos = np.sqrt(np.clip(eig, 0.0, 1.0)).reshape(H, H, d)
    is_shared = cos > 1.0 - SHARED_TOL
    shared = is_shared.sum(axis=-1)
    top = np.where(is_shared, 0.0, cos).max(axis=-1)
    return pk, shared, top


def build_basis_family(
    d_model: int,
    d_head: int,
    n_members: int,
    m: int | None = None,
    r: int | None = None,
    *,
    polynomial: int | None = None,
    stream_template: str = HAAR_STREAM_TEMPLATE,
    pk_rel_tol: float = PK_REL_TOL,
) -> BasisFamily:
    """Build members 0..n_members−1 and run checks C2–C5; raise on any failure.

    * C2: max-abs entry of B_iᵀB_i − I below 1e-12 for every member (computed on B_i).
    * C3: every cross-member head-block PK equals its closed form
      d²/D + δ_hᵀ(K∘K)δ_k / n (K = C_iᵀC_j, δ_h[b] = #columns of block h in residue class b
      minus d/r; for the paper this is (1365 + K[h mod 3, k mod 3]²)/256), and the rejection
      rule: none deviates from d²/D by more than ``pk_rel_tol`` (docs §5.5 items 3–4).
    * C4: all pairwise differences in the whole Kerdock set are bent.
    * C5: shared dimensions of all head-block pairs; for the paper shape (D=768, d=64, m=8,
      r=3, 0x83, n_members <= 24) the sharing pattern must be exactly §5.5 item 5.

    Cross-member products use B_iᵀB_j = (M_iᵀM_j) ⊗ (C_iᵀC_j) (one Kronecker product per
    pair instead of a D×D matmul).
    """
    D, d = d_model, d_head
    m, r = kerdock_shape(D, m, r)
    n = 1 << m
    if d < 1 or D % d:
        raise ValueError(f"no basis family for D={D}, d_head={d}: d_head must divide D")
    if not 1 <= n_members <= n // 2:
        raise ValueError(
            f"no Kerdock family for D={D} with {n_members} members: m={m}, r={r} gives "
            f"2^(m-1) = {n // 2} members at most"
        )
    if polynomial is None:
        polynomial = binary_field(m - 1).polynomial
    try:
        distinct = haar_stream_name(0, r, stream_template) != haar_stream_name(
            1, r, stream_template
        )
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(
            f"stream template {stream_template!r} must use only {{i}} and {{r}}: {err!r}"
        ) from None
    if not distinct:
        raise ValueError(f"stream template {stream_template!r} must depend on the member {{i}}")

    all_forms = kerdock_forms(m, polynomial)
    n_pairs, not_bent = non_bent_differences(all_forms)
    all_bent = not_bent == 0
    if not all_bent:
        raise BasisCheckError(
            f"C4 failed: {not_bent} of {n_pairs} pairwise Kerdock differences are not bent (m={m})"
        )
    forms = all_forms[:n_members].copy()
    haar = np.stack([haar_factor(i, r, stream_template) for i in range(n_members)])
    mub = np.stack([mub_factor(f) for f in forms])
    members = np.stack([np.kron(mub[i], haar[i]) for i in range(n_members)])
    for frozen in (forms, haar, members):
        frozen.setflags(write=False)
    members_sha256 = sha256_bytes(members.astype("<f8", copy=False).tobytes(order="C"))

    H = D // d
    pk = np.zeros((n_members, n_members, H, H))
    shared = np.zeros((n_members, n_members, H, H), dtype=np.int64)
    top = np.zeros((n_members, n_members, H, H))
    residual = 0.0
    for i in range(n_members):
        gram = members[i].T @ members[i]
        residual = max(residual, float(np.max(np.abs(gram - np.eye(D)))))
        pk[i, i] = np.einsum("hakb,hakb->hk", *(2 * [gram.reshape(H, d, H, d)]))
        shared[i, i] = d * np.eye(H, dtype=np.int64)  # same-member blocks: by C2
    if residual >= ORTHOGONALITY_TOL:
        raise BasisCheckError(f"C2 failed: max |B_i^T B_i - I| = {residual:.3e} >= 1e-12")

    expected = d * d / D
    delta = _block_residue_counts(D, d, r) - d / r  # (H, r)
    closed_residual = 0.0
    for i in range(n_members):
        for j in range(i + 1, n_members):
            K = haar[i].T @ haar[j]
            A = mub_cross_gram(forms[i], forms[j])
            pk[i, j], shared[i, j], top[i, j] = _member_pair_geometry(A, K, d)
            pk[j, i], shared[j, i], top[j, i] = pk[i, j].T, shared[i, j].T, top[i, j].T
            closed = expected + delta @ (K * K) @ delta.T / n
            closed_residual = max(closed_residual, float(np.max(np.abs(pk[i, j] - closed))))
    pk.setflags(write=False)
    shared.setflags(write=False)
    top.setflags(write=False)

    cross = ~np.eye(n_members, dtype=bool)
    cross_pk = pk[cross]
    pk_min = float(cross_pk.min()) if cross_pk.size else None
    pk_max = float(cross_pk.max()) if cross_pk.size else None
    max_rel = float(np.max(np.abs(cross_pk - expected)) / expected) if cross_pk.size else 0.0
    if closed_residual > PK_CLOSED_FORM_TOL:
        raise BasisCheckError(
            f"C3 failed: cross-member PK differs from its closed form by {closed_residual:.3e}"
        )
    if max_rel > pk_rel_tol:
        raise BasisCheckError(
            f"C3 rejection rule: a cross-member head-block PK deviates from d^2/D = "
            f"{expected:.6g} by {100 * max_rel:.3g}% > {100 * pk_rel_tol:.3g}% "
            f"(D={D}, d={d}, m={m}, r={r}; PK range [{pk_min:.6g}, {pk_max:.6g}])"
        )

    observed = {tuple(p["members"]): p["head_pairs_by_shared_dims"] for p in sharing_pairs(shared)}
    reference = _reference_sharing(D, d, m, r, polynomial, n_members)
    mismatched = None if reference is None else sharing_mismatches(observed, reference)
    if mismatched:
        raise BasisCheckError(
            f"C5 failed: sharing pairs {observed} differ from docs §5.5 item 5 {reference}"
        )
    range_residual = None  # C3 at the paper's shape: distance outside [1365/256, 1366/256]
    if reference is not None and cross_pk.size:
        low, high = PAPER_PK_RANGE
        range_residual = float(np.max(np.maximum(low - cross_pk, cross_pk - high).clip(0.0)))
        if range_residual > PK_CLOSED_FORM_TOL:
            raise BasisCheckError(
                f"C3 failed: a cross-member PK lies {range_residual:.3e} outside "
                f"[1365/256, 1366/256] (docs §5.5 item 3)"
            )
    cross4 = cross[:, :, None, None]
    shares_dims = shared > 0  # per head pair
    member_shares = np.broadcast_to(shares_dims.any(axis=(2, 3), keepdims=True), shared.shape)
    checks = {
        "C2": {"max_abs_residual": residual, "tolerance": ORTHOGONALITY_TOL},
        "C3": {
            "pk_min": pk_min,
            "pk_max": pk_max,
            "pk_expected": expected,
            "max_rel_deviation": max_rel,
            "rel_tolerance": pk_rel_tol,
            "closed_form_max_abs_residual": closed_residual,
            "closed_form_tolerance": PK_CLOSED_FORM_TOL,
            "paper_range_residual": range_residual,
        },
        "C4": {
            "forms": int(all_forms.shape[0]),
            "pairs": n_pairs,
            "all_bent": all_bent,
            "non_bent_pairs": not_bent,
        },
        "C5": {
            "shared_tolerance": SHARED_TOL,
            "sharing_member_pairs": len(observed),
            "reference": "METHODS §5.5 item 5" if reference is not None else None,
            "matches_reference": True if reference is not None else None,
            "mismatched_member_pairs": mismatched,
            # largest principal cosine that is not shared, in three groups of head pairs
            "max_cosine_sharing_head_pairs": _max_or_none(top[cross4 & shares_dims]),
            "max_cosine_other_head_pairs_of_sharing_members": _max_or_none(
                top[cross4 & member_shares & ~shares_dims]
            ),
            "max_cosine_non_sharing_members": _max_or_none(top[cross4 & ~member_shares]),
        },
    }
    return BasisFamily(
        d_model=D,
        d_head=d,
        m=m,
        r=r,
        polynomial=polynomial,
        stream_template=stream_template,
        pk_rel_tol=pk_rel_tol,
        forms=forms,
        haar=haar,
        members=members,
        members_sha256=members_sha256,
        pk=pk,
        shared=shared,
        top_cosine=top,
        checks=checks,
    )


def sharing_mismatches(observed: Mapping[tuple, Any], reference: Mapping[tuple, Any]) -> int:
    """C5: member pairs whose shared-dimension counts differ between two sharing patterns
    ({(i, j): {"3": 64}}), counting a pair present in only one of them."""
    return sum(observed.get(k) != reference.get(k) for k in {*observed, *reference})


def _max_or_none(values: np.ndarray) -> float | None:
    return float(values.max()) if values.size else None


def _reference_sharing(
    D: int, d: int, m: int, r: int, polynomial: int, n_members: int
) -> dict[tuple[int, int], dict[str, int]] | None:
    """The §5.5 item 5 pattern restricted to the built members, or None if not the paper shape."""
    shape = {"d_model": D, "d_head": d, "m": m, "r": r, "polynomial": polynomial}
    if shape != PAPER_SHAPE or n_members > 24:
        return None
    return {
        pair: {str(PAPER_SHARED_DIMS): count}
        for pair, count in PAPER_SHARING.items()
        if pair[1] < n_members
    }


def family_entry(family: BasisFamily, models: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One family of the basis family file (``geometry/basis_family.json``): its §5.7 record
    and ``basis_family_hash`` (the content hash of the record, as in the manifests), checks
    C2–C5 in the logged format (``checks``) with the construction's own numbers
    (``construction``), and per model that uses it (``{model, geometry, bases}``) where its
    frozen bases share directions (§5.5 item 6, :func:`sharing_consequences`)."""
    return {
        "basis_family_hash": family.family_hash,
        "record": family.record(),
        "checks": family.check_metadata(),
        "construction": family.checks,
        "models": [
            {
                "model": m["model"],
                "geometry": m["geometry"],
                "bases": dict(m["bases"]),
                "sharing": sharing_consequences(family, m["bases"]),
            }
            for m in models
        ],
    }

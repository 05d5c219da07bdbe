"""Frozen Kerdock ⊗ Haar bases against first-principles expectations (docs §5, §18 C2–C5)."""

from __future__ import annotations

import hashlib
import itertools
import json

import numpy as np
import pytest

from headgeom import checks
from headgeom.hashing import canonical_json, content_hash
from headgeom.model.kerdock import (
    PRIMITIVE_POLYNOMIALS,
    RELATIONS,
    BasisCheckError,
    BinaryField,
    bent_differences,
    binary_field,
    build_basis_family,
    haar_factor,
    haar_stream_name,
    kerdock_forms,
    kerdock_member,
    kerdock_shape,
    mub_cross_gram,
    mub_factor,
    non_bent_differences,
    polynomial_terms,
    sharing_consequences,
    sharing_mismatches,
    stream_seed,
    sylvester_hadamard,
    walsh_magnitudes,
    walsh_transform,
)
from headgeom.subspace import projection_kernel, shared_dimensions

PAPER_PAIRS_64 = [(2 * k, 2 * k + 1) for k in range(12)]  # docs §5.5 item 5, verbatim
PAPER_PAIRS_16 = [(12, 16), (13, 17), (14, 18), (15, 19), (8, 20), (9, 21), (10, 22), (11, 23)]


@pytest.fixture(scope="module")
def paper():
    """The paper family: D = 768, d = 64, members 0–23 (built once; ~10 s on a slow core)."""
    return build_basis_family(768, 64, 24)


def popcount_parity(a: np.ndarray) -> np.ndarray:
    return np.array([bin(int(x)).count("1") & 1 for x in a.ravel()]).reshape(a.shape)


# --- GF(2^t) -------------------------------------------------------------------------------
@pytest.mark.parametrize("t", sorted(PRIMITIVE_POLYNOMIALS))
def test_default_polynomials_are_primitive_of_the_right_degree(t):
    field = binary_field(t)  # BinaryField rejects non-primitive polynomials on construction
    assert field.polynomial.bit_length() - 1 == t
    # α^k for k < 2^t − 1 runs through every nonzero element exactly once
    powers, a = [], np.int64(1)
    for _ in range(field.size - 1):
        powers.append(int(a))
        a = field.times_alpha(a)
    assert sorted(powers) == list(range(1, field.size)) and int(a) == 1


def test_paper_field_reduces_by_x7_plus_x_plus_1():
    field = binary_field(7)
    assert field.polynomial == 0x83 and polynomial_terms(0x83) == "x^7+x+1"
    assert int(field.mul(0x40, 0x02)) == 0x03  # α^6·α = α^7 = α + 1
    assert int(field.mul(0x40, 0x40)) == int(field.mul(0x03, 0x20))  # α^12 = (α+1)α^5


@pytest.mark.parametrize("t", [1, 3, 5, 7])
def test_field_axioms_and_trace(t):
    field = binary_field(t)
    x = np.arange(field.size)
    a, b, c = np.meshgrid(x, x, x, indexing="ij", sparse=True)
    ab = field.mul(a, b)
    assert np.array_equal(ab, field.mul(b, a))
    assert np.array_equal(field.mul(ab, c), field.mul(a, field.mul(b, c)))
    assert np.array_equal(field.mul(a, b ^ c), ab ^ field.mul(a, c))
    table = field.mul(x[:, None], x[None, :])
    assert np.array_equal(table[1], x)  # 1 is the identity
    for row in table[1:]:  # every nonzero element is invertible
        assert sorted(row[1:].tolist()) == list(range(1, field.size))
    tr = field.trace(x)
    assert np.array_equal(field.trace(x[:, None] ^ x[None, :]), tr[:, None] ^ tr[None, :])
    assert np.array_equal(field.trace(field.mul(x, x)), tr)  # Tr(ξ²) = Tr(ξ)
    assert tr.sum() == field.size // 2  # a nonzero linear functional is balanced


@pytest.mark.parametrize(
    ("t", "polynomial", "match"),
    [(4, 0x1F, "not primitive"), (3, 0xF, "not primitive"), (7, 0x23, "degree")],
)
def test_bad_polynomials_are_rejected(t, polynomial, match):
    with pytest.raises(ValueError, match=match):
        BinaryField(t, polynomial)


# --- Hadamard and Walsh ---------------------------------------------------------------------
def test_sylvester_hadamard_and_walsh_transform():
    H = sylvester_hadamard(16)
    idx = np.arange(16)
    assert np.array_equal(H, 1.0 - 2.0 * popcount_parity(idx[:, None] & idx[None, :]))
    assert np.array_equal(np.kron(np.kron([[1, 1], [1, -1]], [[1, 1], [1, -1]]), H[:4, :4]), H)
    assert np.array_equal(H.T @ H, 16 * np.eye(16))
    signs = 1 - 2 * np.random.Generator(np.random.PCG64(1)).integers(0, 2, (5, 16))
    assert np.array_equal(walsh_transform(signs), signs @ H.astype(np.int64))
    with pytest.raises(ValueError, match="power of 2"):
        sylvester_hadamard(12)


# --- Kerdock forms --------------------------------------------------------------------------
def test_m2_kerdock_set_is_zero_and_eps_times_xi():
    assert np.array_equal(kerdock_forms(2), [[0, 0, 0, 0], [0, 0, 0, 1]])  # Q_1 = ε·ξ


@pytest.mark.parametrize("m", [2, 4, 6, 8])
def test_every_pairwise_difference_is_bent(m):
    forms = kerdock_forms(m)
    n = 1 << m
    assert forms.shape == (n // 2, n) and not forms[0].any()  # Q_0 ≡ 0
    i, j = np.triu_indices(n // 2, k=1)
    signs = 1.0 - 2.0 * (forms[i] ^ forms[j])  # all C(2^{m−1}, 2) differences
    walsh = np.abs(signs @ sylvester_hadamard(n))  # Walsh transform by Hadamard matmul
    assert np.all(walsh == 2 ** (m // 2))
    assert bent_differences(forms) == (len(i), True)
    assert np.all(walsh_magnitudes(forms[i[:50]] ^ forms[j[:50]]) == 2 ** (m // 2))


def test_bent_check_detects_a_non_bent_difference():
    forms = kerdock_forms(4)
    forms[2] = forms[1] ^ (np.arange(16) & 1)  # differs from Q_1 by a linear form: not bent
    assert bent_differences(forms)[1] is False
    # C4's logged count: Q_1 + Q_2 is linear (Walsh magnitudes 16 and 0); any other pair
    # still differs by a Kerdock difference plus at most that linear form, which keeps it bent
    assert non_bent_differences(forms) == (28, 1)


def test_kerdock_forms_have_the_stated_alternating_forms():
    """B_u((ξ,ε),(η,δ)) = Tr(u²ξη) + Tr(uξ)Tr(uη) + εTr(uη) + δTr(uξ) (docs §5.4 step 4)."""
    m, t = 8, 7
    field, forms = binary_field(t), kerdock_forms(m)
    a = np.arange(1 << m)
    xi, eps = a & 0x7F, a >> t
    for u in [0, 1, 2, 5, 28, 77, 127]:
        q = forms[u].astype(np.int64)
        assert q[0] == 0
        polar = q[a[:, None] ^ a[None, :]] ^ q[:, None] ^ q[None, :]
        tr_u = field.trace(field.mul(u, xi)).astype(np.int64)
        u2_xi = field.mul(field.mul(u, u), xi)
        expected = field.trace(field.mul(u2_xi[:, None], xi[None, :])).astype(np.int64)
        expected ^= tr_u[:, None] & tr_u[None, :]
        expected ^= (eps[:, None] & tr_u[None, :]) ^ (eps[None, :] & tr_u[:, None])
        assert np.array_equal(polar, expected), u


# --- Haar factors ---------------------------------------------------------------------------
@pytest.mark.parametrize("i", [0, 5, 23])
def test_haar_factor_seed_derivation_and_qr_sign_convention(i):
    name = "kerdock-haar3/member=" + str(i)
    assert haar_stream_name(i, 3) == name
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    assert stream_seed(name) == seed
    Z = np.random.Generator(np.random.PCG64(seed)).standard_normal((3, 3))
    C = haar_factor(i, 3)
    assert np.allclose(C.T @ C, np.eye(3), atol=1e-14, rtol=0)
    assert abs(abs(np.linalg.det(C)) - 1) < 1e-14
    R = C.T @ Z  # Z = C·R with R upper triangular, positive diagonal (unique QR)
    assert np.allclose(np.tril(R, -1), 0, atol=1e-14) and np.all(np.diag(R) > 0)
    assert np.array_equal(C, haar_factor(i, 3))  # reproducible bit for bit


def test_haar_stream_template_is_a_parameter():
    assert not np.array_equal(haar_factor(0, 3), haar_factor(1, 3))
    assert not np.array_equal(haar_factor(0, 3), haar_factor(0, 3, "other/{r}/{i}"))
    assert haar_stream_name(7, 2) == "kerdock-haar2/member=7"
    assert abs(haar_factor(4, 1)[0, 0]) == 1.0  # O(1) = {±1}


# --- members --------------------------------------------------------------------------------
def test_kronecker_convention_and_member_zero():
    m, r, n, i = 4, 3, 16, 6
    B = kerdock_member(i, m, r)
    s = 1.0 - 2.0 * kerdock_forms(m)[i]
    idx = np.arange(n)
    M = s[:, None] * (1.0 - 2.0 * popcount_parity(idx[:, None] & idx[None, :])) / 4.0
    C = haar_factor(i, r)
    for a, b, a2, b2 in itertools.product([0, 5, 15], [0, 2], [3, 15], [1, 2]):
        assert B[3 * a + b, 3 * a2 + b2] == M[a, a2] * C[b, b2]
    assert np.array_equal(B.reshape(n, r, n, r), M[:, None, :, None] * C[None, :, None, :])
    B0 = kerdock_member(0, m, r)
    assert np.array_equal(B0, np.kron(sylvester_hadamard(n) / 4.0, haar_factor(0, r)))


def test_mub_cross_gram_equals_the_product_and_is_unbiased():
    forms = kerdock_forms(8)
    for u, v in [(0, 1), (3, 17), (12, 16)]:
        A = mub_cross_gram(forms[u], forms[v])
        assert np.array_equal(A, mub_factor(forms[u]).T @ mub_factor(forms[v]))
        assert np.all(np.abs(A) == 1 / 16)


def test_paper_members_are_orthogonal(paper):
    assert paper.members.shape == (24, 768, 768) and paper.members.dtype == np.float64
    for B in paper.members[[0, 7, 23]]:  # the builder's C2 covers all 24
        assert np.max(np.abs(B.T @ B - np.eye(768))) < 1e-12
    assert paper.checks["C2"]["max_abs_residual"] < 1e-12
    assert not paper.members.flags.writeable


def test_paper_head_blocks(paper):
    assert np.array_equal(paper.head_block(5, 7), paper.members[5][:, 448:512])
    assert np.allclose(paper.pk[3, 3], 64 * np.eye(12), atol=1e-12, rtol=0)  # same member
    lo, hi = 1365 / 256, 1366 / 256
    cross = paper.pk[~np.eye(24, dtype=bool)]
    assert cross.min() >= lo - 1e-12 and cross.max() <= hi + 1e-12
    assert abs(cross.max() / (64**2 / 768) - 1) < 0.01  # rejection rule does not fire
    for i, j in [(0, 1), (4, 19), (12, 16)]:  # closed form (1365 + G[h mod 3, k mod 3]²)/256
        G2 = (paper.haar[i].T @ paper.haar[j]) ** 2
        h = np.arange(12) % 3
        assert np.allclose(paper.pk[i, j], (1365 + G2[h[:, None], h[None, :]]) / 256, atol=1e-12)


@pytest.mark.parametrize(("i", "j"), [(0, 1), (12, 16), (3, 20)])
def test_paper_geometry_matches_direct_principal_angles(paper, i, j):
    """Independent of the family's Kronecker/eigenvalue path: from B_iᵀB_j by batched SVD,
    and per head pair from B_i E_h, B_j E_k with the subspace helpers."""
    direct = paper.members[i].T @ paper.members[j]
    blocks = direct.reshape(12, 64, 12, 64).transpose(0, 2, 1, 3)  # (h, k, 64, 64)
    assert np.allclose(paper.pk[i, j], np.einsum("hkab,hkab->hk", blocks, blocks), atol=1e-12)
    cosines = np.linalg.svd(blocks, compute_uv=False)  # principal cosines (docs §9.3)
    is_shared = cosines > 1 - 1e-9
    assert np.array_equal(paper.shared[i, j], is_shared.sum(axis=-1))
    top = np.where(is_shared, 0.0, cosines).max(axis=-1)
    assert np.allclose(paper.top_cosine[i, j], top, atol=1e-7, rtol=0)
    # a few head pairs through the subspace helpers (each call is one small BLAS/LAPACK call;
    # multi-threaded BLAS on a loaded machine makes many of them slow)
    some_shared = np.argwhere(paper.shared[i, j] > 0)[:1].tolist()
    for h, k in [*some_shared, [0, 0], [11, 6]]:
        U, V = paper.head_block(i, h), paper.head_block(j, k)
        assert abs(paper.pk[i, j, h, k] - projection_kernel(U, V)) < 1e-12
        assert paper.shared[i, j, h, k] == shared_dimensions(U, V)


def test_paper_shared_three_dimensional_pattern(paper):
    """docs §5.5 item 5 / C5, over all 276 member pairs × 144 head pairs."""
    counts = {}
    for i, j in itertools.combinations(range(24), 2):
        s = paper.shared[i, j]
        assert set(np.unique(s).tolist()) <= {0, 3}  # exactly 3 dimensions when any
        counts[(i, j)] = int(np.count_nonzero(s))
    expected = dict.fromkeys(counts, 0)
    expected.update(dict.fromkeys(PAPER_PAIRS_64, 64))
    expected.update(dict.fromkeys(PAPER_PAIRS_16, 16))
    assert counts == expected
    assert {i ^ j for (i, j), c in counts.items() if c} == {1, 28}
    assert np.array_equal(paper.shared, np.transpose(paper.shared, (1, 0, 3, 2)))
    c5 = paper.checks["C5"]
    assert c5["matches_reference"] is True
    assert c5["max_cosine_sharing_head_pairs"] <= 0.83  # paper: remaining cosines <= 0.83
    assert c5["max_cosine_non_sharing_members"] <= 0.75  # spec reconstruction: <= 0.75


def test_paper_checks_are_logged_in_the_fixed_format(paper):
    """C2–C5 as headgeom.checks reads them back; C3.range and C5 apply at this shape."""
    logged = checks.parse(paper.check_metadata())
    assert set(logged) == {"C2", "C3", "C3.rejection", "C3.range", "C4", "C5"}
    assert all(c.passed for c in logged.values())
    assert logged["C3.range"].residual == 0.0  # every PK inside [1365/256, 1366/256]
    # the 1% rule's residual is the largest |PK − 16/3| / (16/3): at most (1366/256 − 16/3)
    # / (16/3) = 1/2048 by the closed form of §5.5 item 3
    assert logged["C3.rejection"].residual <= 1 / 2048 + 1e-12
    assert logged["C4"].residual == 0 and logged["C5"].residual == 0
    assert logged["C4"].note.startswith("non-bent differences among 8128 pairs of 128 forms")


def test_sharing_mismatches_count_pairs_that_differ_or_are_missing():
    reference = {(0, 1): {"3": 64}, (2, 3): {"3": 64}}
    assert sharing_mismatches(dict(reference), reference) == 0
    assert sharing_mismatches({(0, 1): {"3": 64}, (2, 3): {"3": 16}}, reference) == 1
    assert sharing_mismatches({(0, 1): {"3": 64}, (4, 5): {"3": 64}}, reference) == 2


@pytest.mark.parametrize(
    "write, read, counts",
    [
        # docs §5.5 item 6 from the pairs of item 5: (2k, 2k+1), (12+i, 16+i), (8+i, 20+i)
        (range(12), [], {"write-write": 6}),  # write-rotated: layers 2k and 2k+1
        # all-rotated: reads 12+l; shared only write–write, read–read and within a layer
        (range(12), range(12, 24), {"write-write": 6, "read-read": 10,
                                    "write-same-layer-read": 4}),
        # all-rotated-self: each pair (2k, 2k+1) links write 2k to the reader of layer 2k+1
        (range(12), range(12), {"write-write": 6, "read-read": 6, "write-later-read": 6,
                                "read-later-write": 6}),
    ],
)  # fmt: skip
def test_paper_sharing_consequences(paper, write, read, counts):
    found = sharing_consequences(paper, {"write": list(write), "read": list(read)})
    assert found["counts"] == {**dict.fromkeys(RELATIONS, 0), **counts}
    if read and read[0] == 12:  # all-rotated: member 8 written by layer 8, 20 read by it
        same = [p for p in found["pairs"] if p["relation"] == "write-same-layer-read"]
        assert [8, 20] in [p["members"] for p in same] and [8, 8] in [p["layers"] for p in same]


def test_paper_record(paper):
    record = paper.record()
    assert json.loads(canonical_json(record)) == record
    assert paper.family_hash == content_hash(record)
    raw = b"".join(B.astype("<f8").tobytes() for B in paper.members)
    assert record["members_sha256"] == hashlib.sha256(raw).hexdigest()
    assert (record["n"], record["r"], record["m"]) == (256, 3, 8)
    assert record["field"]["polynomial"] == "0x83"
    assert record["haar"]["stream_template"] == "kerdock-haar{r}/member={i}"
    assert record["pk_cross_member"] == {
        "min": round(paper.checks["C3"]["pk_min"], 10),
        "max": round(paper.checks["C3"]["pk_max"], 10),
    }
    pairs = {tuple(p["members"]): p["head_pairs"] for p in record["sharing_pairs"]}
    assert pairs == {**dict.fromkeys(PAPER_PAIRS_64, 64), **dict.fromkeys(PAPER_PAIRS_16, 16)}
    assert paper.stream_names()[:2] == ["kerdock-haar3/member=0", "kerdock-haar3/member=1"]


# --- small families and errors --------------------------------------------------------------
def test_record_hash_is_reproducible_and_tracks_the_stream():
    a, b = build_basis_family(64, 16, 8), build_basis_family(64, 16, 8)
    assert a.family_hash == b.family_hash and a.members_sha256 == b.members_sha256
    other = build_basis_family(64, 16, 8, stream_template="demo-haar{r}/member={i}")
    assert other.family_hash != a.family_hash


@pytest.mark.parametrize(("D", "d", "m", "r"), [(64, 16, 6, 1), (128, 32, 6, 2), (64, 16, 4, 4)])
def test_demo_families_have_exact_uniform_pk(D, d, m, r):
    """d a multiple of r: every block holds d/r columns of each residue class, so PK = d²/D."""
    family = build_basis_family(D, d, 8, m=m)
    assert (family.m, family.r) == (m, r)
    assert family.checks["C3"]["max_rel_deviation"] < 1e-12
    assert family.checks["C2"]["max_abs_residual"] < 1e-12


def test_shape_choice():
    assert kerdock_shape(768) == (8, 3)
    assert kerdock_shape(64) == (6, 1) and kerdock_shape(128) == (6, 2)
    assert kerdock_shape(768, r=12) == (6, 12) and kerdock_shape(64, m=4) == (4, 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"d_model": 90, "d_head": 10, "n_members": 2}, "D=90"),
        ({"d_model": 100, "d_head": 20, "n_members": 24}, r"D=100.*m=2, r=25"),
        ({"d_model": 768, "d_head": 64, "n_members": 129}, r"D=768.*m=8, r=3"),
        ({"d_model": 768, "d_head": 64, "n_members": 24, "m": 7}, r"D=768, m=7"),
        ({"d_model": 768, "d_head": 64, "n_members": 24, "m": 10}, r"D=768, m=10"),
        ({"d_model": 768, "d_head": 64, "n_members": 2, "r": 5}, r"D=768, r=5"),
        ({"d_model": 768, "d_head": 100, "n_members": 2}, "d_head=100"),
    ],
)
def test_no_family_errors_name_the_shape(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_basis_family(**kwargs)


def test_rejection_rule_fires_on_coarse_misaligned_blocks():
    # D = 48 = 16·3 with d = 16: blocks straddle the groups of 3, PK deviates by < 1%
    family = build_basis_family(48, 16, 8)
    assert 0.001 < family.checks["C3"]["max_rel_deviation"] < 0.01
    with pytest.raises(BasisCheckError, match="rejection rule"):
        build_basis_family(48, 16, 8, pk_rel_tol=0.001)
    with pytest.raises(BasisCheckError, match=r"D=24, d=8, m=2, r=6"):
        build_basis_family(24, 8, 2)  # deviation ≈ 5.7%

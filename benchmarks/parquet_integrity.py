"""What verifying a Parquet input on read costs, and what each way catches: pyarrow's page
checksums (CRC-32 of every data page, written with ``write_page_checksum`` and checked with
``page_checksum_verification``) against a whole-file SHA-256 (what a producer's manifest
would record), side by side on an effects-shaped table (the largest Parquet a demo run
writes: split, example, layer, head, e and the drops).

    python benchmarks/parquet_integrity.py --rows 1000000 --flips 200

Prints, per way, the write and read times and their ratio to a plain write and read, then
the share of single flipped bytes (at uniformly random offsets, seeded) that each detects:
a flip in a data page breaks its CRC; one in the footer (schema, key-value metadata: the
provenance) is outside every page checksum, so only the file hash sees all of them.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def effects_table(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "split": pa.array(rng.choice(["discovery", "validation", "evaluation"], rows)),
            "example_id": pa.array(np.arange(rows, dtype=np.int64) // 144),
            "layer": pa.array((np.arange(rows) // 12 % 12).astype(np.int32)),
            "head": pa.array((np.arange(rows) % 12).astype(np.int32)),
            "ld_clean": pa.array(rng.standard_normal(rows)),
            "ld_patched": pa.array(rng.standard_normal(rows)),
            "e": pa.array(rng.standard_normal(rows)),
        }
    )


def timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def footer_start(data: bytes) -> int:
    """Offset of the Parquet footer (FileMetaData): its length is in the 4 bytes before the
    closing PAR1."""
    return len(data) - 8 - int.from_bytes(data[-8:-4], "little")


def detected(path: Path, flips: int, seed: int, check, footer: bool) -> tuple[int, int]:
    """(detected, flips that changed what a plain read returns or could not be read), for
    flips anywhere in the file or only in its footer."""
    data = path.read_bytes()
    rng = np.random.default_rng(seed)
    plain = pq.read_table(path)
    caught = mattered = 0
    bad = path.with_suffix(".flipped.parquet")
    low = footer_start(data) if footer else 4
    for offset in rng.integers(low, len(data) - 8, flips):  # not the length and PAR1
        flipped = bytearray(data)
        flipped[offset] ^= 0xFF
        bad.write_bytes(bytes(flipped))
        try:
            same = pq.read_table(bad).equals(plain) and (
                pq.read_schema(bad).metadata == pq.read_schema(path).metadata
            )
        except (pa.ArrowException, OSError):
            same = False
        mattered += not same
        caught += not check(bad)
    return caught, mattered


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--flips", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    table = effects_table(args.rows)
    table = table.replace_schema_metadata({"provenance": "x" * 4000})  # footer-sized metadata
    with tempfile.TemporaryDirectory() as tmp:
        plain, crc = Path(tmp) / "plain.parquet", Path(tmp) / "crc.parquet"
        w_plain = timed(lambda: pq.write_table(table, plain), args.repeats)
        w_crc = timed(lambda: pq.write_table(table, crc, write_page_checksum=True), args.repeats)
        pq.read_table(plain), pq.read_table(crc)  # both files in the page cache
        r_plain = timed(lambda: pq.read_table(plain), args.repeats)
        r_crc = timed(lambda: pq.read_table(crc, page_checksum_verification=True), args.repeats)
        r_sha = timed(lambda: (sha256(plain), pq.read_table(plain)), args.repeats)
        size = plain.stat().st_size
        print(f"{args.rows:,} rows, {size / 2**20:.1f} MiB (plain), "
              f"{crc.stat().st_size / 2**20:.1f} MiB (page checksums)")  # fmt: skip
        print(f"write: plain {w_plain * 1e3:.1f} ms, page checksums {w_crc * 1e3:.1f} ms "
              f"({w_crc / w_plain:.2f}x)")  # fmt: skip
        print(f"read:  plain {r_plain * 1e3:.1f} ms, page checksums verified "
              f"{r_crc * 1e3:.1f} ms ({r_crc / r_plain:.2f}x), whole-file SHA-256 + read "
              f"{r_sha * 1e3:.1f} ms ({r_sha / r_plain:.2f}x)")  # fmt: skip

        def crc_ok(path):
            try:
                pq.read_table(path, page_checksum_verification=True)
                return pq.read_schema(path) is not None
            except (pa.ArrowException, OSError):
                return False

        want = sha256(crc)
        for name, path, check in (
            ("page checksums", crc, crc_ok),
            ("whole-file SHA-256", crc, lambda f: sha256(f) == want),
        ):
            for where, footer in (("anywhere", False), ("in the footer", True)):
                caught, mattered = detected(path, args.flips, 1, check, footer)
                print(f"{name}: detects {caught} of {args.flips} single-byte flips {where} "
                      f"({mattered} change what a plain read returns or break it)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

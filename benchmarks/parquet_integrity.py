"""What verifying a Parquet input on read costs, and what each way catches, side by side on
an effects-shaped table (the largest Parquet a demo run writes: split, example, layer, head,
e and the drops): pyarrow's page checksums alone (CRC-32 of every data page), headgeom's
footer digests (``headgeom.io``: SHA-256 of every byte before the footer, of the Arrow
schema and of the key-value metadata, the page CRCs still written for other readers), and a
whole-file SHA-256 kept outside the file (what a producer's manifest would record).

    python benchmarks/parquet_integrity.py --rows 1000000 --flips 200

Prints, per way, the write and read times and their ratio to a plain write and read, then
for single flipped bytes (at uniformly random offsets, seeded; anywhere, then only in the
footer) how many each refuses, and how many it lets through although a read then returns
other data or metadata (silent) or the same (harmless).
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

from headgeom import io


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


def plain_read(path: Path) -> tuple[pa.Table, dict]:
    return pq.read_table(path), pq.ParquetFile(path).metadata.metadata


def outcomes(path: Path, flips: int, seed: int, read, footer: bool) -> tuple[int, int, int]:
    """(refused, silent, harmless) among ``flips`` single-byte flips of ``path`` anywhere or
    only in its footer: ``read`` raising is a refusal; otherwise the flip is silent when a
    plain read returns other data or key-value metadata than the original's."""
    data = path.read_bytes()
    rng = np.random.default_rng(seed)
    original = plain_read(path)
    refused = silent = 0
    bad = path.with_suffix(".flipped.parquet")
    low = footer_start(data) if footer else 4
    for offset in rng.integers(low, len(data) - 8, flips):  # not the length and PAR1
        flipped = bytearray(data)
        flipped[offset] ^= 0xFF
        bad.write_bytes(bytes(flipped))
        try:
            read(bad)
        except (pa.ArrowException, OSError, ValueError, KeyError):
            refused += 1
            continue
        got = plain_read(bad)
        silent += not (got[0].equals(original[0]) and got[1] == original[1])
    return refused, silent, flips - refused - silent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--flips", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    table = effects_table(args.rows)
    meta = {"provenance": "x" * 4000}  # footer-sized metadata
    with tempfile.TemporaryDirectory() as tmp:
        plain, crc, ours = (Path(tmp) / f"{n}.parquet" for n in ("plain", "crc", "ours"))
        with_meta = table.replace_schema_metadata(meta)
        w_plain = timed(lambda: pq.write_table(with_meta, plain), args.repeats)
        w_crc = timed(
            lambda: pq.write_table(with_meta, crc, write_page_checksum=True), args.repeats
        )
        w_ours = timed(lambda: io.write_parquet(ours, table, table.schema, meta), args.repeats)
        for f in (plain, crc, ours):
            pq.read_table(f)  # every file in the page cache
        r_plain = timed(lambda: pq.read_table(plain), args.repeats)
        r_crc = timed(lambda: pq.read_table(crc, page_checksum_verification=True), args.repeats)
        r_ours = timed(lambda: io.read_table(ours), args.repeats)
        r_sha = timed(lambda: (sha256(plain), pq.read_table(plain)), args.repeats)
        print(f"{args.rows:,} rows, {plain.stat().st_size / 2**20:.1f} MiB (plain), "
              f"{ours.stat().st_size / 2**20:.1f} MiB (headgeom)")  # fmt: skip
        print(f"write: plain {w_plain * 1e3:.1f} ms; page checksums {w_crc * 1e3:.1f} ms "
              f"({w_crc / w_plain:.2f}x); headgeom digests {w_ours * 1e3:.1f} ms "
              f"({w_ours / w_plain:.2f}x)")  # fmt: skip
        print(f"read:  plain {r_plain * 1e3:.1f} ms; page checksums verified "
              f"{r_crc * 1e3:.1f} ms ({r_crc / r_plain:.2f}x); headgeom digests verified "
              f"{r_ours * 1e3:.1f} ms ({r_ours / r_plain:.2f}x); whole-file SHA-256 + read "
              f"{r_sha * 1e3:.1f} ms ({r_sha / r_plain:.2f}x)")  # fmt: skip

        def crc_read(path):
            pq.read_table(path, page_checksum_verification=True)

        want = sha256(crc)

        def sha_read(path):
            if sha256(path) != want:
                raise ValueError("SHA-256 differs")

        for name, path, read in (
            ("page checksums", crc, crc_read),
            ("headgeom digests", ours, io.read_table),
            ("whole-file SHA-256", crc, sha_read),
        ):
            for where, footer in (("anywhere", False), ("in the footer", True)):
                refused, silent, harmless = outcomes(path, args.flips, 1, read, footer)
                print(f"{name}: of {args.flips} single-byte flips {where}, refuses {refused}, "
                      f"lets through {silent} changed and {harmless} harmless")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The edit atlas: what each block of a decoder-only causal LM does, read from what is lost
when it is removed, averaged or compressed, and what changed between two checkpoints of one
lineage (docs/atlas.md; the specification is ATLAS.md).

The library: :mod:`~headgeom.atlas.blocks` (the blocks of a ``transformers`` model: attention,
MLP and, where present, Gemma's per-layer-embedding branch), :mod:`~headgeom.atlas.prefix`
(edited forwards that reuse the clean run's layers before the edit),
:mod:`~headgeom.atlas.edits` (Zero, Average, rows→mean, layer skip, flatten keys, everywhere),
:mod:`~headgeom.atlas.measures` (KL, Δ top-1, skill retention, the per-layer profile),
:mod:`~headgeom.atlas.corpora` (the offline scoring corpora),
:mod:`~headgeom.atlas.tensor_groups`, :mod:`~headgeom.atlas.compression` (int-k, low rank,
vocabulary pruning, mixed precision) and :mod:`~headgeom.atlas.checkpoints` (blend dial,
grafts, drift, low-rank deltas); :mod:`~headgeom.atlas.page` writes the atlas page.
"""

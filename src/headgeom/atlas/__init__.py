"""The edit atlas: what each block of a decoder-only causal LM does, read from what is lost
when it is removed, averaged or compressed (docs/atlas.md; the specification is ATLAS.md).

The library: :mod:`~headgeom.atlas.blocks` (the blocks of a ``transformers`` model: attention,
MLP and, where present, Gemma's per-layer-embedding branch), :mod:`~headgeom.atlas.prefix`
(edited forwards that reuse the clean run's layers before the edit),
:mod:`~headgeom.atlas.edits` (Zero, Average, rows→mean, layer skip, flatten keys, everywhere),
:mod:`~headgeom.atlas.measures` (KL, Δ top-1, skill retention, the per-layer profile) and
:mod:`~headgeom.atlas.corpora` (the offline scoring corpora).
"""

"""The edit atlas's stage scripts, one module per rule (``python -m headgeom.atlas.stages.X``)."""

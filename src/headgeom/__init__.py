"""headgeom: attention-head read/write geometry and head-patching concentration."""

__version__ = "0.1.0"

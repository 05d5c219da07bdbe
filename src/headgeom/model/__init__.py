"""Architectures and geometries, the model zoo, checkpoints and interop."""

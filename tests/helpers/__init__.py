"""Builders the tests share (models, example pairs, result files); test modules import
these, never each other."""

"""Patching engines and the analyses built on them."""

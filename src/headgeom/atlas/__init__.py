"""The edit atlas: block edits, compression and two-checkpoint views of any causal LM."""

"""The study's words every layer shares: its tasks, the task splits and the head-patching
modes. Defined once here; the modules that name them import them."""

from __future__ import annotations

#: The three behavioural tasks (docs §8), in the order the paper prints them.
TASKS = ("sva", "quote", "plural")
#: The task splits (docs §8.2): discovery selects heads, validation selects directions and
#: examples, evaluation reports, holdout is reserved (§16.1).
SPLITS = ("discovery", "validation", "evaluation", "holdout")
#: What a patched head's z becomes (docs §10.1, §10.6): the reference prompt's (the paper's
#: resample patching), the head's mean z over held-out text, or zero.
MODES = ("resample", "mean", "zero")

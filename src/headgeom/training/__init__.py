"""Training (docs §7), one concept per module; callers import the submodule they need.

``config``  the run config (``RunConfig``, ``parse_run_config``) and its ``training`` section
            (``TrainConfig``), and which intermediate checkpoints a run keeps, under which names.
``data``    what each update reads: the learning rate of step s and the batch of step s in the
            corpus's data order (with replacement, or read once), and the validation windows.
``state``   the resumable state: written atomically, refused when it belongs to another run.
``loop``    the AdamW loop itself (``train``), the seeded step-0 model and the validation loss.
``job``     one (model, seed) training job as ``heads/stages/train.py`` runs it: verified corpus in,
            staged intermediate checkpoints and the final checkpoint and train log out.

Step convention: step s ∈ {1, …, steps} is the s-th optimizer update. It uses the learning
rate ``lr_at(s, cfg)`` and the batch ``batch_at(tokens, s, …)``; after it the model has seen
``s · batch_size · n_ctx`` tokens. Step 0 is the initialisation, so ``lr_at(0) == 0``
(warmup starts from 0), ``lr_at(warmup_steps) == lr_max`` and ``lr_at(steps) == lr_min``.

Exact resume: the batch and the learning rate of step s are pure functions of (data seed, s),
so a run restored from its resumable state after step s (weights and frozen buffers,
AdamW moments, RNG states, the partial log) continues to the same bytes as one that never
stopped (CPU, fp32; CUDA kernels need not be bitwise deterministic).
"""

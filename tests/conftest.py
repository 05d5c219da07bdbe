"""Shared test set-up."""

import torch

# Two cores shared with a running suite: one intra-op thread per test process keeps small
# models fast and results identical to the workflow's single-threaded training jobs.
torch.set_num_threads(1)

"""The frozen-statistic view of each host norm (SAMOE §15): at its own statistic it is the
norm itself, and at a frozen one it is additive over parts."""

import pytest
import torch
from torch import nn

from headgeom.samoe.norms import FrozenNorm


def norms():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    g = torch.Generator().manual_seed(0)
    out = [nn.LayerNorm(16, eps=1e-5), LlamaRMSNorm(16, eps=1e-6), Gemma3RMSNorm(16, eps=1e-6)]
    with torch.no_grad():
        for module in out:
            for p in module.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
    return out


@pytest.mark.parametrize("module", norms(), ids=lambda m: type(m).__name__)
def test_at_its_own_statistic_the_view_is_the_norm(module):
    v = torch.randn(16, generator=torch.Generator().manual_seed(1)) * 3 + 1
    torch.testing.assert_close(
        FrozenNorm.of(module).apply(v), module(v[None])[0], rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("module", norms(), ids=lambda m: type(m).__name__)
def test_at_a_frozen_statistic_the_view_splits_over_parts(module):
    parts = torch.randn(5, 16, generator=torch.Generator().manual_seed(2))
    m = parts.sum(0)
    f = FrozenNorm.of(module)
    sigma = f.sigma(m)
    rebuilt = f.phi(parts, sigma).sum(0) + f.offset()
    torch.testing.assert_close(rebuilt, module(m[None])[0], rtol=0, atol=1e-5)


def test_an_unknown_norm_is_refused_by_name():
    with pytest.raises(ValueError, match="GroupNorm"):
        FrozenNorm.of(nn.GroupNorm(2, 16))

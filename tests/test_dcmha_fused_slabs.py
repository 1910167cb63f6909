"""The fused DCMHA kernel's cache blocking (``csrc/dcmha_fused.cpp``) against the eager float64 reference.

The weight gradients run over slabs of a tile, kSlabRows = 16 rows for the key-side one and kSlabCols = 512 columns
for the query-side one, and the tile buffers have padded strides; the cases of ``test_dcmha_fused.py`` are at most
70 keys long, so none of their rows crosses a column slab. Here rows of up to 600 keys in 64-row tiles (a partial
last tile, a partial last slab) cross both kinds, globally and with a window wider than a slab. Tolerance as in
``test_dcmha_fused.py``: each output and gradient within 2e-5 of that tensor's largest entry (fp32 math; about 1e-6 is
seen). Run it also with ``ATEN_CPU_CAPABILITY=avx2``: the slabs and strides are the same, the vectors half as wide.
"""

import pytest
import torch
from dcmha_cases import Case
from test_dcmha_fused import assert_matches_reference

from attnzoo.attention.kernels import build

pytestmark = pytest.mark.skipif(not build.available(), reason="the fused CPU kernels cannot be built here")

SLAB_CASES = {
    "global-600": Case(window=None, length=600, n_heads=4, n_kv_heads=4, head_dim=8),
    "window-530-gqa": Case(window=530, length=600, n_heads=4, n_kv_heads=2, head_dim=8),
}


@pytest.mark.parametrize("name", SLAB_CASES)
def test_rows_wider_than_a_slab_match_the_eager_reference(name, tile_products):
    assert_matches_reference(SLAB_CASES[name], torch.float32)


def test_the_kernel_reads_strided_heads_and_returns_them_in_their_order():
    """q, k, v and dO as (1, 2)-transposes of (B, T, heads, d) tensors, the layer's own layout: the outputs and
    gradients of contiguous copies (within 1e-6 of each tensor's largest entry: BLAS may sum rows at other strides
    in another order), with O, dQ, dK and dV laid out as q, k and v."""
    build.ensure_built()
    torch.manual_seed(0)
    batch, heads, kv_heads, length, d, m = 2, 4, 2, 40, 8, 4
    q, grad_out = (torch.randn(batch, length, heads, d).transpose(1, 2) for _ in range(2))
    k, v = (torch.randn(batch, length, kv_heads, d).transpose(1, 2) for _ in range(2))
    matrices = [torch.eye(m) + 0.1 * torch.randn(batch, 1, length, m, m), 0.1 * torch.randn(batch, 1, m, m, length)]
    settings = (1, 0, d**-0.5, 16, 1024)

    def run(q, k, v, grad_out):
        out, lse = torch.ops.attnzoo.dcmha_fused_forward(q, k, v, *matrices, *matrices, None, *settings)
        grads = torch.ops.attnzoo.dcmha_fused_backward(grad_out, q, k, v, *matrices, *matrices, None, lse, *settings, 1)
        return [out, lse, *grads]

    strided = run(q, k, v, grad_out)
    contiguous = run(q.contiguous(), k.contiguous(), v.contiguous(), grad_out.contiguous())
    for got, want in zip(strided, contiguous, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6 * want.abs().max().item())
    for got, like in zip((strided[0], *strided[2:5]), (q, q, k, v), strict=True):
        assert got.stride() == like.stride()
    assert not torch.equal(strided[0], run(q, k, v.flip(2), grad_out)[0])  # the comparison can fail

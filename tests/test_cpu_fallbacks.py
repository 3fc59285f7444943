"""The CPU stand-ins for TRL's async trainer: the varlen attention matches plain causal attention."""

import pytest
import torch
import torch.nn.functional as F

from backend.runtime.trainer.cpu_fallbacks import install_cpu_fallbacks, varlen_causal_attention

pytestmark = pytest.mark.unit


def _reference(q, k, v):
    """Causal attention over one whole sequence, [tokens, heads, dim], GQA heads repeated."""
    groups = q.shape[1] // k.shape[1]
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0),
                                         is_causal=True)
    return out.transpose(0, 1)


def test_segments_attend_to_their_own_path_with_a_bottom_right_causal_mask():
    torch.manual_seed(0)
    # A tree row as TRL packs it: a shared prompt (tokens 0-3), then two branches (4-6 and 7-8).
    q, k, v = torch.randn(9, 4, 16), torch.randn(9, 2, 16), torch.randn(9, 2, 16)
    paths = [[0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 7, 8]]
    kv_index = torch.tensor([i for path in paths for i in path])
    cu_q = torch.tensor([0, 4, 7, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 11, 17], dtype=torch.int32)

    out = varlen_causal_attention(q, k.index_select(0, kv_index), v.index_select(0, kv_index), cu_q, cu_k)

    for (start, end), path in zip([(0, 4), (4, 7), (7, 9)], paths):
        ref = _reference(q[path], k[path], v[path])[-(end - start):]
        torch.testing.assert_close(out[start:end], ref)


def test_gradients_flow_through_every_segment():
    q = torch.randn(5, 2, 8, requires_grad=True)
    k, v = torch.randn(5, 1, 8, requires_grad=True), torch.randn(5, 1, 8, requires_grad=True)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    varlen_causal_attention(q, k, v, cu, cu).sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, v))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallbacks install only where CUDA is absent")
def test_install_replaces_the_hub_kernel_and_the_cuda_peak_flops_lookup():
    assert install_cpu_fallbacks() == ["no-CUDA peak FLOPs", "torch varlen attention"]
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    assert packing._flash_attn().flash_attn_varlen_func is varlen_causal_attention
    assert async_grpo_trainer.get_peak_flops_per_device(None, "float32") is None

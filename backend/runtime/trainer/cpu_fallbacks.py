"""CPU stand-ins for the two CUDA-only assumptions of TRL's async GRPO trainer (TRL 1.16).

- `get_peak_flops_per_device` asks `torch.cuda.get_device_name`, which raises without a GPU. The stand-in
  answers None, TRL's own "peak FLOPs unknown" value: MFU metrics are skipped, throughput is still logged.
- The packed "tree" attention fetches the `kernels-community/flash-attn3` kernel from the Hub. The stand-in
  runs the same varlen causal attention in plain torch: one `scaled_dot_product_attention` per segment with a
  bottom-right-aligned causal mask (a segment's queries are the last tokens of its key path), GQA heads repeated.

Call `install_cpu_fallbacks()` before building the trainer. With CUDA it does nothing, unless the `kernels`
package is missing (an offline GPU machine): then only the attention stand-in goes in.
"""

import importlib.util
import types
from itertools import pairwise

import torch
import torch.nn.functional as F


def cpu_peak_flops_per_device(accelerator, dtype: str) -> None:
    return None


def _segment_mask(len_q: int, len_k: int, window_left: int, device) -> torch.Tensor:
    """True where query i may see key j: flash-attn's causal mask, aligned to the bottom-right corner."""
    q_pos = torch.arange(len_q, device=device).unsqueeze(1) + (len_k - len_q)
    k_pos = torch.arange(len_k, device=device).unsqueeze(0)
    mask = k_pos <= q_pos
    if window_left >= 0:
        mask &= k_pos >= q_pos - window_left
    return mask


def varlen_causal_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                            softmax_scale=None, causal=True, window_size=(-1, -1), softcap=None, **_):
    """`flash_attn_varlen_func` over packed [tokens, heads, head_dim] tensors, segment by segment."""
    if not causal:
        raise NotImplementedError("the CPU stand-in only implements causal attention (all TRL uses)")
    if softcap:
        raise NotImplementedError("the CPU stand-in does not implement attention logit softcapping")
    groups = q.shape[1] // k.shape[1]
    outputs = []
    for (qs, qe), (ks, ke) in zip(pairwise(cu_seqlens_q.tolist()), pairwise(cu_seqlens_k.tolist())):
        query = q[qs:qe].transpose(0, 1)
        key = k[ks:ke].transpose(0, 1).repeat_interleave(groups, dim=0)
        value = v[ks:ke].transpose(0, 1).repeat_interleave(groups, dim=0)
        mask = _segment_mask(qe - qs, ke - ks, window_size[0], q.device)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=softmax_scale)
        outputs.append(out.transpose(0, 1))
    return torch.cat(outputs, dim=0)


def install_cpu_fallbacks() -> list[str]:
    """Patch TRL's async GRPO where its CUDA-only or Hub-only parts cannot run; returns what was replaced.

    Without CUDA both stand-ins go in. With CUDA, the attention stand-in goes in only when the `kernels`
    package (which fetches flash-attn3 from the Hub) is not installed, as on an offline GPU machine."""
    cuda = torch.cuda.is_available()
    if cuda and importlib.util.find_spec("kernels") is not None:
        return []
    from trl.experimental.async_grpo import async_grpo_trainer, packing  # noqa: PLC0415 only when a fallback is needed
    from trl.trainer import utils as trl_utils  # noqa: PLC0415 only when a fallback is needed

    patched = []
    if not cuda:
        trl_utils.get_peak_flops_per_device = cpu_peak_flops_per_device
        # The trainer imported the function by name, so its own module binding is the one it calls.
        async_grpo_trainer.get_peak_flops_per_device = cpu_peak_flops_per_device
        patched.append("no-CUDA peak FLOPs")
    # `tree_attention` looks `_flash_attn` up in its module at every call, so replacing it there is enough.
    kernel = types.SimpleNamespace(flash_attn_varlen_func=varlen_causal_attention)
    packing._flash_attn = lambda: kernel
    patched.append("torch varlen attention")
    return patched

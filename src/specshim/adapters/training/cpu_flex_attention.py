"""Train speculators' EAGLE-3 draft on the CPU: dense attention where FlexAttention cannot.

speculators' draft attends through ``torch.nn.attention.flex_attention`` with a block mask
(causal within each packed document, plus the test-time-training steps). PyTorch's
FlexAttention has no backward pass on the CPU: ``NotImplementedError: FlexAttention does not
support backward on CPU``. For CPU tensors that need gradients, the ``flex_attention`` name in
speculators' attention module is routed to ``scaled_dot_product_attention`` with the same mask
made dense (``create_mask`` over the block mask's own ``mask_mod``); everything else (GPU
tensors, inference) still goes to FlexAttention. Same mask, same scale: same attention.
"""

from __future__ import annotations

from typing import Any

from specshim.adapters.kit import module
from specshim.adapters.model import Adapter, Patch, Probe, needed, not_needed
from specshim.adapters.targets import EAGLE3_ATTENTION


def cpu_backward_supported() -> bool:
    """Try FlexAttention's backward on a 16-token CPU problem."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.zeros(1, 1, 16, 16, requires_grad=True)
    try:
        flex_attention(q, q, q).sum().backward()
    except NotImplementedError:
        return False
    return True


def probe() -> Probe:
    if cpu_backward_supported():
        return not_needed("this torch's FlexAttention has a CPU backward")
    return needed("FlexAttention has no backward on the CPU, where the draft may be trained")


def dense_attention(
    query: Any, key: Any, value: Any, block_mask: Any, scale: float | None, enable_gqa: bool
) -> Any:
    import torch
    from torch.nn.attention.flex_attention import create_mask

    _, _, q_len, kv_len = block_mask.shape
    mask = create_mask(block_mask.mask_mod, 1, 1, q_len, kv_len, device=query.device)
    mask = mask[..., : query.shape[-2], : key.shape[-2]]
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scale, enable_gqa=enable_gqa
    )


def _flex_or_dense(original: Any) -> Any:
    def flex_attention(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        needs_backward = query.requires_grad or key.requires_grad or value.requires_grad
        if query.device.type != "cpu" or not needs_backward or args:
            return original(query, key, value, *args, **kwargs)
        return dense_attention(
            query,
            key,
            value,
            kwargs["block_mask"],
            kwargs.get("scale"),
            kwargs.get("enable_gqa", False),
        )

    return flex_attention


def patches() -> list[Patch]:
    attention = module(EAGLE3_ATTENTION)
    return [Patch(attention, "flex_attention", _flex_or_dense(vars(attention)["flex_attention"]))]


ADAPTER = Adapter(
    name="cpu_flex_attention",
    targets=(f"{EAGLE3_ATTENTION}.flex_attention",),
    waits_for=(EAGLE3_ATTENTION,),
    why="PyTorch's FlexAttention has no backward on the CPU, so the draft cannot train there",
    upstream="torch.nn.attention.flex_attention._validate_device (CPU backward unsupported)",
    remove_when="PyTorch supports FlexAttention backward on the CPU",
    evidence=(
        "tests/e2e/test_train.py::test_training_fails_without"
        "[cpu_flex_attention-FlexAttention does not support backward on CPU]",
    ),
    probe=probe,
    patches=patches,
)

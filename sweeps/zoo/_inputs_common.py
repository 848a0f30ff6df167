"""What inputs.py and documented.py share (here, below both, so that neither imports the other back):
the fixed sizes (batch ``B``, text length ``S``, decoder length ``T_DEC``: see inputs.py), token-id draws,
the vision sub-config and image sizes read off a config.
"""

from __future__ import annotations

import torch

B = 2
S = 7
T_DEC = 5


def token_ids(gen: torch.Generator, shape, vocab: int, avoid: set[int]) -> torch.Tensor:
    """Ids in [3, vocab) avoiding special ids (pad/bos/eos/image placeholders...)."""
    allowed = [i for i in range(min(3, vocab - 1), vocab) if i not in avoid]
    if not allowed:
        allowed = list(range(vocab))
    table = torch.tensor(allowed, dtype=torch.long)
    idx = torch.randint(0, len(allowed), shape, generator=gen)
    return table[idx]


def _sub(config, *names):
    for n in names:
        sub = getattr(config, n, None)
        if sub is not None and not isinstance(sub, (int, float, str, bool, list, dict)):
            return sub
    return config


def vision_config(config):
    vlm = _sub(config, "vlm_config")  # wrappers around a whole VLM (ColQwen2, PI0): its vision tower
    if vlm is not config:
        config = vlm
    return _sub(config, "vision_config", "image_config", "vision_tower_config", "backbone_config", "encoder")


def _as_hw(v, default=32):
    if v is None:
        return default, default
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            return int(v[0]), int(v[0])
        return int(v[-2]), int(v[-1])
    if isinstance(v, dict):
        return int(v.get("height", v.get("shortest_edge", default))), int(v.get("width", v.get("shortest_edge", default)))
    return int(v), int(v)

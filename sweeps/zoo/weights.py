"""The tiny models' weights: the initializer range a config is built at, and re-drawn parameters.

A random tiny model must compute something that depends on its inputs, or a parity check on it passes whatever an
export does: the zoo raises a degenerate ``initializer_range`` (``raise_degenerate_init_ranges``) and an override
re-draws parameters a model's ``_init_weights`` sets to a constant (``reinit``).
"""

from __future__ import annotations

import torch


def set_init_range(config, value: float, seen: set | None = None, below: float | None = None) -> None:
    """Set ``initializer_range`` to ``value`` in ``config`` and every sub-config (only where it is below ``below``,
    if given). A config without ``initializer_range`` whose ``init_std`` is above ``value`` (CpmAnt's 1.0) gets
    ``init_std = value`` (without ``below``): see ``init_std_above``."""
    seen = set() if seen is None else seen
    if id(config) in seen:
        return
    seen.add(id(config))
    current = getattr(config, "initializer_range", None)
    if isinstance(current, (int, float)) and (below is None or current < below):
        config.initializer_range = value
    elif below is None and init_std_above(config, value):
        config.init_std = value
    for sub in vars(config).values():
        if hasattr(sub, "to_dict") and hasattr(sub, "model_type"):
            set_init_range(sub, value, seen, below)


def init_std_above(config, value: float) -> bool:
    """Whether ``config`` draws its weights at an ``init_std`` above ``value``, having no ``initializer_range``.

    transformers' ``_init_weights`` reads ``init_std`` where a config has no ``initializer_range``
    (modeling_utils.py:2303), so setting ``initializer_range`` alone leaves such a model at its own std. Only
    CpmAnt's default is above the generate items' ranges (``init_std=1.0``, configuration_cpmant.py:65): built
    at 1.0 its hidden states reach ~1e3 and its logits ~20, and float32 eager itself is 1.4e-4 from float64, past
    the 1e-4 tolerance every backend is held to. The other 43 configs with ``init_std`` default to 0.02, below
    those ranges, and are left as they are built today."""
    std = getattr(config, "init_std", None)
    return getattr(config, "initializer_range", None) is None and isinstance(std, (int, float)) and std > value


# Several vision towers default to initializer_range=1e-10 (BlipVisionConfig, SamVisionConfig, GotOcr2's, Blip-2's,
# InstructBlip's, DeepseekOcr2's SAM encoder...: their checkpoints load every weight). A random tiny model built at
# that range has a tower whose outputs are ~1e-9: every image embeds alike, a parity check on the tower passes
# whatever the export does to it, and int8 quantization collapses it to zero (BlipModel's int8 reference then
# normalizes a zero vector: NaN). The zoo builds such configs at transformers' usual 0.02 instead.
DEGENERATE_INIT_RANGE = 1e-4
USUAL_INIT_RANGE = 0.02


def raise_degenerate_init_ranges(config) -> None:
    """Every ``initializer_range`` in ``config`` below ``DEGENERATE_INIT_RANGE`` set to ``USUAL_INIT_RANGE``."""
    set_init_range(config, USUAL_INIT_RANGE, below=DEGENERATE_INIT_RANGE)


def reinit(model: torch.nn.Module, spec: dict[str, float] | None, seed: int, model_type: str) -> None:
    """An override's ``reinit``: re-draw the parameters matching each name glob from normal(0, std),
    seeded. For weights a model's ``_init_weights`` sets to a constant that leaves the tiny model
    degenerate (a zero router gate ties every expert score, so top-k picks by tie order)."""
    import fnmatch

    if not spec:
        return
    gen = torch.Generator().manual_seed(seed + 11)
    params = dict(model.named_parameters())
    for pattern, std in spec.items():
        names = sorted(n for n in params if fnmatch.fnmatchcase(n, pattern))
        if not names:
            raise KeyError(f"override for {model_type!r}: reinit pattern {pattern!r} matches no parameter "
                           f"(e.g. {sorted(params)[:5]})")
        with torch.no_grad():
            for name in names:
                p = params[name]
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)

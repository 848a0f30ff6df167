"""Per-model-type overrides, kept as DATA, one family per module so that several people
can add entries in parallel.  Each entry::

    "model_type": {        # or a class name (CamelCase) for a class-specific entry
        "reason": "one line: why the generic rules cannot know this",
        "config": {"dotted.path": value, ...},   # applied to the shrunk config dict;
                                                  # value "<delete>" removes the key (derived fields)
        "base": {kwarg: value},                   # passed to ConfigClass() when even the default is invalid
        "inputs": {...},                          # seq_len, pixel_rank (4: no frames axis),
                                                  # images_per_sample, place {token_id_name: [positions]},
                                                  # batch_size (< B: the first samples, for a forward
                                                  # that only runs at a smaller batch; say why),
                                                  # drop [input names],
                                                  # tensors {name: recipe} (documented.tensor_from_recipe:
                                                  # shape dims int / "B" / "S" / config expression),
                                                  # values {name: python value} (a non-tensor kwarg,
                                                  # e.g. sample=False; baked by the exporters)
        "reinit": {"param.name.glob": std},       # re-drawn from normal(0, std) after init, seeded
                                                  # (a constant init that degenerates the tiny model)
        "generate": {                             # only for model.generate (sweeps/generate.py), where
                                                  # it is called unlike the forward:
            "inputs": {...},                      # an input spec (keys as "inputs") used instead of
                                                  # the forward's: generate's inputs are built from it
            "generation_config": {field: value},  # set on model.generation_config; a string value
                                                  # names a generation-config field or a dotted config
                                                  # path ("pad_token_id": ids are remapped by shrinking)
        },
    }

Merged here; a model type defined in two modules is an error.  Prefer a better generic
rule in ``sweeps/zoo/shrink.py`` / ``inputs.py`` to ten overrides.
"""

from __future__ import annotations

from . import audio, multimodal, multimodal2, text, vision

_MODULES = (text, vision, audio, multimodal, multimodal2)
GENERATE_KEYS = {"inputs", "generation_config"}


def _merge() -> dict[str, dict]:
    merged: dict[str, dict] = {}
    owner: dict[str, str] = {}
    for mod in _MODULES:
        for key, entry in mod.OVERRIDES.items():
            if key in merged:
                raise ValueError(
                    f"override for model type {key!r} defined twice: in {owner[key]} and {mod.__name__}; keep one"
                )
            if not isinstance(entry, dict) or not entry.get("reason"):
                raise ValueError(f"override {key!r} in {mod.__name__} needs a dict with a one-line 'reason'")
            unknown = sorted(set(entry.get("generate", {})) - GENERATE_KEYS)
            if unknown:
                raise ValueError(f"override {key!r} in {mod.__name__}: 'generate' takes {sorted(GENERATE_KEYS)}, "
                                 f"not {unknown}")
            merged[key] = entry
            owner[key] = mod.__name__
    return merged


OVERRIDES: dict[str, dict] = _merge()


def get_override(model_type: str) -> dict:
    return OVERRIDES.get(model_type, {})

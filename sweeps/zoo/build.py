"""build_tiny: a tiny, seeded, fp32, eval-mode instance of a catalog class plus inputs."""

from __future__ import annotations

import copy
import inspect
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from .catalog import CatalogEntry, UnknownModelError, resolve_models
from .inputs import make_inputs
from .overrides import get_override
from .shrink import shrink_config_dict
from .weights import raise_degenerate_init_ranges, reinit, set_init_range

__all__ = ["TinyModel", "BlockedByPackage", "NoTensorForward", "NonFiniteOutputError", "build_tiny", "override_for",
           "place_multimodal_tokens", "run_eager", "tiny_config"]

# Attention implementation.  We set "sdpa" explicitly wherever the class supports it: it is
# what users get by default and what they export, so the conformance suite must exercise
# it.  Classes that do not support sdpa get "eager" (also set explicitly; recorded in
# TinyModel.attn_implementation).
PREFERRED_ATTN = "sdpa"


class BlockedByPackage(ImportError):
    """The class needs a package that cannot be installed in this environment."""


class NoTensorForward(BlockedByPackage):
    """The class has no forward over tensors to run or export (generate-only wrapper, a forward
    taking a stateful Python session object, or a class the auto mappings name but transformers
    lacks).  A ``BlockedByPackage`` so that it travels the same listed-and-xfailed path."""


class NonFiniteOutputError(FloatingPointError):
    """The eager forward of the tiny model produced NaN/inf."""


@dataclass
class TinyModel:
    model: torch.nn.Module
    inputs: dict[str, torch.Tensor]
    config: Any
    entry: CatalogEntry | None = None
    attn_implementation: str = PREFERRED_ATTN
    outputs: Any = field(default=None, repr=False)

    def __iter__(self):  # allow `model, inputs, config = build_tiny(...)`
        return iter((self.model, self.inputs, self.config))

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def _set_path(d: dict, path: str, value: Any) -> None:
    keys = path.split(".")
    cur = d
    for k in keys[:-1]:
        if not isinstance(cur.get(k), dict):
            raise KeyError(f"override path {path!r}: {k!r} is not a sub-config (have: {sorted(cur)[:20]})")
        cur = cur[k]
    if value is DELETE or value == "<delete>":
        cur.pop(keys[-1], None)
    else:
        cur[keys[-1]] = copy.deepcopy(value)  # override data is shared: never let a config mutate it


class _Delete:
    def __repr__(self):
        return "DELETE"


DELETE = _Delete()


def _class_config(config, cls):
    """The config the class wants: for e.g. Llama4ForCausalLM (Llama4TextConfig) under model type
    llama4 (Llama4Config), the matching (already shrunk) sub-config of the composite."""
    want = getattr(cls, "config_class", None)
    if want is None or isinstance(config, want):
        return config
    for c in _iter_configs(config):
        if isinstance(c, want):
            return c
    for c in _iter_configs(config):  # same class name in another module (modular copies)
        if type(c).__name__ == want.__name__:
            return c
    return None


def _ensure_pad_token(config) -> None:
    """Sequence classification with batch > 1 needs a pad id; give configs without one id 0
    (inputs avoid ids < 3)."""
    for c in _iter_configs(config):
        if "pad_token_id" in getattr(c, "__dataclass_fields__", {}) or hasattr(c, "pad_token_id"):
            try:
                if getattr(c, "pad_token_id", None) is None and getattr(c, "vocab_size", None):
                    c.pad_token_id = 0
            except Exception:
                pass


def tiny_config(model_type: str, config_overrides: dict | None = None):
    """The shrunk config for a model type (generic rules + overrides data)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise UnknownModelError(f"unknown model type {model_type!r}: not in transformers' CONFIG_MAPPING")
    config_cls = CONFIG_MAPPING[model_type]
    ov = get_override(model_type)
    base_kwargs = dict(ov.get("base", {}))
    default = config_cls(**base_kwargs)
    d = default.to_dict()
    d = shrink_config_dict(d)
    for path, value in {**ov.get("config", {}), **(config_overrides or {})}.items():
        _set_path(d, path, value)
    for k in ("transformers_version", "architectures", "_name_or_path"):
        d.pop(k, None)
    d["dtype"] = "float32"
    config = config_cls(**d)
    _fix_hardcoded_rope_sections(config)
    return config


def _iter_configs(config, seen=None):
    seen = seen if seen is not None else set()
    if id(config) in seen:
        return
    seen.add(id(config))
    yield config
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            yield from _iter_configs(sub, seen)


def _fix_hardcoded_rope_sections(config) -> None:
    """Configs that exempt ``mrope_section`` from rope validation fall back to a section list
    hard-coded in the modeling code (e.g. [16, 24, 24] for head_dim 128).  Give them one that
    sums to the tiny head_dim // 2."""
    from .shrink import _split_sum

    for c in _iter_configs(config):
        if "mrope_section" not in (getattr(type(c), "ignore_keys_at_rope_validation", None) or ()):
            continue
        rp = getattr(c, "rope_parameters", None)
        if not isinstance(rp, dict) or rp.get("mrope_section"):
            continue
        hd = getattr(c, "head_dim", None) or (c.hidden_size // c.num_attention_heads)
        rp["mrope_section"] = _split_sum(hd // 2, 3)


def _resolve_entry(entry) -> CatalogEntry:
    if isinstance(entry, CatalogEntry):
        return entry
    if isinstance(entry, str):
        matches = resolve_models([entry])
        exact = [e for e in matches if e.class_name.lower() == entry.lower()]
        if exact:
            return exact[0]
        if len(matches) == 1:
            return matches[0]
        raise UnknownModelError(
            f"{entry!r} matches {len(matches)} classes ({', '.join(e.class_name for e in matches[:6])}...); "
            "build_tiny needs one: pass a class name or a CatalogEntry from catalog()/resolve_models()"
        )
    raise TypeError(
        f"build_tiny expects a CatalogEntry (from sweeps.zoo.catalog()/resolve_models()) or a class name, got {type(entry).__name__}"
    )


_BLOCK_RE = re.compile(r"requires the (\w+) library|"
                       r"No module named '(timm|natten|detectron2|torchvision|torchaudio|pytesseract|decord|av|librosa|soundfile)'|"
                       r"(\w+) library but it was not found", re.I)


def _blocked_from(exc: BaseException) -> str | None:
    msg = str(exc)
    m = _BLOCK_RE.search(msg)
    if isinstance(exc, ImportError) and m:
        pkg = next(g for g in m.groups() if g)
        if "timm" in msg.lower():  # "X requires the PIL library" raised by a timm-backed tower
            pkg = "timm"
        return f"needs {pkg} (not installable here): {msg.strip().splitlines()[0][:200]}"
    return None


def _instantiate(cls, config, attn: str):
    config = copy.deepcopy(config)
    return cls._from_config(config, attn_implementation=attn, dtype=torch.float32)


def _named_leaves(obj, prefix="out"):
    """``(name, leaf)`` for every leaf of a model output (ModelOutput, dict, list, tuple, tensor)."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif hasattr(obj, "to_tuple") and hasattr(obj, "keys"):
        for k in obj.keys():
            yield from _named_leaves(obj[k], f"{prefix}.{k}")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _named_leaves(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _named_leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix, obj


def _first_nonfinite(obj, prefix="out") -> str | None:
    for name, leaf in _named_leaves(obj, prefix):
        if isinstance(leaf, torch.Tensor) and (leaf.is_floating_point() or leaf.is_complex()) \
                and not torch.isfinite(leaf).all():
            return name
    return None


_PLACEHOLDER_RE = re.compile(
    r"(image|video|audio|multimodal)s? (?:features|embeddings?) and (?:\1s? )?tokens do not match.*?features:? ?(\d+)", re.I | re.S)


def _placeholder_ids(config, modality: str) -> int | None:
    names = [f"{modality}_token_id", f"{modality}_token_index"]
    for src in [config, getattr(config, "text_config", None), *_iter_configs(config)]:
        if src is None:
            continue
        for n in names:
            v = getattr(src, n, None)
            if isinstance(v, int):
                return v
    return None


def _place_tokens(inputs, config, modality: str, n_total: int, seed: int) -> dict:
    tok = _placeholder_ids(config, modality)
    ids = inputs["input_ids"]
    b = ids.shape[0]  # B, or an override's smaller batch_size
    if tok is None or n_total % b:
        return inputs
    per = n_total // b
    existing = {t: (ids == t).sum(-1) for t in [tok]}
    if int(existing[tok][0]) == per:
        return inputs
    # drop old placeholders of this modality, then put `per` of them after a 2-token prefix
    rows = []
    for r in range(b):
        row = ids[r][ids[r] != tok]
        rows.append(torch.cat([row[:2], torch.full((per,), tok, dtype=torch.long), row[2:]]))
    new_ids = torch.stack(rows)
    out = dict(inputs)
    out["input_ids"] = new_ids
    L = new_ids.shape[1]
    if "attention_mask" in out:
        out["attention_mask"] = torch.ones((b, L), dtype=torch.long)
    if "token_type_ids" in out:  # multimodal models use token types to mark placeholder tokens
        out["token_type_ids"] = (new_ids == tok).long()
    return _mm_token_types(out, config)


def _mm_token_types(inputs: dict, config) -> dict:
    if "mm_token_type_ids" not in inputs:
        return inputs
    ids = inputs["input_ids"]
    tt = torch.zeros_like(ids)
    for code, modality in ((1, "image"), (2, "video"), (3, "audio")):
        tok = _placeholder_ids(config, modality)
        # only modalities fed here: configs may alias one placeholder id (Molmo2: video_token_id -> image_patch_id)
        if tok is not None and any(k in inputs for k in _MODAL_KEYS[modality]):
            tt[ids == tok] = code
    inputs["mm_token_type_ids"] = tt
    return inputs


_MODAL_KEYS = {
    "image": ("pixel_values", "image_sizes", "image_grid_thw", "image_grid_hw", "pixel_attention_mask", "image_attention_mask",
              "image_token_pooling", "image_grids"),
    "video": ("pixel_values_videos", "video_grid_thw"),
    "audio": ("input_features", "input_features_mask", "feature_attention_mask", "audio_values", "input_values"),
}
_MODAL_MAIN = {"image": "pixel_values", "video": "pixel_values_videos", "audio": "input_features"}


def _count_features(model, config, inputs, modality: str) -> int | None:
    """Number of placeholder tokens the model's own feature extractor produces (all images)."""
    fn = getattr(model, f"get_{modality}_features", None)
    if fn is None:
        inner = getattr(model, "model", None)
        fn = getattr(inner, f"get_{modality}_features", None)
    if fn is None:
        return None
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    kwargs = {k: v for k, v in inputs.items() if k in params and k in _MODAL_KEYS[modality]}
    if not kwargs:
        return None
    try:
        with torch.no_grad():
            out = fn(**kwargs)
    except Exception:
        return None
    feats = getattr(out, "pooler_output", None)
    if feats is None:
        feats = out[0] if isinstance(out, (tuple, list)) or hasattr(out, "to_tuple") else out
    if isinstance(feats, torch.Tensor):
        feats = [feats]
    if not isinstance(feats, (list, tuple)) or not all(isinstance(f, torch.Tensor) for f in feats):
        return None
    try:
        hidden = config.get_text_config(decoder=True).hidden_size
    except Exception:
        hidden = None
    total = 0
    for f in feats:
        last = f.shape[-1]
        if hidden and last != hidden and f.numel() % hidden == 0:
            last = hidden
        total += f.numel() // last
    return total


def place_multimodal_tokens(model, config, inputs, seed: int) -> dict:
    if "input_ids" not in inputs:
        return inputs
    for modality, main in _MODAL_MAIN.items():
        if main not in inputs or _placeholder_ids(config, modality) is None:
            continue
        n = _count_features(model, config, inputs, modality)
        if n:
            inputs = _place_tokens(inputs, config, modality, n, seed)
    return inputs


def _run_probing(model, config, inputs, seed):
    """One eager forward; when the model reports a placeholder/feature count mismatch, put that
    many placeholder tokens in input_ids and retry (the count comes from the model itself)."""
    for _ in range(4):
        try:
            return inputs, run_forward(model, inputs)
        except Exception as exc:  # noqa: BLE001
            m = _PLACEHOLDER_RE.search(str(exc))
            if not m or "input_ids" not in inputs:
                raise
            modality = m.group(1).lower()
            new = _place_tokens(inputs, config, "image" if modality == "multimodal" else modality, int(m.group(2)), seed)
            if new is inputs:
                raise
            inputs = new
    raise RuntimeError("could not match multimodal placeholder tokens to the features the towers produce")


def _run_first_layout(model, config, inputs, seed):
    """Run the generic inputs; if the forward raises, try the layout alternatives in order
    (placeholders recounted for each) and keep the first that runs.  Re-raises the first error."""
    from .alternatives import ALTERNATIVES

    try:
        return _run_probing(model, config, inputs, seed)
    except Exception as first:  # noqa: BLE001
        for _name, transform in ALTERNATIVES:
            alt = transform(inputs, config, model)
            if alt is None:
                continue
            alt = place_multimodal_tokens(model, config, alt, seed)
            try:
                return _run_probing(model, config, alt, seed)
            except Exception:  # noqa: BLE001
                continue
        raise first


def _mrope_positions(model, inputs: dict) -> Any:
    """Multimodal RoPE position ids (3, batch, seq), computed the way the model computes them itself.

    The 21 families with ``compute_3d_position_ids`` (Qwen2-VL and its descendants, GLM-4V, ...)
    derive these from ``input_ids`` and the image grids with per-sample Python loops over the token
    runs: data-dependent, so no exporter can trace them. Their deployments compute them in
    preprocessing next to the processor and pass ``position_ids``; the zoo does the same, so the
    export covers the network and the positions stay exactly the model's. ``None`` when the class
    has no such method, its forward takes no ``position_ids``, or the inputs already carry them."""
    if "position_ids" in inputs or "input_ids" not in inputs:
        return None
    try:
        if "position_ids" not in inspect.signature(model.forward).parameters:
            return None
    except (TypeError, ValueError):
        return None
    core = next((m for m in model.modules() if hasattr(type(m), "compute_3d_position_ids")), None)
    if core is None:
        return None
    params = inspect.signature(core.compute_3d_position_ids).parameters
    kwargs = {k: inputs.get(k) for k, p in params.items()  # required ones absent from the inputs: None
              if k != "inputs_embeds" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
              and (k in inputs or p.default is p.empty)}
    saved = core.__dict__.get("rope_deltas")
    try:
        with torch.no_grad():
            embeds = core.get_input_embeddings()(inputs["input_ids"])
            if "inputs_embeds" in params:
                kwargs["inputs_embeds"] = embeds
            positions = core.compute_3d_position_ids(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the export then meets the data-dependent code, visibly
        warnings.warn(f"{type(model).__name__}: compute_3d_position_ids failed ({type(exc).__name__}: {exc}); "
                      "the inputs carry no position_ids", stacklevel=2)
        return None
    finally:
        if "rope_deltas" in core.__dict__:
            core.rope_deltas = saved  # the call caches the deltas; leave the model as it was
    return positions if isinstance(positions, torch.Tensor) else None


def _same_outputs(a: Any, b: Any) -> bool:
    left, right = dict(_named_leaves(a)), dict(_named_leaves(b))
    if left.keys() != right.keys():
        return False
    for name, x in left.items():
        y = right[name]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not (torch.equal(x, y) or torch.allclose(x, y, atol=1e-6, rtol=0)):
                return False
        elif type(x) is not type(y):
            return False
    return True


def _with_mrope_positions(model, inputs: dict, out: Any) -> tuple[dict, Any]:
    """Add the model's own multimodal RoPE positions as ``position_ids`` (see ``_mrope_positions``),
    and keep them only if the forward then gives the same outputs as without."""
    positions = _mrope_positions(model, inputs)
    if positions is None:
        return inputs, out
    with_positions = {**inputs, "position_ids": positions}
    out2 = run_forward(model, with_positions)
    if not _same_outputs(out, out2):
        warnings.warn(f"{type(model).__name__}: outputs differ with precomputed position_ids; the zoo keeps "
                      "the inputs without them", stacklevel=2)
        return inputs, out
    return with_positions, out2


def run_forward(model, inputs):
    with torch.no_grad():
        return model(**inputs)




def build_tiny(entry, seed: int = 0, *, check: bool = True, init_range: float | None = None) -> TinyModel:
    """Tiny fp32 eval-mode model + inputs for a catalog entry (or class name).

    With ``check`` (default) one eager forward is run and must give finite outputs;
    the outputs are kept on ``TinyModel.outputs``. ``init_range`` replaces ``initializer_range`` in the
    config and every sub-config (the generate sweep: at the default 0.02 a tiny LM repeats one token).
    """
    import transformers

    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    entry = _resolve_entry(entry)
    if entry.blocked_by:
        from .blocked import untestable_reason

        exc_cls = NoTensorForward if untestable_reason(entry.class_name) == entry.blocked_by else BlockedByPackage
        raise exc_cls(f"{entry.class_name}: {entry.blocked_by}")
    try:
        cls = getattr(transformers, entry.class_name)
    except (ImportError, AttributeError) as exc:
        reason = _blocked_from(exc) if isinstance(exc, ImportError) else None
        if reason:
            raise BlockedByPackage(f"{entry.class_name}: {reason}") from exc
        if isinstance(exc, AttributeError):
            raise AttributeError(
                f"{entry.class_name} is listed in transformers' auto mappings (model type {entry.model_type!r}) but "
                f"transformers {transformers.__version__} does not export it; nothing to build (if it truly has no "
                "class, list it in sweeps/zoo/blocked.py NO_TENSOR_FORWARD_BY_CLASS)") from exc
        raise
    if getattr(cls.forward, "__name__", "") == "_forward_unimplemented":
        raise NotImplementedError(
            f"{entry.class_name} defines no forward() (a generate-only wrapper); there is no eager forward to run "
            "(list it in sweeps/zoo/blocked.py NO_TENSOR_FORWARD_BY_CLASS)")
    ov, ov_cls = override_for(entry)
    try:
        config = tiny_config(entry.model_type, config_overrides=ov_cls.get("config"))
    except ImportError as exc:
        reason = _blocked_from(exc)
        if reason:
            raise BlockedByPackage(f"{entry.class_name}: {reason}") from exc
        raise
    cls_config = _class_config(config, cls)
    if cls_config is None:
        want = cls.config_class
        d = shrink_config_dict(want().to_dict())
        for k in ("transformers_version", "architectures", "_name_or_path"):
            d.pop(k, None)
        cls_config = want(**d)
        _fix_hardcoded_rope_sections(cls_config)
    config = cls_config
    _ensure_pad_token(config)
    # as users configure encoder families for causal LM heads (BertGenerationDecoder, in the causal-LM mapping
    # without the suffix, warns "If you want to use BertGenerationDecoder as a standalone, add is_decoder=True")
    if (entry.class_name.endswith(("ForCausalLM", "LMHeadModel", "WithLMHead")) or "causal_lm" in entry.tasks) \
            and hasattr(config, "is_decoder") and not getattr(config, "is_encoder_decoder", False):
        config.is_decoder = True
    if init_range is not None:
        set_init_range(config, init_range)
    else:  # a vision tower initialized at 1e-10 is degenerate at random weights (sweeps/zoo/weights.py)
        raise_degenerate_init_ranges(config)
    attn = ov.get("attn", PREFERRED_ATTN)
    torch.manual_seed(seed)
    try:
        try:
            model = _instantiate(cls, config, attn)
        except ValueError as exc:
            if attn == "sdpa" and ("sdpa" in str(exc) or "scaled_dot_product" in str(exc)):
                attn = "eager"
                torch.manual_seed(seed)
                model = _instantiate(cls, config, attn)
            else:
                raise
    except ImportError as exc:
        reason = _blocked_from(exc)
        if reason:
            raise BlockedByPackage(f"{entry.class_name}: {reason}") from exc
        raise
    model = model.float().eval()
    reinit(model, ov.get("reinit"), seed, entry.model_type)
    config = model.config
    inputs = make_inputs(model, config, seed=seed, spec=ov.get("inputs"))
    inputs = place_multimodal_tokens(model, config, inputs, seed)
    tiny = TinyModel(model=model, inputs=inputs, config=config, entry=entry, attn_implementation=attn)
    if check:
        run_eager(tiny, seed)
    return tiny


def override_for(entry) -> tuple[dict, dict]:
    """(the override to apply, the class-specific one alone): a class-specific entry (keyed by class name, rare)
    merged over its model type's; ``inputs`` and ``generate`` merged key by key, ``config`` left to ``tiny_config``."""
    ov = get_override(entry.model_type)
    ov_cls = get_override(entry.class_name)
    if ov_cls:
        ov = {**ov, **{k: v for k, v in ov_cls.items() if k != "config"},
              "inputs": {**ov.get("inputs", {}), **ov_cls.get("inputs", {})},
              "generate": {**ov.get("generate", {}), **ov_cls.get("generate", {})}}
    return ov, ov_cls


def run_eager(tiny: TinyModel, seed: int = 0) -> Any:
    """The zoo's eager check: run the forward, and where the generic inputs are refused, switch
    ``tiny.inputs`` to the first layout alternative the model takes. Sets and returns
    ``tiny.outputs``; raises NonFiniteOutputError for NaN/inf outputs.

    ``build_tiny(check=False)`` leaves this to the caller (the sweep runs it as its own "eager"
    stage): a caller that runs the forward itself instead gets the generic layout, not the one
    the zoo validated."""
    tiny.inputs, out = _run_first_layout(tiny.model, tiny.config, tiny.inputs, seed)
    tiny.inputs, out = _with_mrope_positions(tiny.model, tiny.inputs, out)
    bad = _first_nonfinite(out)
    if bad:
        raise NonFiniteOutputError(f"{tiny.entry.class_name}: eager output {bad} has NaN/inf")
    tiny.outputs = out
    return out

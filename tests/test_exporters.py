"""End to end: the three exporters on tiny hand-built models, static and dynamic, against eager.

Each tiny model is built once per module (seeded, eval, attention implementation set explicitly),
and each (model, backend, variant) is exported once and shared by the tests that need it:
ExecuTorch lowering costs ~20 s per export on a small CPU machine. Hand-written toy modules (errors,
explicit shapes, guards, specialized inputs, outputs) are in test_export_edge_cases.py.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from _backend_params import _SLOW, _backends

import exporters
from exporters import BACKENDS, InputError, get_exporter
from exporters.parity import ParityError, assert_close
from exporters.utils import Registry, find_leaked_patches, flatten_outputs, patch_targets_snapshot, register_patch

# ── tiny models ───────────────────────────────────────────────────────────────


@dataclasses.dataclass
class Tiny:
    model: torch.nn.Module
    inputs: dict  # traced inputs (may hold non-tensor constants such as use_cache)
    other: dict  # tensor inputs at another batch size and sequence length, for dynamic artifacts
    varied: dict  # input name -> dims that differ between ``inputs`` and ``other``


def _ids(g, vocab, b, s):
    return torch.randint(1, vocab, (b, s), generator=g)


def _llama() -> Tiny:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, attn_implementation="eager",
    )
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(0)

    def make(b, s):
        return {"input_ids": _ids(g, 64, b, s), "attention_mask": torch.ones(b, s, dtype=torch.long)}

    return Tiny(model, {**make(2, 5), "use_cache": True}, make(3, 7), {"input_ids": (0, 1), "attention_mask": (0, 1)})


def _bert() -> Tiny:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64, attn_implementation="sdpa",
    )
    model = BertModel(cfg).eval()
    g = torch.Generator().manual_seed(1)

    def make(b, s):
        mask = torch.ones(b, s, dtype=torch.long)
        mask[0, -1] = 0  # one padded position, so the mask matters
        return {"input_ids": _ids(g, 64, b, s), "attention_mask": mask}

    return Tiny(model, make(2, 6), make(4, 9), {"input_ids": (0, 1), "attention_mask": (0, 1)})


def _vit() -> Tiny:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=3, attn_implementation="eager",
    )
    model = ViTForImageClassification(cfg).eval()
    g = torch.Generator().manual_seed(2)
    return Tiny(
        model,
        {"pixel_values": torch.randn(2, 3, 32, 32, generator=g)},
        {"pixel_values": torch.randn(3, 3, 32, 32, generator=g)},  # image size is fixed by the config
        {"pixel_values": (0,)},
    )


def _t5() -> Tiny:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    cfg = T5Config(
        vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
        relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0, attn_implementation="eager",
    )
    model = T5ForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(3)

    def make(b, s, t):
        return {
            "input_ids": _ids(g, 64, b, s),
            "attention_mask": torch.ones(b, s, dtype=torch.long),
            "decoder_input_ids": _ids(g, 64, b, t),
        }

    return Tiny(
        model, make(2, 6, 4), make(3, 8, 5),
        {"input_ids": (0, 1), "attention_mask": (0, 1), "decoder_input_ids": (0, 1)},
    )


BUILDERS = {"llama": _llama, "bert": _bert, "vit": _vit, "t5": _t5}


@pytest.fixture(scope="module")
def tiny_models():
    cache: dict[str, Tiny] = {}

    def get(name: str) -> Tiny:
        if name not in cache:
            tiny = BUILDERS[name]()
            assert tiny.model.config._attn_implementation in ("eager", "sdpa")
            assert not tiny.model.training
            cache[name] = tiny
        return cache[name]

    return get


def _eager(tiny: Tiny, inputs: dict) -> dict[str, torch.Tensor]:
    constants = {k: v for k, v in tiny.inputs.items() if not isinstance(v, torch.Tensor)}
    with torch.no_grad():
        return {k: v.clone() for k, v in flatten_outputs(tiny.model(**inputs, **constants)).items()}


def _tensors(inputs: dict) -> dict:
    return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}


@pytest.fixture(scope="module")
def artifacts(tiny_models):
    """``artifacts(model, backend, dynamic)``: exported once per module, then shared."""
    cache = {}

    def get(name: str, backend: str, dynamic: bool):
        key = (name, backend, dynamic)
        if key not in cache:
            tiny = tiny_models(name)
            exporter = get_exporter(backend)
            with torch.no_grad():
                cache[key] = exporter.export(tiny.model, tiny.inputs, config=exporter.config_class(dynamic=dynamic))
        return cache[key]

    return get


def _cases():
    for backend in BACKENDS:
        marks = _SLOW if backend == "executorch" else []
        for name in BUILDERS:
            for dynamic in (False, True):
                variant = "dynamic" if dynamic else "static"
                yield pytest.param(name, backend, dynamic, id=f"{name}-{backend}-{variant}", marks=marks)


# ── parity, output names, dynamic dims ────────────────────────────────────────


@pytest.mark.parametrize("name,backend,dynamic", list(_cases()))
def test_export_matches_eager(tiny_models, artifacts, name, backend, dynamic):
    tiny = tiny_models(name)
    art = artifacts(name, backend, dynamic)
    expected = _eager(tiny, _tensors(tiny.inputs))
    assert art.backend == backend
    assert art.output_names == list(expected)
    if name == "llama":
        assert "past_key_values.0.key" in art.output_names and "past_key_values.0.value" in art.output_names
    assert art.input_names == list(_tensors(tiny.inputs))

    actual = art(**_tensors(tiny.inputs))
    assert list(actual) == list(expected)
    assert_close(expected, actual, backend)

    if not dynamic:
        assert art.dynamic_dims == {}
        return
    for input_name, dims in tiny.varied.items():
        assert set(dims) <= set(art.dynamic_dims.get(input_name, {})), (input_name, art.dynamic_dims)
    other = tiny.other
    expected_other = _eager(tiny, other)
    actual_other = art(**other)
    assert tuple(actual_other[art.output_names[0]].shape) == tuple(expected_other[art.output_names[0]].shape)
    assert_close(expected_other, actual_other, backend)
    # the artifact really ran on the new shapes: its outputs do not match the traced-shape eager outputs
    with pytest.raises(ParityError):
        assert_close(expected, actual_other, backend)


# ── saving ────────────────────────────────────────────────────────────────────

_FILES = {"dynamo": "model.pt2", "onnx": "model.onnx", "executorch": "model.pte"}


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_save_writes_model_and_metadata(tiny_models, artifacts, tmp_path, backend, dynamic):
    art = artifacts("llama", backend, dynamic)
    path = art.save(tmp_path / "out")
    assert os.path.basename(path) == _FILES[backend]
    assert os.path.getsize(path) > 0
    with open(tmp_path / "out" / "metadata.json") as f:
        meta = json.load(f)
    assert meta["backend"] == backend
    assert meta["input_names"] == art.input_names == ["input_ids", "attention_mask"]
    assert meta["output_names"] == art.output_names
    assert isinstance(meta["workarounds_fired"], list) and meta["workarounds_fired"] == art.workarounds_fired
    for package in ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "executorch"):
        assert meta["versions"][package] and meta["versions"][package] != "not installed"
    assert meta["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert meta["dynamic_dims"] == {n: {str(d): v for d, v in dims.items()} for n, dims in art.dynamic_dims.items()}
    if dynamic:
        assert set(meta["dynamic_dims"]) == {"input_ids", "attention_mask"}
        for dims in meta["dynamic_dims"].values():
            for spec in dims.values():
                assert set(spec) == {"symbol", "min", "max"} and spec["min"] <= 5 <= spec["max"]
                assert spec["max"] == art.config.max_dim  # stage 4 bounds every AUTO dim by config.max_dim
    else:
        assert meta["dynamic_dims"] == {}
    assert meta["inputs"]["input_ids"] == {"shape": [2, 5], "dtype": "int64"}

    if backend == "onnx":
        import onnx

        proto = onnx.load(path)
        assert [o.name for o in proto.graph.output] == art.output_names
        assert "patch:onnx:torch.onnx._internal.exporter._fx_passes.decompose_with_registry" in meta["workarounds_fired"]
        assert meta["optimize"] is True
    elif backend == "dynamo":
        loaded = torch.export.load(path)
        tiny = tiny_models("llama")
        out = loaded.module()(**_tensors(tiny.inputs))
        got = [v for v in torch.utils._pytree.tree_leaves(out) if isinstance(v, torch.Tensor)]
        assert_close(_eager(tiny, _tensors(tiny.inputs)), dict(zip(art.output_names, got)), "dynamo")
    else:
        assert meta["executorch_backend"] == "xnnpack"
        with open(path, "rb") as f:
            assert f.read() == art.buffer


# ── input checking ────────────────────────────────────────────────────────────


@pytest.mark.parametrize("backend", _backends())
def test_dynamic_artifact_rejects_shape_outside_bounds(tiny_models, artifacts, backend):
    tiny = tiny_models("llama")
    art = artifacts("llama", backend, True)
    spec = art.dynamic_dims["input_ids"][1]
    too_long = spec["max"] + 1
    inputs = {"input_ids": torch.ones(2, too_long, dtype=torch.long), "attention_mask": torch.ones(2, too_long, dtype=torch.long)}
    with pytest.raises(InputError, match=rf"'input_ids' dim 1.*{too_long}"):
        art(**inputs)
    if spec["min"] > 0:
        short = spec["min"] - 1
        with pytest.raises(InputError, match=r"dim 1.*outside"):
            art(input_ids=torch.ones(2, short, dtype=torch.long), attention_mask=torch.ones(2, short, dtype=torch.long))
    assert art(**_tensors(tiny.inputs))  # still usable


@pytest.mark.parametrize("backend", _backends())
def test_static_artifact_rejects_changed_dim(tiny_models, artifacts, backend):
    tiny = tiny_models("llama")
    art = artifacts("llama", backend, False)
    inputs = _tensors(tiny.inputs)
    changed = dict(inputs, attention_mask=torch.ones(2, 6, dtype=torch.long))
    with pytest.raises(InputError, match=r"'attention_mask' dim 1 is static.*5.*6"):
        art(**changed)
    with pytest.raises(InputError, match=r"'input_ids' dim 0"):
        art(**dict(inputs, input_ids=torch.ones(3, 5, dtype=torch.long)))


def test_artifact_rejects_wrong_names_dtypes_ranks_and_constants(tiny_models, artifacts):
    tiny = tiny_models("llama")
    art = artifacts("llama", "dynamo", False)
    inputs = _tensors(tiny.inputs)
    with pytest.raises(InputError, match="missing.*attention_mask"):
        art(input_ids=inputs["input_ids"])
    with pytest.raises(InputError, match="unexpected.*pixel_values"):
        art(**inputs, pixel_values=torch.zeros(1))
    with pytest.raises(InputError, match="'input_ids' has dtype"):
        art(**dict(inputs, input_ids=inputs["input_ids"].to(torch.int32)))
    with pytest.raises(InputError, match="'input_ids' has rank"):
        art(**dict(inputs, input_ids=inputs["input_ids"][0]))
    with pytest.raises(InputError, match="use_cache=False.*baked"):
        art(**inputs, use_cache=False)
    assert list(art(**inputs, use_cache=True)) == art.output_names


# ── get_exporter, registry injection ──────────────────────────────────────────


@pytest.mark.parametrize("typo,suggestion", [("onxx", "onnx"), ("executorc", "executorch"), ("dynamoo", "dynamo")])
def test_get_exporter_unknown_backend_lists_close_matches(typo, suggestion):
    with pytest.raises(ValueError) as info:
        get_exporter(typo)
    msg = str(info.value)
    assert repr(typo) in msg and "did you mean" in msg and suggestion in msg.split("did you mean", 1)[1]


def test_get_exporter_returns_each_backend_with_its_registry():
    reg = Registry()
    for backend in BACKENDS:
        exp = get_exporter(backend, registry=reg)
        assert exp.backend == backend and exp.registry is reg
        assert isinstance(exp.config_class(dynamic=True), exporters.ExportConfig)
    assert type(get_exporter("onnx")).__name__ == "OnnxExporter"
    assert get_exporter("dynamo").registry is exporters.utils.DEFAULT_REGISTRY


def test_injected_patch_fires_is_reported_and_restored(tiny_models):
    from transformers.models.llama import modeling_llama

    tiny = tiny_models("llama")
    reg = Registry()
    calls = []

    @register_patch("dynamo", "transformers.models.llama.modeling_llama.rotate_half", registry=reg)
    def _patch_rotate_half(original):
        def rotate_half(x):
            calls.append(x.shape)
            return original(x)

        return rotate_half

    before = modeling_llama.rotate_half
    snap = patch_targets_snapshot("dynamo", registry=reg)
    art = exporters.DynamoExporter(registry=reg).export(tiny.model, tiny.inputs)
    assert calls, "the patched function was not used while tracing"
    assert "patch:dynamo:transformers.models.llama.modeling_llama.rotate_half" in art.workarounds_fired
    assert art.metadata["workarounds_fired"] == art.workarounds_fired
    assert modeling_llama.rotate_half is before and find_leaked_patches(snap) == []
    assert_close(_eager(tiny, _tensors(tiny.inputs)), art(**_tensors(tiny.inputs)), "dynamo")


def test_unfired_patch_not_reported(tiny_models):
    tiny = tiny_models("bert")
    reg = Registry()
    register_patch("dynamo", "torch.where", registry=reg)(lambda original: lambda *a, **k: original(*a, **k))
    register_patch("dynamo", "_targets.plain", registry=reg)(lambda original: original)
    art = exporters.DynamoExporter(registry=reg).export(tiny.model, tiny.inputs)
    assert "patch:dynamo:_targets.plain" not in art.workarounds_fired
    assert set(art.workarounds_fired) <= {"patch:dynamo:torch.where"}


def test_export_leaves_model_usable_and_unpatched(tiny_models, artifacts):
    tiny = tiny_models("llama")
    snap = patch_targets_snapshot("dynamo", "onnx", "executorch")
    artifacts("llama", "dynamo", True)
    assert find_leaked_patches(snap) == []
    assert "forward" not in tiny.model.__dict__
    out = _eager(tiny, _tensors(tiny.inputs))
    assert all(type(v) is torch.Tensor for v in out.values())


@pytest.mark.parametrize("name", list(BUILDERS))
def test_saved_dynamo_program_round_trips(tiny_models, artifacts, tmp_path, name):
    tiny = tiny_models(name)
    art = artifacts(name, "dynamo", True)
    loaded = torch.export.load(art.save(tmp_path))
    out = loaded.module()(**tiny.other)
    got = [v for v in torch.utils._pytree.tree_leaves(out) if isinstance(v, torch.Tensor)]
    assert_close(_eager(tiny, tiny.other), dict(zip(art.output_names, got)), "dynamo")


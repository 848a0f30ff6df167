"""DynamoExporter's stages: the flat forward signature, pytree flattening, dynamic shapes, baked
constant buffers, and the model state cleaned up after tracing (exporters/tracing.py, pytrees.py,
model_state.py, specialize.py)."""

from __future__ import annotations

import pytest
import torch

import exporters.exporter_dynamo as dyn
from exporters import ExportStageError
from exporters.model_state import _STATEFUL_CACHE_ATTRS
from exporters.pytrees import _flatten_to_context, _unflatten_from_context
from exporters.tracing import auto_dynamic_shapes, flat_forward_signature


def test_stateful_cache_attrs_and_context_helpers_exist():
    assert isinstance(_STATEFUL_CACHE_ATTRS, tuple) and all(isinstance(a, str) for a in _STATEFUL_CACHE_ATTRS)
    assert callable(_flatten_to_context) and callable(_unflatten_from_context)


class _Kw(torch.nn.Module):
    def forward(self, input_ids=None, attention_mask=None, scale=1.0, **kwargs):
        return input_ids * attention_mask * scale


def test_stage1_flat_forward_signature_restores_forward():
    import inspect

    model = _Kw()
    assert "forward" not in model.__dict__
    with flat_forward_signature(model, ["input_ids", "attention_mask"], {"scale": 2.0}):
        assert list(inspect.signature(model.forward).parameters) == ["input_ids", "attention_mask"]
        out = model.forward(torch.ones(2), torch.full((2,), 3.0))
        assert torch.equal(out, torch.full((2,), 6.0))
    assert "forward" not in model.__dict__


def test_stage3_flatten_unflatten_round_trip():
    class Box:
        def __init__(self):
            self.a = torch.arange(3)
            self.items = [torch.ones(1), {"k": torch.zeros(2), "n": 5}, "text"]

    box = Box()
    tensors: list = []
    ctx = _flatten_to_context(vars(box), tensors)
    hash(ctx)
    assert [p for p, _ in tensors] == ["a", "items.0", "items.1.k"]
    rebuilt = _unflatten_from_context(ctx, iter([t * 2 for _, t in tensors]))
    assert torch.equal(rebuilt["a"], box.a * 2)
    assert rebuilt["items"][1]["n"] == 5 and rebuilt["items"][2] == "text"
    assert torch.equal(rebuilt["items"][1]["k"], torch.zeros(2))


def test_stage3_cache_leaf_names():
    from transformers import DynamicCache

    from exporters.utils import flatten_outputs

    cache = DynamicCache()
    cache.update(torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 3, 4), 0)
    names = list(flatten_outputs({"past_key_values": cache}))
    assert "past_key_values.0.key" in names and "past_key_values.0.value" in names


def test_stage4_auto_dynamic_shapes_bounds():
    from torch.export import Dim

    shapes = auto_dynamic_shapes({"x": torch.zeros(2, 3000), "y": torch.zeros(5)}, max_dim=64)
    assert set(shapes) == {"x", "y"} and set(shapes["x"]) == {0, 1} and set(shapes["y"]) == {0}
    assert all(h.type == Dim.AUTO.type for dims in shapes.values() for h in dims.values())
    assert [shapes["x"][0].max, shapes["x"][1].max, shapes["y"][0].max] == [64, 3000, 64]  # never below the traced size


class _Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self._cache = None

    def forward(self, x):
        self._cache = x * 2
        return x + 1


def test_stage5_state_cleanup_after_export():
    from exporters import DynamoExporter

    model = _Stateful().eval()
    art = DynamoExporter().export(model, {"x": torch.ones(2)})
    assert model._cache is None  # not a leftover fake tensor from tracing
    assert torch.equal(art(x=torch.ones(2))["output"], torch.full((2,), 2.0))


def test_flatten_outputs_rejects_colliding_leaf_names():
    from exporters.utils import flatten_outputs

    flat = flatten_outputs({"a": {"b": torch.zeros(1)}, "c": (torch.ones(1), 3)})
    assert list(flat) == ["a.b", "c.0"]
    with pytest.raises(ValueError, match="a.b"):
        flatten_outputs({"a": {"b": torch.zeros(1)}, "a.b": torch.ones(1)})


class _Leaky(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cached_sequence_length = "before"

    def forward(self, x):
        self.scratch = x + 0  # a new tensor attribute: a FakeTensor after tracing
        self.cached_sequence_length = x.shape[0]  # named in _STATEFUL_CACHE_ATTRS (a SymInt while tracing)
        return x * 3


def test_stage5_removes_fake_tensors_and_restores_named_state():
    from exporters import DynamoExporter
    from exporters.utils import Registry

    assert "cached_sequence_length" in _STATEFUL_CACHE_ATTRS
    model = _Leaky().eval()
    art = DynamoExporter(registry=Registry()).export(model, {"x": torch.ones(2)})
    assert "scratch" not in vars(model)
    assert model.cached_sequence_length == "before"
    assert torch.equal(model(torch.ones(2)), torch.full((2,), 3.0))  # eager still works
    assert torch.equal(art(x=torch.ones(2))["output"], torch.full((2,), 3.0))


class _CausalPadConv(torch.nn.Module):
    """Encodec's causal conv in small: stride/kernel/padding as 0-dim int64 non-persistent buffers, and
    the right padding computed from them as a tensor (models/encodec/modeling_encodec.py:122-135)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 3, kernel_size=4, stride=2)
        self.stride = torch.nn.Buffer(torch.tensor(2), persistent=False)
        self.kernel_size = torch.nn.Buffer(torch.tensor(4), persistent=False)
        self.padding_total = torch.nn.Buffer(torch.tensor(2), persistent=False)
        self.steps = torch.nn.Buffer(torch.tensor(0))  # persistent: saved state, not baked
        self.scale = torch.nn.Buffer(torch.tensor(0.5), persistent=False)  # float: not baked

    def forward(self, x):
        length = x.shape[-1]
        n_frames = torch.ceil((length - self.kernel_size + self.padding_total) / self.stride + 1).to(torch.int64) - 1
        extra = n_frames * self.stride + self.kernel_size - self.padding_total - length
        padded = torch.nn.functional.pad(x, (self.padding_total, extra))
        if padded.shape[-1] <= 4:  # a branch on the padded length, like _pad1d's 'if length <= max_pad'
            padded = torch.nn.functional.pad(padded, (0, 1))
        return self.conv(padded) * self.scale


def test_stage1_scalar_int_buffers_are_baked_while_tracing_and_restored():
    from exporters import DynamoConfig, DynamoExporter
    from exporters.specialize import constant_buffers

    model = _CausalPadConv().eval()
    x = torch.randn(1, 2, 9)
    assert sorted(n for _, n in constant_buffers(model)) == ["kernel_size", "padding_total", "stride"]
    with pytest.raises(Exception, match="(?i)data.dependent|unbacked|guard"):
        torch.export.export(model, (x,))  # the failure the bake removes
    artifact = DynamoExporter().export(model, {"x": x}, DynamoConfig())
    (out,) = artifact(x=x).values()
    torch.testing.assert_close(out, model(x))
    assert {n for n, _ in model.named_buffers()} == {"stride", "kernel_size", "padding_total", "steps", "scale"}
    assert model._non_persistent_buffers_set == {"stride", "kernel_size", "padding_total", "scale"}
    assert "stride" not in model.__dict__


class _AnnealedBlocks(torch.nn.Module):
    """EoMT's masked-attention annealing: per block, a probability kept in a persistent float buffer,
    read in Python to decide whether the block masks at all."""

    def __init__(self, buffer_name: str):
        super().__init__()
        self.buffer_name = buffer_name
        self.register_buffer(buffer_name, torch.tensor([1.0, 0.0, 1.0]))
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        probs = getattr(self, self.buffer_name)
        for i in range(3):
            x = self.proj(x)
            if self.training or probs[i] > 0:
                x = x.masked_fill(x < 0, 0.0)
        return x


def test_stage1_named_constant_buffers_are_baked():
    from exporters import DynamoExporter

    x = torch.randn(2, 4)
    with pytest.raises(ExportStageError, match="(?i)data.dependent"):
        DynamoExporter().export(_AnnealedBlocks("probs").eval(), {"x": x})  # a name the bake does not know
    model = _AnnealedBlocks("attn_mask_probs").eval()
    (out,) = DynamoExporter().export(model, {"x": x})(x=x).values()
    torch.testing.assert_close(out, model(x))
    assert "attn_mask_probs" in model._buffers and "attn_mask_probs" not in model.__dict__


class _DataDependent(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x  # a data-dependent branch: the export fails


def test_failed_dynamic_export_leaves_inputs_unmarked():
    """torch.export leaves dynamic-dim marks on its input tensors when it fails; a later static export
    of the same tensors (the sweep's cached inputs) must stay static."""
    x = torch.randn(3, 4)
    with pytest.raises(ExportStageError):
        dyn.DynamoExporter().export(_DataDependent(), {"x": x}, dyn.DynamoConfig(dynamic=True))
    assert not [a for a in vars(x) if a.startswith("_dynamo_")]
    art = dyn.DynamoExporter().export(torch.nn.Linear(4, 2), {"input": x})
    assert art.dynamic_dims == {"input": {}} or not any(art.dynamic_dims.values())


class _LateField(torch.nn.Module):
    """Returns a ModelOutput whose pooler_output is set after construction (as LlavaOnevision's
    get_image_features does): its keys are in set order, not the dataclass's field order."""

    def forward(self, x):
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        out = BaseModelOutputWithPooling(last_hidden_state=x, hidden_states=(x * 2,))
        out.pooler_output = x.sum(-1)
        return out


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch"])
def test_output_names_follow_the_program_order_not_the_dataclass_order(backend):
    from exporters import get_exporter

    x = torch.randn(2, 3)
    artifact = get_exporter(backend).export(_LateField(), {"x": x})
    out = artifact(x=x)
    assert out["hidden_states.0"].shape == (2, 3) and out["pooler_output"].shape == (2,)
    torch.testing.assert_close(out["hidden_states.0"], x * 2)
    torch.testing.assert_close(out["pooler_output"], x.sum(-1))


def test_a_dim_traced_at_zero_stays_static_in_size_one_mode():
    """Under min=1 a size-0 dim would be a symbol its own range does not hold, which a model's size 0 (an empty
    rotary key part of a latent-attention cache: Glm5Next, MistralLarge4) cannot match in torch.cat; it is left
    static. Without size-one mode torch specializes 0 itself."""
    from exporters.tracing import auto_dynamic_shapes

    inputs = {"values": torch.zeros(2, 1, 13, 0), "ids": torch.zeros(2, 5)}
    shapes = auto_dynamic_shapes(inputs, max_dim=64, min_dim=1)
    assert shapes["values"][3] is None
    assert all(shapes["values"][d] is not None for d in range(3)) and all(v is not None for v in shapes["ids"].values())
    assert all(v is not None for v in auto_dynamic_shapes(inputs, max_dim=64)["values"].values())


def test_inputs_named_as_a_runtime_names_them_export_under_those_names():
    """``past_key_values.0.key`` is no Python identifier: torch.export binds it by a safe parameter name,
    and the artifact (and an ONNX graph) keeps the given name."""
    from exporters import get_exporter
    from exporters.tracing import parameter_names

    assert parameter_names(["x", "past_key_values.0.key", "past_key_values_0_key", "class", "0"]) == [
        "x", "past_key_values_0_key_", "past_key_values_0_key", "_class", "_0"]

    class Add(torch.nn.Module):
        def forward(self, **inputs):
            return {"present.0.key": inputs["past_key_values.0.key"] + inputs["x"]}

    x, past = torch.randn(2, 3), torch.randn(2, 3)
    for backend in ("dynamo", "onnx"):
        artifact = get_exporter(backend).export(Add(), {"x": x, "past_key_values.0.key": past})
        assert artifact.input_names == ["x", "past_key_values.0.key"]
        (got,) = artifact(**{"x": x, "past_key_values.0.key": past}).values()
        torch.testing.assert_close(got, x + past)

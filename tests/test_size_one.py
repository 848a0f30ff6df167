"""Dynamic artifacts take size 1 (a batch of one, a one-token decode step) wherever the model computes it.

torch.export gives a dim traced at >= 2 the lower bound 2 (0/1 specialization); exporters exports
under ``backed_size_oblivious`` with ``Dim.AUTO(min=1)`` (ExportConfig.accept_size_one, Stage 4 in
exporters/tracing.py), and two torch_internals patches keep ``reshape``/``contiguous`` from guarding
``size != 1`` (exporters/workarounds/torch_internals/size_one_strides.py).
"""

from __future__ import annotations

import pytest
import torch
from _backend_params import _backends

from exporters import InputError, get_exporter
from exporters.parity import assert_close

_SIZES = [(1, 1), (1, 6), (3, 1), (2, 5)]


@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)  # grouped-query: repeat_kv's reshape
    return LlamaForCausalLM(cfg).eval()


def _inputs(b, s, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, 64, (b, s), generator=g), "attention_mask": torch.ones(b, s, dtype=torch.long)}


@pytest.mark.parametrize("backend", _backends())
def test_dynamic_llama_runs_at_batch_one_and_one_token(llama, backend):
    exporter = get_exporter(backend)
    artifact = exporter.export(llama, _inputs(2, 5), exporter.config_class(dynamic=True, max_dim=64))
    assert all(spec["min"] == 1 for dims in artifact.dynamic_dims.values() for spec in dims.values())
    for b, s in _SIZES:
        inputs = _inputs(b, s, seed=b * 10 + s)
        with torch.no_grad():
            expected = llama(**inputs).logits
        assert_close({"logits": expected}, {"logits": artifact(**inputs)["logits"]}, backend)
    assert "patch:dynamo:torch.Tensor.reshape" in artifact.workarounds_fired


def test_without_accept_size_one_the_bound_is_two_and_the_error_names_it(llama):
    exporter = get_exporter("dynamo")
    artifact = exporter.export(llama, _inputs(2, 5), exporter.config_class(dynamic=True, accept_size_one=False))
    with pytest.raises(InputError, match=r"input 'input_ids' dim 0 \(\w+\) is 1, outside the exported bounds \[2, 1024\]"):
        artifact(**_inputs(1, 5))


def test_without_the_stride_patches_a_one_token_call_is_refused(llama):
    """The reshape/contiguous patches are what lets the sequence take 1: switched off, torch's stride
    computation guards ``s != 1`` and the artifact refuses a one-token call, naming the condition."""
    from exporters.utils import DEFAULT_REGISTRY

    registry = DEFAULT_REGISTRY.without("patch:dynamo:torch.Tensor.reshape", "patch:dynamo:torch.Tensor.contiguous")
    exporter = get_exporter("dynamo", registry=registry)
    artifact = exporter.export(llama, _inputs(2, 5), exporter.config_class(dynamic=True))
    artifact(**_inputs(1, 5))  # batch 1 is fine either way
    with pytest.raises(InputError, match=r"recorded the condition .*input_ids\.size\(\)\[1\] != "):
        artifact(**_inputs(2, 1))


def test_a_model_that_branches_on_size_one_keeps_its_guard():
    """Where the model's own code asks ``size == 1``, the answer is a guard: the artifact refuses 1 with
    the condition, it does not compute the other branch."""

    class Branchy(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.shape[0] == 1 else x + 1

    exporter = get_exporter("dynamo")
    artifact = exporter.export(Branchy(), {"x": torch.randn(3, 4)}, exporter.config_class(dynamic=True))
    assert torch.equal(artifact(x=torch.ones(5, 4))["output"], torch.full((5, 4), 2.0))
    with pytest.raises(InputError):
        artifact(x=torch.ones(1, 4))


def test_expand_reshape_is_a_copy_only_when_not_contiguous():
    from torch.export import Dim
    from torch.fx.experimental import _config as fx_config

    from exporters.workarounds.torch_internals.size_one_strides import copy_then_view

    reshape = copy_then_view(torch.Tensor.reshape)

    class Repeat(torch.nn.Module):
        def forward(self, x):
            b, h, s, d = x.shape
            flat = reshape(x, b, h * s, d)  # contiguous: a view, as before
            return reshape(x[:, :, None].expand(b, h, 3, s, d), b, 3 * h, s, d), flat

    with fx_config.patch(backed_size_oblivious=True):
        program = torch.export.export(Repeat(), (torch.randn(2, 2, 5, 4),),
                                      dynamic_shapes=({0: Dim.AUTO(min=1), 2: Dim.AUTO(min=1)},))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count("aten.clone.default") == 1
    x = torch.randn(1, 2, 1, 4)
    out, flat = program.module()(x)
    assert torch.equal(out, x[:, :, None].expand(1, 2, 3, 1, 4).reshape(1, 6, 1, 4))
    assert torch.equal(flat, x.reshape(1, 2, 4))


def test_plainly_contiguous_agrees_with_torch_and_leaves_the_graph_unchanged(llama):
    """The cheap contiguity test (expressions compared term for term) says True only where torch's
    is_contiguous_or_false does, on every tensor a dynamic Llama export asks about; and the exported
    graph is the same with the cheap test as with torch's alone, but for node names (torch's test
    traces symbolic arithmetic whose nodes are dropped, but whose names were taken: mul_73 vs mul_77;
    the ONNX and ExecuTorch bytes are identical, benchmarks/README.md)."""
    import re

    from torch._prims_common import is_contiguous_or_false

    from exporters import DynamoConfig, DynamoExporter
    from exporters.workarounds.torch_internals import size_one_strides

    cheap, seen = size_one_strides._plainly_contiguous, []

    def checked(tensor):
        answer = cheap(tensor)
        seen.append((answer, is_contiguous_or_false(tensor)))
        return answer

    def graph(plainly_contiguous):
        size_one_strides._plainly_contiguous = plainly_contiguous
        try:
            artifact = DynamoExporter().export(llama, _inputs(2, 5), DynamoConfig(dynamic=True, max_dim=64))
        finally:
            size_one_strides._plainly_contiguous = cheap
        gm = artifact.program.graph_module
        names = {node.name: f"v{i}" for i, node in enumerate(gm.graph.nodes)}
        return re.sub(r"\b\w+\b", lambda m: names.get(m.group(0), m.group(0)), gm.print_readable(print_output=False))

    assert graph(checked) == graph(lambda tensor: False)
    assert any(answer for answer, _ in seen), "the cheap test recognized nothing: it saves nothing"
    assert any(not torch_answer for _, torch_answer in seen)  # repeat_kv's expand: still copied
    assert all(torch_answer for answer, torch_answer in seen if answer)

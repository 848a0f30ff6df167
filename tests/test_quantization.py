"""Quantized exports (exporters/quantization): a PT2E int8 recipe applied before tracing, PyTorch's
quantized model kept as the artifact's reference."""

from __future__ import annotations

import pytest
import torch

from exporters import get_exporter
from exporters.quantization import QuantizationError, int8


@pytest.fixture(scope="module")
def bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=4, intermediate_size=64)).eval()
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_recipes_refuse_what_they_cannot_run(bert):
    model, inputs = bert
    with pytest.raises(QuantizationError, match="needs at least one calibration input"):
        int8(calibration=[])
    dynamo = get_exporter("dynamo")
    with pytest.raises(Exception, match=r"calibration input 1 lacks the tensor inputs \['attention_mask'\]"):
        dynamo.export(model, inputs, dynamo.config_class(
            quantization=int8(calibration=[inputs, {"input_ids": inputs["input_ids"]}])))
    with pytest.raises(Exception, match="calibration input 0 does not run"):
        dynamo.export(model, inputs, dynamo.config_class(
            quantization=int8(calibration=[{**inputs, "input_ids": inputs["input_ids"].float()}])))


def test_dynamo_quantized_artifact_is_its_reference_and_records_the_recipe(bert):
    model, inputs = bert
    exporter = get_exporter("dynamo")
    artifact = exporter.export(model, inputs, exporter.config_class(quantization=int8(calibration=[inputs, inputs])))
    got, ref = artifact(**inputs), artifact.reference(**inputs)
    assert sorted(got) == sorted(ref) == ["logits"]
    assert torch.equal(got["logits"], ref["logits"])  # dynamo runs the converted program itself
    meta = artifact.metadata["quantization"]
    assert meta["recipe"] == "int8" and meta["calibration_count"] == 2 and meta["quantize_ops"] > 10
    with torch.no_grad():
        eager = model(**inputs).logits
    sqnr = 10 * torch.log10(eager.pow(2).mean() / (eager - ref["logits"]).pow(2).mean())
    assert sqnr > 20, float(sqnr)  # the int8 reference is close to fp32, and not identical
    assert not torch.equal(eager, ref["logits"])


def test_integer_scalars_stay_integers_through_prepare(bert):
    """XNNPACK's quantizer turns every add/mul scalar into a float32 constant; the in-graph mask's index
    arithmetic then makes float indices (IndexError at the first calibration call). Ours keeps integer
    nodes' scalars. When the upstream quantizer stops failing here, the workaround can go."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from exporters.quantization.xnnpack import IntegerSafeXNNPACKQuantizer

    model, inputs = bert
    config = get_symmetric_quantization_config(is_per_channel=True)
    upstream = prepare_pt2e(torch.export.export(model, (), inputs, strict=False).module(), XNNPACKQuantizer().set_global(config))
    with pytest.raises(IndexError, match="tensors used as indices must be long"):
        upstream(**inputs)
    ours = prepare_pt2e(torch.export.export(model, (), inputs, strict=False).module(),
                        IntegerSafeXNNPACKQuantizer().set_global(config))
    ours(**inputs)


def test_quantized_rule_is_in_quantization_steps():
    from exporters.parity import QUANT_STEPS, compare_quantized, quantization_step, sqnr_db, steps_off

    ref = torch.linspace(-1.0, 1.0, 256).reshape(16, 16)
    step = quantization_step(ref)
    assert step == pytest.approx(2.0 / 255)
    assert compare_quantized({"y": ref}, {"y": ref + QUANT_STEPS * step * 0.99}, "onnx") == []
    (problem,) = compare_quantized({"y": ref}, {"y": ref + QUANT_STEPS * step * 1.5}, "onnx")
    assert "quantization steps" in problem and "bound 8" in problem
    off = ref.clone()
    off[3, 4] += 40 * step  # one element: no share of elements may differ
    assert compare_quantized({"y": ref}, {"y": off}, "executorch")
    assert steps_off(ref, off) == pytest.approx(40, rel=1e-4)
    assert compare_quantized({"n": torch.arange(4)}, {"n": torch.tensor([0, 1, 2, 4])}, "onnx")  # integers exact
    assert sqnr_db(ref, ref) == float("inf")
    assert sqnr_db(ref, ref * 1.1) == pytest.approx(20.0, abs=1e-4)  # noise 10% of the signal: 20 dB


def test_onnx_artifact_equals_its_reference_with_seven_bit_weights(bert):
    """ONNX Runtime's u8 x s8 kernel saturates on CPUs without VNNI with full 8-bit weights; the recipe
    gives ONNX 7-bit weights, and the artifact then computes its reference's arithmetic."""
    from exporters.parity import compare_quantized

    model, inputs = bert
    onnx = get_exporter("onnx")
    artifact = onnx.export(model, inputs, onnx.config_class(dynamic=False, quantization=int8(calibration=[inputs])))
    assert artifact.extra_metadata["quantization"]["weight_range"] == [-63, 63]
    assert compare_quantized(artifact.reference(**inputs), artifact(**inputs), "onnx") == []
    assert int8(calibration=[inputs], reduce_range=False).weight_range("onnx") == (-127, 127)
    assert int8(calibration=[inputs]).weight_range("executorch") == (-127, 127)


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch"])
def test_dynamic_int8_runs_on_every_backend_and_matches_its_reference(bert, backend):
    """int8(dynamic=True): activations quantized per call (choose_qparams in the graph). ONNX needs the
    translations of choose_qparams.tensor and the tensor-scale quantize/dequantize (workarounds/onnx)."""
    from exporters.parity import compare_quantized

    model, inputs = bert
    exporter = get_exporter(backend)
    artifact = exporter.export(model, inputs, exporter.config_class(
        dynamic=False, quantization=int8(calibration=[inputs], dynamic=True)))
    meta = artifact.extra_metadata["quantization"]
    assert meta["recipe"] == "int8-dynamic" and meta["quantize_ops"] > 0
    assert meta["dynamic_quantize_ops"] > 0  # scale and zero point computed per call
    assert compare_quantized(artifact.reference(**inputs), artifact(**inputs), backend) == []


def test_a_model_with_nothing_to_quantize_is_recorded_not_refused():
    class Norm(torch.nn.Module):  # no op XNNPACK's quantizer annotates (it takes linear, conv, add, mul...)
        def forward(self, x):
            return torch.nn.functional.layer_norm(x, (4,)).cumsum(-1)

    inputs = {"x": torch.randn(2, 4)}
    dynamo = get_exporter("dynamo")
    artifact = dynamo.export(Norm(), inputs, dynamo.config_class(quantization=int8(calibration=[inputs])))
    assert artifact.extra_metadata["quantization"]["quantize_ops"] == 0
    (out,) = artifact(**inputs).values()
    assert torch.equal(out, Norm()(inputs["x"]))  # the fp32 model, exported as it is


def test_generation_export_takes_a_recipe_per_component_and_refuses_what_it_cannot_apply():
    from exporters.generation import GenerationError
    from tests._tiny_llama import tiny_llama

    model = tiny_llama()
    inputs = {"input_ids": torch.tensor([[3, 5, 7]]), "attention_mask": torch.ones(1, 3, dtype=torch.long)}
    onnx = get_exporter("onnx")
    with pytest.raises(GenerationError, match="takes a recipe per component"):
        onnx.export_for_generation(model, inputs, onnx.config_class(quantization=int8(calibration=[inputs])))
    with pytest.raises(GenerationError, match=r"\['lm_head'\], which are not components.*\['prefill', 'decode'\]"):
        onnx.export_for_generation(model, inputs, quantization={"lm_head": int8(calibration=[inputs])})
    with pytest.raises(GenerationError, match="dynamic cache form only"):
        onnx.export_for_generation(model, inputs, cache="static", quantization={"decode": int8(calibration=[inputs])})
    with pytest.raises(QuantizationError, match="pass a recipe"):
        onnx.export_for_generation(model, inputs, quantization={"decode": "int8"})
    with pytest.raises(QuantizationError, match=r"quantization\['decode'\] has expose_selections=True"):
        onnx.export_for_generation(model, inputs, quantization={"decode": int8(calibration=[inputs],
                                                                                expose_selections=True)})


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch"])
def test_an_int8_decode_step_generates_what_its_quantized_reference_generates(backend):
    """exporters/generation/quantized.py: an int8 decode step (calibrated on its own inputs in the model's
    generate) beside an fp32 prefill; the loop over the artifacts and the loop over PyTorch's quantized components
    (reference_generator) give the same tokens, and each step's logits agree within the quantized rule. On
    ExecuTorch its dynamic sizes hold a power (exporters/workarounds/executorch/symbolic_power.py)."""
    from exporters.generation.quantized import reference_generator
    from exporters.parity import compare_quantized
    from tests._tiny_llama import tiny_llama

    model = tiny_llama()
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    exporter = get_exporter(backend)
    generator = exporter.export_for_generation(model, inputs, exporter.config_class(dynamic=True),
                                               quantization={"decode": int8(calibration=[inputs])})
    assert set(generator.metadata["quantization"]) == {"decode"}
    assert generator.metadata["quantization"]["decode"]["quantize_ops"] > 10
    assert generator.components["prefill"].reference is None  # fp32
    if backend == "executorch":
        assert ("patch:executorch:executorch.exir.passes.replace_edge_with_backend_pass.EdgeToBackendOpsPass.call"
                in generator.components["decode"].workarounds_fired)
    out = generator.generate(**inputs, max_new_tokens=8, return_dict_in_generate=True, output_logits=True)
    ref = reference_generator(generator).generate(**inputs, max_new_tokens=8, teacher_tokens=out.sequences[:, 6:],
                                                  return_dict_in_generate=True, output_logits=True)
    assert torch.equal(out.sequences, ref.sequences)
    for got, expected in zip(out.logits, ref.logits):
        assert compare_quantized({"logits": expected}, {"logits": got}, backend) == []


def test_selection_ops_are_named():
    from exporters.quantization import selection_ops

    class Pick(torch.nn.Module):
        def forward(self, x):
            return x.topk(2).indices, x.argmax(-1), x.max(-1).values

    graph = torch.export.export(Pick(), (torch.randn(3, 4),)).graph
    assert selection_ops(graph) == ["aten.argmax.default", "aten.topk.default"]  # max's values are not a choice


def test_float64_nodes_stay_unquantized(monkeypatch):
    """PT2E's quantize ops take float32: a float64 computation keeps its precision, unannotated (DEIMv2)."""
    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            anchors = torch.cat([x.double(), x.double() * 2])  # DEIMv2's anchors: a cat of float64 grids
            return self.proj(x) + anchors.float()[:2]

    inputs = {"x": torch.randn(2, 4)}
    dynamo = get_exporter("dynamo")
    artifact = dynamo.export(Mixed().eval(), inputs, dynamo.config_class(quantization=int8(calibration=[inputs])))
    assert artifact.extra_metadata["quantization"]["quantize_ops"] > 0  # the linear is still quantized
    (out,) = artifact(**inputs).values()
    assert torch.isfinite(out).all()
    from exporters.quantization import xnnpack

    monkeypatch.setattr(xnnpack, "float32_annotations_only", lambda model: 0)  # upstream's behaviour
    with pytest.raises(Exception, match="Expecting input to have dtype torch.float32, but got dtype: torch.float64"):
        dynamo.export(Mixed().eval(), inputs, dynamo.config_class(quantization=int8(calibration=[inputs])))


def test_the_scores_a_selection_chooses_from_stay_float():
    """A router's gate (linear -> softmax -> topk) stays float: on int8-grid scores ties are common and
    one step flips the choice. The expert's own linear is still quantized."""
    class Routed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.expert = torch.nn.Linear(8, 4), torch.nn.Linear(8, 8)

        def forward(self, x):
            weights, chosen = self.gate(x).softmax(-1).topk(2)
            return self.expert(x) * weights.sum(-1, keepdim=True) + chosen.float().sum(-1, keepdim=True)

    inputs = {"x": torch.randn(6, 8)}
    dynamo = get_exporter("dynamo")
    artifact = dynamo.export(Routed().eval(), inputs, dynamo.config_class(quantization=int8(calibration=[inputs])))
    meta = artifact.extra_metadata["quantization"]
    assert meta["selection_ops"] == ["aten.topk.default"]
    assert meta["float_for_selection"] == ["linear"]  # the gate: the first linear traced
    assert meta["quantize_ops"] > 0  # the expert


def test_an_op_sharing_the_grid_of_a_float_selection_input_stays_float(monkeypatch):
    """A view of the scores a top-k reads, feeding a quantized linear, shares its producer's grid
    (SharedQuantizationSpec); with the producer kept in float, prepare failed looking it up ("KeyError: mul",
    Mistral4Model's router). The view stays in float with it (drop_orphaned_sharing)."""
    from exporters.quantization import xnnpack

    class Routed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.other, self.after = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            scores = self.gate(x) * 2.0
            weights, chosen = scores.topk(2)
            both = torch.cat([self.after(scores.view(2, 3, 4)).view(6, 4), self.other(x)], dim=-1)
            return both * weights.sum(-1, keepdim=True) + chosen.float().sum(-1, keepdim=True)

    inputs = {"x": torch.randn(6, 8, generator=torch.Generator().manual_seed(0))}
    dynamo = get_exporter("dynamo")
    artifact = dynamo.export(Routed().eval(), inputs, dynamo.config_class(quantization=int8(calibration=[inputs])))
    assert artifact.extra_metadata["quantization"]["float_for_selection"] == ["mul", "view"]
    monkeypatch.setattr(xnnpack, "drop_orphaned_sharing", lambda model: [])  # before
    with pytest.raises(Exception, match="KeyError: mul"):
        dynamo.export(Routed().eval(), inputs, dynamo.config_class(quantization=int8(calibration=[inputs])))


def test_a_custom_pt2e_quantizer_is_used_as_given():
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

    torch.manual_seed(0)  # unseeded, the weights depended on the tests run before it in the process
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    inputs = {"input": torch.randn(3, 8)}
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=False))
    onnx = get_exporter("onnx")
    artifact = onnx.export(model, inputs, onnx.config_class(dynamic=False, quantization=int8(calibration=[inputs], quantizer=quantizer)))
    meta = artifact.extra_metadata["quantization"]
    assert meta["quantizer"] == "XNNPACKQuantizer" and meta["weight_range"] is None and meta["quantize_ops"] > 0
    from exporters.parity import compare_quantized

    assert compare_quantized(artifact.reference(**inputs), artifact(**inputs), "onnx") == []


class _ConvBn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)
        self.conv1d, self.bn1d = torch.nn.Conv1d(8, 4, 3), torch.nn.BatchNorm1d(4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.bn1d(self.conv1d(y.flatten(2)))


def test_pattern_graphs_are_traced_once_and_the_quantized_model_is_the_same():
    """exporters/workarounds/quantization/pattern_graphs.py: a second quantization in the process reuses
    the conv + batch-norm pattern graphs (the patch fires), and the converted model is the same code
    and computes the same values as with the patch switched off."""
    from exporters.utils import DEFAULT_REGISTRY
    from exporters.workarounds.quantization import pattern_graphs

    torch.manual_seed(0)
    model = _ConvBn().eval()
    with torch.no_grad():  # running statistics that are not the defaults
        model.bn.running_mean.uniform_(-1, 1), model.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 10, 10)
    names = [f"patch:dynamo:{p}" for p in pattern_graphs.PATHS]

    def quantized(exporter):
        return exporter.export(model, {"x": x}, exporter.config_class(quantization=int8(calibration=[{"x": x}])))

    pattern_graphs._KEPT.clear()
    first = quantized(get_exporter("dynamo"))
    assert pattern_graphs._KEPT and not set(names) & set(first.workarounds_fired)
    second = quantized(get_exporter("dynamo"))
    assert set(names) & set(second.workarounds_fired)
    from exporters.exporter_dynamo import DynamoExporter

    plain = quantized(DynamoExporter(DEFAULT_REGISTRY.without(*names)))
    assert second.metadata["quantization"]["quantize_ops"] == plain.metadata["quantization"]["quantize_ops"] > 4
    assert str(second.program.graph) == str(plain.program.graph)
    assert torch.equal(second(x=x)["output"], plain(x=x)["output"])


class _BoolMaskCat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        keep = torch.cat([x[:, :4] > 0, x.new_ones(x.shape[0], 4, dtype=torch.bool)], dim=1)  # XNNPACK annotates cat
        return self.proj(torch.where(keep, x, 0.0))


def test_a_boolean_operand_is_not_observed():
    """A cat of boolean masks is left unannotated (float32_annotations_only): a histogram observer on a
    bool tensor fails at the first calibration call ("linspace_cpu" not implemented for 'Bool'), as
    OneFormer's and Nemotron3_5Transcribe's did."""
    x = torch.randn(4, 8)
    exporter = get_exporter("dynamo")
    artifact = exporter.export(_BoolMaskCat().eval(), {"x": x}, exporter.config_class(quantization=int8(calibration=[{"x": x}])))
    assert artifact.metadata["quantization"]["quantize_ops"] > 0
    assert torch.equal(artifact(x=x)["output"], artifact.reference(x=x)["output"])


class _Conv3d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(2, 4, 2)
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(self.conv(x).flatten(2).transpose(1, 2))


def test_quantize_ops_left_outside_the_delegate_lower_and_run_on_executorch():
    """A quantized op XNNPACK does not take (a Conv3d: Glm4v's patch embedding) leaves its per-channel
    weight's dequantize outside the delegate; the portable quantized kernels' out variants are registered
    (exporters.exporter_executorch.quantized_kernels_registered) so the program lowers and runs, equal to
    its reference within the quantized rule."""
    from exporters.parity import assert_close_quantized

    torch.manual_seed(0)
    x = torch.randn(1, 2, 3, 4, 4)
    exporter = get_exporter("executorch")
    artifact = exporter.export(_Conv3d().eval(), {"x": x}, exporter.config_class(quantization=int8(calibration=[{"x": x}])))
    assert_close_quantized(artifact.reference(x=x), artifact(x=x), "executorch")



def test_a_per_channel_quantize_outside_the_delegate_runs_on_executorch():
    """The portable quantize_per_channel kernel takes float64 scales only; convert_pt2e writes float32
    (_fix_quantize_per_channel_double_scales). DeepseekV3's experts quantize weights that are not
    constants, outside the XNNPACK delegate: without the fix the runtime aborts the process."""
    from exporters.parity import assert_close_quantized
    from sweeps.runner import reference

    tiny = reference("DeepseekV3ForTokenClassification").tiny
    exporter = get_exporter("executorch")
    artifact = exporter.export(tiny.model, tiny.inputs,
                               exporter.config_class(dynamic=False, quantization=int8(calibration=[tiny.inputs])))
    assert "fix:executorch:_fix_quantize_per_channel_double_scales" in artifact.workarounds_fired
    assert_close_quantized(artifact.reference(**tiny.inputs), artifact(**tiny.inputs), "executorch")


class _FilledInPlace(torch.nn.Module):
    """A table created, then written in place through views, then read: Siglip2's resized position
    embeddings (a torch.empty filled with copy_) in small."""

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Parameter(torch.randn(4, 8))
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        table = torch.zeros(x.shape[0], 4, 8)
        for i in range(x.shape[0]):
            table[i].copy_(self.pos)
        return self.proj(x + table)


def test_a_tensor_written_in_place_is_observed_as_it_is_read():
    """exporters/workarounds/quantization/observer_placement.py: prepare_pt2e observes a tensor right
    after it is created, before the in-place writes that fill it. Here that observer would see only the
    zeros, so the add's input would be quantized to nothing. With the patch, the quantized reference
    stays close to fp32; without it, it is far off."""
    from exporters.parity import sqnr_db
    from exporters.utils import DEFAULT_REGISTRY

    torch.manual_seed(0)
    model, x = _FilledInPlace().eval(), torch.randn(2, 4, 8)
    name = "patch:dynamo:torchao.quantization.pt2e.quantize_pt2e.prepare_pt2e"
    expected = model(x)

    def quantized(exporter):
        return exporter.export(model, {"x": x}, exporter.config_class(quantization=int8(calibration=[{"x": x}])))

    from exporters.exporter_dynamo import DynamoExporter

    patched, plain = quantized(get_exporter("dynamo")), quantized(DynamoExporter(DEFAULT_REGISTRY.without(name)))
    assert name in patched.workarounds_fired and name not in plain.workarounds_fired
    assert sqnr_db(expected, patched.reference(x=x)["output"]) > 25
    assert sqnr_db(expected, plain.reference(x=x)["output"]) < 10


def test_histogram_range_search_gives_upstreams_range_bit_for_bit():
    """exporters/workarounds/quantization/histogram_search.py: the bulk-skipping range search returns
    torchao's min and max exactly, on histograms calibrated from data (one and several calls, outliers),
    on a single occupied bin, on two far-apart bins and on an empty histogram; and a quantized export
    records that it fired."""
    from torchao.quantization.pt2e.observer import HistogramObserver

    from exporters.workarounds.quantization.histogram_search import range_search

    g = torch.Generator().manual_seed(0)
    observers = []
    for data in ([torch.randn(4000, generator=g)], [torch.randn(3000, generator=g) ** 3, torch.randn(500, generator=g) * 9],
                 [torch.rand(64, generator=g) - 0.2], [torch.zeros(10)]):
        observer = HistogramObserver(dtype=torch.int8, qscheme=torch.per_tensor_symmetric, quant_min=-128, quant_max=127)
        for x in data:
            observer(x)
        observers.append(observer)
    for occupied in ([7], [3, 2040], []):
        observer = HistogramObserver(dtype=torch.int8, qscheme=torch.per_tensor_symmetric, quant_min=-128, quant_max=127)
        observer.histogram[occupied] = 5.0
        observer.min_val.fill_(-1.5), observer.max_val.fill_(2.5)
        observers.append(observer)
    for observer in observers:
        upstream = HistogramObserver._non_linear_param_search(observer)
        fast = range_search(observer)
        assert fast is not None
        assert torch.equal(fast[0], upstream[0]) and torch.equal(fast[1], upstream[1]), (fast, upstream)
    nan = HistogramObserver(dtype=torch.int8, qscheme=torch.per_tensor_symmetric, quant_min=-128, quant_max=127)
    nan.histogram[0] = float("nan")
    assert range_search(nan) is None  # left to upstream

    x = torch.randn(2, 8, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    exporter = get_exporter("dynamo")
    artifact = exporter.export(model, {"input": x}, exporter.config_class(quantization=int8(calibration=[{"input": x}])))
    assert any("HistogramObserver._non_linear_param_search" in name for name in artifact.workarounds_fired)


class _VmappedGate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        keep = torch.vmap(lambda row: row > row.mean())(x)  # a vmapped function, as masking_utils vmaps masks
        return self.proj(torch.where(keep, x, 0.0))


def test_vmap_nesting_calls_survive_prepare_and_convert():
    """exporters/workarounds/quantization/vmap_nesting.py: PT2E's dead-code elimination removed the vmap nesting
    calls of a pre-dispatch graph, and calibration then failed ("Either your tensor may have escaped from inside a
    function being vmapped", Gemma 3); with the patch the model quantizes and its artifact is its reference."""
    from exporters.exporter_dynamo import DynamoExporter
    from exporters.utils import DEFAULT_REGISTRY

    name = "patch:dynamo:torch._library.utils.is_impure"
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    model = _VmappedGate().eval()
    config = DynamoExporter.config_class(quantization=int8(calibration=[{"x": x}]))
    with pytest.raises(Exception, match="escaped from inside a function being vmapped"):
        DynamoExporter(DEFAULT_REGISTRY.without(name)).export(model, {"x": x}, config)
    artifact = DynamoExporter().export(model, {"x": x}, config)
    assert name in artifact.workarounds_fired
    assert torch.equal(artifact(x=x)["output"], artifact.reference(x=x)["output"])


def test_the_bound_widens_to_the_references_own_rounding_spread():
    """exporters/parity.py: an output's bound is the larger of QUANT_STEPS steps and the reference's spread under
    one-step rounding (absolute units); a non-finite spread leaves the fixed bound."""
    from exporters.parity import QUANT_STEPS, compare_quantized, quantization_step

    ref = torch.linspace(-1.0, 1.0, 256).reshape(16, 16)
    step = quantization_step(ref)
    off = {"y": ref + 12 * step}
    (problem,) = compare_quantized({"y": ref}, off, "onnx")
    assert "bound 8" in problem
    assert compare_quantized({"y": ref}, off, "onnx", {"y": 15 * step}) == []
    (problem,) = compare_quantized({"y": ref}, {"y": ref + 20 * step}, "onnx", {"y": 15 * step})
    assert "bound 15" in problem and "own spread under one-step rounding" in problem
    assert compare_quantized({"y": ref}, off, "onnx", {"y": float("inf")}) != []
    assert QUANT_STEPS == 8.0
    # a spread past a quarter of the range (a selection that lands anywhere) widens the bound to 64 steps only
    assert compare_quantized({"y": ref}, {"y": ref + 60 * step}, "onnx", {"y": 200 * step}) == []
    (problem,) = compare_quantized({"y": ref}, {"y": ref + 100 * step}, "onnx", {"y": 200 * step})
    assert "bound 64" in problem and "spread under one-step rounding is 200 steps" in problem


def test_rounding_spread_moves_quantized_activations_one_step():
    """exporters/quantization/rounding.py: the perturbed copy follows every activation quantize with a one-step
    nudge; the spread is finite and positive on a quantized MLP, and the same for the same seeds."""
    from exporters.quantization.rounding import perturbed_copy, rounding_spread

    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    exporter = get_exporter("dynamo")
    artifact = exporter.export(model, {"input": x}, exporter.config_class(quantization=int8(calibration=[{"input": x}])))
    from exporters.quantization import quantize

    quantized = quantize(model, {"input": x}, int8(calibration=[{"input": x}]), "dynamo").module
    copied, count = perturbed_copy(quantized.converted, fraction=1.0)
    assert rounding_spread(quantized, {"input": x}) == artifact.reference_spread(input=x)
    assert count >= 2
    spread = artifact.reference_spread(input=x)
    assert list(spread) == ["output"] and 0 < spread["output"] < float("inf")
    assert artifact.reference_spread(input=x) == spread


def test_a_perturbed_run_outside_the_programs_asserted_domain_measures_no_spread(monkeypatch):
    """A one-step move that breaks one of the program's runtime assertions (a data-dependent branch or count
    baked at trace time) gives no spread: every floating output gets inf, so the fixed bound applies, and the
    failure message says why."""
    import exporters.quantization.rounding as rounding
    from exporters.parity import compare_quantized
    from exporters.quantization import quantize

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    quantized = quantize(model, {"input": x}, int8(calibration=[{"input": x}]), "dynamo").module
    perturbed, count = rounding.perturbed_copy(quantized.converted)

    def asserting(*args, **kwargs):
        raise RuntimeError("Runtime assertion failed for expression u11 >= 1 on node 'ge_24'")

    perturbed.forward = asserting
    monkeypatch.setattr(rounding, "perturbed_copy", lambda converted, fraction=rounding.FRACTION: (perturbed, count))
    spread = rounding.rounding_spread(quantized, {"input": x})
    assert spread == {"output": float("inf")}
    ref = quantized(input=x)
    (problem,) = compare_quantized({"output": ref}, {"output": ref + 1.0}, "onnx", spread)
    assert "no spread of the reference's own could be measured" in problem and "bound 8" in problem


def test_a_reference_that_differs_between_two_runs_is_refused():
    """A model that draws random numbers in eval (SpeechT5's prenet dropout) has no reference to compare with:
    two runs of the quantized reference must agree exactly (NaN where both give NaN counts as agreeing)."""
    from exporters.parity import ParityError
    from sweeps.quantized import _check_deterministic

    nan = torch.tensor([1.0, float("nan")])
    _check_deterministic({"a": nan, "ids": torch.tensor([3])}, {"a": nan.clone(), "ids": torch.tensor([3])})
    with pytest.raises(ParityError, match=r"not deterministic: two runs on the same inputs differ at 'a' \(max \|difference\| 0.5"):
        _check_deterministic({"a": torch.tensor([1.0, 2.0])}, {"a": torch.tensor([1.5, 2.0])})


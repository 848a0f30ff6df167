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
    with pytest.raises(Exception, match="calibration input 0 does not run"):
        get_exporter("dynamo").export(model, inputs, get_exporter("dynamo").config_class(
            quantization=int8(calibration=[{"input_ids": inputs["input_ids"][:, :0].float()}])))


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

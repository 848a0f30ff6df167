"""sweeps.repro: item ids and node ids parse back to the sweep case; bad ids say what is expected."""

from __future__ import annotations

import pytest

from sweeps.repro import main, parse_item
from sweeps.runner import BACKENDS, VARIANTS, Case
from sweeps.zoo import UnknownModelError, resolve_models


def _entry(class_name):
    (entry,) = [e for e in resolve_models([class_name]) if e.class_name == class_name]
    return entry


def test_parse_item_accepts_an_item_id():
    case = parse_item("onnx-dynamic-BertModel")
    assert case == Case("onnx", "dynamic", _entry("BertModel"))
    assert case.id == "onnx-dynamic-BertModel"
    assert case.repro == "python -m sweeps.repro onnx-dynamic-BertModel"


@pytest.mark.parametrize("text", [
    "sweeps/test_export.py::test_export[executorch-static-NllbMoeForConditionalGeneration]",
    "test_export[executorch-static-NllbMoeForConditionalGeneration]",
    "executorch-static-NllbMoeForConditionalGeneration",
])
def test_parse_item_accepts_a_full_node_id(text):
    case = parse_item(text)
    assert (case.backend, case.variant, case.entry.class_name) == (
        "executorch", "static", "NllbMoeForConditionalGeneration")
    assert case.entry.model_type.replace("-", "_") == "nllb_moe"


@pytest.mark.parametrize("class_name", ["LlamaForCausalLM", "ViTForImageClassification", "T5ForConditionalGeneration"])
def test_every_backend_and_variant_round_trips_through_the_id(class_name):
    entry = _entry(class_name)
    for backend in BACKENDS:
        for variant in VARIANTS:
            case = Case(backend, variant, entry)
            assert parse_item(case.id) == case
            assert parse_item(f"sweeps/test_export.py::test_export[{case.id}]") == case


@pytest.mark.parametrize("text, wrong", [
    ("onx-dynamic-BertModel", "onx"),
    ("onnx-dynamc-BertModel", "dynamc"),
    ("dynamic-onnx-BertModel", "dynamic"),
    ("BertModel", None),
    ("onnx-BertModel", None),
    ("sweeps/test_export.py::test_export[tflite-static-BertModel]", "tflite"),
])
def test_parse_item_rejects_bad_backend_or_variant_clearly(text, wrong):
    with pytest.raises(SystemExit) as info:
        parse_item(text)
    message = str(info.value.code)
    assert "item id must look like 'onnx-dynamic-LlamaForCausalLM'" in message
    for name in BACKENDS + VARIANTS:
        assert name in message
    assert repr(text) in message


def test_a_model_type_instead_of_a_class_lists_its_classes():
    with pytest.raises(SystemExit) as info:
        parse_item("dynamo-static-nllb_moe")
    message = str(info.value.code)
    assert "'nllb_moe' is a model type or pattern, not a class" in message
    listed = message.split("classes: ", 1)[1].split(", ")
    assert set(listed) == {e.class_name for e in resolve_models(["nllb_moe"])}
    assert "NllbMoeForConditionalGeneration" in listed and "NllbMoeModel" in listed


def test_a_glob_instead_of_a_class_lists_the_matches():
    with pytest.raises(SystemExit) as info:
        parse_item("onnx-static-NllbMoe*")
    assert "NllbMoeModel" in str(info.value.code)


def test_an_unknown_class_names_close_matches():
    with pytest.raises((SystemExit, UnknownModelError)) as info:
        parse_item("onnx-static-BertModle")
    message = str(info.value.code if isinstance(info.value, SystemExit) else info.value)
    assert "BertModel" in message


def test_main_rejects_a_bad_item_before_exporting(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["onx-dynamic-BertModel", "--keep", str(tmp_path)])
    assert "item id must look like" in str(info.value.code)
    assert list(tmp_path.iterdir()) == []  # nothing kept: no artifact folder for a bad id


def test_parse_item_accepts_a_node_id_with_an_xdist_group_suffix():
    case = parse_item("sweeps/test_export.py::test_export[onnx-dynamic-BertModel]@BertModel")
    assert case == Case("onnx", "dynamic", _entry("BertModel"))


@pytest.mark.parametrize(("text", "expected"), [
    ("generate:onnx-static-LlamaForCausalLM", Case("onnx", "static", None, "generate")),
    ("sweeps/test_generate.py::test_generate[executorch-dynamic-LlamaForCausalLM]",
     Case("executorch", "dynamic", None, "generate")),
    ("runner:ort-genai-LlamaForCausalLM", Case("onnx", "genai", None, "runner")),
    ("sweeps/test_runner.py::test_runner[executorch-llm-LlamaForCausalLM]", Case("executorch", "llm", None, "runner")),
])
def test_generate_and_runner_items_parse_back_with_their_test(text, expected):
    case = parse_item(text)
    assert (case.backend, case.variant, case.test, case.entry.class_name) == \
        (expected.backend, expected.variant, expected.test, "LlamaForCausalLM")
    assert parse_item(case.repro.split()[-1]) == case  # the printed repro line parses back to the item


def test_unknown_runtime_names_the_runtimes():
    with pytest.raises(SystemExit, match="runtime: executorch-llm, ort-genai"):
        parse_item("runner:tflite-LlamaForCausalLM")

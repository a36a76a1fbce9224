"""The backbone registry: every registered backbone runs the conformance suite (a test file
`test_<model_type>.py` whose class subclasses `BackboneConformance` for it), so a new
backbone's module and test file are all it takes, with no list to edit."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from adapters_conformance import BackboneConformance

import craft_adapters
from craft_adapters.backbones.qwen3_vl import Qwen3VLAdapter
from craft_adapters.registry import BackboneAdapter, adapter_classes, register_backbone

HERE = Path(__file__).parent


@pytest.mark.parametrize("model_type", craft_adapters.supported_model_types())
def test_every_registered_backbone_runs_the_suite(model_type: str) -> None:
    path = HERE / f"test_{model_type}.py"
    assert path.exists(), f"{model_type} is registered but has no {path.name}"
    module = importlib.import_module(path.stem)
    suites = [
        value
        for name, value in vars(module).items()
        if name.startswith("Test")
        and isinstance(value, type)
        and issubclass(value, BackboneConformance)
        and value.model_type == model_type
    ]
    assert suites, f"{path.name} declares no BackboneConformance class for {model_type}"


def test_an_adapter_without_model_types_is_refused() -> None:
    with pytest.raises(ValueError, match="model_types is empty"):

        @register_backbone
        class Empty(BackboneAdapter):
            pass


def test_only_qwen3_vl_saves_deepstack_rows() -> None:
    # `compress_videos` asks the adapter for the rows a saved video carries beside its own
    # (`CompressedVideo.deepstack`): the base hook has none, even for an output that holds
    # deepstack rows; Qwen3-VL's gives its kept tokens' rows, level after level.
    levels = [(torch.ones(3, 4), torch.zeros(2, 4)), (2 * torch.ones(3, 4), torch.ones(2, 4))]
    output = SimpleNamespace(deepstack_features=levels)
    for cls in adapter_classes():
        adapter = cls.__new__(cls)  # the hook reads only its arguments
        if cls is Qwen3VLAdapter:
            for video in (0, 1):
                want = torch.cat([level[video] for level in levels], 1)
                assert torch.equal(adapter.deepstack_rows(output, video), want)
            assert adapter.deepstack_rows(SimpleNamespace(deepstack_features=None), 0) is None
        else:
            assert adapter.deepstack_rows(output, 0) is None, cls.__name__

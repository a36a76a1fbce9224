"""The backbone registry: every registered backbone runs the conformance suite (a test file
`test_<model_type>.py` whose class subclasses `BackboneConformance` for it), so a new
backbone's module and test file are all it takes, with no list to edit."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from adapters_conformance import BackboneConformance

import craft_adapters
from craft_adapters.registry import BackboneAdapter, register_backbone

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

"""Each served backbone's knowledge lives in its model file (`ARCHITECTURE`, `PAYLOAD`), no
engine.

A client (`payload.video_payload`, `python -m craft_vllm.payload`) reads the declarations from
the model files' sources (it has no vLLM), the plugin registers the architectures they name,
the server imports them. Checked here: the readings are the same objects for every served
architecture (its class is named `ARCHITECTURE`, the 1-D RoPE ones are the files declaring
`flat`), and each processing info serves its own file's; the declared merge is the served config's and the timed backbones' processor
writes the frame runs the format says; a declaration that is not literal, and a payload of a
backbone that is not served, are refused by name. The payloads themselves are served in
test_precompressed.py and test_openai_*.py.
"""

from __future__ import annotations

import importlib

import pytest
import tiny
import tiny_glm4v
import tiny_internvl
import tiny_llava
import tiny_qwen3
import tiny_qwen3_5
import torch
from craft_vllm import payload
from craft_vllm.plugin import ARCHITECTURES, ONE_D
from craft_vllm.precompressed import PayloadProcessingInfo

from craft_adapters import CompressedVideo

KINDS = [tiny, tiny_qwen3, tiny_qwen3_5, tiny_llava, tiny_internvl, tiny_glm4v]


def _module(target: str):
    return importlib.import_module(target.split(":")[0])


def test_every_served_backbone_declares_its_format_in_its_own_file() -> None:
    declared = payload.declared_formats()
    modules = [_module(target) for target in ARCHITECTURES.values()]
    assert sorted(declared) == sorted(m.PAYLOAD.model_type for m in modules)
    assert len(modules) == 6 and set(ONE_D) == {
        "CraftLlavaOnevisionForConditionalGeneration",
        "CraftInternVLForConditionalGeneration",
    }
    for module in modules:
        assert declared[module.PAYLOAD.model_type] == module.PAYLOAD  # source == import
        assert getattr(module, module.ARCHITECTURE).architecture == module.ARCHITECTURE
        infos = [
            v
            for v in vars(module).values()
            if isinstance(v, type)
            and issubclass(v, PayloadProcessingInfo)
            and v.__module__ == module.__name__
        ]
        assert [i.payload_format for i in infos] == [module.PAYLOAD]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_declared_format_fits_the_served_config(kind) -> None:
    config = kind.config()
    form = payload.payload_format(config.model_type)
    assert form.merge == getattr(config.vision_config, "spatial_merge_size", 1)
    if form.frame_runs:  # the processor's timestamps: one per run of `frame_runs` frames
        for frames, fps in [(6, 2.0), (7, 0.7)]:
            grid = -(-frames // form.frame_runs)
            mine = payload.frame_timestamps(frames, fps, grid, form.frame_runs, form.run_seconds)
            assert mine == pytest.approx(processor_timestamps(kind, frames, fps), abs=1e-12)


def processor_timestamps(kind, frames: int, fps: float) -> list[float]:
    """The frame runs' seconds `kind`'s processor writes for `frames` frames at `fps`."""
    if kind is tiny_glm4v:  # read back from its prompt
        return tiny_glm4v.timestamps(frames, fps)
    return kind.processor()._calculate_timestamps(list(range(frames)), fps, 2)


def test_a_declaration_must_be_literal(tmp_path) -> None:
    good = tmp_path / "sixth.py"
    good.write_text(
        'import vllm\nARCHITECTURE = "CraftGlm4vForConditionalGeneration"\n'
        'PAYLOAD = PayloadFormat("glm4v", merge=2, frame_runs=2)\n'
    )
    sixth = payload.ServedBackbone(
        "sixth", "CraftGlm4vForConditionalGeneration", payload.PayloadFormat("glm4v", 2, 2)
    )
    assert payload._declared(good) == sixth
    bad = tmp_path / "bad.py"
    bad.write_text('ARCHITECTURE = "X"\nPAYLOAD = make_format()\n')
    with pytest.raises(TypeError, match=r"bad\.py: PAYLOAD must be PayloadFormat"):
        payload._declared(bad)
    (tmp_path / "nameless.py").write_text('PAYLOAD = PayloadFormat("x")\n')
    with pytest.raises(TypeError, match=r"nameless\.py: a model file declares ARCHITECTURE"):
        payload._declared(tmp_path / "nameless.py")
    (tmp_path / "none.py").write_text("ARCHITECTURE = 'x'\n")
    assert payload._declared(tmp_path / "none.py") is None


def test_a_backbone_that_is_not_served_is_named() -> None:
    video = CompressedVideo(torch.ones(1, 8), torch.zeros(1, 3, dtype=torch.long), (1, 1, 1))
    with pytest.raises(ValueError, match="no served backbone has model_type None"):
        payload.video_payload(video)
    gemma = CompressedVideo(video.features, video.coords, (1, 1, 1), {"model_type": "gemma3"})
    with pytest.raises(ValueError, match=r"model_type 'gemma3' .*served: glm4v, internvl, llava_"):
        payload.chat_part(gemma)

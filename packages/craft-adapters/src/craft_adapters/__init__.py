"""craft-adapters: CRAFT inside Hugging Face transformers VLMs.

import craft_adapters
model = craft_adapters.wrap(hf_model, compressor, ratio=8.0)   # or threshold=0.9
out = model(**inputs)                                          # HF forward, compressed
ids = model.generate(**inputs, max_new_tokens=16)
session = model.encode_video(**video_inputs)                   # compress + prefill once
answer_ids = session.ask(question_ids, max_new_tokens=16)      # reuses the prefix cache
craft_adapters.supported_model_types()
"""

from craft_adapters.compressed import (
    CompressedVideo,
    load_compressed_video,
    save_compressed_video,
)
from craft_adapters.inputs import build_inputs, build_session_inputs, render_prompt
from craft_adapters.registry import (
    BackboneAdapter,
    VideoLayout,
    get_adapter,
    register_backbone,
    supported_model_types,
)
from craft_adapters.splice import group_mean
from craft_adapters.video import SampledVideo, read_video, sample_indices
from craft_adapters.wrapper import (
    CompressionReport,
    CraftModel,
    VideoCompression,
    VideoSession,
    wrap,
)

__version__ = "0.5.0"

__all__ = [
    "BackboneAdapter",
    "CompressedVideo",
    "CompressionReport",
    "CraftModel",
    "SampledVideo",
    "VideoCompression",
    "VideoLayout",
    "VideoSession",
    "build_inputs",
    "build_session_inputs",
    "get_adapter",
    "group_mean",
    "load_compressed_video",
    "read_video",
    "register_backbone",
    "render_prompt",
    "sample_indices",
    "save_compressed_video",
    "supported_model_types",
    "wrap",
]

"""The plugin's model classes: lmms-eval 0.7.3's own class for each backbone, with
`CraftLMMixin` in front (frame sampling, chat template, prompt, batching and generation
settings stay lmms-eval's; only the language model's input is compressed).

The classes are generated from the craft-adapters registry: each backbone's adapter names
the lmms-eval classes it extends (`BackboneAdapter.lmms_classes`), and this module defines
`Craft<Class>` (simple) and `Craft<Class>Chat` (chat) for them, e.g.

| plugin id | classes here | lmms-eval classes extended (`lmms_eval/models/...`) |
| --- | --- | --- |
| craft_qwen2_5_vl | `CraftQwen2_5_VL`, `CraftQwen2_5_VLChat` | `{simple,chat}/qwen2_5_vl.py` |
| craft_qwen3_vl | `CraftQwen3_VL`, `CraftQwen3_VLChat` | `{simple,chat}/qwen3_vl.py:Qwen3_VL` |
| craft_qwen3_5 | `CraftQwen3_5`, `CraftQwen3_5Chat` | `{simple,chat}/qwen3_5.py:Qwen3_5` |
| craft_llava_onevision | `CraftLlavaHf` | `simple/llava_hf.py:LlavaHf` (its chat class fails) |
| craft_internvl | `CraftInternVLHfChat` | `chat/internvl_hf.py:InternVLHf` (no simple class) |
| craft_glm4v | `CraftGLM4V` (written here: `VideoRoute`) | `simple/glm4v.py:GLM4V` |

lmms-eval 0.7.3's `GLM4V` hands every visual to the processor as an image, a video file
included, and loads any checkpoint whose name lacks "Flash" with the MoE class (it serves
GLM-4.6V). `CraftGLM4V` loads the class the checkpoint's config names and gives videos a route
of their own (`VideoRoute`): sampled by craft-adapters (`read_video`, model_args `fps` and
`max_num_frames`) and processed as a video (`build_inputs`: the frame groups and their
seconds GLM-4.1V's processor writes), so they reach the compressor.

Importing this module imports lmms-eval (install `craft-eval[lmms]`).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from craft_eval.lmms.compress import CraftLMMixin
from craft_eval.lmms.plugin import plugin_class_name, plugin_specs

__all__: list[str] = []


def _extend(spec: str, chat: bool) -> type:
    """`CraftLMMixin` in front of the lmms-eval class `spec` (`"chat.qwen3_vl:Qwen3_VL"`)."""
    module, _, name = spec.partition(":")
    base = getattr(importlib.import_module(f"lmms_eval.models.{module}"), name)
    attrs: dict[str, object] = {
        "__module__": __name__,
        "__doc__": f"lmms-eval's `{name}` ({'chat' if chat else 'simple'}) with a compressor.",
    }
    if chat:
        attrs["is_simple"] = False
    return type(str(plugin_class_name(spec, chat)), (CraftLMMixin, base), attrs)


for _spec in plugin_specs(routed=False).values():
    for _path, _chat in ((_spec.simple, False), (_spec.chat, True)):
        if _path is not None:
            _cls = _extend(_path, _chat)
            globals()[_cls.__name__] = _cls
            __all__.append(_cls.__name__)


VIDEO_SUFFIXES = {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpeg", ".mpg", ".flv", ".wmv"}
"""File names read as videos by `VideoRoute` (lmms-eval's video tasks hand their paths)."""


class VideoRoute:
    """Stands where lmms-eval's `GLM4V` keeps its processor: `apply_chat_template` on
    messages holding a video file (an `{"type": "image", "url": PATH}` item whose PATH ends in
    a `VIDEO_SUFFIXES` suffix, as `GLM4V` writes it) samples each video with craft-adapters
    (`read_video(path, fps, max_frames)`) and returns `build_inputs` of the frames, the
    message's text and its system turn (left-padded batch); other messages, and everything
    else, reach the processor unchanged.
    """

    def __init__(self, processor: Any, fps: float, max_frames: int) -> None:
        self._processor, self.fps, self.max_frames = processor, fps, max_frames

    def __getattr__(self, name: str) -> Any:
        return getattr(self._processor, name)

    def apply_chat_template(self, conversations: Any, *args: Any, **kwargs: Any) -> Any:
        batch = [conversations] if conversations and isinstance(conversations[0], dict) else None
        messages = batch or list(conversations)
        if not any(_video_paths(m) for m in messages):
            return self._processor.apply_chat_template(conversations, *args, **kwargs)
        from craft_adapters import build_inputs, read_video

        frames, rates, texts, systems = [], [], [], []
        for message in messages:
            (path,) = _one_video(message)
            video = read_video(path, fps=self.fps, max_frames=self.max_frames)
            frames.append(video.frames)
            rates.append(video.fps)
            texts.append(_text(message))
            systems.append(_system(message))
        if len(set(systems)) != 1:
            raise ValueError("craft_glm4v: a batch's messages must share one system prompt")
        return build_inputs(self._processor, frames, rates, texts, system=systems[0])


def _video_paths(message: list[dict[str, Any]]) -> list[str]:
    """The video files among a message's image items (`GLM4V` writes them so)."""
    out = []
    for turn in message:
        content = turn.get("content")
        for item in content if isinstance(content, list) else []:
            url = item.get("url") if item.get("type") == "image" else None
            if isinstance(url, str) and Path(url).suffix.lower() in VIDEO_SUFFIXES:
                out.append(url)
    return out


def _one_video(message: list[dict[str, Any]]) -> list[str]:
    """The message's one video; refused: several videos, or a video beside images."""
    paths = _video_paths(message)
    items = [
        item
        for turn in message
        if isinstance(turn.get("content"), list)
        for item in turn["content"]
        if item.get("type") != "text"
    ]
    if len(paths) != 1 or len(items) != 1:
        raise ValueError(
            f"craft_glm4v: a message with a video holds that one video and text only, got "
            f"{len(paths)} video(s) among {len(items)} visual item(s)"
        )
    return paths


def _text(message: list[dict[str, Any]]) -> str:
    """The user turn's text items, joined."""
    parts = [
        item["text"]
        for turn in message
        if turn.get("role") == "user" and isinstance(turn.get("content"), list)
        for item in turn["content"]
        if item.get("type") == "text"
    ]
    return "".join(parts)


def _system(message: list[dict[str, Any]]) -> str | None:
    """The message's system turn (a string), or None."""
    return next((t["content"] for t in message if t.get("role") == "system"), None)


@contextlib.contextmanager
def _model_class_from_config() -> Iterator[None]:
    """While `GLM4V.__init__` runs, both of its model classes are transformers'
    `AutoModelForImageTextToText` (it picks the checkpoint's class from its config: GLM4V
    picks the MoE class for any name without "Flash", GLM-4.1V's included)."""
    from transformers import AutoModelForImageTextToText

    module = importlib.import_module("lmms_eval.models.simple.glm4v")
    names = ("Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration")
    saved = {name: getattr(module, name) for name in names}
    for name in names:
        setattr(module, name, AutoModelForImageTextToText)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def _model_arg(name: str, value: Any, kind: type) -> Any:
    """A model_args value as `kind` (int: >= 1, float: > 0 and finite); errors name it."""
    try:
        out = kind(str(value))
    except ValueError:
        out = None
    if out is None or not (0 < out < float("inf")) or (kind is int and out < 1):
        what = "an integer >= 1" if kind is int else "a number > 0"
        raise ValueError(f"model_args {name}={value!r}: must be {what}")
    return out


_GLM4V: Any = importlib.import_module("lmms_eval.models.simple.glm4v").GLM4V


class CraftGLM4V(CraftLMMixin, _GLM4V):  # type: ignore[misc]
    """lmms-eval's `GLM4V` (simple) with a compressor and a video route (`VideoRoute`).

    model_args besides `GLM4V`'s and the plugin's: `fps` (2) and `max_num_frames` (64), how
    each video is sampled.
    """

    processor: Any  # GLM4V's, then the route in front of it

    def __init__(self, *, fps: Any = 2.0, max_num_frames: Any = 64, **kwargs: Any) -> None:
        rate = _model_arg("fps", fps, float)
        frames = _model_arg("max_num_frames", max_num_frames, int)
        with _model_class_from_config():
            super().__init__(**kwargs)
        self.processor = VideoRoute(self.processor, rate, frames)


__all__.append(CraftGLM4V.__name__)

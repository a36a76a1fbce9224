"""`craft_glm4v`: GLM-4.1V through lmms-eval's CLI entry function with the plugin's video
route (`craft_eval.lmms.models.CraftGLM4V`), on a tiny random GLM-4.1V saved with its
processor, against craft-adapters' own `generate()`.

lmms-eval 0.7.3's `GLM4V` hands a video file to the processor as an image; the plugin samples
it (`read_video`, model_args `fps` / `max_num_frames`) and processes it as a video, so CRAFT
compresses its frame groups. Checked per document (two video shapes): the reply equals
craft-adapters' `wrap(model, craft, ratio=4).generate()` on the same frames, prompt and
generation settings (bfloat16, as lmms-eval's class loads the model), the sample log's token
counts are the library's (N group tokens, `floor(N / 4)` kept); control: the uncompressed
reference replies otherwise on at least one document (the comparison sees the compression).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from test_lmms_plugin import _argv, _read, lmms_env, tiny_models, write_task

__all__ = ["lmms_env", "tiny_models"]  # the fixtures, shared with the plugin's tests

FPS, FRAMES, RATIO, NEW_TOKENS = 4.0, 4, 4, 8
GAP, CONTROL_GAP = 1e-5, 1e-2  # first-step log-probs: the same computation; far from it


def _task(root: Path, videos: list[Path]) -> tuple[Path, list[dict[str, Any]]]:
    """The local task `tiny_glm` (the plugin's tests' task, the question alone as the prompt,
    NEW_TOKENS new tokens, its replies unsplit: `until` never matches)."""
    docs = [
        {"id": i, "video": str(video), "question": f"What moves {i}?", "answer": "A"}
        for i, video in enumerate(videos)
    ]
    task = write_task(root, docs, "tiny_glm", NEW_TOKENS, until=["<|never|>"], suffix="")
    return task, docs


class Reply(NamedTuple):
    """One document's reply: new token ids, the first step's `[vocab]` log-probs, the video's
    tokens before and after compression."""

    tokens: list[int]
    first: torch.Tensor
    before: int
    after: int


def _reference(model_dir: Path, craft: Any, videos: list[str], questions: list[str]) -> list[Any]:
    """craft-adapters' `generate()` on each video."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    import craft_adapters

    processor = AutoProcessor.from_pretrained(model_dir)
    tokenizer = processor.tokenizer
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    ratio = None if craft is None else RATIO
    wrapped = craft_adapters.wrap(model, craft, ratio=ratio)
    out = []
    for path, question in zip(videos, questions):
        frames, fps = craft_adapters.read_video(path, fps=FPS, max_frames=FRAMES)
        inputs = craft_adapters.build_inputs(processor, frames, fps, question)
        with torch.no_grad():
            gen = wrapped.generate(
                **inputs,
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                output_scores=True,
                return_dict_in_generate=True,
            )
        new = gen.sequences[0, inputs["input_ids"].shape[1] :].tolist()
        first = torch.log_softmax(gen.scores[0][0].float(), -1)
        report = wrapped.last_compression
        counts = (
            (0, 0)
            if report is None
            else (report.videos[0].tokens_before, report.videos[0].tokens_after)
        )
        out.append(Reply(new, first, *counts))
    return out


@pytest.mark.slow
def test_lmms_eval_glm4v_video_route_equals_generate(
    lmms_env: dict[str, Any], tiny_models: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmms_eval.cli.dispatch import main

    from craft_core import CraftCompressor, CraftConfig

    model = tiny_models("glm4v")
    root = lmms_env["root"]
    torch.manual_seed(0)
    craft = CraftCompressor(CraftConfig(hidden_size=64))
    craft.save_pretrained(root / "craft_glm")
    task, docs = _task(root, lmms_env["videos"])
    out = root / "out-glm4v"
    extra = f"fps={FPS},max_num_frames={FRAMES}"
    method = f"method=craft,checkpoint={root / 'craft_glm'},ratio={RATIO}"
    argv = _argv("craft_glm4v", model, extra, method, task, out, "tiny_glm")
    monkeypatch.setattr(sys, "argv", ["lmms-eval", *argv])
    replies = _record_replies(monkeypatch)
    main()
    summary, samples = _read(out, "tiny_glm")
    assert summary["config"]["model"] == "craft_glm4v"
    videos, questions = [d["video"] for d in docs], [d["question"] for d in docs]
    loaded = CraftCompressor.from_pretrained(root / "craft_glm")
    reference = _reference(model, loaded, videos, questions)
    uncompressed = _reference(model, None, videos, questions)
    for sample, ref, plain in zip(samples, reference, uncompressed):
        counts = sample["token_counts"][0]
        tokens, first = replies[questions[sample["doc_id"]]]
        gap = float((first - ref.first).abs().max())
        control = float((plain.first - ref.first).abs().max())
        print(f"doc {sample['doc_id']}: gap {gap:.2e}, uncompressed {control:.2e} away")
        assert tokens == ref.tokens and gap <= GAP
        assert (counts["visual_tokens_before"], counts["visual_tokens_after"]) == (
            ref.before,
            ref.after,
        )
        assert ref.after == ref.before // RATIO and control >= CONTROL_GAP
    assert len({r.before for r in reference}) == 2  # two video shapes, counted apart


def _record_replies(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Record each reply's new token ids and first-step log-probs as the plugin's model
    generates them (lmms-eval logs the decoded text only: a tiny byte-level model's bytes
    decode to the same replacement characters), by the question its prompt holds."""
    from craft_eval.lmms.compress import CompressedGenerate

    replies: dict[str, tuple[list[int], torch.Tensor]] = {}
    generate = CompressedGenerate.generate

    def record(self: Any, **kwargs: Any) -> Any:
        out = generate(self, **kwargs, output_scores=True, return_dict_in_generate=True)
        prompt = kwargs["input_ids"]
        for i, (row, ids) in enumerate(zip(prompt, out.sequences)):
            # the tiny tokenizer's ids 0-255 are the bytes themselves
            text = bytes(t for t in row.tolist() if t < 256).decode("utf-8", "replace")
            question = text[text.index("What moves") :].split("?")[0] + "?"
            first = torch.log_softmax(out.scores[0][i].float(), -1)
            replies[question] = (ids[row.shape[0] :].tolist(), first)
        return out.sequences

    monkeypatch.setattr(CompressedGenerate, "generate", record)
    return replies

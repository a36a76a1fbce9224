"""The integration on a tiny random model of EVERY backbone (the `backbone` fixture)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from adapters_testkit import KeepEvery, LMRecorder, make_frames

import craft_adapters
from craft_adapters import build_inputs, build_session_inputs, wrap

GEN = {"max_new_tokens": 4, "do_sample": False}


def _inputs(processor: Any, frames: int = 4, prompt: str = "What?", seed: int = 0) -> Any:
    return build_inputs(processor, make_frames(frames, seed), 2.0, prompt)


def _lm(wrapped: craft_adapters.CraftModel) -> torch.nn.Module:
    return wrapped.adapter.language_model


def _new(out: torch.Tensor, inputs: Any) -> torch.Tensor:
    return out[:, inputs["input_ids"].shape[1] :]


@torch.no_grad()
def test_identity_equals_hf(backbone: tuple[str, Any, Any]) -> None:
    """compressor=None and ratio 1 give exactly the HF model's logits and greedy tokens."""
    _, model, processor = backbone
    inputs = _inputs(processor)
    ref_logits = model(**inputs).logits
    ref_ids = model.generate(**inputs, **GEN)
    for wrapped in (wrap(model, None), wrap(model, KeepEvery(2), ratio=1.0)):
        assert torch.equal(wrapped(**inputs).logits, ref_logits)
        assert torch.equal(wrapped.generate(**inputs, **GEN), ref_ids)
    # ratio 1 really went through the compressed route (precomputed features, own positions)
    assert wrapped.last_compression is not None
    assert wrapped.last_compression.ratio == 1.0


@torch.no_grad()
def test_positions_survive_and_decoding_continues(backbone: tuple[str, Any, Any]) -> None:
    _, model, processor = backbone
    inputs = _inputs(processor)
    ids = inputs["input_ids"]
    wrapped = wrap(model, KeepEvery(2), ratio=2.0)
    rec = LMRecorder(_lm(wrapped))
    with rec.record():
        model(**inputs)  # HF reference: positions of the full sequence
        ref_pos = rec.calls[-1]["position_ids"]
        wrapped(**inputs)
        got = rec.calls[-1]["position_ids"]
    kept = wrapped.compressed_index(0)
    if not wrapped.adapter.uses_mrope:  # LLaVA-OneVision, InternVL
        ref_pos = torch.arange(ids.shape[1]).unsqueeze(0)  # HF's 1D default
        assert got.shape == (1, kept.numel())
        assert torch.equal(got[0], ref_pos[0, kept])
    else:
        assert ref_pos.shape[0] == 3 and got.shape == (3, 1, kept.numel())
        assert torch.equal(got[:, 0], ref_pos[:, 0, kept])
    # every text token survives, and only video tokens were dropped
    video = ids[0] == wrapped.adapter.video_token_id
    kept_mask = torch.zeros_like(video)
    kept_mask[kept] = True
    assert bool(kept_mask[~video].all())
    report = wrapped.last_compression
    assert report is not None and report.tokens_before == int(video.sum())
    assert int(kept_mask[video].sum()) == report.tokens_after < report.tokens_before
    # decoding continues from the ORIGINAL last position
    rec.calls.clear()
    with rec.record():
        wrapped.generate(**inputs, max_new_tokens=3, do_sample=False)
    first_decode = rec.calls[1]["position_ids"]
    expected = int(ref_pos.max()) + 1
    assert first_decode.shape[-1] == 1
    assert bool((first_decode == expected).all()), (first_decode, expected)
    assert bool((rec.calls[2]["position_ids"] == expected + 1).all())


@torch.no_grad()
def test_mask_always_reaches_the_language_model(backbone: tuple[str, Any, Any]) -> None:
    """Gapped positions never reach the LM without a 2-D mask (the block-diagonal trap)."""
    _, model, processor = backbone
    inputs = _inputs(processor)
    wrapped = wrap(model, KeepEvery(2), ratio=2.0)
    rec = LMRecorder(_lm(wrapped))
    with rec.record():
        wrapped(**inputs)
        wrapped(**inputs, use_cache=False)
        wrapped.generate(**inputs, **GEN)
        wrapped.generate(**inputs, use_cache=False, **GEN)  # HF drops an all-ones mask here
        session = wrapped.encode_video(**inputs)
        session.ask(torch.tensor([[65, 66]]), **GEN)
    assert len(rec.calls) > 10
    for call in rec.calls:
        mask = call["attention_mask"]
        assert isinstance(mask, torch.Tensor) and mask.dim() == 2, call
        assert mask.shape[1] == call["past"] + call["length"]


@torch.no_grad()
def test_coordinates_are_the_backbones_thw(backbone: tuple[str, Any, Any]) -> None:
    name, model, processor = backbone
    inputs = _inputs(processor, frames=4)
    comp = KeepEvery(2)
    wrap(model, comp, ratio=2.0)(**inputs)
    coords = comp.calls[-1]["coords"]
    t, h, w = coords.unbind(-1)
    if name == "llava_onevision":
        side = wrap(model, None).adapter.pooled_side  # type: ignore[attr-defined]
        per_frame = side * side
        idx = torch.arange(coords.shape[0])
        assert coords.shape[0] == 4 * per_frame  # the newline is not handed over
        assert torch.equal(t, idx // per_frame)
        assert torch.equal(h, (idx % per_frame) // side)
        assert torch.equal(w, idx % side)
        return
    gt, gh, gw = inputs["video_grid_thw"][0].tolist()
    gh, gw = gh // 2, gw // 2
    assert coords.shape[0] == gt * gh * gw
    idx = torch.arange(coords.shape[0])
    assert torch.equal(h, (idx % (gh * gw)) // gw)
    assert torch.equal(w, idx % gw)
    group = idx // (gh * gw)
    starts = t[:: gh * gw]
    assert torch.equal(t, starts[group])  # constant within a temporal group
    assert bool((starts[1:] > starts[:-1]).all()) and int(starts[0]) == 0
    if name == "qwen2_5_vl":  # t = group * tokens_per_second * second_per_grid
        interval = model.config.vision_config.tokens_per_second * float(
            inputs["second_per_grid_ts"][0]
        )
        assert torch.equal(starts, (torch.arange(gt) * interval).long())


@torch.no_grad()
def test_llava_newline_always_survives(tiny_models: dict[str, Any]) -> None:
    model, processor = tiny_models["llava_onevision"]
    inputs = _inputs(processor)
    wrapped = wrap(model, KeepEvery(4), ratio=4.0)
    out = wrapped(**inputs)
    ids = inputs["input_ids"][0]
    video_pos = (ids == wrapped.adapter.video_token_id).nonzero().squeeze(1)
    kept = wrapped.compressed_index(0)
    assert int(video_pos[-1]) in kept.tolist()  # the newline row is the last video token
    # its row is the model's image_newline parameter, unchanged
    enc_rows = []
    hook = model.model.language_model.register_forward_pre_hook(
        lambda _m, a, k: enc_rows.append(k["inputs_embeds"].clone()), with_kwargs=True
    )
    try:
        wrapped(**inputs)
    finally:
        hook.remove()
    c_ids = ids[kept]
    last_video = int((c_ids == wrapped.adapter.video_token_id).nonzero()[-1])
    assert torch.allclose(enc_rows[0][0, last_video], model.model.image_newline)
    report = wrapped.last_compression
    assert report is not None and report.tokens_after == 16 // 4 + 1
    assert out.logits.shape[1] == kept.numel()


@torch.no_grad()
def test_qwen3_vl_deepstack_shrunk_consistently(tiny_models: dict[str, Any]) -> None:
    model, processor = tiny_models["qwen3_vl"]
    inputs = _inputs(processor)
    seen: list[dict[str, Any]] = []
    lm = model.model.language_model
    hook = lm.register_forward_pre_hook(
        lambda _m, a, k: seen.append(
            {"mask": k["visual_pos_masks"], "deep": k["deepstack_visual_embeds"]}
        ),
        with_kwargs=True,
    )
    try:
        model(**inputs)
        wrapped = wrap(model, KeepEvery(2), ratio=2.0)
        wrapped(**inputs)
    finally:
        hook.remove()
    full, comp = seen
    n_kept = wrapped.last_compression.tokens_after  # type: ignore[union-attr]
    assert int(comp["mask"].sum()) == n_kept
    for deep_full, deep_comp in zip(full["deep"], comp["deep"]):
        assert deep_comp.shape == (n_kept, deep_full.shape[1])
        # KeepEvery(2) merges pairs (2i, 2i+1): the kept row is their mean
        n = deep_full.shape[0]
        expected = torch.stack([deep_full[i : min(i + 2, n)].mean(0) for i in range(0, n, 2)])
        assert torch.allclose(deep_comp, expected, atol=1e-6)


@torch.no_grad()
def test_session_equals_fresh_full_run(backbone: tuple[str, Any, Any]) -> None:
    _, model, processor = backbone
    frames = make_frames(4, seed=3)
    questions = ["What is it?", "Who?"]
    video_inputs, q_ids = build_session_inputs(processor, frames, 2.0, questions)
    wrapped = wrap(model, KeepEvery(2), ratio=2.0)
    session = wrapped.encode_video(**video_inputs)
    vision = getattr(model.model, "visual", None) or model.model.vision_tower
    vision_calls: list[int] = []
    handle = vision.register_forward_pre_hook(lambda *_: vision_calls.append(1))
    rec = LMRecorder(_lm(wrapped))
    try:
        with rec.record():
            answers = [session.ask(q, **GEN) for q in q_ids]
    finally:
        handle.remove()
    assert not vision_calls  # the video is never re-encoded
    first = rec.calls[0]
    assert first["past"] == session.prefix_length and first["length"] == q_ids[0].shape[1]
    for question, answer in zip(questions, answers):
        full = build_inputs(processor, frames, 2.0, question)
        fresh = _new(wrapped.generate(**full, **GEN), full)
        assert torch.equal(answer, fresh), (question, answer, fresh)
    # token-level check of the split: prefix + question == the full prompt
    full = build_inputs(processor, frames, 2.0, questions[0])
    joined = torch.cat([video_inputs["input_ids"], q_ids[0]], dim=1)
    assert torch.equal(joined, full["input_ids"])


@torch.no_grad()
def test_batch_of_two_lengths_matches_one_at_a_time(backbone: tuple[str, Any, Any]) -> None:
    _, model, processor = backbone
    videos = [make_frames(4, seed=5), make_frames(2, seed=6)]
    prompts = ["What?", "Why is that so?"]
    wrapped = wrap(model, KeepEvery(2), ratio=2.0)
    batch = build_inputs(processor, videos, 2.0, prompts)
    assert bool((batch["attention_mask"][:, 0] == 0).any())  # left-padded
    batched = _new(wrapped.generate(**batch, **GEN), batch)
    report = wrapped.last_compression
    assert report is not None and [v.batch_index for v in report.videos] == [0, 1]
    for b, (video, prompt) in enumerate(zip(videos, prompts)):
        single = build_inputs(processor, video, 2.0, prompt)
        alone = _new(wrapped.generate(**single, **GEN), single)
        assert torch.equal(batched[b, : alone.shape[1]], alone[0]), (b, batched, alone)


@torch.no_grad()
def test_video_less_prompt_runs_uncompressed(backbone: tuple[str, Any, Any]) -> None:
    _, model, processor = backbone
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    inputs = processor(text=[text], return_tensors="pt")
    wrapped = wrap(model, KeepEvery(2), ratio=4.0)
    assert torch.equal(wrapped(**inputs).logits, model(**inputs).logits)
    assert wrapped.last_compression is None
    assert torch.equal(wrapped.generate(**inputs, **GEN), model.generate(**inputs, **GEN))


def test_training_forward_slices_labels_and_backprops(backbone: tuple[str, Any, Any]) -> None:
    from craft_core import CraftCompressor, CraftConfig

    _, model, processor = backbone
    inputs = dict(_inputs(processor))
    labels = inputs["input_ids"].clone()
    video_id = craft_adapters.get_adapter(model).video_token_id
    labels[labels == video_id] = -100
    labels[:, :3] = -100
    inputs["labels"] = labels
    torch.manual_seed(0)
    comp = CraftCompressor(CraftConfig(hidden_size=64, gate_hidden=32, round_embed_dim=16))
    wrapped = wrap(model, comp, ratio=2.0)
    out = wrapped(**inputs)
    kept = wrapped.compressed_index(0)
    assert out.logits.shape[1] == kept.numel()
    # the loss equals HF's loss on the compressed logits with the sliced labels
    sliced = labels[0, kept].unsqueeze(0)
    expected = model.loss_function(
        logits=out.logits, labels=sliced, vocab_size=model.config.get_text_config().vocab_size
    )
    assert torch.allclose(out.loss, expected)
    out.loss.backward()
    grads = [p.grad for p in comp.parameters() if p.requires_grad]
    assert any(g is not None and bool(g.abs().sum() > 0) for g in grads)
    model.zero_grad(set_to_none=True)


@torch.no_grad()
def test_real_craft_compressor_ratio_and_threshold(backbone: tuple[str, Any, Any]) -> None:
    from craft_core import CraftCompressor, CraftConfig

    _, model, processor = backbone
    inputs = _inputs(processor)
    comp = CraftCompressor(CraftConfig(hidden_size=64, gate_hidden=32, round_embed_dim=16))
    wrapped = wrap(model, comp, ratio=1.0)
    assert torch.equal(wrapped(**inputs).logits, model(**inputs).logits)
    wrapped.set_budget(ratio=3.0)
    wrapped.generate(**inputs, **GEN)
    report = wrapped.last_compression
    assert report is not None
    assert report.videos[0].rounds >= 1 and report.ratio > 1.5
    wrapped.set_budget(threshold=0.0, min_tokens=2)
    wrapped.generate(**inputs, **GEN)
    assert wrapped.budget["threshold"] == 0.0
    assert wrapped.last_compression is not None


def test_bad_inputs_raise_clear_errors(tiny_models: dict[str, Any]) -> None:
    from craft_core import CraftCompressor, CraftConfig

    class Fake:
        class config:
            model_type = "bert"

    with pytest.raises(ValueError, match="unsupported model_type 'bert'"):
        wrap(Fake(), None)
    model, processor = tiny_models["qwen2_5_vl"]
    with pytest.raises(ValueError, match="hidden size 32 != language model hidden size 64"):
        wrap(model, CraftCompressor(CraftConfig(hidden_size=32)), ratio=2.0)
    with pytest.raises(ValueError, match=r"ratio=\.\.\. or threshold"):
        wrap(model, KeepEvery(2))
    with pytest.raises(ValueError, match="ratio must be a finite number >= 1"):
        wrap(model, KeepEvery(2), ratio=0.5)
    for name in ("qwen2_5_vl", "llava_onevision"):
        model, processor = tiny_models[name]
        inputs = dict(_inputs(processor))
        wrapped = wrap(model, KeepEvery(2), ratio=2.0)
        video = (inputs["input_ids"][0] == wrapped.adapter.video_token_id).nonzero().squeeze(1)
        sel = torch.ones(inputs["input_ids"].shape[1], dtype=torch.bool)
        sel[int(video[0])] = False  # one placeholder too few
        for key in ("input_ids", "attention_mask", "mm_token_type_ids"):
            if key in inputs:
                inputs[key] = inputs[key][:, sel]
        with pytest.raises(ValueError, match="mismatched video placeholders"):
            wrapped(**inputs)
    model, processor = tiny_models["qwen3_vl"]
    inputs = dict(_inputs(processor))
    inputs.pop("mm_token_type_ids")
    with pytest.raises(ValueError, match="mm_token_type_ids is missing"):
        wrap(model, KeepEvery(2), ratio=2.0)(**inputs)


@pytest.mark.gpu
@torch.no_grad()
def test_bf16_cuda_generate_and_session(tiny_models: dict[str, Any]) -> None:
    """On CUDA in bf16 with inputs left on the CPU: compressed generate and a session run."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from craft_core import CraftCompressor, CraftConfig

    for name in ("qwen3_5", "llava_onevision"):
        model, processor = tiny_models[name]
        model = model.to("cuda", torch.bfloat16)
        try:
            comp = CraftCompressor(CraftConfig(hidden_size=64, gate_hidden=32, round_embed_dim=16))
            wrapped = wrap(model, comp.to("cuda"), ratio=2.0)
            inputs = _inputs(processor)
            out = wrapped.generate(**inputs, **GEN)
            assert inputs["input_ids"].shape[1] < out.shape[1] <= inputs["input_ids"].shape[1] + 4
            video_inputs, q_ids = build_session_inputs(processor, make_frames(4), 2.0, ["Why?"])
            answer = wrapped.encode_video(**video_inputs).ask(q_ids[0], **GEN)
            assert answer.shape[0] == 1 and 1 <= answer.shape[1] <= 4
        finally:
            model.to("cpu", torch.float32)


@pytest.mark.parametrize("name", ["qwen3_vl", "llava_onevision"])
@torch.no_grad()
def test_images_beside_the_video_are_kept(name: str, tiny_models: dict[str, Any]) -> None:
    """An image in the same prompt is encoded uncompressed; only the video shrinks."""
    from transformers.video_utils import VideoMetadata

    model, processor = tiny_models[name]
    messages = [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "Same?"}],
        }
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    kwargs: dict[str, Any] = {}
    if name != "llava_onevision":
        meta = VideoMetadata(total_num_frames=4, fps=2.0, frames_indices=[0, 1, 2, 3])
        kwargs = {"video_metadata": [meta], "do_sample_frames": False}
    inputs = processor(
        text=[text],
        images=[make_frames(1, seed=9)[0]],
        videos=[make_frames(4)],
        return_tensors="pt",
        **kwargs,
    )
    wrapped = wrap(model, KeepEvery(2), ratio=1.0)
    assert torch.equal(wrapped(**inputs).logits, model(**inputs).logits)
    wrapped.set_budget(ratio=2.0)
    wrapped(**inputs)
    kept = wrapped.compressed_index(0)
    image_id = model.config.image_token_id
    n_image = int((inputs["input_ids"] == image_id).sum())
    assert n_image > 0 and int((inputs["input_ids"][0, kept] == image_id).sum()) == n_image


@torch.no_grad()
@pytest.mark.parametrize("setting", [{"use_cache": False}, {"logits_to_keep": 0}])
def test_encode_video_refuses_the_settings_it_fixes(
    tiny_models: dict[str, Any], setting: dict[str, Any]
) -> None:
    """A session is one cached prefill: a caller's use_cache / logits_to_keep is refused by
    name, never silently overridden."""
    model, processor = tiny_models["qwen2_5_vl"]
    video_inputs, _ = build_session_inputs(processor, make_frames(4, seed=3), 2.0, ["Why?"])
    wrapped = wrap(model, KeepEvery(2), ratio=2.0)
    with pytest.raises(ValueError, match=next(iter(setting))):
        wrapped.encode_video(**video_inputs, **setting)

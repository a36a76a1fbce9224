"""The stage inside the language model (`craft_adapters.in_model`) against a hand-spliced
reference, through logits, on the tiny Qwen2.5-VL and LLaVA-OneVision.

The reference runs the unmodified language model twice: once on the whole sequence with
eager attention, returning every layer's attention weights and hidden states (the score:
the last token's row of layer L - 1, mean over heads; the rows entering layer L), and once
with only layers L.. on the kept rows at their original positions. Decode steps and a
later turn on the same cache are checked the same way, the new tokens appended.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from adapters_testkit import make_frames

import craft_adapters
from craft_adapters.in_model import InModelDrop, refuse_compress_once, top_fraction

BACKBONES = ["qwen2_5_vl", "llava_onevision"]
LAYER = 1
ATOL = 1e-5


def lm_inputs(model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """What the plain model hands its language model (inputs_embeds, position_ids, ...)."""
    seen: dict[str, Any] = {}
    lm = model.model.language_model
    handle = lm.register_forward_pre_hook(lambda _m, _a, k: seen.update(k), with_kwargs=True)
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        handle.remove()
    return seen


def eager_pass(model: Any, seen: dict[str, Any]) -> Any:
    """The whole sequence through the language model with eager attention."""
    lm = model.model.language_model
    saved = lm.config._attn_implementation
    lm.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            return lm(
                inputs_embeds=seen["inputs_embeds"],
                position_ids=seen.get("position_ids"),
                attention_mask=torch.ones(seen["inputs_embeds"].shape[:2], dtype=torch.long),
                output_attentions=True,
                output_hidden_states=True,
            )
    finally:
        lm.config._attn_implementation = saved


def upper_layers(model: Any, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Layers L.. of the language model on `hidden [1, K, D]` at `positions`; -> logits."""
    lm = model.model.language_model
    layers = lm.layers
    lm.layers = torch.nn.ModuleList(list(layers)[LAYER:])
    try:
        with torch.no_grad():
            out = lm(
                inputs_embeds=hidden,
                position_ids=positions,
                attention_mask=torch.ones(hidden.shape[:2], dtype=torch.long),
            ).last_hidden_state
            return model.get_output_embeddings()(out)[0]  # type: ignore[no-any-return]
    finally:
        lm.layers = layers


def reference(
    model: Any, inputs: dict[str, Any], video: torch.Tensor, fraction: float, extra: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits `[K + extra, V]` of the kept prompt positions then the `extra` appended
    tokens, the kept positions `[K]`). The kept rows: the top `ceil(n * fraction)` by the
    last PROMPT token's attention in layer L - 1 (ties: the smaller position)."""
    prompt_len = int(video.numel())
    seen = lm_inputs(model, inputs)
    prompt = eager_pass(model, lm_inputs(model, _prefix(inputs, prompt_len)))
    score = prompt.attentions[LAYER - 1][0, :, -1, :].mean(dim=0)
    rows = [i for i in range(prompt_len) if bool(video[i])]
    count = math.ceil(len(rows) * fraction)
    ranked = sorted(rows, key=lambda i: (-float(score[i]), i))[:count]
    keep = sorted([i for i in range(prompt_len) if not bool(video[i])] + ranked)
    full = eager_pass(model, seen)  # prompt + appended tokens: causal, so the prompt's equal
    index = torch.tensor(keep + list(range(prompt_len, prompt_len + extra)))
    pos = seen.get("position_ids")
    pos = torch.arange(seen["inputs_embeds"].shape[1])[None] if pos is None else pos
    hidden = full.hidden_states[LAYER][:, index]
    return upper_layers(model, hidden, pos[..., index]), torch.tensor(keep)


def _prefix(inputs: dict[str, Any], length: int) -> dict[str, Any]:
    """`inputs` cut to the first `length` tokens (the prompt of a longer sequence)."""
    return {
        k: v[:, :length] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v
        for k, v in inputs.items()
    }


def video_inputs(processor: Any, append: list[int] = ()) -> dict[str, Any]:
    inputs = dict(craft_adapters.build_inputs(processor, make_frames(4), 2.0, "What is it?"))
    if append:
        ids = torch.tensor([list(append)])
        for key in ("input_ids", "attention_mask", "mm_token_type_ids"):
            if key in inputs:
                tail = (
                    ids
                    if key == "input_ids"
                    else torch.full_like(ids, int(key != "mm_token_type_ids"))
                )
                inputs[key] = torch.cat([inputs[key], tail], dim=1)
    return inputs


def video_of(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """`[S]` bool: the video placeholders of the one prompt."""
    return craft_adapters.get_adapter(model).video_mask(inputs)[0]


@pytest.fixture(params=BACKBONES)
def case(request: pytest.FixtureRequest, tiny_models: dict[str, Any]) -> tuple[Any, Any]:
    return tiny_models[request.param]  # type: ignore[no-any-return]


@contextmanager
def attached(model: Any, fraction: float = 0.5) -> Iterator[InModelDrop]:
    """The hook on `model` while open (the references run on the bare model)."""
    hook = InModelDrop(model, top_fraction(fraction), layer=LAYER, name="fastv-test")
    try:
        yield hook
    finally:
        hook.remove()


def test_prefill_equals_spliced_reference(case: tuple[Any, Any]) -> None:
    model, processor = case
    inputs = video_inputs(processor)
    want, keep = reference(model, inputs, video_of(model, inputs), 0.5)
    with attached(model) as drop, torch.no_grad():
        got = model(**inputs).logits[0]
    assert drop.report is not None and torch.equal(drop.report.kept, keep)
    assert drop.report.rows_after == -(-drop.report.rows_before // 2)
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


@pytest.fixture(params=["sdpa", "eager"])
def attention(request: pytest.FixtureRequest, case: tuple[Any, Any]) -> Iterator[str]:
    """The language model's attention: eager builds a 4-D mask on every call (the hook
    must select its keys), sdpa may pass none."""
    config = case[0].model.language_model.config
    saved = config._attn_implementation
    config._attn_implementation = request.param
    yield request.param
    config._attn_implementation = saved


def test_decode_and_a_later_turn_on_one_cache(case: tuple[Any, Any], attention: str) -> None:
    """generate()'s step logits, then three more tokens on the returned cache."""
    model, processor = case
    inputs = video_inputs(processor)
    video = video_of(model, inputs)
    with attached(model), torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=3,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        new = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
        turn = [new[2], 7, 11]
        length = inputs["input_ids"].shape[1] + 5
        extended = video_inputs(processor, new[:2] + turn)
        positions, _ = craft_adapters.get_adapter(model).full_positions(extended)
        extra = {"mm_token_type_ids": torch.zeros(1, 3, dtype=torch.long)}
        later = model(
            input_ids=torch.tensor([turn]),
            attention_mask=torch.ones(1, length, dtype=torch.long),
            position_ids=positions[..., -3:],
            past_key_values=out.past_key_values,
            use_cache=True,
            **(extra if "mm_token_type_ids" in inputs else {}),
        ).logits[0]
    want, _ = reference(model, extended, video, 0.5, extra=5)
    steps = torch.stack([step[0] for step in out.logits])
    torch.testing.assert_close(steps, want[-6:-3], rtol=0, atol=ATOL)
    torch.testing.assert_close(later, want[-3:], rtol=0, atol=ATOL)


def test_unselected_positions_are_caught(
    case: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planted fault: rotary tables and position ids left unselected (the kept rows
    at the wrong positions) must not pass for the reference."""
    model, processor = case
    inputs = video_inputs(processor)
    want, _ = reference(model, inputs, video_of(model, inputs), 0.5)
    monkeypatch.setattr(
        "craft_adapters.in_model._take",
        lambda value, keep, full: (
            tuple(v[..., : keep.numel(), :] for v in value) if isinstance(value, tuple) else value
        ),
    )
    with attached(model), torch.no_grad():
        got = model(**inputs).logits[0]
    assert (got - want).abs().max() > 100 * ATOL


def test_batches_and_bad_layers_are_refused(case: tuple[Any, Any]) -> None:
    model, processor = case
    frames = make_frames(4)
    batch = craft_adapters.build_inputs(processor, [frames, frames], 2.0, ["A?", "B?"])
    with attached(model), pytest.raises(ValueError, match="batch of 1"):
        model(**batch)
    for layer in (0, 2, True, 1.0):
        with pytest.raises(ValueError, match="layer must be"):
            InModelDrop(model, top_fraction(0.5), layer=layer, name="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fraction"):
        top_fraction(0.0)


def test_compress_once_refuses_the_method_by_name(case: tuple[Any, Any]) -> None:
    """encode_video (a session) and compress_videos (files served later) refuse a
    query-dependent method, naming it; once removed, nothing is refused."""
    model, processor = case
    craft = craft_adapters.wrap(model, None)
    inputs = video_inputs(processor)
    hook = InModelDrop(craft, top_fraction(0.3), layer=LAYER, name="flashvid-llm")
    try:
        for entry in (craft.encode_video, craft.compress_videos):
            with pytest.raises(ValueError, match=r"'flashvid-llm'.*query-dependent"):
                entry(**inputs)
    finally:
        hook.remove()
    refuse_compress_once(craft, "encode_video")

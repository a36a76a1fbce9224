"""The stage inside the language model (`craft_adapters.in_model`) against a hand-spliced
reference, through logits, on the tiny model of every backbone craft-adapters supports.

The reference runs the unmodified language model twice: once on the whole sequence with
eager attention (the score: the last token's attention row in layer L - 1, mean over
heads, read from that layer's attention weights; the rows entering layer L, read by a
pre-hook there, so after Qwen3-VL's deepstack additions), and once with only layers L.. on
the kept rows at their original positions (Qwen3-VL: the later deepstack levels on the kept
visual rows). Decode steps and a later turn on the same cache are checked the same way,
the new tokens appended.

Cases: the stock tiny model of each backbone with L = 1, except Qwen3.5 (the stock
model's only softmax-attention layer is its last): a variant with layers (linear, full,
linear, full) and L = 2, so one layer of each kind runs after the drop; and
`qwen3_vl-deep`, a 3-layer Qwen3-VL with two deepstack levels, where level 1 is added
after layer 1, on the kept rows.
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
from craft_adapters.tiny import build_tiny_processor

BACKBONES = [
    "qwen2_5_vl",
    "llava_onevision",
    "qwen3_vl",
    "qwen3_vl-deep",
    "qwen3_5",
    "internvl",
    "glm4v",
]
ATOL = 1e-5


def variant(name: str) -> tuple[Any, Any, int]:
    """`(model, processor, L)` of a tiny model that differs from the stock one."""
    from transformers import AutoModelForImageTextToText

    from craft_adapters.registry import adapter_class

    model_type = name.split("-")[0]
    config = adapter_class(model_type).tiny_config()
    if name == "qwen3_5":
        config.text_config.layer_types = ["linear_attention", "full_attention"] * 2
        layer = 2
    else:  # qwen3_vl-deep
        config.text_config.num_hidden_layers = 3
        config.vision_config.deepstack_visual_indexes = [0, 1]
        layer = 1
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
    return model, build_tiny_processor(model_type), layer


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


def _deepstack(seen: dict[str, Any], index: torch.Tensor | None, layer: int) -> dict[str, Any]:
    """Qwen3-VL's deepstack inputs of `seen` (levels `layer..`; at `index` if given)."""
    if seen.get("deepstack_visual_embeds") is None:
        return {}
    visual, levels = seen["visual_pos_masks"], seen["deepstack_visual_embeds"][layer:]
    if index is not None:
        rows = (visual[0].long().cumsum(0) - 1)[index][visual[0, index]]
        visual, levels = visual[:, index], [level[rows] for level in levels]
    return {"visual_pos_masks": visual, "deepstack_visual_embeds": levels}


def eager_pass(model: Any, seen: dict[str, Any], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole sequence through the language model with eager attention: (the last
    token's attention in layer L - 1, mean over heads `[S]`; the rows entering layer L
    `[1, S, D]`)."""
    lm = model.model.language_model
    got: dict[str, torch.Tensor] = {}

    def weights(_m: Any, _a: Any, out: Any) -> None:
        got["score"] = out[1][0, :, -1, :].mean(dim=0)

    def entering(_m: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        got["hidden"] = args[0] if args else kwargs["hidden_states"]

    saved = lm.config._attn_implementation
    lm.config._attn_implementation = "eager"
    handles = [
        lm.layers[layer - 1].self_attn.register_forward_hook(weights),
        lm.layers[layer].register_forward_pre_hook(entering, with_kwargs=True),
    ]
    try:
        with torch.no_grad():
            lm(
                inputs_embeds=seen["inputs_embeds"],
                position_ids=seen.get("position_ids"),
                attention_mask=torch.ones(seen["inputs_embeds"].shape[:2], dtype=torch.long),
                use_cache=False,
                **_deepstack(seen, None, 0),
            )
    finally:
        lm.config._attn_implementation = saved
        for handle in handles:
            handle.remove()
    return got["score"], got["hidden"]


def upper_layers(
    model: Any, hidden: torch.Tensor, positions: torch.Tensor, layer: int, deep: dict[str, Any]
) -> torch.Tensor:
    """Layers L.. of the language model on `hidden [1, K, D]` at `positions`; -> logits."""
    lm = model.model.language_model
    layers, types = lm.layers, getattr(lm.config, "layer_types", None)
    lm.layers = torch.nn.ModuleList(list(layers)[layer:])
    if types is not None:
        lm.config.layer_types = types[layer:]  # Qwen3.5 picks each layer's mask by index
    try:
        with torch.no_grad():
            out = lm(
                inputs_embeds=hidden,
                position_ids=positions,
                attention_mask=torch.ones(hidden.shape[:2], dtype=torch.long),
                use_cache=False,
                **deep,
            ).last_hidden_state
            return model.get_output_embeddings()(out)[0]  # type: ignore[no-any-return]
    finally:
        lm.layers = layers
        if types is not None:
            lm.config.layer_types = types


def reference(
    case: tuple[Any, Any, int],
    inputs: dict[str, Any],
    video: torch.Tensor,
    fraction: float,
    extra: int = 0,
    merge: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits `[K + extra, V]` of the kept prompt positions then the `extra` appended
    tokens, the kept positions `[K]`). The kept rows: the top `ceil(n * fraction)` by the
    last PROMPT token's attention in layer L - 1 (ties: the smaller position); with
    `merge`, each of them rewritten as `merge_rule` does before layer L."""
    model, _, layer = case
    prompt_len = int(video.numel())
    seen = lm_inputs(model, inputs)
    score, _ = eager_pass(model, lm_inputs(model, _prefix(inputs, prompt_len)), layer)
    rows = [i for i in range(prompt_len) if bool(video[i])]
    count = math.ceil(len(rows) * fraction)
    ranked = sorted(rows, key=lambda i: (-float(score[i]), i))[:count]
    keep = sorted([i for i in range(prompt_len) if not bool(video[i])] + ranked)
    _, hidden = eager_pass(model, seen, layer)  # prompt + appended: causal, the prompt's equal
    if merge:
        hidden = hidden.clone()
        hidden[0, ranked] = 0.5 * hidden[0, ranked] + 0.5 * hidden[0, rows].mean(dim=0)
    index = torch.tensor(keep + list(range(prompt_len, prompt_len + extra)))
    pos = seen.get("position_ids")
    pos = torch.arange(seen["inputs_embeds"].shape[1])[None] if pos is None else pos
    deep = _deepstack(seen, index, layer)
    return upper_layers(model, hidden[:, index], pos[..., index], layer, deep), torch.tensor(keep)


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


@pytest.fixture(scope="module")
def variants() -> dict[str, tuple[Any, Any, int]]:
    class _Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, key: str) -> tuple[Any, Any, int]:
            self[key] = variant(key)
            return self[key]  # type: ignore[no-any-return]

    return _Lazy()


@pytest.fixture(params=BACKBONES)
def case(
    request: pytest.FixtureRequest, tiny_models: dict[str, Any], variants: dict[str, Any]
) -> tuple[Any, Any, int]:
    """`(model, processor, L)`."""
    if request.param in ("qwen3_5", "qwen3_vl-deep"):
        return variants[request.param]  # type: ignore[no-any-return]
    return (*tiny_models[request.param], 1)


@contextmanager
def attached(case: tuple[Any, Any, int], fraction: float = 0.5) -> Iterator[InModelDrop]:
    """The hook on the case's model while open (the references run on the bare model)."""
    hook = InModelDrop(case[0], top_fraction(fraction), layer=case[2], name="fastv-test")
    try:
        yield hook
    finally:
        hook.remove()


def test_prefill_equals_spliced_reference(case: tuple[Any, Any, int]) -> None:
    model, processor, _ = case
    inputs = video_inputs(processor)
    want, keep = reference(case, inputs, video_of(model, inputs), 0.5)
    with attached(case) as drop, torch.no_grad():
        got = model(**inputs).logits[0]
    assert drop.report is not None and torch.equal(drop.report.kept, keep)
    assert drop.report.rows_after == -(-drop.report.rows_before // 2)
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


def merge_rule(hidden: torch.Tensor, score: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A rule that rewrites the rows it keeps (as HoliTom's merge does): the top half by the
    score, each kept row averaged with the mean of every video row."""
    kept, _ = top_fraction(0.5)(hidden, score)
    return kept, 0.5 * hidden[kept] + 0.5 * hidden.mean(dim=0)


def test_rows_the_rule_rewrites_enter_layer_l(case: tuple[Any, Any, int]) -> None:
    """A rule's rows (not only its positions) are what layer L and later see."""
    model, processor, layer = case
    inputs = video_inputs(processor)
    want, keep = reference(case, inputs, video_of(model, inputs), 0.5, merge=True)
    hook = InModelDrop(model, merge_rule, layer=layer, name="merge-test")
    try:
        with torch.no_grad():
            got = model(**inputs).logits[0]
    finally:
        hook.remove()
    assert hook.report is not None and torch.equal(hook.report.kept, keep)
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


@pytest.fixture(params=["sdpa", "eager"])
def attention(request: pytest.FixtureRequest, case: tuple[Any, Any, int]) -> Iterator[str]:
    """The language model's attention: eager builds a 4-D mask on every call (the hook
    must select its keys), sdpa may pass none."""
    config = case[0].model.language_model.config
    saved = config._attn_implementation
    config._attn_implementation = request.param
    yield request.param
    config._attn_implementation = saved


def test_decode_and_a_later_turn_on_one_cache(case: tuple[Any, Any, int], attention: str) -> None:
    """generate()'s step logits, then three more tokens on the returned cache."""
    model, processor, _ = case
    inputs = video_inputs(processor)
    video = video_of(model, inputs)
    with attached(case), torch.no_grad():
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
    want, _ = reference(case, extended, video, 0.5, extra=5)
    steps = torch.stack([step[0] for step in out.logits])
    torch.testing.assert_close(steps, want[-6:-3], rtol=0, atol=ATOL)
    torch.testing.assert_close(later, want[-3:], rtol=0, atol=ATOL)


def test_unselected_positions_are_caught(
    case: tuple[Any, Any, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planted fault: rotary tables and position ids left unselected (the kept rows
    at the wrong positions) must not pass for the reference."""
    model, processor, _ = case
    inputs = video_inputs(processor)
    want, _ = reference(case, inputs, video_of(model, inputs), 0.5)
    monkeypatch.setattr(
        "craft_adapters.in_model._take",
        lambda value, keep, full: (
            tuple(v[..., : keep.numel(), :] for v in value) if isinstance(value, tuple) else value
        ),
    )
    with attached(case), torch.no_grad():
        got = model(**inputs).logits[0]
    assert (got - want).abs().max() > 100 * ATOL


def test_batches_and_bad_layers_are_refused(case: tuple[Any, Any, int]) -> None:
    model, processor, _ = case
    frames = make_frames(4)
    batch = craft_adapters.build_inputs(processor, [frames, frames], 2.0, ["A?", "B?"])
    with attached(case), pytest.raises(ValueError, match="batch of 1"):
        model(**batch)
    depth = len(model.model.language_model.layers)
    for layer in (0, depth, True, 1.0):
        with pytest.raises(ValueError, match="layer must be"):
            InModelDrop(model, top_fraction(0.5), layer=layer, name="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fraction"):
        top_fraction(0.0)


def test_linear_attention_layers_are_refused_by_name(
    case: tuple[Any, Any, int], tiny_models: dict[str, Any]
) -> None:
    """Qwen3.5: the score needs softmax attention in layer L - 1; a Gated-DeltaNet layer
    there is refused naming the model class and the layers that qualify (the stock tiny
    model, whose only attention layer is its last: none)."""
    model = case[0]
    if model.config.model_type != "qwen3_5":
        pytest.skip("only Qwen3.5 has linear-attention layers")
    with pytest.raises(ValueError, match=r"layer 0 of Qwen3_5ForConditionalGeneration .*\[2\]"):
        InModelDrop(model, top_fraction(0.5), layer=1, name="x")
    stock, _ = tiny_models["qwen3_5"]
    with pytest.raises(ValueError, match=r"layer 2 of .* no layer of it qualifies"):
        InModelDrop(stock, top_fraction(0.5), layer=3, name="x")


def test_compress_once_refuses_the_method_by_name(case: tuple[Any, Any, int]) -> None:
    """encode_video (a session) and compress_videos (files served later) refuse a
    query-dependent method, naming it; once removed, nothing is refused."""
    model, processor, layer = case
    craft = craft_adapters.wrap(model, None)
    inputs = video_inputs(processor)
    hook = InModelDrop(craft, top_fraction(0.3), layer=layer, name="flashvid-llm")
    try:
        for entry in (craft.encode_video, craft.compress_videos):
            with pytest.raises(ValueError, match=r"'flashvid-llm'.*query-dependent"):
                entry(**inputs)
    finally:
        hook.remove()
    refuse_compress_once(craft, "encode_video")


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_5"])
def test_a_bare_language_model_with_video_rows(
    name: str, tiny_models: dict[str, Any], variants: dict[str, Any]
) -> None:
    """`video_rows=` on the language model alone, fed the VLM's `inputs_embeds` (how
    craft-eval's efficiency bench times a prefill with the drop): the same kept positions
    and logits as the hook on the whole VLM; without `video_rows` it is refused by name."""
    case = variants[name] if name == "qwen3_5" else (*tiny_models[name], 1)
    model, processor, layer = case
    inputs = video_inputs(processor)
    video = video_of(model, inputs)
    seen = lm_inputs(model, inputs)
    with attached(case) as drop, torch.no_grad():
        want = model(**inputs).logits[0]
    lm = model.model.language_model
    with pytest.raises(ValueError, match=r"bare language model .*video_rows="):
        InModelDrop(lm, top_fraction(0.5), layer=layer, name="x")
    bare = InModelDrop(lm, top_fraction(0.5), layer=layer, name="x", video_rows=lambda _s: video)
    try:
        with torch.no_grad():
            out = lm(
                inputs_embeds=seen["inputs_embeds"],
                position_ids=seen.get("position_ids"),
                attention_mask=torch.ones(video.shape[0], dtype=torch.long)[None],
            ).last_hidden_state
    finally:
        bare.remove()
    assert bare.report is not None and drop.report is not None
    assert torch.equal(bare.report.kept, drop.report.kept)
    torch.testing.assert_close(model.get_output_embeddings()(out)[0], want, rtol=0, atol=ATOL)

"""The conformance suite every backbone runs (like transformers' model tester mixins).

A backbone's test file, `tests/test_<model_type>.py`, subclasses `BackboneConformance`,
sets `model_type` and declares its fixtures (the abstract methods below: which placeholder
positions hold the video rows and their `(t, h, w)`, the vision layer whose attention is
scored and how its per-patch attention becomes per-token); every generic check then runs on
it, with no list to edit (`test_adapters_registry.py` checks that each registered backbone
has such a file).

Every check compares against the UNMODIFIED transformers model: identity with
`torch.equal`, and a compressed run against a hand-spliced reference built here from what the
plain model's language model receives (its `inputs_embeds` and position ids): the kept rows
(group means of the rows merged into them, computed by a slow loop) at their ORIGINAL
positions, text untouched, decoding at `max position + 1`. Logits are compared (never greedy
tokens of a tiny random model, which hide wrong positions) within `ATOL`: the reference and
the wrapper sum the same floats in a different order (the group means, a shorter attention
mask), measured at most 3e-7 on these models.

`FAULTS` plant the bugs the suite must catch (coordinates, positions, the placeholder token
id) by wrapping the adapter's own methods, generically; `test_planted_fault_is_caught`
checks each check listed in `CATCHES` fails under each fault.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from adapters_testkit import LMRecorder, make_frames

from craft_adapters import (
    build_inputs,
    build_session_inputs,
    load_compressed_video,
    save_compressed_video,
    wrap,
)
from craft_adapters.registry import adapter_class
from craft_core import TokenBudget
from craft_core.result import CompressionResult

ATOL = 1e-5  # logits of order 0.1-1; measured differences are at most 3e-7
GEN = {"max_new_tokens": 2, "do_sample": False}
# LM inputs the reference rebuilds itself (or that only steer HF's own bookkeeping)
_OWN_KEYS = {
    "input_ids",
    "inputs_embeds",
    "position_ids",
    "attention_mask",
    "past_key_values",
    "use_cache",
    "logits_to_keep",
    "cache_position",
}


@dataclass
class Video:
    """One video of a one-prompt input as the backbone's test file derives it.

    Attributes:
        seq: `[n]` long, the sequence positions of the rows the compressor may touch, in the
            order of the video's feature rows.
        coords: `[n, 3]` long, their expected `(t, h, w)`.
    """

    seq: torch.Tensor
    coords: torch.Tensor


def keep_rule(coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(kept [k], assignment [n])` decided from the coordinates alone: keep the rows with
    `(rank of t) + h + 2 w = 0 mod 3`; every other row merges into the kept row before it (the
    first kept row for leading rows). Wrong coordinates give another kept set."""
    t_rank = torch.unique(coords[:, 0], return_inverse=True)[1]
    keep = (t_rank + coords[:, 1] + 2 * coords[:, 2]) % 3 == 0
    kept = keep.nonzero().squeeze(1)
    if kept.numel() == 0:
        kept = torch.zeros(1, dtype=torch.long, device=coords.device)
    idx = torch.arange(coords.shape[0], device=coords.device)
    assign = (torch.searchsorted(kept, idx, right=True) - 1).clamp_min(0)
    return kept, assign


class RuleCompressor:
    """A `TokenCompressor` applying `keep_rule` (ratio 1: keeps everything); the kept row is
    the mean of its group. Records the coords and importance it was handed."""

    def __init__(self, needs_attention: bool = False) -> None:
        self.needs_attention = needs_attention
        self.coords: list[torch.Tensor] = []
        self.importance: list[torch.Tensor | None] = []

    def __call__(
        self,
        features: torch.Tensor,
        coords: torch.Tensor,
        budget: TokenBudget,
        *,
        importance: torch.Tensor | None = None,
    ) -> CompressionResult:
        self.coords.append(coords.clone())
        self.importance.append(importance)
        n = features.shape[0]
        if budget.ratio == 1:
            kept = assign = torch.arange(n, device=features.device)
        else:
            kept, assign = keep_rule(coords)
        sums = torch.zeros_like(features[kept]).index_add(0, assign, features)
        counts = torch.bincount(assign, minlength=kept.numel()).to(features.dtype)
        out = sums / counts.unsqueeze(-1)
        return CompressionResult(out, coords[kept], kept, assign, rounds=1, info={})


class ManyRecorder:
    """A `TokenCompressor` with a batched entry: records each `compress_many` call (how many
    videos, their importance) and each single-video call, and runs `inner` on every video
    (its own `compress_many` where it has one)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.needs_attention = bool(inner.needs_attention)
        self.calls: list[int] = []
        self.importance: list[Any] = []
        self.single = 0

    def __call__(self, features: torch.Tensor, coords: torch.Tensor, budget: TokenBudget,
                 *, importance: torch.Tensor | None = None) -> CompressionResult:  # fmt: skip
        self.single += 1
        return self.inner(features, coords, budget, importance=importance)  # type: ignore[no-any-return]

    def compress_many(self, features: list[torch.Tensor], coords: list[torch.Tensor],
                      budget: TokenBudget, *, importance: Any = None) -> list[CompressionResult]:  # fmt: skip
        self.calls.append(len(features))
        self.importance.append(importance)
        own = getattr(self.inner, "compress_many", None)
        if callable(own):
            return own(features, coords, budget, importance=importance)  # type: ignore[no-any-return]
        imps = importance if importance is not None else [None] * len(features)
        return [self.inner(f, c, budget, importance=i) for f, c, i in zip(features, coords, imps)]


class OnePerVideo:
    """`inner` called once per video (no batched entry): the path before craft-core 1.1."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.needs_attention = bool(inner.needs_attention)
        self.calls = 0

    def __call__(self, features: torch.Tensor, coords: torch.Tensor, budget: TokenBudget,
                 *, importance: torch.Tensor | None = None) -> CompressionResult:  # fmt: skip
        self.calls += 1
        return self.inner(features, coords, budget, importance=importance)  # type: ignore[no-any-return]


# -- the reference: the unmodified model's language-model inputs, spliced by hand ---------------


def hf_lm_inputs(model: Any, inputs: Any) -> dict[str, Any]:
    """What the plain HF model hands its language model for `inputs` (one forward)."""
    seen: dict[str, Any] = {}
    lm = model.model.language_model
    handle = lm.register_forward_pre_hook(lambda _m, _a, k: seen.update(k), with_kwargs=True)
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        handle.remove()
    return seen


def _group_means(rows: torch.Tensor, assign: torch.Tensor) -> torch.Tensor:
    """Slow, obvious loop: the mean of the rows assigned to each group `[k, D]`."""
    k = int(assign.max()) + 1
    return torch.stack([rows[assign == j].mean(0) for j in range(k)])


def reference_logits(
    model: Any, lm_inputs: dict[str, Any], videos: list[Video], append: list[int] = ()
) -> torch.Tensor:
    """`[K (+ len(append)), V]` logits of the spliced one-prompt sequence: text kept, each
    video's `keep_rule` rows (group means) at their original positions, then `append` tokens
    at `max position + 1, + 2, ...` (where HF decoding continues)."""
    emb = lm_inputs["inputs_embeds"][0].clone()
    length = emb.shape[0]
    pos = lm_inputs.get("position_ids")
    pos = torch.arange(length).unsqueeze(0) if pos is None else pos  # HF's 1-D default
    pos = pos[..., 0, :] if pos.dim() == 3 else pos[0]  # [rows, L] or [L]
    keep = torch.ones(length, dtype=torch.bool)
    groups = []
    for video in videos:
        kept, assign = keep_rule(video.coords)
        emb[video.seq[kept]] = _group_means(emb[video.seq], assign)
        dropped = torch.ones(video.seq.numel(), dtype=torch.bool)
        dropped[kept] = False
        keep[video.seq[dropped]] = False
        groups.append(assign)
    extras = {}
    n_rows = sum(v.seq.numel() for v in videos)
    for key, value in lm_inputs.items():
        if key in _OWN_KEYS or value is None:
            continue
        if isinstance(value, torch.Tensor) and value.shape == (1, length):  # per token
            extras[key] = torch.cat([value[:, keep], value.new_zeros(1, len(append))], dim=1)
        elif isinstance(value, (list, tuple)) and all(v.shape[0] == n_rows for v in value):
            extras[key] = [_shrink_rows(v, groups) for v in value]  # per video row
        else:
            raise AssertionError(f"the reference does not know LM input {key!r}: declare it")
    embeds = emb[keep]
    positions = pos[..., keep]
    if append:
        ids = torch.tensor(list(append))
        embeds = torch.cat([embeds, model.get_input_embeddings()(ids)])
        nxt = int(pos.max()) + 1 + torch.arange(len(append))
        positions = torch.cat([positions, nxt.expand(*positions.shape[:-1], -1)], dim=-1)
    positions = positions.unsqueeze(-2) if positions.dim() == 2 else positions.unsqueeze(0)
    with torch.no_grad():
        hidden = model.model.language_model(
            inputs_embeds=embeds.unsqueeze(0),
            position_ids=positions,
            attention_mask=torch.ones(1, embeds.shape[0], dtype=torch.long),
            **extras,
        ).last_hidden_state
        return model.get_output_embeddings()(hidden)[0]  # type: ignore[no-any-return]


def _shrink_rows(rows: torch.Tensor, groups: list[torch.Tensor]) -> torch.Tensor:
    """`[n_all, D]` rows of every video (in order) -> each video's group means."""
    out, start = [], 0
    for assign in groups:
        n = assign.numel()
        out.append(_group_means(rows[start : start + n], assign))
        start += n
    return torch.cat(out)


@contextmanager
def output_logits(model: Any) -> Iterator[list[torch.Tensor]]:
    """Every logits tensor the LM head produces while open (generate's steps, `ask`'s)."""
    calls: list[torch.Tensor] = []
    head = model.get_output_embeddings()
    handle = head.register_forward_hook(lambda _m, _a, out: calls.append(out.detach()))
    try:
        yield calls
    finally:
        handle.remove()


def close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL, msg=lambda m: f"{what}: {m}")


# -- the suite --------------------------------------------------------------------------------


class BackboneConformance:
    """Subclass in `tests/test_<model_type>.py` (named `Test...`), set `model_type` and the
    fixtures; every `test_` method here then runs on that backbone."""

    model_type: ClassVar[str]
    frames: ClassVar[int] = 4
    batch_frames: ClassVar[tuple[int, int]] = (4, 2)
    """Frames of the two videos of the batch check (different lengths where supported)."""
    saves_compressed_videos: ClassVar[bool] = True
    """`compress_videos` + save / load works here (False: it must refuse by name)."""
    images_beside_video: ClassVar[bool] = True
    """An image and a video in one prompt (False where the backbone cannot take them)."""

    # -- fixtures each backbone declares -------------------------------------------------------

    def expected_videos(self, model: Any, inputs: Any, positions: torch.Tensor) -> list[Video]:
        """The videos of a one-prompt input: compressible rows' positions and `(t, h, w)`,
        derived without the adapter (`positions`: the plain model's LM position ids)."""
        raise NotImplementedError

    def attention_layer(self, model: Any) -> torch.nn.Module:
        """The vision-tower attention module whose received attention is scored."""
        raise NotImplementedError

    def attention_to_tokens(
        self, model: Any, inputs: Any, features: list[torch.Tensor], received: list[torch.Tensor]
    ) -> torch.Tensor:
        """`[total compressible rows]` from that layer's received attention per call (eager
        weights averaged over heads and queries, `[images, keys]`)."""
        raise NotImplementedError

    # -- plumbing ------------------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def case(cls, tiny_models: dict[str, Any]) -> tuple[Any, Any]:
        return tiny_models[cls.model_type]  # type: ignore[no-any-return]

    def inputs(self, processor: Any, frames: int | None = None, prompt: str = "What?") -> Any:
        return build_inputs(processor, make_frames(frames or self.frames), 2.0, prompt)

    def expected(self, model: Any, inputs: Any) -> tuple[dict[str, Any], list[Video]]:
        """The plain model's LM inputs for `inputs` and the backbone's declared videos."""
        lm_inputs = hf_lm_inputs(model, inputs)
        pos = lm_inputs.get("position_ids")
        if pos is None:  # 1-D RoPE: the LM's default positions
            pos = torch.arange(inputs["input_ids"].shape[1]).unsqueeze(0)
        return lm_inputs, self.expected_videos(model, inputs, pos)

    def reference(self, model: Any, inputs: Any, append: list[int] = ()) -> torch.Tensor:
        lm_inputs, videos = self.expected(model, inputs)
        return reference_logits(model, lm_inputs, videos, append)

    # -- the checks (plain methods: the planted-fault test calls them too) -------------------

    def check_identity(self, model: Any, processor: Any) -> None:
        """No compressor, and ratio 1 (through the compressed route): `torch.equal` logits."""
        inputs = self.inputs(processor)
        want = model(**inputs).logits
        for wrapped in (wrap(model, None), wrap(model, RuleCompressor(), ratio=1.0)):
            assert torch.equal(wrapped(**inputs).logits, want), type(wrapped.compressor)
        assert wrapped.last_compression is not None and wrapped.last_compression.ratio == 1.0

    def check_prefill(self, model: Any, processor: Any) -> None:
        """Compressed prefill logits == the hand-spliced reference; the compressor got the
        expected `(t, h, w)`; exactly the reference's positions survive."""
        inputs = self.inputs(processor)
        comp = RuleCompressor()
        wrapped = wrap(model, comp, ratio=2.0)
        got = wrapped(**inputs).logits[0]
        lm_inputs, videos = self.expected(model, inputs)
        want = reference_logits(model, lm_inputs, videos)
        assert got.shape == want.shape, (got.shape, want.shape)
        close(got, want, "compressed prefill vs spliced reference")
        assert len(comp.coords) == len(videos)
        for seen, video in zip(comp.coords, videos):
            assert torch.equal(seen, video.coords), "the compressor got other coordinates"

    def check_decode(self, model: Any, processor: Any) -> None:
        """Decoding continues at the ORIGINAL max position + 1: the second step's logits of a
        compressed `generate` equal the reference continued by the first new token."""
        inputs = self.inputs(processor, prompt="Describe the motion.")
        wrapped = wrap(model, RuleCompressor(), ratio=2.0)
        with output_logits(model) as calls:
            out = wrapped.generate(**inputs, **GEN)
        first = int(out[0, inputs["input_ids"].shape[1]])
        want = self.reference(model, inputs, append=[first])
        close(calls[0][0, -1], want[-2], "first step")
        close(calls[1][0, -1], want[-1], "second step (decode position)")

    def check_session(self, model: Any, processor: Any) -> None:
        """`encode_video` once, then each `ask` on a copy of the one KV cache: its first
        logits equal the reference of the full prompt (video + that question); the video is
        never encoded again."""
        frames = make_frames(self.frames, seed=3)
        questions = ["What is it?", "Who?"]
        video_inputs, q_ids = build_session_inputs(processor, frames, 2.0, questions)
        wrapped = wrap(model, RuleCompressor(), ratio=2.0)
        session = wrapped.encode_video(**video_inputs)

        def never(*_: Any) -> Any:
            raise AssertionError("a session encoded its video again")

        wrapped.adapter.encode_videos = never  # type: ignore[method-assign]
        for question, ids in zip(questions, q_ids):
            with output_logits(model) as calls:
                session.ask(ids, max_new_tokens=1, do_sample=False)
            full = build_inputs(processor, frames, 2.0, question)
            assert torch.equal(torch.cat([video_inputs["input_ids"], ids], 1), full["input_ids"])
            close(calls[0][0, -1], self.reference(model, full)[-1], f"ask({question!r})")

    def check_batch(self, model: Any, processor: Any) -> None:
        """Two prompts (videos of `batch_frames` frames, left-padded) in one call: each row's
        logits equal that prompt's own reference."""
        videos = [make_frames(n, seed=5 + i) for i, n in enumerate(self.batch_frames)]
        prompts = ["What?", "Why is that so?"]
        wrapped = wrap(model, RuleCompressor(), ratio=2.0)
        batch = build_inputs(processor, videos, 2.0, prompts)
        assert bool((batch["attention_mask"][:, 0] == 0).any())  # padding is exercised
        logits = wrapped(**batch).logits
        report = wrapped.last_compression
        assert report is not None and [v.batch_index for v in report.videos] == [0, 1]
        for b, (video, prompt) in enumerate(zip(videos, prompts)):
            want = self.reference(model, build_inputs(processor, video, 2.0, prompt))
            close(logits[b, -want.shape[0] :], want, f"batch row {b}")

    def check_one_call(self, model: Any, processor: Any) -> None:
        """The two videos of a batch reach the compressor in ONE `compress_many` call: with a
        real `CraftCompressor`, the logits, kept positions and rows equal (`torch.equal`)
        those of the same compressor called once per video (the path before craft-core
        1.1); a `needs_attention` double gets both videos' importance in that one call."""
        from craft_core import CraftCompressor, CraftConfig

        videos = [make_frames(n, seed=5 + i) for i, n in enumerate(self.batch_frames)]
        batch = build_inputs(processor, videos, 2.0, ["What?", "Why is that so?"])
        hidden = wrap(model, None).adapter.text_hidden_size
        torch.manual_seed(0)
        craft = CraftCompressor(CraftConfig(hidden_size=hidden, gate_hidden=32, round_embed_dim=16))
        batched, alone = ManyRecorder(craft), OnePerVideo(craft)
        got = wrap(model, batched, ratio=3.0)
        logits = got(**batch).logits
        assert batched.calls == [2] and batched.single == 0, (batched.calls, batched.single)
        want = wrap(model, alone, ratio=3.0)
        assert torch.equal(logits, want(**batch).logits)
        assert alone.calls == 2
        for b in range(2):
            assert torch.equal(got.compressed_index(b), want.compressed_index(b))
        report = got.last_compression
        assert report is not None and report.ratio > 1.5
        assert [v.tokens_after for v in report.videos] == [
            v.tokens_after
            for v in want.last_compression.videos  # type: ignore[union-attr]
        ]
        asks = ManyRecorder(RuleCompressor(needs_attention=True))
        wrap(model, asks, ratio=2.0)(**batch)
        assert asks.calls == [2] and asks.single == 0
        (importance,) = asks.importance
        assert importance is not None and len(importance) == 2
        assert all(isinstance(i, torch.Tensor) and i.dim() == 1 for i in importance)

    def check_attention(self, model: Any, processor: Any) -> None:
        """The `importance` a `needs_attention` compressor gets == the received attention of
        the declared layer computed from transformers' own EAGER attention weights."""
        inputs = self.inputs(processor)
        comp = RuleCompressor(needs_attention=True)
        wrap(model, comp, ratio=2.0)(**inputs)
        layer = self.attention_layer(model)
        module = sys.modules[type(layer).__module__]
        eager = module.eager_attention_forward
        received: list[torch.Tensor] = []

        def recording(mod: Any, *args: Any, **kwargs: Any) -> Any:
            out, weights = eager(mod, *args, **kwargs)
            if mod is layer:
                received.append(weights.double().mean(dim=(1, 2)))  # [images, keys]
            return out, weights

        config = layer.config
        before = config._attn_implementation
        module.eager_attention_forward = recording
        config._attn_implementation = "eager"
        try:
            with torch.no_grad():
                model(**inputs)
        finally:
            module.eager_attention_forward = eager
            config._attn_implementation = before
        assert received, "the declared attention layer never ran"
        features = wrap(model, None).adapter.encode_videos(dict(inputs))[1]
        want = self.attention_to_tokens(model, inputs, features, received).float()
        got = torch.cat([i for i in comp.importance if i is not None])
        assert len(comp.importance) == len(features) and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)

    def check_saved_videos(self, model: Any, processor: Any, tmp: Path) -> None:
        """`compress_videos` -> save -> load gives the reference's kept rows and group means
        (or, where the backbone does not support it, a ValueError naming it)."""
        inputs = self.inputs(processor)
        wrapped = wrap(model, RuleCompressor(), ratio=2.0)
        if not self.saves_compressed_videos:
            with pytest.raises(ValueError, match="compress_videos"):
                wrapped.compress_videos(**inputs)
            return
        lm_inputs, videos = self.expected(model, inputs)
        saved = wrapped.compress_videos(**inputs)
        assert len(saved) == len(videos)
        for i, (video, expected) in enumerate(zip(saved, videos)):
            loaded = load_compressed_video(save_compressed_video(tmp / f"{i}.safetensors", video))
            kept, assign = keep_rule(expected.coords)
            rows = lm_inputs["inputs_embeds"][0, expected.seq]
            assert torch.equal(loaded.kept_index, kept), "other rows were kept"
            assert torch.equal(loaded.features, video.features)
            assert torch.equal(loaded.coords, video.coords) and loaded.grid == video.grid
            flat = loaded.coords[:, 0] * loaded.grid[1] * loaded.grid[2]
            flat = flat + loaded.coords[:, 1] * loaded.grid[2] + loaded.coords[:, 2]
            assert torch.equal(flat, kept), "the saved coords are not the kept rows' cells"
            close(loaded.features, _group_means(rows, assign), "saved rows")
            assert loaded.metadata["model_type"] == self.model_type

    # -- pytest entry points -----------------------------------------------------------------

    @torch.no_grad()
    def test_identity(self, case: tuple[Any, Any]) -> None:
        self.check_identity(*case)

    @torch.no_grad()
    def test_prefill_equals_spliced_reference(self, case: tuple[Any, Any]) -> None:
        self.check_prefill(*case)

    @torch.no_grad()
    def test_decode_positions_through_logits(self, case: tuple[Any, Any]) -> None:
        self.check_decode(*case)

    @torch.no_grad()
    def test_session_on_one_cache(self, case: tuple[Any, Any]) -> None:
        self.check_session(*case)

    @torch.no_grad()
    def test_batch_of_two(self, case: tuple[Any, Any]) -> None:
        self.check_batch(*case)

    def test_batch_is_one_compress_many_call(self, case: tuple[Any, Any]) -> None:
        with torch.no_grad():
            self.check_one_call(*case)

    @pytest.mark.parametrize("fault", ["per_video", "swapped"])
    def test_one_call_fault_is_caught(
        self, fault: str, case: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`check_one_call` fails when the batch is split into one call a video, or when the
        results come back in another video's place."""
        import craft_adapters.splice as splice
        from craft_core import compress_many

        def per_video(comp: Any, feats: Any, coords: Any, budget: Any, **kw: Any) -> Any:
            imps = kw.get("importance") or [None] * len(feats)
            return [comp(f, c, budget, importance=i) for f, c, i in zip(feats, coords, imps)]

        def swapped(comp: Any, feats: Any, coords: Any, budget: Any, **kw: Any) -> Any:
            out = compress_many(comp, feats, coords, budget, **kw)
            batched = callable(getattr(comp, "compress_many", None))
            return out[::-1] if batched else out  # the batched path hands results back reversed

        monkeypatch.setattr(splice, "compress_many", per_video if fault == "per_video" else swapped)
        with pytest.raises((AssertionError, ValueError)), torch.no_grad():
            self.check_one_call(*case)

    def test_received_attention_equals_eager(self, case: tuple[Any, Any]) -> None:
        self.check_attention(*case)

    def test_compressed_videos_saved_and_loaded(
        self, case: tuple[Any, Any], tmp_path: Path
    ) -> None:
        self.check_saved_videos(*case, tmp_path)

    @pytest.mark.parametrize("fault", ["coords", "positions", "token_id"])
    def test_planted_fault_is_caught(
        self,
        fault: str,
        case: tuple[Any, Any],
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path,
    ) -> None:
        """Each check of `CATCHES` fails under each planted fault it lists."""
        FAULTS[fault](monkeypatch, adapter_class(self.model_type))
        for check, faults in CATCHES.items():
            if fault not in faults:
                continue
            args = (tmp_path,) if check == "check_saved_videos" else ()
            if check == "check_saved_videos" and not self.saves_compressed_videos:
                continue
            with pytest.raises((AssertionError, ValueError)), torch.no_grad():
                getattr(self, check)(*case, *args)

    @torch.no_grad()
    def test_mask_always_reaches_the_language_model(self, case: tuple[Any, Any]) -> None:
        """Gapped positions never reach the LM without a 2-D mask (the block-diagonal trap)."""
        model, processor = case
        inputs = self.inputs(processor)
        wrapped = wrap(model, RuleCompressor(), ratio=2.0)
        rec = LMRecorder(wrapped.adapter.language_model)
        with rec.record():
            wrapped(**inputs, use_cache=False)
            wrapped.generate(**inputs, use_cache=False, **GEN)  # HF drops an all-ones mask here
            wrapped.encode_video(**inputs).ask(torch.tensor([[65, 66]]), **GEN)
        assert len(rec.calls) >= 5
        for call in rec.calls:
            mask = call["attention_mask"]
            assert isinstance(mask, torch.Tensor) and mask.dim() == 2, call
            assert mask.shape[1] == call["past"] + call["length"]

    @torch.no_grad()
    def test_video_less_prompt_runs_uncompressed(self, case: tuple[Any, Any]) -> None:
        model, processor = case
        text = processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
            add_generation_prompt=True,
            tokenize=False,
        )
        inputs = processor(text=[text], return_tensors="pt")
        wrapped = wrap(model, RuleCompressor(), ratio=4.0)
        assert torch.equal(wrapped(**inputs).logits, model(**inputs).logits)
        assert wrapped.last_compression is None

    @torch.no_grad()
    def test_mismatched_placeholders_are_named(self, case: tuple[Any, Any]) -> None:
        model, processor = case
        inputs = dict(self.inputs(processor))
        wrapped = wrap(model, RuleCompressor(), ratio=2.0)
        video = (inputs["input_ids"][0] == wrapped.adapter.video_token_id).nonzero().squeeze(1)
        sel = torch.ones(inputs["input_ids"].shape[1], dtype=torch.bool)
        sel[int(video[0])] = False  # one placeholder too few
        for key, value in list(inputs.items()):
            if isinstance(value, torch.Tensor) and value.shape == (1, sel.numel()):
                inputs[key] = value[:, sel]
        with pytest.raises(ValueError, match="placeholders"):  # or InternVL's frame count
            wrapped(**inputs)

    def test_training_forward_slices_labels_and_backprops(self, case: tuple[Any, Any]) -> None:
        """With CRAFT's compressor: the loss is HF's loss on the compressed logits with the
        sliced labels, and gradients reach the compressor."""
        from craft_core import CraftCompressor, CraftConfig

        model, processor = case
        inputs = dict(self.inputs(processor))
        wrapped = wrap(model, None)
        labels = inputs["input_ids"].clone()
        labels[labels == wrapped.adapter.video_token_id] = -100
        labels[:, :3] = -100
        inputs["labels"] = labels
        torch.manual_seed(0)
        hidden = wrapped.adapter.text_hidden_size
        comp = CraftCompressor(CraftConfig(hidden_size=hidden, gate_hidden=32, round_embed_dim=16))
        wrapped = wrap(model, comp, ratio=2.0)
        out = wrapped(**inputs)
        kept = wrapped.compressed_index(0)
        vocab = model.config.get_text_config().vocab_size
        expected = model.loss_function(
            logits=out.logits, labels=labels[0, kept].unsqueeze(0), vocab_size=vocab
        )
        assert out.logits.shape[1] == kept.numel()
        assert torch.allclose(out.loss, expected)
        out.loss.backward()
        grads = [p.grad for p in comp.parameters() if p.requires_grad]
        assert any(g is not None and bool(g.abs().sum() > 0) for g in grads)
        model.zero_grad(set_to_none=True)

    @torch.no_grad()
    def test_craft_compressor_ratio_and_threshold(self, case: tuple[Any, Any]) -> None:
        from craft_core import CraftCompressor, CraftConfig

        model, processor = case
        inputs = self.inputs(processor)
        hidden = wrap(model, None).adapter.text_hidden_size
        comp = CraftCompressor(CraftConfig(hidden_size=hidden, gate_hidden=32, round_embed_dim=16))
        wrapped = wrap(model, comp, ratio=1.0)
        assert torch.equal(wrapped(**inputs).logits, model(**inputs).logits)
        wrapped.set_budget(ratio=3.0)
        wrapped(**inputs)
        report = wrapped.last_compression
        assert report is not None and report.videos[0].rounds >= 1 and report.ratio > 1.5
        wrapped.set_budget(threshold=0.0, min_tokens=2)
        wrapped(**inputs)
        assert wrapped.budget["threshold"] == 0.0 and wrapped.last_compression is not None

    @torch.no_grad()
    def test_images_beside_the_video_are_kept(self, case: tuple[Any, Any]) -> None:
        """An image in the same prompt is encoded uncompressed; only the video shrinks."""
        if not self.images_beside_video:
            pytest.skip(f"{self.model_type}: no image beside a video (see its test file)")
        from transformers.video_utils import VideoMetadata

        model, processor = case
        wrapped = wrap(model, RuleCompressor(), ratio=1.0)
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image"},
                    {"type": "video"},
                    {"type": "text", "text": "Same?"},
                ],
            }
        ]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        kwargs: dict[str, Any] = {"do_sample_frames": False}
        if wrapped.adapter.input_rules.video_metadata:
            meta = VideoMetadata(total_num_frames=4, fps=2.0, frames_indices=[0, 1, 2, 3])
            kwargs["video_metadata"] = [meta]
        inputs = processor(
            text=[text],
            images=[make_frames(1, seed=9)[0]],
            videos=[make_frames(4)],
            return_tensors="pt",
            **kwargs,
        )
        assert torch.equal(wrapped(**inputs).logits, model(**inputs).logits)
        wrapped.set_budget(ratio=2.0)
        wrapped(**inputs)
        kept = wrapped.compressed_index(0)
        image_id = model.config.image_token_id
        n_image = int((inputs["input_ids"] == image_id).sum())
        assert n_image > 0 and int((inputs["input_ids"][0, kept] == image_id).sum()) == n_image
        assert wrapped.last_compression.tokens_after < wrapped.last_compression.tokens_before

    def test_build_inputs_through_the_processor(self, case: tuple[Any, Any]) -> None:
        """`build_inputs` through the backbone's own processor: one placeholder per feature
        row, the chat template around the prompt, a system turn, named errors."""
        model, processor = case
        frames = make_frames(4)
        inputs = build_inputs(processor, frames, 2.0, "Describe.")
        ids = inputs["input_ids"]
        assert ids.shape[0] == 1 and inputs["attention_mask"].shape == ids.shape
        adapter = wrap(model, None).adapter
        with torch.no_grad():
            rows = sum(f.shape[0] for f in adapter.encode_videos(dict(inputs))[1])
        assert int((ids == adapter.video_token_id).sum()) == rows > 0
        text = processor.tokenizer.decode(ids[0])
        assert "Describe." in text and text.endswith("assistant\n")
        with_system = build_inputs(processor, frames, 2.0, "Describe.", system="Be brief.")
        assert "Be brief." in processor.tokenizer.decode(with_system["input_ids"][0])
        with pytest.raises(ValueError, match="uint8"):
            build_inputs(processor, frames.astype("float32"), 2.0, "x")
        with pytest.raises(ValueError, match="2 video"):
            build_inputs(processor, [frames, frames], 2.0, ["x"])

    def test_tiny_model_is_saved_and_reloaded(self, case: tuple[Any, Any]) -> None:
        """`build_tiny_vlm` gives the registered backbone's tiny config, reloaded in eval."""
        model, _ = case
        tiny = adapter_class(self.model_type).tiny_config()
        assert model.config.model_type == self.model_type and not model.training
        assert model.config.get_text_config().hidden_size == tiny.get_text_config().hidden_size


# -- planted faults ---------------------------------------------------------------------------


def _swap_hw(monkeypatch: pytest.MonkeyPatch, cls: type) -> None:
    """Coordinates with h and w exchanged."""
    layout = cls.video_layout

    def wrong(self: Any, *args: Any) -> Any:
        out = layout(self, *args)
        for item in out:
            item.coords = item.coords[:, [0, 2, 1]]
        return out

    monkeypatch.setattr(cls, "video_layout", wrong)


def _gap_positions(monkeypatch: pytest.MonkeyPatch, cls: type) -> None:
    """Every position from the first video token on moved 3 further (a gap RoPE sees)."""
    full = cls.full_positions

    def wrong(self: Any, inputs: dict[str, Any]) -> Any:
        pos, deltas = full(self, inputs)
        first = int((inputs["input_ids"][0] == self.video_token_id).nonzero()[0, 0])
        pos = pos.clone()
        pos[..., first:] += 3
        return pos, deltas

    monkeypatch.setattr(cls, "full_positions", wrong)


def _wrong_token(monkeypatch: pytest.MonkeyPatch, cls: type) -> None:
    """The placeholder id of another token (one past the real one)."""
    token = cls.video_token_id
    monkeypatch.setattr(cls, "video_token_id", property(lambda self: token.fget(self) + 1))


FAULTS: dict[str, Callable[[pytest.MonkeyPatch, type], None]] = {
    "coords": _swap_hw,
    "positions": _gap_positions,
    "token_id": _wrong_token,
}
ALL = ("coords", "positions", "token_id")
CATCHES: dict[str, tuple[str, ...]] = {
    "check_identity": ("positions", "token_id"),
    "check_prefill": ALL,
    "check_decode": ALL,
    "check_session": ALL,
    "check_batch": ALL,
    "check_attention": ("token_id",),
    "check_saved_videos": ("coords", "token_id"),  # positions do not enter a saved video
}

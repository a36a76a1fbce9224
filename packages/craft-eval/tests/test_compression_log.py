"""One compression log (`methods.build.row_logs`) for `craft-eval run` and the lmms-eval
plugin: per batch row, the tokens and time of its own videos, checked against what the
input ids and the compressor's calls say independently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from craft_core import TokenBudget
from craft_eval.lmms.compress import CompressedGenerate, row_fields
from craft_eval.methods.build import build_compressor, row_logs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from craft_adapters.tiny import build_tiny_vlm

    return build_tiny_vlm("qwen2_5_vl", tmp_path_factory.mktemp("tiny"))  # type: ignore[no-any-return]


def _batch(processor: Any) -> Any:
    """Two rows with videos of different sizes (4 frames each, left-padded batch)."""
    from craft_adapters import build_inputs

    rng = np.random.default_rng(0)
    videos = [rng.integers(0, 255, (4, h, w, 3), dtype=np.uint8) for h, w in ((56, 56), (56, 112))]
    return build_inputs(processor, videos, 2.0, ["What happens?", "Which colour?"])


def test_row_logs_of_a_batch_equal_the_ids_and_the_calls(tiny: Any) -> None:
    model, processor = tiny
    width = int(model.config.get_text_config().hidden_size)
    compressor = build_compressor("uniform", hidden_size=width)
    gen = CompressedGenerate(model, compressor, TokenBudget(ratio=4.0))
    inputs = _batch(processor)
    gen.generate(**inputs, max_new_tokens=2, do_sample=False)
    video_id = gen._video_token_id
    counts = (inputs["input_ids"] == video_id).sum(dim=1).tolist()
    assert counts[0] != counts[1]  # two shapes: a row mix-up cannot pass
    assert compressor is not None and len(compressor.calls) == 2
    for row, n, call in zip(gen.rows, counts, compressor.calls):
        assert (row.tokens_before, row.tokens_after) == (n, call.kept_index.numel())
        assert row.compression_ms == call.ms and row.kept_digests == [call.digest]
    fields = row_fields(gen.rows[1])
    assert fields["visual_tokens_before"] == counts[1]
    assert fields["realized_ratio"] == round(counts[1] / gen.rows[1].tokens_after, 4)
    # uncompressed: the counts of the ids, nothing timed
    plain = CompressedGenerate(model, None, None)
    plain.generate(**inputs, max_new_tokens=2, do_sample=False)
    assert [(r.tokens_before, r.tokens_after, r.compression_ms) for r in plain.rows] == [
        (n, n, 0.0) for n in counts
    ]


def test_backend_records_the_same_log_as_the_plugin(tiny: Any, tmp_path: Path) -> None:
    """`HFBackend.generate` (one row) logs what `row_logs` says for that row's call."""
    from craft_eval.backend import HFBackend
    from craft_eval.fixtures import write_fixture
    from craft_eval.tasks import get_benchmark

    model, processor = tiny
    data = write_fixture("mvbench", tmp_path / "mv", num_items=1, num_frames=4)
    bench = get_benchmark("mvbench")
    item = bench.load(data, subset="object_existence")[0]
    backend = HFBackend(model, processor, method="uniform", ratio=4.0)
    got = backend.generate(item, bench.prompt(item))
    (call,) = backend.compressor.calls
    (log,) = row_logs(backend.model.last_compression, backend.compressor, [0])
    assert got.tokens_after == call.kept_index.numel() == log.tokens_after
    assert got.tokens_before == log.tokens_before and got.compress_ms == call.ms
    assert got.extra["kept_digests"] == [call.digest] and got.extra["rounds"] == log.rounds


class _OneAVideo:
    """`method` without a batched entry: called once per video (the path before 1.1)."""

    def __init__(self, method: Any) -> None:
        self.method = method
        self.needs_attention = bool(method.needs_attention)

    def __call__(self, features: Any, coords: Any, budget: Any, *, importance: Any = None) -> Any:
        return self.method(features, coords, budget, importance=importance)


def test_a_batch_is_one_compress_many_call_equal_to_one_call_a_video(tiny: Any) -> None:
    """The plugin's two-row batch reaches CRAFT in ONE `compress_many` call: the replies'
    scores, each video's digest (tokens and rows) and the rows' logs equal those of the same
    method called once per video; the log keeps one record per video, the call's time shared."""
    import torch

    from craft_eval.methods.build import TimedCompressor

    model, processor = tiny
    width = int(model.config.get_text_config().hidden_size)
    timed = build_compressor("craft", hidden_size=width, allow_untrained=True)
    assert timed is not None
    module, seen = timed.method.module, []
    own = module.compress_many

    def spy(features: Any, coords: Any, budget: Any, **kwargs: Any) -> Any:
        seen.append(len(features))
        return own(features, coords, budget, **kwargs)

    module.compress_many = spy
    inputs = _batch(processor)
    gen_kwargs = {"max_new_tokens": 2, "do_sample": False, "output_scores": True}
    gen = CompressedGenerate(model, timed, TokenBudget(ratio=4.0))
    got = gen.generate(**inputs, **gen_kwargs, return_dict_in_generate=True)
    assert seen == [2] and len(timed.calls) == 2
    alone = TimedCompressor(_OneAVideo(timed.method))
    ref_gen = CompressedGenerate(model, alone, TokenBudget(ratio=4.0))
    want = ref_gen.generate(**inputs, **gen_kwargs, return_dict_in_generate=True)
    assert seen == [2] and len(alone.calls) == 2  # the reference: one call a video
    assert torch.equal(got.sequences, want.sequences)
    assert all(torch.equal(a, b) for a, b in zip(got.scores, want.scores, strict=True))
    assert [c.digest for c in timed.calls] == [c.digest for c in alone.calls]
    assert [(r.tokens_before, r.tokens_after, r.kept_digests, r.rounds) for r in gen.rows] == [
        (r.tokens_before, r.tokens_after, r.kept_digests, r.rounds) for r in ref_gen.rows
    ]
    assert gen.rows[0].tokens_after < gen.rows[0].tokens_before  # it compressed
    assert sum(r.compression_ms for r in gen.rows) == pytest.approx(timed.elapsed_ms)

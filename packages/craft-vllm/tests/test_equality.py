"""vLLM's greedy tokens == craft-adapters' `generate()` tokens, on the same tiny model, videos
and CRAFT checkpoint, at ratios 2, 4, 8, 16 and uncompressed.

The reference is the library (transformers + craft-adapters, with the positions vLLM uses:
`positions="original"`), not vLLM: positions, kept tokens and fused rows must all agree for
12 greedy tokens and the first step's log-probs (within `engine.GAP`) to agree. Steps where
the reference is within `engine.TIE` of a tie end the token comparison (vLLM's CPU kernels
round differently; a tie may break either way). Controls, judged on log-probs (far beyond
`engine.GAP`, so on every CPU): at ratio 4 a FRESH (unloaded) CRAFT module on the library
side, and uncompressed the library's default position rule (transformers 5.x's), are both
far from what vLLM serves. Batches: the three videos of one forward are compressed in ONE
call of craft-core's `compress_many`, each with the kept rows it gets when served alone (bit
for bit, the same engine).
"""

from __future__ import annotations

import engine
import pytest
import tiny
import torch
from conftest import small_config

from craft_core import CraftCompressor

RATIOS = [2, 4, 8, 16]
CONTROL = 4
TOKENS = [128, 80, 96]  # merged tokens of the three videos: 16 per frame pair


@pytest.fixture(scope="module")
def videos() -> list:
    return [tiny.video(16, seed=0), tiny.video(10, seed=1), tiny.video(12, seed=2)]


def test_uncompressed_equals_transformers(workdir, videos) -> None:
    served = engine.run(workdir / "model", {}, lambda llm: engine.vllm_generate(llm, videos))
    reference = engine.adapters_generate(workdir / "model", None, None, videos)
    engine.compare(served, reference)
    assert [s.length for s in served] == [engine.text_tokens() + n for n in TOKENS]
    # control: transformers 5.x's own rule (the text after the video starts at s + max(h, w))
    library = engine.adapters_generate(workdir / "model", None, None, videos, positions=None)
    engine.control_gaps(served, library)


def _batch_then_alone(llm, videos: list) -> tuple[list, list, list[int], list]:
    """The videos served in one batch, then each alone (a multimodal id of its own, so
    nothing comes from vLLM's caches) -> (served, the batch's compressed videos, videos per
    compression call, the videos compressed alone)."""
    engine.record_craft_calls(llm)
    served = engine.vllm_generate(llm, videos, uuids=[f"batch-{i}" for i in range(len(videos))])
    batch, sizes = engine.craft_calls(llm)
    alone = []
    for i, video in enumerate(videos):
        engine.vllm_generate(llm, [video], uuids=[f"alone-{i}"])
        calls, one = engine.craft_calls(llm)
        assert one == [1]
        alone.extend(calls)
    return served, batch, sizes, alone


@pytest.mark.parametrize("ratio", RATIOS)
def test_craft_equals_craft_adapters(workdir, videos, ratio) -> None:
    checkpoint = workdir / "craft"
    served, batch, sizes, alone = engine.run(
        workdir / "model",
        engine.overrides(checkpoint, ratio),
        lambda llm: _batch_then_alone(llm, videos),
    )
    # the three videos reached one forward: ONE compression call (craft-core's
    # compress_many), and each video's kept rows are those it gets served alone, bit for bit
    assert sizes == [len(videos)]
    for together, one in zip(batch, alone):
        assert torch.equal(together.kept, one.kept) and torch.equal(together.rows, one.rows)
    loaded = CraftCompressor.from_pretrained(checkpoint)
    reference = engine.adapters_generate(workdir / "model", loaded, ratio, videos)
    engine.compare(served, reference)
    # floor(N / ratio) placeholders per video, the text around them unchanged
    assert [s.length for s in served] == [engine.text_tokens() + n // ratio for n in TOKENS]
    if ratio == CONTROL:  # what an ignored checkpoint gives (once: each run costs a generate)
        fresh = CraftCompressor(small_config())
        control = engine.adapters_generate(workdir / "model", fresh, ratio, videos)
        engine.control_gaps(served, control)


@pytest.mark.parametrize(
    ("key", "name"), [("craft_compile", "compile"), ("craft_cuda_graphs", "cuda_graphs")]
)
def test_cuda_graph_loops_are_refused_on_a_cpu_server(workdir, key, name) -> None:
    """craft-core's padded loops are server options (`craft_compile`, `craft_cuda_graphs`),
    CUDA only: a CPU server refuses each by name before serving; both at once, or a value
    that is not a boolean, are refused by name when the settings are read."""
    from craft_vllm.options import CraftConfigError, load_compressor, read_options

    arch = "CraftQwen2_5_VLForConditionalGeneration"
    config = type("HfConfig", (), engine.overrides(workdir / "craft", CONTROL, **{key: True}))
    options = read_options(config, arch)
    assert options.run == {name: True}
    with pytest.raises(CraftConfigError, match=rf"{key}.*CUDA only"):
        load_compressor(options, 64, "cpu")
    both = engine.overrides(workdir / "craft", CONTROL, craft_compile=True, craft_cuda_graphs=True)
    with pytest.raises(
        CraftConfigError, match=r"craft_compile and craft_cuda_graphs: .*choose one"
    ):
        read_options(type("HfConfig", (), both), arch)
    with pytest.raises(CraftConfigError, match=rf"{key} must be true or false"):
        read_options(
            type("HfConfig", (), engine.overrides(workdir / "craft", CONTROL, **{key: 1})), arch
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="craft_compile is CUDA only")
def test_compiled_loop_serves_the_eager_tokens(workdir, videos) -> None:
    """craft-core's compiled loop (the server option `"craft_compile": true`) inside vLLM's
    worker: the same greedy tokens as craft-adapters' EAGER generate() with the same weights,
    and the worker's module really runs the compiled loop (its result says so)."""
    eager = CraftCompressor.from_pretrained(workdir / "craft")

    def work(llm):
        return engine.served_craft_path(llm), engine.vllm_generate(llm, videos)

    path, served = engine.run(
        workdir / "model",
        engine.overrides(workdir / "craft", CONTROL, craft_compile=True),
        work,
    )
    assert path == "compiled"
    reference = engine.adapters_generate(workdir / "model", eager, CONTROL, videos)
    engine.compare(served, reference)

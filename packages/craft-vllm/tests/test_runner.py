"""The runner side: a prefix-cache hit stays exact, and the CPU runner's EVS fix.

- A second question on the same video is served from vLLM's prefix cache (the encoder does
  not run again for the cached part) and still gives craft-adapters' tokens for that
  question: the positions of the text after a compressed video do not come from the encoder.
- vLLM 0.32's CPU runner never turns its pruning path on, so `--video-pruning-rate` (EVS)
  crashes there; the plugin's version-guarded fix makes EVS serve `[n, D]` rows again.
"""

from __future__ import annotations

import engine
import tiny
from craft_vllm import plugin

from craft_core import CraftCompressor


def test_prefix_cache_hit_equals_library(workdir) -> None:
    video = tiny.video(16, seed=0)
    first, second = "What happens?", "Describe the colors in detail."

    def work(llm):
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=engine.NEW_TOKENS, temperature=0.0)
        outs = []
        for question in (first, second):
            request = {
                "prompt": engine.prompt(question),
                "multi_modal_data": {"video": engine.video_item(video)},
            }
            out = llm.generate([request], params)[0]
            outs.append((list(out.outputs[0].token_ids), out.num_cached_tokens or 0))
        return outs

    ratio = 4
    (_, cold), (tokens, cached) = engine.run(
        workdir / "model", engine.overrides(workdir / "craft", ratio), work, block_size=32
    )
    before_video, _ = engine.video_span(128 // ratio, second)
    assert cold == 0 and cached > before_video  # cached blocks hold video rows
    engine.QUESTION, saved = second, engine.QUESTION
    try:
        loaded = CraftCompressor.from_pretrained(workdir / "craft")
        [reference] = engine.adapters_generate(workdir / "model", loaded, ratio, [video])
    finally:
        engine.QUESTION = saved
    assert engine.agree(tokens, reference.tokens, reference.margins)


def test_cpu_runner_fix_is_version_guarded() -> None:
    assert plugin.cpu_runner_needs_fix((0, 32))
    assert not plugin.cpu_runner_needs_fix((0, 33))
    assert not plugin.cpu_runner_needs_fix((0, 31))


def test_evs_serves_on_cpu_with_the_fix(workdir) -> None:
    """EVS at q = 0.75 keeps max(tokens per frame, int(N * 0.25)) rows and answers."""
    videos = [tiny.video(16, seed=0)]
    served = engine.run(
        workdir / "model",
        {},
        lambda llm: engine.vllm_generate(llm, videos),
        video_pruning_rate=0.75,
    )
    assert served[0][1] == engine.text_tokens() + 128 // 4
    assert len(served[0][0]) > 0


_WITHOUT_FIX = """
import sys
sys.path.insert(0, {tests!r})
import conftest, engine, tiny
from pathlib import Path
from craft_vllm import plugin
plugin.CPU_PRUNING_BUG = ((0, 0), (0, 0))  # no version gets the fix
try:
    engine.run(Path({model!r}), {{}}, lambda llm: engine.vllm_generate(llm, [tiny.video(16, 0)]),
               video_pruning_rate=0.75)
    print("SERVED")
except Exception as error:
    print("FAILED:", type(error).__name__, error)
"""


def test_evs_fails_on_cpu_without_the_fix(workdir) -> None:
    """The control: the same EVS request with the fix switched off (fresh process) fails."""
    import subprocess
    import sys
    from pathlib import Path

    code = _WITHOUT_FIX.format(tests=str(Path(__file__).parent), model=str(workdir / "model"))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
    )
    assert "FAILED:" in done.stdout and "SERVED" not in done.stdout, done.stdout[-2000:]
    # and fails with the bug the fix is for ([n, D + 4] rows written into [n, D]), not
    # with any error (a bad path or import would fail too)
    assert "Error during index put operation" in done.stdout, done.stdout[-2000:]

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


def _serve_evs(llm) -> str:
    """One EVS request -> "SERVED", or "FAILED: <error>" (kept as text: an exception would
    keep the engine alive past `engine.run`, which must drop it)."""
    try:
        engine.vllm_generate(llm, [tiny.video(16, seed=0)])
    except Exception as error:
        return f"FAILED: {type(error).__name__} {error}"
    return "SERVED"


def test_evs_fails_on_cpu_without_the_fix(workdir, monkeypatch) -> None:
    """The control: the same EVS request with the fix switched off fails. The runner patch is
    made again as `register()` makes it where no vLLM version gets the fix (the version guard
    emptied, `patch_runners` re-run on the unpatched runner), in this process: a fresh Python
    (the former way) cost a second vLLM import; the patch the other tests use is put back."""
    from vllm.plugins import load_general_plugins
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    load_general_plugins()  # register() patched the runner (once a process)
    monkeypatch.setattr(CPUModelRunner, "load_model", CPUModelRunner.load_model.__wrapped__)
    monkeypatch.setattr(plugin, "CPU_PRUNING_BUG", ((0, 0), (0, 0)))  # no version gets it
    plugin.patch_runners()
    assert not plugin.cpu_runner_needs_fix(plugin.vllm_version())
    done = engine.run(workdir / "model", {}, _serve_evs, video_pruning_rate=0.75)
    assert done.startswith("FAILED:"), done[-2000:]
    # and fails with the bug the fix is for ([n, D + 4] rows written into [n, D]), not
    # with any error (a bad path or import would fail too)
    assert "Error during index put operation" in done, done[-2000:]

"""The `vllm.general_plugins` entry point: registers the CRAFT architectures, patches the runner.

vLLM calls `register()` in every process it starts (API server, engine core, workers), so
everything here is idempotent. Three runner patches, the first two applied after `load_model`:

1. CRAFT models need vLLM's pruning path in the runner (`recompute_mrope_positions`), which
   the runner turns on only for `--video-pruning-rate`: `is_multimodal_pruning_enabled` is
   set for a model that says `craft_compression = True`.
2. vLLM 0.32's `CPUModelRunner.load_model` never sets `is_multimodal_pruning_enabled`
   (the GPU runner does), so EVS (`--video-pruning-rate`) crashes on the CPU with a broadcast
   error (`[n, D + 4]` into `[n, D]`). Guarded by version: applied for vLLM < 0.33 only,
   where the bug is known; a later vLLM runs its own code.
3. With pruning on, vLLM's `_execute_mm_encoder` hands the model ONE video a call (a
   stop-gap for EVS's memory: the scheduler's encoder budget counts pruned tokens). A CRAFT
   model gets the step's videos in one call instead (`_execute_mm_encoder` runs with the flag
   off; the flag is read there and in `_gather_mm_embeddings` only), as vLLM gives a model
   without pruning, so its model file compresses them in one batched call. The vision tower
   then runs on every video of the step at once: the encoder budget (`--max-num-batched-tokens`)
   is counted in KEPT tokens, so a step may hold up to `craft_ratio` times the video the
   budget suggests (lower the budget where the tower's memory is tight; not measured on a
   GPU).

`register()` also gives the 1-D RoPE variants (LLaVA-OneVision, InternVL) their M-RoPE layout (vLLM's per-architecture
config hook, `MODELS_CONFIG_MAP`), which must be in the config before the runner is built.

A config holding `craft_*` keys served by an architecture that is not a CRAFT one is refused
at load time: without the architecture override the keys would be silently ignored.
"""

from __future__ import annotations

import logging
from typing import Any

from craft_vllm import video_checks
from craft_vllm.options import KEYS, OPTIONAL_KEYS, REFUSED, CraftConfigError
from craft_vllm.payload import served_backbones

logger = logging.getLogger("craft_vllm")

ARCHITECTURES = {
    b.architecture: f"craft_vllm.{b.module}:{b.architecture}" for b in served_backbones()
}
"""Every CRAFT architecture -> its model class, one per model file (`payload.served_backbones`:
each file's `ARCHITECTURE` and `PAYLOAD`, read from the sources)."""
ONE_D = tuple(b.architecture for b in served_backbones() if b.payload.flat)
"""1-D RoPE served as M-RoPE row 0 (flat.py): the files whose PAYLOAD says `flat`."""
CPU_PRUNING_BUG = ((0, 32), (0, 33))  # [first, first fixed) (major, minor) of the CPU bug


def vllm_version() -> tuple[int, int]:
    import vllm

    major, minor = (int(p) for p in vllm.__version__.split(".")[:2])
    return major, minor


def cpu_runner_needs_fix(version: tuple[int, int]) -> bool:
    """True for the vLLM versions whose CPU runner forgets `is_multimodal_pruning_enabled`."""
    first, fixed = CPU_PRUNING_BUG
    return first <= version < fixed


def _check_not_ignored(runner: Any, model: Any) -> None:
    config = runner.model_config.hf_config
    given = [k for k in (*KEYS, *OPTIONAL_KEYS, *REFUSED) if getattr(config, k, None) is not None]
    if given and not getattr(model, "craft_compression", False):
        names = ", ".join(ARCHITECTURES)
        raise CraftConfigError(
            f"{', '.join(given)} given, but the served architecture "
            f"{type(model).__name__} does not run CRAFT (the keys would be ignored); add "
            f'"architectures": ["<one of: {names}>"] to --hf-overrides'
        )


def _pruning_wanted(runner: Any, model: Any, fix_cpu: bool) -> bool | None:
    """The value `is_multimodal_pruning_enabled` must have, or None to leave it."""
    if getattr(model, "craft_compression", False):
        return True
    if fix_cpu:
        from vllm.model_executor.models.interfaces import supports_multimodal_pruning

        mm = runner.model_config.multimodal_config
        return bool(
            supports_multimodal_pruning(model)
            and mm is not None
            and mm.is_multimodal_pruning_enabled()
        )
    return None


def _patch_load_model(cls: type, fix_cpu: bool) -> None:
    original = cls.__dict__["load_model"]
    if getattr(original, "_craft_patched", False):
        return

    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        model = self.get_model()
        _check_not_ignored(self, model)
        wanted = _pruning_wanted(self, model, fix_cpu)
        if wanted is not None:
            self.is_multimodal_pruning_enabled = wanted
        return result

    load_model._craft_patched = True  # type: ignore[attr-defined]
    load_model.__wrapped__ = original  # type: ignore[attr-defined]
    load_model.__doc__ = original.__doc__
    cls.load_model = load_model  # type: ignore[attr-defined]


def _patch_encoder_batches(cls: Any) -> None:
    """Patch 3 of the module docstring: a CRAFT model's videos of one step in one call."""
    original = cls.__dict__["_execute_mm_encoder"]
    if getattr(original, "_craft_patched", False):
        return

    def _execute_mm_encoder(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self.get_model(), "craft_compression", False):
            return original(self, *args, **kwargs)
        self.is_multimodal_pruning_enabled = False  # read there: one video a call
        try:
            return original(self, *args, **kwargs)
        finally:
            self.is_multimodal_pruning_enabled = True

    _execute_mm_encoder._craft_patched = True  # type: ignore[attr-defined]
    cls._execute_mm_encoder = _execute_mm_encoder


def patch_runners() -> None:
    """Apply the three runner patches of the module docstring (idempotent)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _patch_load_model(GPUModelRunner, fix_cpu=False)
    _patch_encoder_batches(GPUModelRunner)
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except ImportError:  # a build without the CPU runner
        return
    fix = cpu_runner_needs_fix(vllm_version())
    if fix:
        logger.info("craft-vllm: applying the CPU runner pruning fix (vLLM 0.32.x)")
    _patch_load_model(CPUModelRunner, fix_cpu=fix)


def register_config_update() -> None:
    """Have vLLM's model config give the 1-D RoPE variants the M-RoPE layout they need
    (`flat.update_model_config`), before the runner reads `uses_mrope`."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP, VerifyAndUpdateConfig

    class OneDimensionalAsMRoPE(VerifyAndUpdateConfig):
        @staticmethod
        def verify_and_update_model_config(model_config: Any) -> None:
            from craft_vllm.flat import update_model_config

            update_model_config(model_config)

    for name in ONE_D:
        MODELS_CONFIG_MAP.setdefault(name, OneDimensionalAsMRoPE)


def register() -> None:
    """Entry point: register every CRAFT architecture with vLLM and patch the runners."""
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for name, target in ARCHITECTURES.items():
        if name not in supported:
            ModelRegistry.register_model(name, target)
    register_config_update()
    video_checks.install()
    patch_runners()

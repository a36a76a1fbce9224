"""CraftCompressor: CRAFT's select-then-fuse loop on a video's tokens, as an nn.Module.

    from craft_core import CraftConfig, CraftCompressor
    compressor = CraftCompressor(CraftConfig(hidden_size=2560))
    out = compressor(features, coords, ratio=8.0)        # features [N, D], coords [N, 3] long
    out = compressor(features, coords, threshold=0.9)    # adaptive mode
    out = compressor(features, coords, TokenBudget(ratio=8))  # the budget object, same call
    CraftCompressor(config, precision="fast")            # float32 merge (runtime.RunOptions)

    outs = compressor.compress_many([f1, f2], [c1, c2], ratio=8.0)  # one batched loop

Each round pairs every active token with its most similar one (training-free, exact),
keeps the best edges within the budget, orients them by L2 norm, drops chains, and fuses
each target with its sources through `GatedMerge` (differentiable). See `docs/algorithm.md`
for every rule. Three runners: `algorithm.compress` (the plain reference), `batched.py`
(every eager call, one video or many) and, with `cuda_graphs=True` or `compile=True` on
CUDA and no autograd, `compiled.py` (one CUDA graph a round). How it runs is chosen when
building or loading (`runtime.RunOptions`), never saved.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import ModelCard, PyTorchModelHubMixin
from safetensors.torch import save_file
from torch import nn

from craft_core import hub
from craft_core.algorithm import room
from craft_core.batched import run_rounds, start_tables
from craft_core.budget import Budget, TokenBudget, check_tokens, check_videos
from craft_core.certify import similarity_bound
from craft_core.checks import (
    check_groups,
    check_int,
)
from craft_core.compiled import SPARE, RoundRunner, fallback_round, runner
from craft_core.config import CraftConfig
from craft_core.contract import budget_of
from craft_core.hub import check_state, read_checkpoint
from craft_core.merge import GatedMerge, group_edges, round_embedding
from craft_core.result import CompressionResult, loop_result
from craft_core.runtime import RunOptions
from craft_core.selection import (
    grid_projection,
    make_projection,
)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class CraftCompressor(
    nn.Module,
    PyTorchModelHubMixin,  # push_to_hub; the card and the files are ours (below)
    library_name=hub.LIBRARY_NAME,
    license="apache-2.0",
    tags=hub.TAGS,
    repo_url=hub.REPO_URL,
    docs_url=hub.DOCS_URL,
):
    """The CRAFT compressor: ~5M learnable parameters (at D = 2560) plus a fixed projection.

    Args:
        config: what defines the function (saved with checkpoints).
        **options: how it runs (`runtime.RunOptions`: precision, compile, cuda_graphs,
            allow_cpu, sim_block, threads), chosen here, by `from_pretrained` or by `configure`.

    Attributes:
        config: the `CraftConfig` it was built from.
        options: its `RunOptions` (not saved).
        merge: the learnable `GatedMerge`.
        projection: buffer W_rand `[D, d_sim]` (float32, saved with checkpoints, never trained).
        needs_attention: False: CRAFT ranks tokens by their features (`TokenCompressor`).
    """

    projection: torch.Tensor
    needs_attention = False

    def __init__(self, config: CraftConfig, **options: Any) -> None:
        super().__init__()
        if not isinstance(config, CraftConfig):
            raise TypeError(f"config must be a CraftConfig, got {type(config).__name__}")
        self.config = config
        self.options = RunOptions(**options)
        # The padded loop's runners (their CUDA graphs and tables), by (device, compiled).
        self._runners: dict[tuple[torch.device, bool], RoundRunner] = {}
        self.merge = GatedMerge(config)
        projection = make_projection(config.hidden_size, config.sim_dim, config.seed)
        self.register_buffer("projection", projection)

    def configure(self, **options: Any) -> CraftCompressor:
        """Change how it runs (`RunOptions` fields, e.g. `precision="fast"`), in place; the
        other options stay. Returns the compressor."""
        self.options = RunOptions(**{**self.options.model_dump(), **options})
        return self

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        # Casting the module (e.g. to bf16) must not round W_rand: selection stays float32.
        projection = self.projection
        super()._apply(fn, recurse)
        self.projection = projection.to(device=self.projection.device, dtype=torch.float32)
        return self

    def forward(
        self,
        features: torch.Tensor,
        coords: torch.Tensor,
        budget: TokenBudget | None = None,
        *,
        ratio: float | None = None,
        threshold: float | None = None,
        min_tokens: int | None = None,
        importance: torch.Tensor | None = None,
    ) -> CompressionResult:
        """Compress one video (the `craft_core.TokenCompressor` contract).

        Args:
            features: `[N, D]` video tokens after the vision projector (any float dtype).
            coords: `[N, 3]` integer (t, h, w) of each token.
            budget: a `TokenBudget`; or its fields as keywords (the user's spelling):
            ratio: fixed-ratio mode: stop at exactly `max(1, floor(N / ratio))` tokens.
            threshold: adaptive mode: stop when no pair is at least this similar.
            min_tokens: floor of the adaptive mode (default `max(1, N // 128)`).
            importance: accepted for a uniform call signature with baselines; unused.

        Returns:
            A `CompressionResult` (features in the input dtype, ascending `kept_index`).
        """
        del importance
        check_tokens(features, coords, self.config.hidden_size)
        budget = budget_of(budget, ratio=ratio, threshold=threshold, min_tokens=min_tokens)
        if self.projection.device != features.device:
            raise ValueError(
                f"features are on {features.device} but the compressor is on "
                f"{self.projection.device}; move one of them (compressor.to(device))"
            )
        return self._run([features], [coords], budget)[0]

    def _run(
        self, features: list[torch.Tensor], coords: list[torch.Tensor], budget: TokenBudget
    ) -> list[CompressionResult]:
        """Checked videos through the loop: the padded one per video (`compiled.py`) when
        built for it and no gradient flows, else the batched one on all of them."""
        budgets = [budget.resolve(int(f.shape[0])) for f in features]
        coords = [c.long() for c in coords]
        with self.options.cpu_threads(features[0].device):
            if self.options.padded() and not any(self._tracks_grad(f) for f in features):
                if features[0].device.type == "cpu" and not self.options.allow_cpu:
                    name = "compile" if self.options.compile else "cuda_graphs"
                    raise ValueError(
                        f"{name}=True runs on CUDA only (a CPU has no CUDA graphs, and there "
                        "the compiled loop is 3-4x slower than eager: craft-core README); "
                        "build or load without it (or with allow_cpu=True to run it anyway)"
                    )
                with torch.no_grad():
                    return [
                        self._compress_padded(f, c, b) for f, c, b in zip(features, coords, budgets)
                    ]
            return self._compress_eager(features, coords, budgets)

    def _compress_eager(
        self, features: list[torch.Tensor], coords: list[torch.Tensor], budgets: list[Budget]
    ) -> list[CompressionResult]:
        """The batched loop (`batched.py`) on videos checked by the caller: one result each."""
        started = time.perf_counter()
        tracks_grad = any(self._tracks_grad(f) for f in features)
        dtype, block = self.options.merge_dtype(), self.options.sim_block
        weight = grid_projection(self.projection)
        tables, active = start_tables(features, coords, weight, block)
        with self.merge.parameters_cast(dtype):
            run = (weight, block, dtype, tracks_grad)
            kept, rounds = run_rounds(self.merge, tables, active, budgets, run)
        results, start = [], 0
        info = {"pairing": "batched", "batch": len(features)}
        for video, (feats, coord, budget) in enumerate(zip(features, coords, budgets)):
            ids, stop = kept[video], start + feats.shape[0]
            final = (tables.rows[ids], ids - start, tables.owner[start:stop] - start)
            results.append(loop_result(feats, coord, final, rounds[video], budget, started, info))
            start = stop
        return results

    def _compress_padded(
        self, features: torch.Tensor, coords: torch.Tensor, budget: Budget
    ) -> CompressionResult:
        """The loop with one padded round a round (`compiled.py`: a CUDA graph on CUDA,
        compiled first with `compile=True`); no autograd."""
        started = time.perf_counter()
        config, options, device = self.config, self.options, features.device
        weight = grid_projection(self.projection)
        key = (device, options.compile)
        if key not in self._runners:
            self._runners[key] = runner(device, options.compile)
        rounds_runner = self._runners[key]
        state = rounds_runner.start(features, coords, weight, options.sim_block)
        block_and_delta = (options.sim_block, similarity_bound(config.sim_dim))
        rounds, fallbacks, replays = 0, 0, rounds_runner.replays
        while (edges_allowed := room(state.n, budget.floor)) > 0:
            phi = round_embedding(rounds + 1, config.round_embed_dim, device)
            scalars = (state.n, edges_allowed, budget.threshold, phi, options.merge_dtype())
            sizes = rounds_runner.run(self.merge, state, scalars, weight, block_and_delta)
            if sizes[3] > SPARE:  # the graph merged nothing: this round, eagerly
                fallbacks += 1
                if not fallback_round(self.merge, state, budget, (weight, rounds + 1, options)):
                    break
            elif sizes[0] == 0:
                break
            else:
                state.n -= sizes[0]
                state.shrink()
            rounds += 1
        kept = state.kept().clone()
        final = (state.rows[kept], kept, state.owner[: features.shape[0]])
        loop = "compiled" if options.compile else "graphed"
        info: dict[str, object] = {"pairing": loop, "fallbacks": fallbacks}
        if device.type == "cuda":
            info["graph_replays"] = rounds_runner.replays - replays  # rounds that were one launch
        return loop_result(features, coords, final, rounds, budget, started, info)

    def _tracks_grad(self, features: torch.Tensor) -> bool:
        """Whether a gradient must flow (to the features or the merge's weights)."""
        return torch.is_grad_enabled() and (
            features.requires_grad or any(p.requires_grad for p in self.merge.parameters())
        )

    def compress_many(
        self,
        features: Sequence[torch.Tensor],
        coords: Sequence[torch.Tensor],
        budget: TokenBudget | None = None,
        *,
        ratio: float | None = None,
        threshold: float | None = None,
        min_tokens: int | None = None,
        importance: Sequence[torch.Tensor | None] | None = None,
    ) -> list[CompressionResult]:
        """Compress several videos (of any lengths) with one budget in ONE batched loop: all
        videos advance through each round together (`batched.py`), so 16 videos cost the
        ops and host syncs of one. Each result is the same tokens and rows as `forward` on
        that video alone (`exact` precision), whatever else is in the batch.

        Args:
            features: B tensors `[N_b, D]` on one device (any float dtypes).
            coords: B tensors `[N_b, 3]` integer (t, h, w).
            budget: a `TokenBudget`, or its fields as keywords (as `forward`); each video
                resolves it for its own `N_b`.
            importance: accepted for the contract's uniform call (`compress_many`); unused.

        Raises:
            ValueError / TypeError: as `forward`, naming the video (`features[b]`), and
                lists of different lengths or videos on different devices.
        """
        del importance
        budget = budget_of(budget, ratio=ratio, threshold=threshold, min_tokens=min_tokens)
        features, coords = list(features), list(coords)
        check_videos(features, coords, self.config.hidden_size, self.projection.device)
        if not features:
            return []
        return self._run(features, coords, budget)

    def fuse_groups(
        self,
        features: torch.Tensor,
        coords: torch.Tensor,
        targets: torch.Tensor,
        sources: torch.Tensor,
        similarity: torch.Tensor,
        round_index: int = 1,
    ) -> torch.Tensor:
        """One GatedMerge step on groups chosen elsewhere (e.g. by another method's selection).

        Args:
            features: `[N, D]` tokens.
            coords: `[N, 3]` integer (t, h, w).
            targets: `[E]` target index of each edge.
            sources: `[E]` source index of each edge; each source once, never also a target.
            similarity: `[E]` similarity of each (target, source) pair.
            round_index: the round m fed to the gate (int >= 1).

        Returns:
            `[N, D]`: every target row replaced by its fusion, all other rows unchanged.

        Raises:
            TypeError / ValueError: as `checks.check_groups` and `check_tokens` say.
        """
        check_tokens(features, coords, self.config.hidden_size)
        n = features.shape[0]
        targets, sources = check_groups(n, targets, sources, similarity, round_index)
        if targets.numel() == 0:
            return features
        layout = group_edges(targets)
        sources = sources[layout.order]
        coords = coords.long()
        new_rows = self.merge(
            features[layout.targets],
            features[sources],
            layout,
            coords[layout.targets],
            coords[sources],
            similarity[layout.order].float(),
            round_index,
            self.options.merge_dtype(),
        )
        return features.index_put((layout.targets,), new_rows)

    def save_pretrained(  # type: ignore[override]
        self,
        save_directory: str | Path,
        *,
        model_card_kwargs: dict[str, Any] | None = None,
        push_to_hub: bool = False,
        repo_id: str | None = None,
        **push_to_hub_kwargs: Any,
    ) -> str | None:
        """Write `config.json`, `model.safetensors` (weights + W_rand) and `README.md` (the
        model card: `craft_core.hub.model_card(config, **model_card_kwargs)`, e.g.
        `{"base_model": ..., "ratios": [...], "recipe": {...}, "results": table}`) into the
        folder. A README this library wrote is refreshed; any other README is kept.
        `push_to_hub=True, repo_id=...` then uploads it (huggingface_hub's `push_to_hub`)."""
        if hub.is_craft_card(Path(save_directory) / hub.CARD_NAME):
            (Path(save_directory) / hub.CARD_NAME).unlink()
        return super().save_pretrained(
            save_directory,
            model_card_kwargs=model_card_kwargs,
            push_to_hub=push_to_hub,
            repo_id=repo_id,
            **push_to_hub_kwargs,
        )

    def _save_pretrained(self, save_directory: Path) -> None:
        # The 0.1 format, byte for byte: the mixin calls this, then writes the card.
        (save_directory / CONFIG_NAME).write_text(self.config.model_dump_json(indent=2) + "\n")
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(save_directory / WEIGHTS_NAME), metadata={"format": "pt"})

    def generate_model_card(self, *args: Any, **kwargs: Any) -> ModelCard:
        return hub.model_card(self.config, **kwargs)

    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls,
        path: str | Path,
        *,
        revision: str | None = None,
        hidden_size: int | None = None,
        device: str | torch.device = "cpu",
        token: str | bool | None = None,
        cache_dir: str | Path | None = None,
        force_download: bool = False,
        local_files_only: bool = False,
        **options: Any,
    ) -> CraftCompressor:
        """Load a folder written by `save_pretrained`, or a Hub id ("org/name").

        Args:
            path: the folder, or a Hub id (a folder of that name wins). Files of an id come
                from huggingface_hub's cache (downloaded into it when online);
                `HF_HUB_OFFLINE=1` keeps it to the cache.
            revision: branch, tag or commit of a Hub id.
            hidden_size: if given, the width the caller needs; a checkpoint of another width
                raises ValueError instead of failing later inside a model.
            device: where to put the weights.
            token, cache_dir, force_download, local_files_only: as in `hf_hub_download`.
            **options: how it runs (`runtime.RunOptions`, e.g. `precision="fast"`,
                `compile=True`). A checkpoint written before 1.0 may hold some of them in
                its `config.json`: they are ignored, with a `LegacyConfigWarning`.
        """
        options = RunOptions(**options).model_dump()  # a bad option fails before any file
        if hidden_size is not None:
            check_int("hidden_size", hidden_size, minimum=1)
        (config_file, weights_file), folder = hub.resolve_files(
            path,
            (CONFIG_NAME, WEIGHTS_NAME),
            revision=revision,
            token=token,
            cache_dir=cache_dir,
            force_download=force_download,
            local_files_only=local_files_only,
        )
        config, state = read_checkpoint(config_file, weights_file)
        if hidden_size is not None and config.hidden_size != hidden_size:
            raise ValueError(
                f"checkpoint {folder} has hidden_size {config.hidden_size}, but hidden_size "
                f"{hidden_size} was asked for"
            )
        module = cls(config, **options)
        check_state(module.state_dict(), state, folder, weights_file)
        module.load_state_dict(state)
        return module.to(device)

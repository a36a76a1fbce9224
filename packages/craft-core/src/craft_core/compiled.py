"""The padded compression loop (`cuda_graphs=True` or `compile=True`, on CUDA): one graph a
round.

    compressor = CraftCompressor(CraftConfig(hidden_size=2560), cuda_graphs=True).cuda()
    with torch.no_grad():
        out = compressor(features, coords, ratio=8.0)   # the same tokens as eager

A round (pairing, selection, the gated merge, retiring the sources, the embedding update) is
`padded_round`: fixed shapes and no host sync inside, so it can be captured whole. With
`cuda_graphs=True` its own ATen kernels are captured as a CUDA graph (`GraphedRounds`, no
Inductor: a capture costs milliseconds); with `compile=True` it is first traced by
`torch.compile(fullgraph=True, dynamic=False)` and fused by Inductor. Its shapes
are static: the tables hold `bucket(N) + 1` rows (the last one a dummy that masked writes
land on) and the active set is padded to `bucket(n)` slots, a power of two, with a mask;
sizes that depend on the data (n, the round's budget, the threshold, the round embedding)
enter as tensors. So a video of N tokens compiles at most about log2(N) graphs (one per
bucket it passes through; rounds in one bucket share it), and a second video of a length
in the same bucket compiles nothing. The round's one host sync reads its sizes (edges,
targets, lone targets, rows in doubt): the stop test and the next bucket.

Exactness on a CPU is the eager loop's, rows included: certified partners (a float32 pass
with an error bound and exact rechecks, `certify.buffered_partners`), the same selection with
masks, the merge in float64 rounded once (`GatedMerge.fuse_all`). If more rows are in doubt
than the recheck buffer holds (`spare`), the graph merges nothing and the round is redone
eagerly (`fallback_round`).
On CUDA the tokens are the same but not every row bit: Triton's float64 (the gate, the
softmax) differs from ATen's by up to ~1e-13 relative, so a once-rounded float32 value now
and then lands one ulp away (measured on an H100: docs/measurements.md, "On a GPU").

Training stays eager: with autograd on, `CraftCompressor` runs the eager loop. The runner and
its graphs belong to the compressor (`CraftCompressor._runners`), and Dynamo's graph limit is
raised only while a compiled round runs. On a CPU (tests only: no CUDA graphs there, and
compiled it is slower than eager) `PaddedRounds` runs the round as it is, or compiled with
`compiling.inductor_options()` (its cache keyed by the instruction path). On CUDA,
`GraphedRounds` records each round as a CUDA graph and replays it: one launch a round.
(`mode="reduce-overhead"` would not: it skips CUDA graphs for a function that writes its
inputs, and the round updates its tables in place.)
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from craft_core.algorithm import retire
from craft_core.budget import Budget
from craft_core.certify import buffered_partners, certified_partners
from craft_core.compiling import inductor_options
from craft_core.merge import EXACT, GatedMerge, round_embedding
from craft_core.runtime import RunOptions
from craft_core.selection import lay_out, rank_edges, row_keys

MIN_BUCKET = 64
"""Fewest slots of a padded active set: below it, rounds cost their ops, not their size."""
SPARE = 64
"""Rows in doubt that a round rechecks exactly inside its graph (`buffered_partners`)."""
RECOMPILE_LIMIT = 64
"""Dynamo's per-function graph limit while the loop runs, set for the loop only (its
default, 8, is fewer than the buckets of one long video; past it Dynamo would run the round
eagerly)."""


def bucket(n: int) -> int:
    """Slots of a padded set of `n` rows: the next power of two, at least `MIN_BUCKET`."""
    return max(MIN_BUCKET, 1 << max(n - 1, 0).bit_length())


def _store_rows(
    tables: tuple[torch.Tensor, ...],
    row_ids: torch.Tensor,
    new_rows: torch.Tensor,
    weight: torch.Tensor,
    block: int,
) -> None:
    """Write `new_rows` `[E, D]` and their exact keys into the padded tables at `row_ids`."""
    rows, _, embed, norms, _ = tables
    new_embed, new_norms = row_keys(new_rows, weight, block)
    rows.index_put_((row_ids,), new_rows)
    embed.index_put_((row_ids,), new_embed)
    norms.index_put_((row_ids,), new_norms)


def padded_round(
    merge: GatedMerge,
    tables: tuple[torch.Tensor, ...],
    active: torch.Tensor,
    scalars: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor],
    weight: torch.Tensor,
    block: int,
    delta: float,
    dtype: torch.dtype = EXACT,
) -> torch.Tensor:
    """One round on padded, fixed-shape state, updated in place; nothing read back.

    Args:
        merge: the `GatedMerge`.
        tables: `(rows [S, D] float32, coords [S, 3] long, embed [S, d] float64, norms [S]
            float64, owner [S] long)` with `S = bucket(N) + 1`: row `S - 1` is the dummy.
        active: `[B]` long, the active ids ascending in its first n slots, then `S - 1`.
        scalars: `(n, room, threshold, phi)`: 0-d long active count and budget
            (`min(n - floor, n // 2)`), 0-d float64 threshold (None: fixed-ratio mode),
            `[d_phi]` float64 round embedding.
        weight: `[D, d]` `grid_projection(W_rand)`.
        block, delta: `sim_block` and `similarity_bound(d)`.
        dtype: the merge's arithmetic (`RunOptions.merge_dtype`).

    Returns:
        `[4]` long: kept edges, targets, lone targets, rows in doubt. With more than `SPARE`
        rows in doubt no edge is kept and nothing changes.
    """
    rows, coords, embed, norms, owner = tables
    n, room, threshold, phi = scalars
    dummy = rows.shape[0] - 1
    slots = torch.arange(active.shape[0], device=active.device)
    valid = slots < n
    sim, pos, in_doubt = buffered_partners(embed[active], block, delta, SPARE, valid=valid)
    sim = sim.masked_fill(~valid, float("-inf"))  # padding is nobody's candidate
    room = torch.where(in_doubt <= SPARE, room, 0)  # not exact: merge nothing, redo eagerly
    edges = rank_edges(active, active[pos], sim, norms, 0, threshold, room=room)
    assert edges is not None  # B >= MIN_BUCKET: there are B // 2 edge slots
    num_edges, num_targets = edges.sizes[0], edges.sizes[1]
    edge_slots = slots[: edges.targets.shape[0]]
    row_ok = edge_slots < num_targets
    row_ids = torch.where(row_ok, edges.row_target, dummy)
    sources = torch.where(edge_slots < num_edges, edges.sources, dummy)
    targets = torch.where(edge_slots < num_edges, edges.targets, dummy)
    similarity = torch.where(edge_slots < num_edges, edges.similarity, 0.0).float()
    new_rows = merge.fuse_all(
        (rows[row_ids], rows[sources]),
        edges.group,
        (coords[row_ids], coords[sources]),
        similarity,
        phi,
        dtype,
    )
    new_rows = new_rows.masked_fill(~row_ok.unsqueeze(1), 0.0)  # the dummy row stays zero
    _store_rows(tables, row_ids, new_rows, weight, block)
    # The leaving ids become padding (the dummy); unused edge slots hold it on both sides.
    new_owner, new_active = retire(owner, active, sources, targets, dummy)
    owner.copy_(new_owner)
    active.copy_(new_active)
    return torch.cat([edges.sizes, in_doubt.view(1)])


Scalars = tuple[int, int, "float | None", torch.Tensor, torch.dtype]
"""A round's `(n, room, threshold, phi, dtype)`: host ints, the threshold (None: fixed
ratio), the `[d_phi]` float64 round embedding (`padded_round`'s scalars before they are
tensors) and the merge's arithmetic."""


class RoundRunner(Protocol):
    """What the padded loop (`CraftCompressor._compress_padded`) asks of a round runner."""

    replays: int
    """Rounds replayed from a CUDA graph so far."""

    def start(
        self, features: torch.Tensor, coords: torch.Tensor, weight: torch.Tensor, block: int
    ) -> PaddedState:
        """A video's padded state (`features [N, D]`, `coords [N, 3]`)."""
        ...

    def run(
        self,
        merge: GatedMerge,
        state: PaddedState,
        scalars: Scalars,
        weight: torch.Tensor,
        block_and_delta: tuple[int, float],
    ) -> list[int]:
        """One `padded_round` on `state`, in place; its sizes read back (the one sync)."""
        ...


class PaddedRounds:
    """Runs the padded round on the tables of each video, compiled or as it is (CPU tests,
    or CUDA without graphs).

    Its `torch.compile` wrapper is its own (Dynamo still shares graphs between wrappers of
    `padded_round` with the same options, so a second compressor compiles nothing new)."""

    def __init__(self, device: torch.device, compile: bool) -> None:
        self.compiled = compile
        self.round = padded_round
        if compile:
            inductor = inductor_options() if device.type == "cpu" else {}
            self.round = torch.compile(
                padded_round, fullgraph=True, dynamic=False, options=inductor or None
            )
        self.replays = 0  # rounds replayed from a CUDA graph (none here)

    def start(
        self, features: torch.Tensor, coords: torch.Tensor, weight: torch.Tensor, block: int
    ) -> PaddedState:
        """A video's padded state (`features [N, D]`, `coords [N, 3]`)."""
        return PaddedState(features, coords, weight, block)

    def run(
        self,
        merge: GatedMerge,
        state: PaddedState,
        scalars: Scalars,
        weight: torch.Tensor,
        block_and_delta: tuple[int, float],
    ) -> list[int]:
        """One round on `state`, in place; its sizes (`padded_round`'s return) read back:
        the round's one host sync."""
        active, values, weight = self._round_inputs(state, scalars[:4], weight)
        args = (merge, state.tables(), active, values, weight, *block_and_delta, scalars[4])
        if not self.compiled:
            return self._launch(args)
        # Dynamo's graph limit raised for this round only (a video passes ~log2(N) buckets).
        limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        with torch._dynamo.config.patch(recompile_limit=limit):
            return self._launch(args)

    def _round_inputs(
        self, state: PaddedState, scalars: tuple, weight: torch.Tensor
    ) -> tuple[torch.Tensor, tuple, torch.Tensor]:
        """`padded_round`'s `(active, scalars as tensors, weight)` for this round, from
        `(n, room, threshold, phi)`."""
        device = state.rows.device
        n, room, threshold, phi = scalars
        values = (
            torch.tensor(n, device=device),
            torch.tensor(room, device=device),
            None
            if threshold is None
            else torch.tensor(threshold, dtype=torch.float64, device=device),
            phi,
        )
        return state.active, values, weight

    def _launch(self, args: tuple) -> list[int]:
        """`padded_round(*args)` run; its sizes read back."""
        return self.round(*args).tolist()


class GraphedRounds(PaddedRounds):
    """The padded round (compiled or not) replayed as CUDA graphs: one launch a round
    instead of its kernels.

    A graph replays fixed addresses, so what a round reads lives here and stays put: one set
    of tables per table size (reused by every video of that bucket), one active buffer per
    (table size, active bucket), and the scalars and projection as tensors that each round
    copies into. The first round at a (table size, active bucket, budget mode) runs the
    round as is (compiling it first if compiled), then records it (recording runs nothing);
    later rounds, of this video or the next, replay it. Graphs share one memory pool: rounds run one at a time.
    Held per compressor and device (`CraftCompressor._runners`); the tables of the largest video seen stay
    allocated until the compressor is deleted.
    """

    def __init__(self, device: torch.device, compile: bool) -> None:
        super().__init__(device, compile)
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.tables: dict[tuple[int, ...], tuple[torch.Tensor, ...]] = {}
        self.actives: dict[tuple[int, int], torch.Tensor] = {}
        self.inputs: dict[tuple[int, ...], tuple[torch.Tensor, ...]] = {}
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capture_seconds: list[float] = []  # host seconds of each capture

    def start(
        self, features: torch.Tensor, coords: torch.Tensor, weight: torch.Tensor, block: int
    ) -> PaddedState:
        key = (bucket(features.shape[0]) + 1, features.shape[1], weight.shape[1])
        if key not in self.tables:
            with torch.inference_mode(False):  # see `_inputs`
                self.tables[key] = empty_tables(*key, self.device)
        return PaddedState(features, coords, weight, block, self.tables[key])

    def _round_inputs(
        self, state: PaddedState, scalars: tuple, weight: torch.Tensor
    ) -> tuple[torch.Tensor, tuple, torch.Tensor]:
        """The static active buffer (the state moves onto it) and the static scalars and
        projection, this round's values copied in."""
        n, room, threshold, phi = scalars
        slots = (state.rows.shape[0], state.active.numel())
        if slots not in self.actives:
            with torch.inference_mode(False):  # see `_inputs`
                self.actives[slots] = torch.empty_like(state.active)
        active = self.actives[slots]
        if state.active.data_ptr() != active.data_ptr():
            active.copy_(state.active)
            state.active = active
        static = self._inputs(weight, phi)
        static[0].fill_(n)
        static[1].fill_(room)
        static[2].fill_(0.0 if threshold is None else threshold)
        static[3].copy_(phi)
        static[4].copy_(weight)
        values = (static[0], static[1], None if threshold is None else static[2], static[3])
        return active, values, static[4]

    def _launch(self, args: tuple) -> list[int]:
        """Replay the graph of this (table size, active bucket, budget mode, weights), or run
        the round as is and record it for next time (recording runs nothing)."""
        merge, tables, active, values = args[:4]
        params = tuple(t.data_ptr() for t in (*merge.parameters(), *merge.buffers()))
        key = (tables[0].shape[0], active.numel(), values[2] is None, params, args[-1])
        if key in self.graphs:
            graph, sizes = self.graphs[key]
            graph.replay()
            self.replays += 1
            return sizes.tolist()
        done = self.round(*args).tolist()  # this round's work (compiled on first sight)
        graph = torch.cuda.CUDAGraph()
        started = time.perf_counter()
        with torch.cuda.graph(graph, pool=self.pool):
            sizes = self.round(*args)  # recorded, not run
        self.capture_seconds.append(time.perf_counter() - started)
        self.graphs[key] = (graph, sizes)
        return done

    def _inputs(self, weight: torch.Tensor, phi: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`(n, room, threshold, phi, weight)` as static tensors, one set per shape.

        Every static tensor is made outside inference mode: one made under a caller's
        `torch.inference_mode()` could not be written by a later call without it."""
        key = (*weight.shape, phi.numel())
        if key not in self.inputs:
            with torch.inference_mode(False):
                self.inputs[key] = self._new_inputs(weight, phi)
        return self.inputs[key]

    def _new_inputs(self, weight: torch.Tensor, phi: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.zeros((), dtype=torch.long, device=self.device),
            torch.zeros((), dtype=torch.long, device=self.device),
            torch.zeros((), dtype=torch.float64, device=self.device),
            torch.empty_like(phi),
            torch.empty_like(weight),
        )


def runner(device: torch.device, compile: bool) -> RoundRunner:
    """A new round runner for `device`: `GraphedRounds` on CUDA (its graphs and tables
    outlive a call: the compressor keeps it), else a `PaddedRounds`; the round compiled by
    Inductor first if `compile`."""
    if device.type == "cuda":
        return GraphedRounds(device, compile)
    return PaddedRounds(device, compile)


def empty_tables(
    size: int, width: int, key_dim: int, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """Uninitialised `padded_round` tables of `size` rows: `(rows [S, D] float32, coords
    [S, 3] long, embed [S, d] float64, norms [S] float64, owner [S] long)`."""
    return (
        torch.empty(size, width, device=device),
        torch.empty(size, 3, dtype=torch.long, device=device),
        torch.empty(size, key_dim, dtype=torch.float64, device=device),
        torch.empty(size, dtype=torch.float64, device=device),
        torch.empty(size, dtype=torch.long, device=device),
    )


class PaddedState:
    """The compiled loop's state: padded tables (see `padded_round`) and the active count.

    Attributes:
        rows: `[S, D]` float32 current rows (`S = bucket(N) + 1`; row `S - 1` the dummy).
        coords, embed, norms: `[S, 3]` long, `[S, d]` float64, `[S]` float64 (as `row_keys`).
        owner: `[S]` long, the token each input token now belongs to (the first N; the
            padding belongs to the dummy).
        active: `[bucket(n)]` long, the active ids ascending, then the dummy id.
        n: active tokens (host int, from the round's sizes).
    """

    def __init__(
        self,
        features: torch.Tensor,
        coords: torch.Tensor,
        weight: torch.Tensor,
        block: int,
        tables: tuple[torch.Tensor, ...] | None = None,
    ) -> None:
        n, device = features.shape[0], features.device
        size = bucket(n) + 1
        embed, norms = row_keys(features, weight, block)
        if tables is None:
            tables = empty_tables(size, features.shape[1], embed.shape[1], device)
        self.rows, self.coords, self.embed, self.norms, self.owner = tables
        for table in (self.rows, self.coords, self.embed, self.norms):
            table.zero_()  # reused tables (CUDA graphs) hold the last video's rows
        self.rows[:n] = features.detach()
        self.coords[:n] = coords
        self.embed[:n] = embed
        self.norms[:n] = norms
        # Padded too (the padding owned by the dummy): a table's shape is the bucket's, so
        # videos of every length in one bucket share the graphs.
        self.owner.fill_(size - 1)
        self.owner[:n] = torch.arange(n, device=device)
        self.n = n
        self.set_active(self.owner[:n])

    def tables(self) -> tuple[torch.Tensor, ...]:
        """`padded_round`'s tables."""
        return self.rows, self.coords, self.embed, self.norms, self.owner

    def kept(self) -> torch.Tensor:
        """`[n]` the active ids, ascending."""
        return self.active[: self.n]

    def set_active(self, active_ids: torch.Tensor) -> None:
        """Take `active_ids` (`[n]` ascending) as the active set, padded to its bucket."""
        self.n = active_ids.numel()
        dummy = self.rows.shape[0] - 1
        self.active = torch.full((bucket(self.n),), dummy, device=active_ids.device)
        self.active[: self.n] = active_ids

    def shrink(self) -> None:
        """Drop padding slots once n fits a smaller bucket (the slots past n are padding)."""
        if bucket(self.n) < self.active.numel():
            self.active = self.active[: bucket(self.n)].clone()


def fallback_round(
    merge: GatedMerge,
    state: PaddedState,
    budget: Budget,
    run: tuple[torch.Tensor, int, RunOptions],
) -> bool:
    """A padded round whose rows in doubt overflowed its buffer, redone eagerly on the same
    state with exact partners (host syncs); False if the budget allows no edge.

    `run` is `(grid_projection(W_rand) [D, d], the round m, the run options)`."""
    weight, round_index, options = run
    active = state.kept()
    sim, position, _ = certified_partners(state.embed[active], options.sim_block)
    edges = rank_edges(active, active[position], sim, state.norms, budget.floor, budget.threshold)
    sizes = [] if edges is None else edges.sizes.tolist()
    if not sizes or sizes[0] == 0:
        return False
    plan = lay_out(edges, *sizes[:3])  # type: ignore[arg-type]
    targets, sources = plan.layout.targets, plan.sources
    phi = round_embedding(round_index, merge.config.round_embed_dim, active.device)
    new_rows = merge.fuse_all(
        (state.rows[targets], state.rows[sources]),
        plan.layout.group,
        (state.coords[targets], state.coords[sources]),
        plan.similarity.float(),
        phi,
        options.merge_dtype(),
    )
    _store_rows(state.tables(), targets, new_rows, weight, options.sim_block)
    owner, active = retire(state.owner, active, sources, plan.targets, state.rows.shape[0])
    state.owner.copy_(owner)  # in place: a CUDA graph reads the table at its address
    state.set_active(active[: active.numel() - sources.numel()])
    return True

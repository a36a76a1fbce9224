"""When can a merge carry what a selection drops? Idealised video tokens, an oracle reader.

    uv run python packages/craft-eval/scripts/ideal_tokens.py [--clips 400] [--vocab 6 24 96]
    uv run python packages/craft-eval/scripts/ideal_tokens.py --learn 600 --vocab 24 --ratios 16 \
        [--lr 1e-3] [--control]

craft-world's crowd family (issue 44) asks whether one rare thing is in a clip of many
distinct tiles; DivPrune kept it. This script asks the question without a trained backbone,
so that only the token geometry decides. A clip is 144 tokens `[144, D]` on a 4 x 6 x 6 grid:
104 background rows (`2 e_bg` + noise) and 40 tiles (`e_bg` + the sum of the unit vectors of
the `per_tile` features the tile shows + noise; features drawn from a vocabulary of V, each
its own orthogonal direction). The asked feature (index 0) is in no distractor; in half the
clips one tile shows it in place of one of its own. The reader is an oracle that is generous
to every method alike: "present" iff the largest projection of a kept row on `e_asked`
exceeds a threshold, the threshold the best for that method and ratio (so a method loses
only what its rows no longer carry). Uncompressed, the reader is right on every clip.

What it measures: accuracy (%) +- binomial SE per method, vocabulary and ratio, for
DivPrune, uniform, CRAFT's selection with the mean rule (`craft-selection`) and untrained
CRAFT (a fresh module, gate 0.5). With a small vocabulary the asked tile is an outlier
(its feature is in no other row), and DivPrune, which keeps outliers first, keeps it; with a
large one every tile carries features of its own, DivPrune cannot tell the asked tile from
the rest, and a merge that folds it into a neighbour still carries `e_asked` at about half
its length. The noise is Gaussian from a seeded numpy generator (the same rows on every CPU).

`--learn STEPS`: can the module LEARN a better fusion there? A fresh CRAFT module's merge
(gate and weights; the selection is training-free) is trained with AdamW for STEPS steps,
each one clip with the asked feature and one without (fresh clips from their own seed
stream), on the ranking loss `softplus(score(without) - score(with))`, score = the reader's
largest projection on `e_asked` (so it optimises exactly what the reader needs, with no
threshold). The asked feature is feature 0 in every clip, or (`--any-feature`) drawn per
clip, so that the module must learn to keep whichever feature is rare, not one direction.
`--control`: the two clips' roles swapped at random (a coin per step), a target that carries
nothing to learn. Printed: the reader's accuracy on the same held-out
clips (`--clips`, their own seed stream) before and after, and DivPrune's.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from craft_core import CraftCompressor, CraftConfig, TokenBudget
from craft_eval.methods.registry import get_method

GRID = (4, 6, 6)
TILES, NOISE, DIM = 40, 0.15, 256


def clip(
    rng: np.random.Generator, vocab: int, per_tile: int, present: bool, asked: int = 0
) -> torch.Tensor:
    """One clip's rows `[144, DIM]` float32 (feature f -> e_f, the background -> e_vocab);
    the asked feature is `asked` (drawn as feature 0, then its column swapped with `asked`'s:
    the same draws for every `asked`)."""
    n = math.prod(GRID)
    basis = np.eye(DIM)[: vocab + 1]
    rows = 2.0 * basis[vocab] + NOISE * rng.standard_normal((n, DIM))
    cells = rng.permutation(n)[:TILES]
    for k, cell in enumerate(cells):
        feats = rng.choice(np.arange(1, vocab), per_tile, replace=False)
        if present and k == 0:
            feats[0] = 0  # the asked feature, in place of one of the tile's own
        rows[cell] = basis[vocab] + basis[feats].sum(0) + NOISE * rng.standard_normal(DIM)
    rows[:, [0, asked]] = rows[:, [asked, 0]]
    return torch.from_numpy(rows).float()


def best_accuracy(scores: np.ndarray, labels: np.ndarray) -> float:
    """The oracle reader's accuracy with its best threshold on `scores` `[clips]`."""
    cuts = np.concatenate([scores, [-np.inf]])
    return max(float(((scores > c) == labels).mean()) for c in cuts)


def held_out(args: argparse.Namespace, per_tile: int) -> list[tuple[torch.Tensor, bool, int]]:
    """The `--learn` mode's held-out clips `(rows, present, asked)` (seed streams of their
    own), half with the asked feature."""
    vocab = args.vocab[0]
    rng, asks = np.random.default_rng([vocab, 2000]), np.random.default_rng([vocab, 2001])
    out = []
    for i in range(args.clips):
        asked = int(asks.integers(vocab)) if args.any_feature else 0
        out.append((clip(rng, vocab, per_tile, i % 2 == 0, asked), i % 2 == 0, asked))
    return out


def reader_accuracy(method, clips, coords: torch.Tensor, ratio: float) -> float:  # type: ignore[no-untyped-def]
    """The oracle reader's accuracy (best threshold) on `clips` compressed by `method`."""
    with torch.no_grad():
        scores = [float(method(r, coords, TokenBudget(ratio=ratio)).features[:, a].max())
                  for r, _, a in clips]  # fmt: skip
    return best_accuracy(np.array(scores), np.array([p for _, p, _ in clips]))


def learn(args: argparse.Namespace, coords: torch.Tensor) -> None:
    """`--learn`: train a fresh module's merge on the ranking loss; print before / after."""
    vocab, ratio = args.vocab[0], args.ratios[0]
    per_tile = min(args.per_tile, vocab - 1)
    torch.manual_seed(args.seed)
    craft = CraftCompressor(CraftConfig(hidden_size=DIM))
    test = held_out(args, per_tile)
    before = reader_accuracy(craft.eval(), test, coords, ratio)
    optimiser = torch.optim.AdamW(craft.merge.parameters(), lr=args.lr)
    rng, coin = np.random.default_rng([vocab, 1000, args.seed]), np.random.default_rng(7)
    asks = np.random.default_rng([vocab, 1001, args.seed])
    craft.train()
    for step in range(args.learn):
        asked = int(asks.integers(vocab)) if args.any_feature else 0
        pair = [clip(rng, vocab, per_tile, True, asked), clip(rng, vocab, per_tile, False, asked)]
        if args.control and coin.random() < 0.5:
            pair.reverse()
        with_it, without = (craft(r, coords, TokenBudget(ratio=ratio)).features[:, asked].max()
                            for r in pair)  # fmt: skip
        loss = torch.nn.functional.softplus(without - with_it)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if (step + 1) % 100 == 0:
            print(f"step {step + 1}: loss {float(loss):.3f}", flush=True)
    after = reader_accuracy(craft.eval(), test, coords, ratio)
    divprune = reader_accuracy(get_method("divprune"), test, coords, ratio)
    kind = "control (roles at random)" if args.control else "trained"
    asked_what = "any feature" if args.any_feature else "feature 0"
    print(f"vocabulary {vocab}, {ratio:g}x, asked {asked_what}, seed {args.seed}, {args.learn} steps, lr "
          f"{args.lr:g}, {kind}: untrained {100 * before:.1f}% -> {100 * after:.1f}%; "
          f"DivPrune {100 * divprune:.1f}% ({args.clips} held-out clips)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=400)
    parser.add_argument("--vocab", type=int, nargs="+", default=[6, 24, 96])
    parser.add_argument("--per-tile", type=int, default=4)
    parser.add_argument("--ratios", type=float, nargs="+", default=[8.0, 16.0])
    parser.add_argument("--learn", type=int, default=0, help="train the merge for N steps")
    parser.add_argument("--lr", type=float, default=1e-3, help="--learn's learning rate")
    parser.add_argument("--control", action="store_true", help="--learn with roles at random")
    parser.add_argument("--seed", type=int, default=0, help="--learn: init and training clips")
    parser.add_argument(
        "--any-feature", action="store_true", help="--learn: the asked feature drawn per clip"
    )
    args = parser.parse_args(argv)
    if args.learn < 0 or args.lr <= 0:
        parser.error(f"need --learn >= 0 and --lr > 0, got {args.learn} and {args.lr}")
    if args.clips < 2 or any(v <= args.per_tile for v in args.vocab) or args.per_tile < 1:
        parser.error("need --clips >= 2, --per-tile >= 1 and every --vocab > --per-tile")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    coords = torch.tensor([(t, h, w) for t in range(GRID[0]) for h in range(GRID[1])
                           for w in range(GRID[2])])  # fmt: skip
    if args.learn:
        learn(args, coords)
        return 0
    methods = {
        "divprune": get_method("divprune"),
        "uniform": get_method("uniform"),
        "craft-selection": get_method("craft-selection", hidden_size=DIM),
        "craft": CraftCompressor(CraftConfig(hidden_size=DIM)).eval(),
    }
    print("| vocabulary | ratio | " + " | ".join(methods) + " |")
    print("| --- | --- |" + " ---: |" * len(methods))
    for vocab in args.vocab:
        for ratio in args.ratios:
            rng = np.random.default_rng([vocab, int(ratio)])
            labels = np.arange(args.clips) % 2 == 0
            scores = {m: np.zeros(args.clips) for m in methods}
            with torch.no_grad():
                for i, present in enumerate(labels):
                    rows = clip(rng, vocab, min(args.per_tile, vocab - 1), bool(present))
                    for name, method in methods.items():
                        kept = method(rows, coords, TokenBudget(ratio=ratio)).features
                        scores[name][i] = float(kept[:, 0].double().max())
            cells = []
            for name in methods:
                acc = best_accuracy(scores[name], labels)
                cells.append(
                    f"{100 * acc:.1f} ± {100 * math.sqrt(acc * (1 - acc) / args.clips):.1f}"
                )
            print(f"| {vocab} | {ratio:g}x | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The tile families: many small multi-coloured tiles, one question about a single dot.

Why it needs fusion (issue 44): the first family's questions are answered by a handful of
distinct tokens, which a selector keeps. Here a clip has 40 tiles (10 in each temporal
patch pair, each tile inside one 14 x 14 patch: 40 of the 144 video tokens), more than the
18 tokens kept at 8x or the 9 at 16x. Each tile is a 2 x 2 grid of 6 px dots, each dot
(with probability 3/4) of one of the five colours OTHER than the clip's asked colour; with
probability 1/2 one dot of one tile has the asked colour. So the tiles are mutually distinct
(many colour arrangements), the asked dot is one quarter of one token among 40 alike, and a
selector keeping 18 of them drops it about half the time (measured before training: DivPrune
keeps it in 55% of clips at 8x, 30% at 16x), while a merge that folds its token into a
neighbour can still carry its colour in the colour's channels.

Question (MVBench's format, filed under `moving_attribute`, options fixed):

    "Is there a red dot?"   (A) yes (B) no

The corners family (`sample_corners`) lays out the same tiles with the question fixed to a
colour AT a corner: "Is there a red dot in a top-left corner?". Red dots are everywhere
(any colour may fill any other corner); only the top-left corner never shows red, except in
the one tile of a "yes" clip. A tile then shows 4 of 24 colour-corner features, so the asked
tile is not an outlier of the token set (every tile has features few others share) and a
diversity selection cannot tell it from the rest, while the feature that matters is ONE
channel of the answer's token that a trained merge can carry into a neighbour. Filed under
`moving_direction` (options fixed).

The quiz family (`sample_quiz`, issue 54) asks a question that VARIES per clip: each clip
draws its asked feature, one of the 24 colour x corner features ("Is there a green dot in a
bottom-right corner?"), lays out the corners' tiles with that feature absent from every
tile but, in a "yes" clip (probability 1/2), exactly one, and every other feature common
(each dot any colour). A compressor never sees the question, so it must keep every feature
a clip shows: the one present in a single tile may be any of the 24. Its caption (stage 1,
"describe the video") lists every feature present (`quiz_caption`). Filed under
`counterfactual_inference` (options fixed).

Everything is a pure function of `(seed, split, index)`, as in `craft_world.clips`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from craft_world.clips import FRAMES, PALETTE, SIZE, YES_NO, Question, Scene, _rng, render

__all__ = [
    "CELLS",
    "CORNERS",
    "CORNERS_ASKED",
    "CORNERS_TASK",
    "CROWD_TASK",
    "QUIZ_TASK",
    "TILES_PER_PAIR",
    "TILE_FAMILIES",
    "CrowdScene",
    "crowd_question",
    "crowd_token_colours",
    "quiz_caption",
    "quiz_feature_set",
    "quiz_features",
    "render_crowd",
    "sample_corners",
    "sample_crowd",
    "sample_quiz",
    "sample_tiles",
    "tile_caption",
]

CROWD_TASK = "moving_attribute"
"""The MVBench task name the crowd questions are filed under (clevrer's video folder)."""
CORNERS_TASK = "moving_direction"
"""The MVBench task name the corners questions are filed under (clevrer's video folder)."""
QUIZ_TASK = "counterfactual_inference"
"""The MVBench task name the quiz questions are filed under (clevrer's video folder)."""
CORNERS = ("top-left", "top-right", "bottom-left", "bottom-right")
"""A tile's dot positions, in the order of `CrowdScene.tiles`' dots."""
CORNERS_ASKED = ("red", 0)
"""The corners family's asked feature: (colour, corner index into CORNERS)."""
TILES_PER_PAIR = 10
"""Tiles per temporal patch pair (4 pairs: 40 of the 144 video tokens)."""
DOT = 6
"""Side of a dot in pixels; a tile is 2 x 2 dots at offsets 1 and 8 inside its 14 px patch."""
P_EMPTY = 0.25
"""Probability that a dot of a tile is left out (background)."""
CELLS = (SIZE // 14) ** 2
"""Patch cells of a frame (6 x 6): a tile sits in one."""
_STREAM = 10  # rng streams of the tile families, disjoint from clips' 0 and 1
_CORNERS_STREAM = 11
_QUIZ_STREAM = 13  # 12: craft_world.tower_probe's balanced tiles


Tile = tuple[int, int, tuple[str | None, ...]]
"""(temporal pair, patch cell, the four dots' colours or None), as in `CrowdScene.tiles`."""


@dataclass(frozen=True)
class CrowdScene:
    """What a crowd clip shows.

    Attributes:
        asked: the colour the question asks about.
        present: whether one dot has the asked colour (at the asked corner).
        tiles: per tile `(pair, cell, dots)`: temporal pair 0-3, patch cell 0-35 (row-major)
            and the four dots' colour names (top-left, top-right, bottom-left, bottom-right;
            None: no dot).
        seed: seed of the background texture and noise.
        corner: the corner the question asks about (index into CORNERS), None: any corner
            (the crowd family).
        family: the tile family that drew it ("crowd", "corners" or "quiz"; "" for tiles
            drawn elsewhere, e.g. `craft_world.tower_probe`'s).
    """

    asked: str
    present: bool
    tiles: tuple[Tile, ...]
    seed: int
    corner: int | None = None
    family: str = ""


def _lay_out(
    rng: np.random.Generator, draw_dots: Callable[[], list[str]], per_pair: int = TILES_PER_PAIR
) -> list[Tile]:
    """`per_pair` tiles (`TILES_PER_PAIR`) in distinct cells of each temporal pair, their four
    dots drawn by `draw_dots`, each left out with probability `P_EMPTY`."""
    tiles: list[Tile] = []
    for pair in range(FRAMES // 2):
        for cell in sorted(int(c) for c in rng.choice(CELLS, per_pair, replace=False)):
            dots = draw_dots()
            empty = rng.random(4) < P_EMPTY
            tiles.append((pair, cell, tuple(None if e else d for d, e in zip(dots, empty))))
    return tiles


def _paint(tiles: list[Tile], k: int, dot: int, colour: str) -> None:
    """Dot `dot` of tile `k` takes `colour` (the one tile that answers "yes")."""
    pair, cell, shown = tiles[k]
    tiles[k] = (pair, cell, tuple(colour if i == dot else d for i, d in enumerate(shown)))


def sample_crowd(seed: int, split: str, index: int) -> CrowdScene:
    """The crowd scene of clip `index` of `split` (a pure function of its arguments)."""
    rng = _rng(seed, split, index, stream=_STREAM)
    names = list(PALETTE)
    asked = names[int(rng.integers(len(names)))]
    others = [c for c in names if c != asked]
    present = bool(rng.random() < 0.5)
    tiles = _lay_out(rng, lambda: [others[int(i)] for i in rng.integers(0, len(others), 4)])
    if present:
        k, dot = int(rng.integers(len(tiles))), int(rng.integers(4))
        _paint(tiles, k, dot, asked)
    return CrowdScene(asked, present, tuple(tiles), int(rng.integers(2**31)), family="crowd")


def _corner_tiles(
    rng: np.random.Generator,
    asked: str,
    corner: int,
    present: bool,
    shown_in: int = 1,
    per_pair: int = TILES_PER_PAIR,
) -> list[Tile]:
    """The corners' layout (`per_pair` tiles a temporal pair): every dot any colour but
    `asked` at `corner`, which one tile (`shown_in` distinct tiles) shows when `present`."""
    names = list(PALETTE)
    others = [c for c in names if c != asked]

    def draw_dots() -> list[str]:
        dots = [names[int(i)] for i in rng.integers(0, len(names), 4)]
        dots[corner] = others[int(rng.integers(len(others)))]
        return dots

    tiles = _lay_out(rng, draw_dots, per_pair)
    if present and shown_in == 1:
        _paint(tiles, int(rng.integers(len(tiles))), corner, asked)
    elif present:
        for k in sorted(int(t) for t in rng.choice(len(tiles), shown_in, replace=False)):
            _paint(tiles, k, corner, asked)
    return tiles


def sample_corners(seed: int, split: str, index: int) -> CrowdScene:
    """The corners scene of clip `index` of `split` (a pure function of its arguments): the
    crowd's layout, any colour at any corner but `CORNERS_ASKED`, which one tile shows in
    half the clips."""
    rng = _rng(seed, split, index, stream=_CORNERS_STREAM)
    asked, corner = CORNERS_ASKED
    present = bool(rng.random() < 0.5)
    tiles = _corner_tiles(rng, asked, corner, present)
    seed_ = int(rng.integers(2**31))
    return CrowdScene(asked, present, tuple(tiles), seed_, corner, family="corners")


def sample_quiz(
    seed: int,
    split: str,
    index: int,
    features: Sequence[int] | None = None,
    shown_in: int = 1,
    per_pair: int = TILES_PER_PAIR,
) -> CrowdScene:
    """The quiz scene of clip `index` of `split` (a pure function of its arguments): the
    asked feature (colour x corner) drawn uniformly from the 24, then the corners' layout
    with that feature absent but in one tile of a "yes" clip (probability 1/2).

    `features` (a training curriculum's option, `quiz_feature_set`): draw the asked feature
    uniformly from these feature numbers (colour-major, `colour * 4 + corner`) instead;
    None (the family's clips): from all 24, the same draws as without the option.
    `shown_in` (a curriculum's option too): a "yes" clip shows the asked feature in that
    many distinct tiles instead of one; 1 (the family's clips): the same draws. `per_pair`
    (a curriculum's option too): tiles per temporal pair, 1 to `TILES_PER_PAIR` (the
    family's clips: `TILES_PER_PAIR`, the same draws)."""
    if not 1 <= per_pair <= TILES_PER_PAIR:
        raise ValueError(f"per_pair must be in [1, {TILES_PER_PAIR}], got {per_pair}")
    if not 1 <= shown_in <= per_pair * FRAMES // 2:
        raise ValueError(f"shown_in must be in [1, {per_pair * FRAMES // 2}], got {shown_in}")
    rng = _rng(seed, split, index, stream=_QUIZ_STREAM)
    names = list(PALETTE)
    if features is None:
        feature = int(rng.integers(len(names) * len(CORNERS)))
    else:
        feature = int(features[int(rng.integers(len(features)))])
    asked, corner = names[feature // len(CORNERS)], feature % len(CORNERS)
    present = bool(rng.random() < 0.5)
    tiles = _corner_tiles(rng, asked, corner, present, shown_in, per_pair)
    seed_ = int(rng.integers(2**31))
    return CrowdScene(asked, present, tuple(tiles), seed_, corner, family="quiz")


def quiz_feature_set(spec: str) -> tuple[int, ...] | None:
    """The asked features a curriculum draws from (`sample_quiz`'s `features`): `spec` is a
    comma-separated list of `colour:corner` patterns, `*` for any ("*:top-left" the six
    colours at the top left, "red:*" red at the four corners, "*:top-left,red:*" both: 9).
    "" or "*:*" (all 24): None, the family's own draws. Sorted feature numbers, colour-major
    (`colour * 4 + corner`, as `craft_world.tower_probe`'s probe)."""
    names = list(PALETTE)
    chosen: set[int] = set()
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        colour, sep, corner = part.partition(":")
        if (
            not sep
            or (colour != "*" and colour not in names)
            or (corner != "*" and corner not in CORNERS)
        ):
            raise ValueError(
                f"quiz features: {part!r} is not colour:corner with a colour of {names} "
                f"and a corner of {list(CORNERS)} (or *)"
            )
        colours = range(len(names)) if colour == "*" else [names.index(colour)]
        corners = range(len(CORNERS)) if corner == "*" else [CORNERS.index(corner)]
        chosen |= {c * len(CORNERS) + k for c in colours for k in corners}
    if not chosen or len(chosen) == len(names) * len(CORNERS):
        return None
    return tuple(sorted(chosen))


TILE_FAMILIES = {"crowd": sample_crowd, "corners": sample_corners, "quiz": sample_quiz}
"""The tile families by name: each a sampler `(seed, split, index) -> CrowdScene`."""


def sample_tiles(family: str, seed: int, split: str, index: int) -> CrowdScene:
    """Clip `index` of `split` of the tile family `family` ("crowd", "corners" or "quiz")."""
    if family not in TILE_FAMILIES:
        raise ValueError(f"family must be one of {tuple(TILE_FAMILIES)}, got {family!r}")
    return TILE_FAMILIES[family](seed, split, index)


def render_crowd(scene: CrowdScene) -> np.ndarray:
    """The clip's frames: uint8 `[FRAMES, SIZE, SIZE, 3]` (the first family's background)."""
    frames = render(Scene((), (), (), (), scene.seed, ()))
    for pair, cell, dots in scene.tiles:
        row, col = divmod(cell, SIZE // 14)
        for q, colour in enumerate(dots):
            if colour is None:
                continue
            y = row * 14 + 1 + (q // 2) * (DOT + 1)
            x = col * 14 + 1 + (q % 2) * (DOT + 1)
            frames[2 * pair : 2 * pair + 2, y : y + DOT, x : x + DOT] = PALETTE[colour]
    return frames


def crowd_question(scene: CrowdScene) -> Question:
    """The clip's one question: is there a dot of the asked colour (at the asked corner)?"""
    answer = "yes" if scene.present else "no"
    if scene.corner is None:
        return Question(CROWD_TASK, f"Is there a {scene.asked} dot?", YES_NO, answer)
    where = CORNERS[scene.corner]
    task = QUIZ_TASK if scene.family == "quiz" else CORNERS_TASK
    return Question(task, f"Is there a {scene.asked} dot in a {where} corner?", YES_NO, answer)


def quiz_features(scene: CrowdScene) -> set[tuple[str, int]]:
    """The colour x corner features the scene's tiles show: `(colour, corner index)`."""
    return {
        (colour, corner)
        for _, _, dots in scene.tiles
        for corner, colour in enumerate(dots)
        if colour is not None
    }


_SHORT = ("tl", "tr", "bl", "br")
"""The caption's names of `CORNERS` (short: the world's tokenizer is byte-level)."""


def quiz_caption(scene: CrowdScene) -> str:
    """The quiz family's stage-1 caption: every feature present, colour by colour in palette
    order, each colour's corners in `CORNERS`' order ("red tl tr br; green tl bl tr br; ...";
    a colour shown at no corner is left out)."""
    shown = quiz_features(scene)
    parts = []
    for colour in PALETTE:
        corners = [_SHORT[k] for k in range(len(CORNERS)) if (colour, k) in shown]
        if corners:
            parts.append(" ".join([colour, *corners]))
    return "; ".join(parts) + "."


def tile_caption(scene: CrowdScene) -> str:
    """The stage-1 caption: the colours shown in palette order ("red, blue."), and for the
    corners family whether the asked feature is there; the quiz family's: `quiz_caption`."""
    if scene.family == "quiz":
        return quiz_caption(scene)
    shown = {d for _, _, dots in scene.tiles for d in dots if d is not None}
    caption = ", ".join(c for c in PALETTE if c in shown) + "."
    if scene.corner is not None:
        where = CORNERS[scene.corner]
        caption += f" {'A' if scene.present else 'No'} {scene.asked} dot in a {where} corner."
    return caption


def crowd_token_colours(scene: CrowdScene) -> torch.Tensor:
    """Which colours each of the clip's 144 video tokens shows: float `[144, 6]` (0/1), in
    Qwen2.5-VL's token order (temporal pair, patch row, patch column), as
    `train_backbone.token_colours` for the first family."""
    names = list(PALETTE)
    out = torch.zeros(FRAMES // 2 * CELLS, len(names))
    for pair, cell, dots in scene.tiles:
        for colour in dots:
            if colour is not None:
                out[pair * CELLS + cell, names.index(colour)] = 1.0
    return out

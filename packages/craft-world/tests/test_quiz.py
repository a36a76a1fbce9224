"""The quiz family (issue 54, part 1): the question varies per clip over the 24 colour x
corner features, the asked one is absent but in the one tile of a "yes" clip, every other
feature common, the caption lists every feature the pixels show, and everything is a pure
function of `(seed, split, index)`."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest
import torch

torch.set_num_threads(1)

from craft_world import make_clips  # noqa: E402
from craft_world.clips import CAPTION_PROMPT, FRAMES, PALETTE, SIZE, VIDEO_FOLDER  # noqa: E402
from craft_world.crowd import (  # noqa: E402
    CORNERS,
    DOT,
    QUIZ_TASK,
    TILES_PER_PAIR,
    crowd_question,
    quiz_caption,
    quiz_feature_set,
    quiz_features,
    render_crowd,
    sample_quiz,
    sample_tiles,
    tile_caption,
)

SHORT = {"tl": 0, "tr": 1, "bl": 2, "br": 3}


def _pixel_features(frames: np.ndarray) -> Counter[tuple[str, int]]:
    """How many tiles show each (colour, corner), read from the pixels: the 6 x 6 square at
    a corner's offset in a cell of a pair's first frame is exactly one palette colour."""
    seen: Counter[tuple[str, int]] = Counter()
    for pair in range(FRAMES // 2):
        frame = frames[2 * pair]
        for cell in range((SIZE // 14) ** 2):
            r, c = divmod(cell, SIZE // 14)
            for corner in range(len(CORNERS)):
                y = r * 14 + 1 + (corner // 2) * (DOT + 1)
                x = c * 14 + 1 + (corner % 2) * (DOT + 1)
                block = frame[y : y + DOT, x : x + DOT].reshape(-1, 3)
                for name, rgb in PALETTE.items():
                    if (block == np.array(rgb)).all():
                        seen[(name, corner)] += 1
    return seen


def _parse_caption(caption: str) -> set[tuple[str, int]]:
    """The features a quiz caption names ("red tl br; blue tr.")."""
    assert caption.endswith(".")
    out = set()
    for part in caption[:-1].split("; "):
        colour, *corners = part.split(" ")
        assert colour in PALETTE and corners, part
        out |= {(colour, SHORT[k]) for k in corners}
    return out


def test_quiz_clips_show_what_they_say() -> None:
    presents = []
    for i in range(12):
        scene = sample_quiz(0, "test", i)
        assert scene == sample_tiles("quiz", 0, "test", i) and scene.family == "quiz"
        assert len(scene.tiles) == 4 * TILES_PER_PAIR
        frames = render_crowd(scene)
        seen = _pixel_features(frames)
        asked = (scene.asked, scene.corner)
        # the asked feature: in exactly one tile of a "yes" clip, in none of a "no" clip
        assert seen[asked] == (1 if scene.present else 0), (i, asked, seen[asked])
        # every other feature is common: about 40 x 3/4 / 6 = 5 tiles each
        others = [seen[(c, k)] for c in PALETTE for k in range(4) if (c, k) != asked]
        assert sum(others) / len(others) >= 3.0, (i, others)
        assert set(seen) == quiz_features(scene)
        # the caption names every feature the pixels show, and nothing else
        assert _parse_caption(quiz_caption(scene)) == set(seen)
        assert tile_caption(scene) == quiz_caption(scene)
        q = crowd_question(scene)
        assert q.task == QUIZ_TASK and q.candidates == ("yes", "no")
        assert q.question == f"Is there a {scene.asked} dot in a {CORNERS[scene.corner]} corner?"
        assert q.answer == ("yes" if scene.present else "no")
        presents.append(scene.present)
    assert True in presents and False in presents


def test_quiz_draws_every_feature_evenly_and_half_yes() -> None:
    n = 960
    scenes = [sample_quiz(0, "craft", i) for i in range(n)]
    asked = Counter((s.asked, s.corner) for s in scenes)
    assert len(asked) == len(PALETTE) * len(CORNERS) == 24
    assert min(asked.values()) >= n / 24 / 2 and max(asked.values()) <= n / 24 * 2, asked
    yes = sum(s.present for s in scenes)
    assert abs(yes - n / 2) <= 4 * (n / 4) ** 0.5, yes
    # yes and no are balanced within each feature too: the answer is not the feature's
    for feature in asked:
        mine = [s.present for s in scenes if (s.asked, s.corner) == feature]
        assert 0 < sum(mine) < len(mine), feature
    # absent from the tiles but in a "yes" clip's one tile (its annotation, all n clips)
    for s in scenes:
        hits = sum(1 for _, _, dots in s.tiles if dots[s.corner] == s.asked)
        assert hits == int(s.present)


def test_quiz_is_a_pure_function_of_seed_split_index() -> None:
    a = [sample_quiz(0, "test", i) for i in range(5)]
    assert a == [sample_quiz(0, "test", i) for i in range(5)]
    assert np.array_equal(render_crowd(a[2]), render_crowd(sample_quiz(0, "test", 2)))
    assert sample_quiz(0, "test", 3) != sample_quiz(0, "craft", 3)
    assert sample_quiz(0, "test", 3) != sample_quiz(1, "test", 3)
    assert sample_quiz(0, "test", 3) != sample_quiz(0, "test", 4)
    # its own stream: not the corners' clip of the same index with another question
    corners = sample_tiles("corners", 0, "test", 3)
    assert corners.tiles != sample_quiz(0, "test", 3).tiles


def test_make_clips_quiz_family(tmp_path: Path) -> None:
    root = make_clips(tmp_path / "q", 3, seed=0, family="quiz")
    rows = json.loads((root / "json" / f"{QUIZ_TASK}.json").read_text())
    assert [r["video"] for r in rows] == [f"quiz_test_{i:06d}.mp4" for i in range(3)]
    scenes = [sample_quiz(0, "test", i) for i in range(3)]
    assert [r["question"] for r in rows] == [crowd_question(s).question for s in scenes]
    assert [r["answer"] for r in rows] == [crowd_question(s).answer for s in scenes]
    assert (root / "video" / VIDEO_FOLDER / rows[0]["video"]).is_file()
    captions = [json.loads(x) for x in (root / "captions.jsonl").read_text().splitlines()]
    assert [c["caption"] for c in captions] == [quiz_caption(s) for s in scenes]
    qa = [json.loads(x) for x in (root / "qa.jsonl").read_text().splitlines()]
    assert [r["answer"] for r in qa] == ["A" if s.present else "B" for s in scenes]
    assert json.loads((root / "world.json").read_text())["family"] == "quiz"


def test_phase_c_caption_share() -> None:
    """Phase C on the quiz with `caption_share_c`: some tile examples are the caption; at
    0 (the shipped recipe) none are, and no extra draw changes the batches."""
    from craft_world.train_backbone import Recipe, training_example

    def draws(recipe: Recipe) -> list[tuple[str, str]]:
        rng = np.random.default_rng(0)
        return [training_example(recipe, 2, 0, j, rng)[2] for j in range(16)]

    with_captions = draws(Recipe(batch=16, family_c="quiz", crowd_share=1.0, caption_share_c=0.5))
    prompts = [p for p, _ in with_captions]
    assert CAPTION_PROMPT in prompts and any(p != CAPTION_PROMPT for p in prompts)
    for j, (prompt, target) in enumerate(with_captions):
        if prompt == CAPTION_PROMPT:
            assert target == quiz_caption(sample_quiz(0, "train", 2 * 10**8 * 16 + j))
    # caption_share_c = 0: two draws an example (tile or not, newline stripped or not)
    plain = draws(Recipe(batch=16, family_c="quiz", crowd_share=1.0))
    rng = np.random.default_rng(0)
    for j, (prompt, target) in enumerate(plain):
        rng.random()
        stripped = rng.random() < 0.5
        q = crowd_question(sample_quiz(0, "train", 2 * 10**8 * 16 + j))
        assert q.question in prompt and prompt.endswith("\n") != stripped
        assert target == ("A" if q.answer == "yes" else "B")


def test_quiz_feature_subsets() -> None:
    """A curriculum's stage (`quiz_feature_set`, `sample_quiz(features=...)`): the asked
    feature drawn from the subset only, all of it drawn, the layout the family's; all 24
    features (or none given) the family's own clips, draw for draw."""
    names = list(PALETTE)
    assert quiz_feature_set("*:top-left") == tuple(4 * c for c in range(6))
    assert quiz_feature_set("red:*") == (0, 1, 2, 3)
    assert quiz_feature_set("*:top-left, red:*") == (0, 1, 2, 3, 4, 8, 12, 16, 20)
    assert quiz_feature_set("green:bottom-right") == (4 * names.index("green") + 3,)
    assert quiz_feature_set("") is None and quiz_feature_set("*:*") is None
    for bad in ("red", "pink:*", "*:middle", "red:top"):
        with pytest.raises(ValueError):
            quiz_feature_set(bad)
    top_left = quiz_feature_set("*:top-left")
    scenes = [sample_quiz(0, "train", i, features=top_left) for i in range(240)]
    assert {(s.asked, s.corner) for s in scenes} == {(c, 0) for c in PALETTE}
    assert 0 < sum(s.present for s in scenes) < len(scenes)
    for s in scenes[:60]:  # the asked feature in exactly the one tile of a "yes" clip
        hits = sum(1 for _, _, dots in s.tiles if dots[s.corner] == s.asked)
        assert hits == int(s.present) and s.family == "quiz"
    for i in range(50):  # every feature listed = the family's own draw
        assert sample_quiz(0, "test", i, features=range(24)) == sample_quiz(0, "test", i)
    for i in range(30):  # a needle curriculum's clips: the asked feature in 5 tiles of a "yes"
        s = sample_quiz(0, "train", i, features=top_left, shown_in=5)
        hits = sum(1 for _, _, dots in s.tiles if dots[s.corner] == s.asked)
        assert hits == 5 * int(s.present) and s.corner == 0
        assert sample_quiz(0, "train", i, shown_in=1) == sample_quiz(0, "train", i)
    with pytest.raises(ValueError):
        sample_quiz(0, "train", 0, shown_in=41)
    # the family's first test clips (asked colour, corner, answer), as before the option
    first = [(s.asked, s.corner, s.present) for s in (sample_quiz(0, "test", i) for i in range(6))]
    assert first == [
        ("red", 3, True),
        ("magenta", 3, True),
        ("red", 3, True),
        ("cyan", 3, True),
        ("blue", 2, False),
        ("yellow", 3, False),
    ]


def test_phase_c_quiz_features() -> None:
    """Phase C with `quiz_features` asks only those features; the option needs the quiz."""
    from craft_world.train_backbone import Recipe, _parser, training_example

    recipe = Recipe(batch=16, family_c="quiz", crowd_share=1.0, quiz_features="red:*")
    rng = np.random.default_rng(0)
    prompts = [training_example(recipe, 2, 0, j, rng)[2][0] for j in range(16)]
    assert all("Is there a red dot in a " in p for p in prompts)
    assert len({p.strip() for p in prompts}) > 1  # the corner varies
    with pytest.raises(ValueError, match="family_c"):
        Recipe(quiz_features="red:*")
    with pytest.raises(ValueError):
        Recipe(family_c="quiz", quiz_features="red")
    args = _parser().parse_args(["--work", "w", "--out", "o", "--quiz-features", "*:top-left"])
    assert args.quiz_features == "*:top-left"


def test_phase_c_quiz_shown_in() -> None:
    """The needle curriculum: a "yes" clip shows the asked feature in `quiz_shown_in` tiles
    at step 0, linearly fewer down to one at half of phase C; 1 is the family's clips."""
    from craft_world.train_backbone import Recipe, quiz_shown_in_at, training_example

    recipe = Recipe(batch=16, steps_c=100, family_c="quiz", crowd_share=1.0, quiz_shown_in=9)
    assert [quiz_shown_in_at(recipe, s) for s in (0, 25, 50, 99)] == [9, 5, 1, 1]
    for step, shown in ((0, 9), (25, 5), (60, 1)):
        rng = np.random.default_rng(0)
        for j in range(16):
            frames = training_example(recipe, 2, step, j, rng)[0]
            scene = sample_quiz(0, "train", (2 * 10**8 + step) * 16 + j, shown_in=shown)
            assert np.array_equal(frames, render_crowd(scene))
            if scene.present:
                asked = (scene.asked, scene.corner)
                assert _pixel_features(frames)[asked] == shown
    for bad in (
        {"quiz_shown_in": 0},
        {"quiz_shown_in": 41},
        {"family_c": "corners", "quiz_shown_in": 2},
    ):
        with pytest.raises(ValueError):
            Recipe(**{"family_c": "quiz", **bad})  # type: ignore[arg-type]


def test_attention_aux_teaches_where_the_asked_feature_is() -> None:
    """`attn_aux_c`'s loss: near 0 when head 0 at the answer position attends to exactly
    the asked feature's tokens of a "yes" clip (or off the video in a "no" clip), large
    when it attends elsewhere; `training_example` hands over each tile question's scene."""
    from craft_world.backbone import world_processor
    from craft_world.tower_probe import corner_labels
    from craft_world.train_backbone import (
        PromptCache,
        Recipe,
        _attention_aux,
        make_batch,
        training_example,
    )

    recipe = Recipe(batch=4, family_c="quiz", crowd_share=1.0, attn_aux_c=1.0)
    rng = np.random.default_rng(0)
    scenes: list = []
    drawn = [training_example(recipe, 2, 0, j, rng, scenes) for j in range(4)]
    for j, scene in enumerate(scenes):
        assert scene == sample_quiz(0, "train", 2 * 10**8 * 4 + j)
        assert np.array_equal(drawn[j][0], render_crowd(scene))
    assert {s.present for s in scenes} == {True, False}
    cache = PromptCache(world_processor())
    pixels = torch.zeros(4, 144, 1176)
    prompts = [ex[0] for _, _, ex in drawn]
    batch = make_batch(cache, pixels, [ex for _, _, ex in drawn], 0)
    length = batch["input_ids"].shape[1]
    video = batch["input_ids"] == cache.tok.convert_tokens_to_ids("<|video_pad|>")

    def attention(on_answer: bool, by_corner: bool = False) -> torch.Tensor:
        att = torch.zeros(4, 4, length, length)
        for row, scene in enumerate(scenes):
            at = len(cache.prompt(prompts[row])) - 1
            head = scene.corner if by_corner else 0
            where = torch.nonzero(video[row])[:, 0]
            feature = list(PALETTE).index(scene.asked) * 4 + scene.corner
            shows = corner_labels(scene)[:, feature] > 0
            if on_answer:  # the right tokens: the feature's, or off the video
                if scene.present:
                    att[row, head, at, where[shows]] = 1.0 / int(shows.sum())
                else:
                    att[row, head, at, 0] = 1.0
            else:  # wrong: a video token without the feature, spread over the rest
                att[row, head, at, where[~shows]] = 1.0 / int((~shows).sum())
        return att

    yes = [sc if sc is not None and sc.present else None for sc in scenes]
    no = [sc if sc is not None and not sc.present else None for sc in scenes]
    for only in (scenes, yes, no):  # "yes" and "no" rows each count
        right = _attention_aux(attention(True), batch, cache, prompts, only)
        wrong = _attention_aux(attention(False), batch, cache, prompts, only)
        assert right is not None and wrong is not None
        assert float(right) < 1e-3 and float(wrong) > 5.0
    assert _attention_aux(attention(True), batch, cache, prompts, [None] * 4) is None
    # corner heads: head k taught for corner k (the scenes' corners are not all 0)
    assert {sc.corner for sc in scenes} != {0}
    by_corner = _attention_aux(attention(True, True), batch, cache, prompts, scenes, True)
    assert by_corner is not None and float(by_corner) < 1e-3
    head_0 = _attention_aux(attention(True), batch, cache, prompts, scenes, True)
    assert head_0 is not None and float(head_0) > 1.0
    for bad in ({"attn_aux_c": -1.0}, {"attn_aux_layer": 4}):
        with pytest.raises(ValueError):
            Recipe(**{"family_c": "quiz", **bad})  # type: ignore[arg-type]


def test_phase_c_quiz_tiles() -> None:
    """The clutter curriculum: `quiz_tiles` tiles a temporal pair at step 0, linearly up to
    the family's 10 at half of phase C; 10 tiles is the family's clip."""
    from craft_world.train_backbone import Recipe, quiz_tiles_at, training_example

    recipe = Recipe(batch=8, steps_c=100, family_c="quiz", crowd_share=1.0, quiz_tiles=2)
    assert [quiz_tiles_at(recipe, s) for s in (0, 25, 50, 99)] == [2, 6, 10, 10]
    for step, per_pair in ((0, 2), (25, 6)):
        rng = np.random.default_rng(0)
        for j in range(8):
            frames = training_example(recipe, 2, step, j, rng)[0]
            scene = sample_quiz(0, "train", (2 * 10**8 + step) * 8 + j, per_pair=per_pair)
            assert len(scene.tiles) == 4 * per_pair
            assert np.array_equal(frames, render_crowd(scene))
            hits = sum(1 for _, _, dots in scene.tiles if dots[scene.corner] == scene.asked)
            assert hits == int(scene.present)
    assert sample_quiz(0, "train", 7, per_pair=10) == sample_quiz(0, "train", 7)
    with pytest.raises(ValueError):
        Recipe(family_c="quiz", quiz_tiles=11)


class _Stop(Exception):
    """Raised by `_FramesSeen` once `_train_step` has handed over its batch's frames."""


class _FramesSeen:
    """A stand-in for `PromptCache`: records the frames `_train_step` turns into pixels
    (uint8 `[8, 84, 84, 3]` each), then stops the step when it asks for a prompt."""

    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []

    def pixels(self, frames: np.ndarray) -> torch.Tensor:
        self.frames.append(frames)
        return torch.zeros(144, 1176)

    def prompt(self, text: str) -> torch.Tensor:
        raise _Stop


def _step_frames(recipe: object, phase: int) -> list[np.ndarray]:
    """The frames step 0 of `phase` feeds the model under `recipe` (`_train_step` stopped
    before the model runs)."""
    from craft_world.train_backbone import _train_step

    weight = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([weight], lr=0.1)
    seen = _FramesSeen()
    with pytest.raises(_Stop):
        _train_step((None, None, [], opt), seen, 0, recipe, phase, 0)  # type: ignore[arg-type]
    return seen.frames


def test_phase_c_mp4_trains_on_the_frames_the_evaluation_decodes(tmp_path: Path) -> None:
    """`mp4_c`: phase C's frames go through the clip's mp4 (`through_mp4`: exactly what
    `make_clips`' file decodes to with `read_video`), phases A and B's do not; off (the
    shipped recipe) phase C's are the in-memory render."""
    from craft_adapters import read_video
    from craft_world.train_backbone import Recipe, _parser, through_mp4

    scene = sample_quiz(0, "test", 0)
    root = make_clips(tmp_path / "q", 1, seed=0, family="quiz")
    decoded = read_video(root / "video" / VIDEO_FOLDER / "quiz_test_000000.mp4", fps=2.0).frames
    assert np.array_equal(through_mp4(render_crowd(scene)), np.asarray(decoded))
    assert not np.array_equal(decoded, render_crowd(scene))
    base = {"batch": 4, "family_c": "quiz", "crowd_share": 1.0}
    plain, encoded = Recipe(**base), Recipe(**base, mp4_c=True)  # type: ignore[arg-type]
    memory = _step_frames(plain, 2)
    for j, frames in enumerate(memory):
        assert np.array_equal(frames, render_crowd(sample_quiz(0, "train", 2 * 10**8 * 4 + j)))
    through = _step_frames(encoded, 2)
    assert all(np.array_equal(t, through_mp4(m)) for t, m in zip(through, memory, strict=True))
    assert not any(np.array_equal(t, m) for t, m in zip(through, memory, strict=True))
    for a, b in zip(_step_frames(plain, 1), _step_frames(encoded, 1), strict=True):
        assert np.array_equal(a, b)  # phase B: in memory either way
    assert not Recipe().mp4_c
    assert _parser().parse_args(["--work", "w", "--out", "o", "--mp4-c"]).mp4_c

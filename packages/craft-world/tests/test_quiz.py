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

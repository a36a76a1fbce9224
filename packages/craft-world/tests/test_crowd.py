"""The tile families (issue 44: crowd, corners): their clips show what their annotations
say, their files are MVBench's, and phase C of the backbone recipe starts only from a
backbone of its phases A+B."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest
import torch

torch.set_num_threads(1)

from craft_world import make_clips  # noqa: E402
from craft_world.clips import FRAMES, PALETTE, SIZE, VIDEO_FOLDER  # noqa: E402
from craft_world.crowd import (  # noqa: E402
    CORNERS,
    CORNERS_ASKED,
    CORNERS_TASK,
    CROWD_TASK,
    DOT,
    TILES_PER_PAIR,
    crowd_question,
    crowd_token_colours,
    render_crowd,
    sample_corners,
    sample_crowd,
    sample_tiles,
    tile_caption,
)


def _reference_token_colours(frames: np.ndarray) -> np.ndarray:
    """A slow, obvious reading of the pixels: token (pair, row, col) shows colour c when
    some pixel of its 14 x 14 patch in either frame of its pair IS c's palette value (the
    grey background with noise never is). `[144, 6]` bool."""
    out = np.zeros((FRAMES // 2, SIZE // 14, SIZE // 14, len(PALETTE)), dtype=bool)
    for t in range(FRAMES):
        for r in range(SIZE // 14):
            for c in range(SIZE // 14):
                patch = frames[t, r * 14 : r * 14 + 14, c * 14 : c * 14 + 14].astype(int)
                for k, rgb in enumerate(PALETTE.values()):
                    if (np.abs(patch - np.array(rgb)).max(-1) == 0).any():
                        out[t // 2, r, c, k] = True
    return out.reshape(-1, len(PALETTE))


def test_crowd_scenes_show_what_they_say() -> None:
    presents = []
    for i in range(6):
        scene = sample_crowd(0, "test", i)
        frames = render_crowd(scene)
        assert frames.shape == (FRAMES, SIZE, SIZE, 3) and frames.dtype == np.uint8
        assert len(scene.tiles) == 4 * TILES_PER_PAIR
        labels = crowd_token_colours(scene)
        assert np.array_equal(labels.numpy().astype(bool), _reference_token_colours(frames))
        asked = list(PALETTE).index(scene.asked)
        shown = int(labels[:, asked].sum())
        assert shown == (1 if scene.present else 0), (i, scene.asked, shown)
        exact = (np.abs(frames.astype(int) - np.array(PALETTE[scene.asked])).max(-1) == 0).sum()
        assert exact == (2 * DOT * DOT if scene.present else 0)  # one dot, in two frames
        q = crowd_question(scene)
        assert q.question == f"Is there a {scene.asked} dot?" and q.task == CROWD_TASK
        assert q.answer == ("yes" if scene.present else "no")
        presents.append(scene.present)
    assert sample_crowd(0, "test", 3) == sample_crowd(0, "test", 3)
    assert sample_crowd(0, "test", 3) != sample_crowd(0, "craft", 3)
    assert True in presents and False in presents


def _reference_corner_colours(frames: np.ndarray) -> list[set[tuple[int, str]]]:
    """Per temporal pair, the (cell, colour) of every dot drawn at the ASKED corner of a
    cell, read from the pixels of the pair's first frame: the 6 x 6 square at the corner's
    offset is exactly one palette colour."""
    corner = CORNERS_ASKED[1]
    dy, dx = (corner // 2) * (DOT + 1) + 1, (corner % 2) * (DOT + 1) + 1
    out: list[set[tuple[int, str]]] = []
    for pair in range(FRAMES // 2):
        seen = set()
        for cell in range((SIZE // 14) ** 2):
            r, c = divmod(cell, SIZE // 14)
            block = frames[
                2 * pair, r * 14 + dy : r * 14 + dy + DOT, c * 14 + dx : c * 14 + dx + DOT
            ]
            for name, rgb in PALETTE.items():
                if (block.reshape(-1, 3) == np.array(rgb)).all():
                    seen.add((cell, name))
        out.append(seen)
    return out


def test_corners_scenes_show_what_they_say() -> None:
    asked, corner = CORNERS_ASKED
    presents, red_elsewhere = [], 0
    for i in range(8):
        scene = sample_corners(0, "test", i)
        assert scene == sample_tiles("corners", 0, "test", i)
        frames = render_crowd(scene)
        assert len(scene.tiles) == 4 * TILES_PER_PAIR and scene.corner == corner
        at_corner = _reference_corner_colours(frames)
        hits = sum(1 for seen in at_corner for _, name in seen if name == asked)
        assert hits == (1 if scene.present else 0), (i, hits)
        # the asked colour is common elsewhere: a selector cannot look for the colour alone
        red_elsewhere += int(crowd_token_colours(scene)[:, list(PALETTE).index(asked)].sum())
        assert np.array_equal(
            crowd_token_colours(scene).numpy().astype(bool), _reference_token_colours(frames)
        )
        q = crowd_question(scene)
        assert q.task == CORNERS_TASK and q.answer == ("yes" if scene.present else "no")
        assert q.question == f"Is there a {asked} dot in a {CORNERS[corner]} corner?"
        assert tile_caption(scene).endswith(
            f"{'A' if scene.present else 'No'} {asked} dot in a {CORNERS[corner]} corner."
        )
        presents.append(scene.present)
    assert red_elsewhere >= 8 * 10  # about 40 tiles x 3 corners x 3/4 / 6 = 15 a clip
    assert True in presents and False in presents
    assert sample_corners(0, "test", 3) != sample_corners(0, "craft", 3)
    with pytest.raises(ValueError, match="family"):
        sample_tiles("dots", 0, "test", 0)


def test_make_clips_corners_family(tmp_path: Path) -> None:
    root = make_clips(tmp_path / "k", 3, seed=0, family="corners")
    rows = json.loads((root / "json" / f"{CORNERS_TASK}.json").read_text())
    assert [r["video"] for r in rows] == [f"corners_test_{i:06d}.mp4" for i in range(3)]
    assert [r["answer"] for r in rows] == [
        crowd_question(sample_corners(0, "test", i)).answer for i in range(3)
    ]
    assert (root / "video" / VIDEO_FOLDER / rows[0]["video"]).is_file()


def test_make_clips_crowd_family(tmp_path: Path) -> None:
    from craft_adapters import read_video

    root = make_clips(tmp_path / "c", 4, seed=0, family="crowd")
    rows = json.loads((root / "json" / f"{CROWD_TASK}.json").read_text())
    assert not (root / "json" / "object_existence.json").exists()
    assert len(rows) == 4 and json.loads((root / "world.json").read_text())["family"] == "crowd"
    for i, row in enumerate(rows):
        scene = sample_crowd(0, "test", i)
        assert row["video"] == f"crowd_test_{i:06d}.mp4" and row["candidates"] == ["yes", "no"]
        assert row["answer"] == crowd_question(scene).answer
        video = read_video(root / "video" / VIDEO_FOLDER / row["video"], fps=2.0)
        assert video.frames.shape == (FRAMES, SIZE, SIZE, 3)
        # the encoded clip keeps the dots' colours: the mean over each dot within 40 levels
        for pair, cell, dots in scene.tiles[:8]:
            r, c = divmod(cell, SIZE // 14)
            for q, colour in enumerate(dots):
                if colour is None:
                    continue
                y, x = r * 14 + 1 + (q // 2) * (DOT + 1), c * 14 + 1 + (q % 2) * (DOT + 1)
                got = video.frames[2 * pair, y + 1 : y + DOT - 1, x + 1 : x + DOT - 1]
                mean = got.reshape(-1, 3).astype(float).mean(0)
                assert np.abs(mean - np.array(PALETTE[colour])).max() <= 40, (i, colour, mean)
    qa = [json.loads(x) for x in (root / "qa.jsonl").read_text().splitlines()]
    assert len(qa) == 4 and {r["answer"] for r in qa} <= {"A", "B"}
    with pytest.raises(ValueError, match="family"):
        make_clips(tmp_path / "bad", 2, family="dots")
    assert not (tmp_path / "bad").exists()


def test_phase_c_starts_only_from_its_own_phases(tmp_path: Path) -> None:
    from craft_world.train_backbone import Recipe, _model_and_probes, _start_after_ab

    folder = tmp_path / "bb"
    folder.mkdir()
    model, _, _ = _model_and_probes(0)
    with pytest.raises(ValueError, match=r"world_recipe\.json"):
        _start_after_ab(folder, Recipe(steps_c=10), model)
    (folder / "world_recipe.json").write_text(json.dumps({"seed": 0, "steps_a": 1}))
    with pytest.raises(ValueError, match="steps_a"):
        _start_after_ab(folder, Recipe(steps_c=10), model)
    with pytest.raises(ValueError, match="crowd_share"):
        Recipe(crowd_share=1.5)
    with pytest.raises(ValueError, match="family_c"):
        Recipe(family_c="squares")


def test_phase_c_on_corners_with_the_vision_tower_frozen(tmp_path: Path) -> None:
    """Phase C (`family_c="corners"`, `freeze_vision_c`) moves the language model and leaves
    every vision-tower weight of the start bit for bit; the saved recipe names its start."""
    from safetensors.torch import load_file

    from craft_world.train_backbone import Recipe, train_backbone

    kw = {"save_every": 100, "eval_every": 100, "eval_clips": 1, "final_clips": 1}
    ab = Recipe(steps_a=1, steps_b=1, batch=2, steps_p=0, steps_c=0)
    train_backbone(tmp_path / "ab", tmp_path / "ab-out", ab, **kw)
    for freeze in (True, False):
        c = Recipe(steps_a=1, steps_b=1, batch=2, steps_p=0, steps_c=2, family_c="corners",
                   crowd_share=1.0, freeze_vision_c=freeze)  # fmt: skip
        out = tmp_path / f"c-{freeze}"
        acc = train_backbone(tmp_path / f"w-{freeze}", out, c, start_from=tmp_path / "ab-out", **kw)
        assert set(acc) == {"object_existence", "moving_count", "all", "corners"}
        start, after = (load_file(str(d / "model.safetensors")) for d in (tmp_path / "ab-out", out))
        vision = [k for k in start if ".visual." in k or k.startswith("visual.")]
        assert vision and len(vision) < len(start)
        moved_vision = [k for k in vision if not torch.equal(start[k], after[k])]
        moved_text = [k for k in start if k not in vision and not torch.equal(start[k], after[k])]
        assert moved_text
        assert (moved_vision == []) == freeze, moved_vision[:3]
        made = json.loads((out / "world_recipe.json").read_text())
        assert made["family_c"] == "corners" and made["freeze_vision_c"] == freeze
        assert made["started_from"]["steps_c"] == 0 and made["started_from"]["steps_a"] == 1


def test_corner_labels_are_what_the_pixels_show() -> None:
    """Phase P's labels: token (pair, cell) shows colour c at corner k exactly when the
    middle pixel of that corner's dot IS c's palette value in both frames of the pair (read
    from the rendered frames, not from the scene's tile list)."""
    from craft_world.crowd import CELLS
    from craft_world.tower_probe import FEATURES, balanced_tiles, corner_labels

    names, side = list(PALETTE), SIZE // 14
    for index in range(6):
        scene = balanced_tiles(0, index)
        frames, labels = render_crowd(scene), corner_labels(scene)
        assert labels.shape == (FRAMES // 2 * CELLS, FEATURES)
        reference = torch.zeros_like(labels)
        for pair in range(FRAMES // 2):
            for cell in range(CELLS):
                row, col = divmod(cell, side)
                for corner in range(len(CORNERS)):
                    dy, dx = divmod(corner, 2)
                    y = row * 14 + 1 + dy * (DOT + 1) + DOT // 2
                    x = col * 14 + 1 + dx * (DOT + 1) + DOT // 2
                    for c, name in enumerate(names):
                        value = np.asarray(PALETTE[name], dtype=np.uint8)
                        if all((frames[2 * pair + t, y, x] == value).all() for t in (0, 1)):
                            reference[pair * CELLS + cell, c * len(CORNERS) + corner] = 1.0
        assert torch.equal(labels, reference), index
        # balanced: every one of the 24 features shows up in a clip's tiles
        assert (labels.sum(0) > 0).sum() >= FEATURES - 2


def test_phase_p_trains_the_tower_alone_and_resumes(tmp_path: Path) -> None:
    """Phase P (`steps_p`) moves only vision-tower weights, leaving every language-model
    weight of its A+B start bit for bit; then C on the frozen tower moves only the language
    model. A run killed in P and resumed gives the same weights bit for bit."""
    from safetensors.torch import load_file

    from craft_world.train_backbone import Recipe, train_backbone

    kw = {"save_every": 1, "eval_every": 100, "eval_clips": 1, "final_clips": 1}
    ab = Recipe(steps_a=1, steps_b=1, batch=2, steps_p=0, steps_c=0)
    train_backbone(tmp_path / "ab", tmp_path / "ab-out", ab, **kw)
    start = load_file(str(tmp_path / "ab-out" / "model.safetensors"))
    vision = {k for k in start if ".visual." in k or k.startswith("visual.")}

    def moved(out: Path) -> tuple[set[str], set[str]]:
        after = load_file(str(out / "model.safetensors"))
        changed = {k for k in start if not torch.equal(start[k], after[k])}
        return changed & vision, changed - vision

    common = {"steps_a": 1, "steps_b": 1, "batch": 2, "family_c": "corners"}
    p_only = Recipe(**common, steps_p=3, steps_c=0)  # type: ignore[arg-type]
    train_backbone(tmp_path / "p", tmp_path / "p-out", p_only, start_from=tmp_path / "ab-out", **kw)
    vision_moved, text_moved = moved(tmp_path / "p-out")
    assert vision_moved and not text_moved, sorted(text_moved)[:3]
    log = [json.loads(line) for line in (tmp_path / "p" / "log.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in log] == ["P"] and "exact" in log[0]

    # killed at P step 1, resumed: the same run
    import shutil

    shutil.copytree(tmp_path / "p" / "test", tmp_path / "k" / "test")
    stop = train_backbone(tmp_path / "k", tmp_path / "k-out", p_only,
                          start_from=tmp_path / "ab-out", stop_at=(3, 1), **kw)  # fmt: skip
    assert stop == {} and not (tmp_path / "k-out").exists()
    train_backbone(tmp_path / "k", tmp_path / "k-out", p_only, start_from=tmp_path / "ab-out", **kw)
    a, b = (
        load_file(str(d / "model.safetensors")) for d in (tmp_path / "p-out", tmp_path / "k-out")
    )
    assert all(torch.equal(a[k], b[k]) for k in a)

    pc = Recipe(**common, steps_p=3, steps_c=2, crowd_share=1.0, freeze_vision_c=True)  # type: ignore[arg-type]
    train_backbone(tmp_path / "pc", tmp_path / "pc-out", pc, start_from=tmp_path / "ab-out", **kw)
    after_p, after_pc = (
        load_file(str(d / "model.safetensors")) for d in (tmp_path / "p-out", tmp_path / "pc-out")
    )
    assert all(torch.equal(after_p[k], after_pc[k]) for k in vision)  # C kept P's tower
    assert any(not torch.equal(after_p[k], after_pc[k]) for k in start if k not in vision)
    made = json.loads((tmp_path / "pc-out" / "world_recipe.json").read_text())
    assert made["steps_p"] == 3 and made["started_from"]["steps_a"] == 1


def test_command_line_defaults_are_the_shipped_recipe() -> None:
    """`python -m craft_world.train_backbone` without options trains `Recipe()`, the
    shipped backbone's recipe (a store_true `--freeze-vision-c` once left the tower
    trainable by default)."""
    from dataclasses import fields

    from craft_world.train_backbone import Recipe, _parser

    args = vars(_parser().parse_args(["--work", "w", "--out", "o"]))
    shipped = Recipe()
    for field in fields(Recipe):
        if field.name in args:
            assert args[field.name] == getattr(shipped, field.name), field.name
    assert {"steps_p", "steps_c", "freeze_vision_c", "family_c"} <= set(args)
    assert not vars(_parser().parse_args(["--work", "w", "--out", "o", "--no-freeze-vision-c"]))[
        "freeze_vision_c"
    ]

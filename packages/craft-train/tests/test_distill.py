"""Distillation (`stage: distill`): config, manifest, teacher cache, loss, and a training run.

The loss is checked against an independent reference (the unmodified transformers model's
logits for the teacher, the student's full logits, a per-token loop); the vision tower runs
once per micro-batch; the teacher's responses are generated once, cached, and a killed
generation resumes without regenerating; a killed run resumes to the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TinySetup, heldout_distill
from safetensors.torch import load_file

from craft_train.cli import main
from craft_train.config import ConfigError, load_config
from craft_train.data import collate
from craft_train.distill import (
    DistillEncoder,
    Distiller,
    left_align,
    load_distill_examples,
    read_distill_manifest,
)
from craft_train.model import build_model
from craft_train.teacher_cache import TeacherCache, example_key, fill_cache
from craft_train.trainer import StepInfo, train


def _manifest(tiny: TinySetup, rows: list[dict[str, Any]] | None = None) -> Path:
    path = tiny.root / "distill.jsonl"
    rows = rows if rows is not None else [{"video": f"clip{i}.mp4"} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _config(tiny: TinySetup, out: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    sections = {
        **sections,
        "data": {"manifests": [str(_manifest(tiny))], **sections.get("data", {})},
        "distill": {"max_new_tokens": 6, **sections.get("distill", {})},
    }
    return tiny.config(out, stage="distill", **sections)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- config, manifest


def test_config_and_cli_errors_name_the_field(tiny: TinySetup, tmp_path: Path, capsys) -> None:
    cfg = load_config(data=_config(tiny, tmp_path / "o"), stage="distill")
    assert cfg.distill is not None and cfg.distill.temperature == 1.0
    assert len(cfg.distill.prompts) == 6
    with pytest.raises(ConfigError, match=r"distill\.temperature"):
        load_config(data=_config(tiny, tmp_path, distill={"temperature": 0}), stage="distill")
    with pytest.raises(ConfigError, match=r"distill\.prompts_per_video"):
        load_config(
            data=_config(tiny, tmp_path, distill={"prompts": ["a"], "prompts_per_video": 2}),
        )
    with pytest.raises(ConfigError, match="distill: this section belongs to stage distill"):
        load_config(data={**tiny.config(tmp_path), "distill": {}}, stage=1)
    stage1 = tiny.config(tmp_path)
    assert load_config(data=stage1, stage=1).distill is None  # other stages: no section

    path = tmp_path / "d.yaml"
    import yaml

    path.write_text(yaml.safe_dump(_config(tiny, tmp_path / "o")))
    assert main(["distill", "--config", str(path), "--check"]) == 0
    assert "config ok: stage distill, 8 examples" in capsys.readouterr().out
    assert main(["distill", "--config", str(path), "distill.ce_weight=2"]) == 2
    assert "distill.ce_weight" in capsys.readouterr().err
    assert main(["stage1", "--config", str(path)]) == 2
    assert "`stage1` was run" in capsys.readouterr().err


def test_manifest_prompts(tmp_path: Path) -> None:
    rows = [
        {"video": "a.mp4"},
        {"video": "b.mp4", "prompt": "Count the cars.", "source": "road"},
        {"video": "/abs/c.mp4"},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = ["p1", "p2", "p3"]
    got = read_distill_manifest(path, prompts=prompts, prompts_per_video=2, seed=0)
    assert [e.video for e in got] == [str(tmp_path / "a.mp4")] * 2 + [
        str(tmp_path / "b.mp4"),
        "/abs/c.mp4",
        "/abs/c.mp4",
    ]
    assert got[2].prompt == "Count the cars." and got[2].source == "road"
    assert got[0].source == "distill" and got[0].target == ""
    assert got[0].prompt != got[1].prompt and {got[0].prompt, got[1].prompt} <= set(prompts)
    again = read_distill_manifest(path, prompts=prompts, prompts_per_video=2, seed=0)
    assert again == got  # seeded: the same on every rank and after a resume
    path.write_text('{"prompt": "no video"}\n')
    with pytest.raises(ConfigError, match=r"m\.jsonl:1: field 'video'"):
        read_distill_manifest(path, prompts=prompts, prompts_per_video=1, seed=0)


# --------------------------------------------------------------------------- the loss


@pytest.fixture(scope="module")
def loaded(tiny: TinySetup, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A built student, its distiller (responses cached) and two encoded examples."""
    out = tmp_path_factory.mktemp("distill") / "run"
    cfg = load_config(data=_config(tiny, out), stage="distill")
    bundle = build_model(cfg)
    distiller = Distiller(cfg, bundle)
    examples = load_distill_examples(cfg)[:2]
    assert distiller.fill_cache(examples) == 2
    encode = distiller.make_encoder(cfg, bundle.processor)
    items = [{**encode(e), "skipped_videos": []} for e in examples]
    return cfg, bundle, distiller, examples, items


def _batch(items: list[dict[str, Any]], bundle: Any) -> dict[str, Any]:
    batch = collate(items, bundle.pad_token_id)
    batch.pop("skipped_videos")
    return batch


def _reference_kl(bundle: Any, item: dict[str, Any], ratio: float, t: float) -> torch.Tensor:
    """Per response token: KL between the UNMODIFIED HF model's and the compressed model's
    full-sequence logits, positions found by a plain loop over the labels."""
    inputs = {k: v for k, v in item.items() if k not in ("labels", "skipped_videos")}
    labels = item["labels"][0]
    with torch.no_grad():
        teacher = bundle.backbone(**inputs).logits[0]
        bundle.model.set_budget(ratio=ratio)
        student = bundle.model(**inputs).logits[0]
    n_resp = int((labels != -100).sum())
    out = []
    for j in range(n_resp):  # the j-th response token is predicted by the position before it
        tp = torch.softmax(teacher[len(labels) - n_resp - 1 + j] / t, -1)
        sq = torch.softmax(student[student.shape[0] - n_resp - 1 + j] / t, -1)
        out.append(sum(float(tp[v] * (tp[v].log() - sq[v].log())) for v in range(tp.shape[0])))
    return torch.tensor(out)


def test_loss_matches_a_reference_and_vanishes_uncompressed(loaded: Any) -> None:
    cfg, bundle, distiller, _, items = loaded
    bundle.model.eval()
    t = 2.0
    distiller.temperature = t
    try:
        for item in items:
            ref = _reference_kl(bundle, item, ratio=4.0, t=t)
            bundle.model.set_budget(ratio=4.0)
            with torch.no_grad():
                loss = distiller.loss(bundle.model, _batch([item], bundle))
            assert float(ref.mean()) > 1e-3  # compression changes the answers
            torch.testing.assert_close(loss, ref.mean() * t * t, rtol=1e-4, atol=1e-6)
            bundle.model.set_budget(ratio=1.0)  # nothing merged: the student IS the teacher
            with torch.no_grad():
                assert float(distiller.loss(bundle.model, _batch([item], bundle))) < 1e-6
    finally:
        distiller.temperature = cfg.distill.temperature


def test_batch_of_uneven_rows_equals_rows_one_by_one(loaded: Any) -> None:
    _, bundle, distiller, _, items = loaded
    assert items[0]["input_ids"].shape != items[1]["input_ids"].shape  # different prompts
    bundle.model.eval()
    bundle.model.set_budget(ratio=4.0)
    one = torch.cat([distiller.item_kl(bundle.model, _batch([i], bundle)) for i in items])
    both = distiller.item_kl(bundle.model, _batch(items, bundle))
    torch.testing.assert_close(both, one, rtol=1e-4, atol=1e-6)
    batch = _batch(items, bundle)
    aligned = left_align(batch, bundle.pad_token_id)
    assert bool((aligned["attention_mask"][:, -1] == 1).all())
    for b in range(2):
        n = int(batch["attention_mask"][b].sum())
        assert torch.equal(aligned["input_ids"][b, -n:], batch["input_ids"][b, :n])


def test_vision_tower_runs_once_per_micro_batch(loaded: Any) -> None:
    _, bundle, distiller, _, items = loaded
    calls = []
    handle = bundle.backbone.model.visual.register_forward_hook(lambda *a: calls.append(1))
    try:
        bundle.model.train()
        bundle.model.set_budget(ratio=8.0)
        loss = distiller.loss(bundle.model, _batch(items, bundle))
        loss.backward()
        assert len(calls) == 1  # the teacher and the student shared one vision pass
        grads = [p.grad for p in bundle.compressor.parameters() if p.requires_grad]
        assert any(g is not None and float(g.abs().sum()) > 0 for g in grads)
    finally:
        handle.remove()
        bundle.compressor.zero_grad()


def test_shuffled_teacher_teaches_each_row_another_rows_video(
    loaded: Any, tiny: TinySetup, tmp_path: Path
) -> None:
    """`distill.shuffle_teacher` (a learning test's control that must not learn): row b is
    taught row b-1's teacher distributions. With nothing merged the student IS the teacher,
    so the plain loss is zero and the shuffled one is not; the student's side is unchanged."""
    with pytest.raises(ConfigError, match=r"distill\.shuffle_teacher.*per_device_batch_size"):
        load_config(data=_config(tiny, tmp_path, distill={"shuffle_teacher": True}))
    cfg, bundle, distiller, _, items = loaded
    assert cfg.distill is not None and not cfg.distill.shuffle_teacher  # off by default
    bundle.model.eval()
    bundle.model.set_budget(ratio=1.0)
    batch = _batch(items, bundle)
    with torch.no_grad():
        plain = distiller.response_logits(bundle.model, batch)
        distiller.shuffle_teacher = True
        try:
            shuffled = distiller.response_logits(bundle.model, batch)
            assert float(distiller.loss(bundle.model, batch)) > 1e-3
        finally:
            distiller.shuffle_teacher = False
        assert float(distiller.loss(bundle.model, batch)) < 1e-6
    torch.testing.assert_close(shuffled.student, plain.student)
    assert torch.equal(shuffled.rows, plain.rows)
    assert not torch.allclose(shuffled.teacher, plain.teacher)


def test_kept_teacher_logits_are_the_teachers_and_spare_its_forward(
    loaded: Any, tiny: TinySetup, tmp_path: Path
) -> None:
    """`distill.keep_teacher_logits`: a batch whose rows were all seen runs no teacher forward,
    and gives the logits the teacher computes, row by row (the rows in another order, and
    rolled by `shuffle_teacher`); a row not seen yet makes the teacher run again."""
    _, bundle, plain, examples, _ = loaded
    keep_cfg = load_config(
        data=_config(tiny, tmp_path / "k", distill={"keep_teacher_logits": True})
    )
    keeper = Distiller(keep_cfg, bundle)
    keeper.responses = plain.responses
    encode = keeper.make_encoder(keep_cfg, bundle.processor)
    items = [{**encode(e), "skipped_videos": []} for e in examples]
    assert [i["teacher_key"] for i in items] == [example_key(e) for e in examples]
    calls = []
    handle = keeper.teacher.register_forward_hook(lambda *_: calls.append(1))
    bundle.model.eval()
    bundle.model.set_budget(ratio=4.0)
    try:
        with torch.no_grad():
            for order, shuffle, runs in [([0], False, 1), ([0, 1], False, 1), ([1, 0], False, 0),
                                         ([1, 0], True, 0), ([1], False, 0)]:  # fmt: skip
                calls.clear()
                plain.shuffle_teacher = keeper.shuffle_teacher = shuffle
                batch = _batch([items[i] for i in order], bundle)
                got = keeper.response_logits(bundle.model, batch)
                ref = plain.response_logits(bundle.model, batch)
                assert len(calls) == runs, (order, shuffle, len(calls))
                torch.testing.assert_close(got.teacher, ref.teacher, rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(got.student, ref.student)
    finally:
        plain.shuffle_teacher = keeper.shuffle_teacher = False
        handle.remove()
    assert set(keeper.kept) == {example_key(e) for e in examples}
    assert plain.kept == {}  # off by default


@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen2_5_vl", "qwen3_vl", "llava_onevision"])
def test_every_backbone_teacher_is_the_plain_model_and_sees_the_video_once(
    model_type: str, tiny: TinySetup, tmp_path: Path
) -> None:
    """On a tiny model of each backbone: the teacher's logits are the unmodified HF model's,
    the vision tower runs once per micro-batch for both passes, nothing merged gives KL 0,
    and a batch of two uneven rows equals the rows one by one."""
    import numpy as np
    from conftest import TINY_CRAFT

    from craft_adapters import build_inputs, wrap
    from craft_adapters.tiny import TINY_FRAME_SIZE, build_tiny_vlm
    from craft_core import CraftCompressor, CraftConfig
    from craft_train.inputs import _append_target
    from craft_train.model import ModelBundle

    model, processor = build_tiny_vlm(model_type, tmp_path / model_type)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20.0)  # sharper than the random init's
    hidden = int(model.config.get_text_config().hidden_size)
    compressor = CraftCompressor(CraftConfig(hidden_size=hidden, **TINY_CRAFT))
    bundle = ModelBundle(wrap(model, compressor, ratio=4.0), model, compressor, processor)
    distiller = Distiller(load_config(data=_config(tiny, tmp_path / "o")), bundle)
    frames = np.random.default_rng(0).integers(0, 255, (4, TINY_FRAME_SIZE, TINY_FRAME_SIZE, 3))
    items = []
    for prompt, response in (("What happens here?", [72, 101, 33]), ("Describe.", [66, 33])):
        inputs = dict(build_inputs(processor, frames.astype(np.uint8), 2.0, prompt))
        items.append({**_append_target(inputs, torch.tensor([response])), "skipped_videos": []})

    calls = []
    encode = model.model.get_video_features
    model.model.get_video_features = lambda *a, **k: calls.append(1) or encode(*a, **k)
    try:
        with torch.no_grad():
            inputs = {k: v for k, v in items[0].items() if k not in ("labels", "skipped_videos")}
            torch.testing.assert_close(
                distiller.teacher(**inputs).logits, model(**inputs).logits, rtol=1e-4, atol=1e-5
            )
            calls.clear()
            loss = distiller.loss(bundle.model, _batch(items, bundle))
            assert calls == [1] and float(loss) > 1e-4
            one = torch.cat([distiller.item_kl(bundle.model, _batch([i], bundle)) for i in items])
            both = distiller.item_kl(bundle.model, _batch(items, bundle))
            torch.testing.assert_close(both, one, rtol=1e-4, atol=1e-6)
            bundle.model.set_budget(ratio=1.0)
            assert float(distiller.loss(bundle.model, _batch(items, bundle))) < 1e-6
    finally:
        del model.model.get_video_features


# --------------------------------------------------------------------------- the cache


def test_cached_responses_are_the_greedy_generation_and_resume(loaded: Any, tmp_path: Path) -> None:
    cfg, bundle, distiller, examples, _ = loaded
    encoder = DistillEncoder(cfg, bundle.processor)
    inputs = encoder.prompt_inputs(examples[0])
    with torch.no_grad():
        bundle.backbone.eval()
        ref = bundle.backbone.generate(
            **inputs, max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0
        )
    length = inputs["input_ids"].shape[-1]
    assert distiller.responses[example_key(examples[0])] == ref[0, length:].tolist()

    # A killed generation keeps what it wrote (a torn last line is dropped) and resumes.
    meta = {"teacher": "x"}
    cache = TeacherCache(tmp_path / "c", meta)
    made: list[str] = []

    def generate(example: Any) -> list[int]:
        if len(made) == 1:
            raise KeyboardInterrupt
        made.append(example.video)
        return [1, 2]

    with pytest.raises(KeyboardInterrupt):
        fill_cache(cache, examples, generate)
    with (tmp_path / "c" / "responses-0.jsonl").open("a") as handle:
        handle.write('{"key": "torn')
    assert list(cache.responses().values()) == [[1, 2]]
    assert fill_cache(cache, examples + examples, lambda e: made.append(e.video) or [3]) == 1
    assert made == [examples[0].video, examples[1].video]  # nothing generated twice
    assert sorted(map(str, cache.responses().values())) == ["[1, 2]", "[3]"]
    with pytest.raises(ConfigError, match=r"distill\.cache_dir: .* \(changed: teacher\)"):
        TeacherCache(tmp_path / "c", {"teacher": "y"})


# --------------------------------------------------------------------------- training runs


class Killed(Exception):
    pass


def test_killed_distill_run_resumes_to_the_same_weights(tiny: TinySetup, tmp_path: Path) -> None:
    """CRAFT+ (LoRA; the teacher runs without it): killed after step 3 (checkpoint-2 on
    disk), started again, it ends with the uninterrupted run's weights, and the teacher's
    responses are not generated again."""

    def config(out: Path) -> Any:
        data = _config(
            tiny,
            out,
            model={"lora": {"enabled": True, "lr": 1e-3}},
            optim={"max_steps": 4, "epochs": 10},
            train={"save_steps": 2},
        )
        return load_config(data=data, stage="distill")

    reference = train(config(tmp_path / "ref"))
    assert len(reference.losses) == 4 and all(loss > 0 for loss in reference.losses)

    out = tmp_path / "killed"

    def kill_after_3(info: StepInfo) -> None:
        if info.step == 3:
            raise Killed

    with pytest.raises(Killed):
        train(config(out), on_step=kill_after_3)
    cached = (out / "teacher" / "responses-0.jsonl").read_text()
    assert len(cached.splitlines()) == 8
    resumed = train(config(out))
    assert resumed.resumed_from == out / "checkpoint-2" and len(resumed.losses) == 2
    assert (out / "teacher" / "responses-0.jsonl").read_text() == cached  # not regenerated
    for part in ("craft/model.safetensors", "lora/adapter_model.safetensors"):
        ref, mine = load_file(str(tmp_path / "ref" / part)), load_file(str(out / part))
        assert set(ref) == set(mine) and ref
        for name in ref:
            torch.testing.assert_close(mine[name], ref[name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(resumed.losses, reference.losses[2:], rtol=1e-5, atol=1e-7)

    # The teacher of CRAFT+ is the ORIGINAL model: the trained LoRA is off while it runs.
    from transformers import AutoModelForImageTextToText

    bundle = resumed.bundle
    assert bundle is not None and bundle.peft_model is not None
    cfg = config(out)
    distiller = Distiller(cfg, bundle)
    example = load_distill_examples(cfg)[0]
    distiller.fill_cache([example])  # cached: nothing generated
    item = distiller.make_encoder(cfg, bundle.processor)(example)
    inputs = {k: v for k, v in item.items() if k != "labels"}
    bundle.model.eval()
    plain = AutoModelForImageTextToText.from_pretrained(tiny.backbone, dtype=torch.float32)
    with torch.no_grad():
        expected = plain(**inputs).logits
        with distiller.teacher_mode():
            teacher = distiller.teacher(**inputs).logits
        with_lora = distiller.teacher(**inputs).logits
    torch.testing.assert_close(teacher, expected, rtol=1e-4, atol=1e-5)
    assert float((with_lora - expected).abs().max()) > 1e-3


def paired(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Mean of `a - b` over items and the standard error of that mean."""
    d = (a - b).double()
    return float(d.mean()), float(d.std() / d.numel() ** 0.5)


def _clips_manifest(path: Path, videos: list[Path], prompts_per_clip: int) -> Path:
    """Rows with explicit generic prompts (cycled), `prompts_per_clip` per clip."""
    from craft_train.distill import DEFAULT_PROMPTS

    rows, k = [], 0
    for video in videos:
        for _ in range(prompts_per_clip):
            rows.append({"video": str(video), "prompt": DEFAULT_PROMPTS[k % len(DEFAULT_PROMPTS)]})
            k += 1
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
def test_distillation_lowers_heldout_kl_and_a_random_teacher_does_not(
    tiny: TinySetup, tmp_path: Path
) -> None:
    """A short distillation run (the shipped budget sampling) on 32 unlabeled clips lowers
    the held-out KL to the uncompressed model at 8x below the untrained module's by several
    paired standard errors (48 held-out (clip, prompt) items, 16 unseen clips); the same
    run whose teacher is a different random model does not."""
    from conftest import COLOURS, save_scaled_tiny_vlm, write_clip

    from craft_core import CraftCompressor

    def clips(indices: range) -> list[Path]:
        for i in indices:
            write_clip(tmp_path / f"c{i}.mp4", list(COLOURS)[i % 4], seed=1000 + i)
        return [tmp_path / f"c{i}.mp4" for i in indices]

    seen = _clips_manifest(tmp_path / "train.jsonl", clips(range(32)), 3)
    unseen = _clips_manifest(tmp_path / "test.jsonl", clips(range(100, 116)), 6)
    save_scaled_tiny_vlm(tmp_path / "random", seed=1)

    def config(out: Path, manifest: Path, **distill: Any) -> Any:
        data = tiny.config(
            out,
            stage="distill",  # type: ignore[arg-type]
            data={"manifests": [str(manifest)]},
            optim={"lr": 2e-2, "max_steps": 80, "epochs": 100, "grad_accum": 2},
            distill={"max_new_tokens": 8, **distill},
        )
        return load_config(data=data, stage="distill")

    trained = {}
    for name, teacher in (("distill", None), ("control", str(tmp_path / "random"))):
        train(config(tmp_path / name, seen, teacher=teacher))
        trained[name] = CraftCompressor.from_pretrained(tmp_path / name / "craft")

    # Held out: the uncompressed model's own responses to 3 prompts on each unseen clip.
    bundle, judge, batches = heldout_distill(config(tmp_path / "eval", unseen))
    assert len(batches) == 96

    def heldout_kl(state: dict[str, torch.Tensor]) -> torch.Tensor:
        bundle.compressor.load_state_dict(state)
        bundle.model.set_budget(ratio=8.0)
        return torch.cat([judge.item_kl(bundle.model, b) for b in batches])

    kl_untrained = heldout_kl({k: v.clone() for k, v in bundle.compressor.state_dict().items()})
    gains = {name: paired(kl_untrained, heldout_kl(m.state_dict())) for name, m in trained.items()}
    print(f"held-out KL at 8x: untrained {float(kl_untrained.mean()):.4f}; drop (SE) {gains}")
    drop, se = gains["distill"]
    assert drop > 3.0 * se, gains
    control_drop, control_se = gains["control"]
    assert control_drop < 2.0 * control_se and control_drop < drop / 3, gains


@pytest.mark.slow
def test_deepspeed_two_processes_through_the_cli(tiny: TinySetup, tmp_path: Path) -> None:
    """`craft-train distill` under torchrun, ZeRO-2 on gloo: the ranks share the teacher's
    generation (each writes its half) and train on the same responses."""
    from test_deepspeed import _torchrun

    out = tmp_path / "out"
    config = tmp_path / "distill.yaml"
    data = _config(
        tiny,
        out,
        optim={"max_steps": 2, "epochs": 10, "grad_accum": 1},
        train={"deepspeed": "zero2", "save_steps": 1},
    )
    import yaml

    config.write_text(yaml.safe_dump(data))
    done = _torchrun(2, ["-m", "craft_train.cli", "distill", "--config", str(config)])
    assert "stage distill done (2 steps)" in done.stdout
    halves = [(out / "teacher" / f"responses-{r}.jsonl").read_text().splitlines() for r in (0, 1)]
    assert [len(h) for h in halves] == [4, 4]
    assert (out / "checkpoint-2" / "deepspeed" / "latest").is_file()
    rows = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["loss"] > 0 for r in rows)
    trained = load_file(str(out / "craft" / "model.safetensors"))
    assert float(trained["merge.w_up.weight"].abs().sum()) > 0  # left its zero init

"""`craft-train stage1|stage2 --config FILE [--set a.b=value ...]`.

    craft-train stage1 --config qwen3_5_4b_stage1.yaml --set optim.lr=1e-3 --set train.output_dir=runs/x
    craft-train stage2 --config qwen3_5_4b_stage2.yaml model.lora.enabled=true   # bare overrides work too
    craft-train distill --config qwen3_5_4b_distill.yaml   # unlabeled videos, match the full model
    craft-train configs                      # list the shipped example configs
    craft-train show-config --config FILE    # print the resolved config and exit

The config is read, overridden and fully checked (fields, referenced files, DeepSpeed
JSON) before the model, data or GPU is touched; an error names the field and exits with 2.
Launch on many GPUs with `deepspeed`, `torchrun` or `accelerate launch` on
`-m craft_train.cli` (see the README).
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from importlib import resources
from pathlib import Path
from typing import Any

from craft_train.config import ConfigError, TrainingConfig, check_paths, dump_config, load_config

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="craft-train",
        description="Train the CRAFT merge module on a frozen VLM: stage 1 (captions), then "
        "stage 2 (video QA); or distill (unlabeled videos, matching the uncompressed model).",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the Python traceback of an unexpected error"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command, help_text in (
        ("stage1", "run training stage 1 (captions)"),
        ("stage2", "run training stage 2 (video QA)"),
        ("distill", "train on unlabeled videos to match the uncompressed model"),
    ):
        p = sub.add_parser(command, help=help_text)
        _config_args(p)
        p.add_argument(
            "--check",
            action="store_true",
            help="validate the config and the data files, print the mixture and every row "
            "that cannot be used (file:line: why), and exit",
        )
    show = sub.add_parser("show-config", help="print the resolved config")
    _config_args(show)
    sub.add_parser("configs", help="list the shipped example configs")
    return parser


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field, e.g. --set optim.lr=1e-3 (repeatable; YAML values)",
    )
    p.add_argument("extra", nargs="*", metavar="KEY=VALUE", help="more overrides")


def shipped_configs() -> list[str]:
    """Names of the example configs inside the package (`craft_train/configs/*.yaml`)."""
    folder = resources.files("craft_train").joinpath("configs")
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".yaml"))


def _load(args: argparse.Namespace, stage: int | str | None) -> TrainingConfig:
    path = args.config
    folder = resources.files("craft_train").joinpath("configs")
    if path in shipped_configs() and not _exists(path):
        path = str(folder.joinpath(path))
    return load_config(path, [*args.overrides, *args.extra], stage=stage)


def _exists(path: str) -> bool:
    return Path(path).exists()


def _missing_videos(examples: list[Any]) -> list[str]:
    """Videos the examples name that are not files; ConfigError when none of them is (the
    run would train on nothing). Cheap: one stat per distinct video."""
    videos = sorted({e.video for e in examples})
    missing = [v for v in videos if not (Path(v).is_file() or Path(v).is_dir())]
    if videos and len(missing) == len(videos):
        raise ConfigError(
            f"data.manifests: all {len(videos)} videos are missing (first: {missing[0]}); "
            "check data.video_root and the manifests' video paths"
        )
    gone = set(missing)
    return [e.video for e in examples if e.video in gone]


def _report_rows(load: Any, missing: list[str], examples: list[Any]) -> None:
    """`--check`: every row that cannot be used and every missing video, with file:line."""
    for note in load.notes:
        print(f"note: {note}")
    folders = [e for e in examples if e.video_fps is None and Path(e.video).is_dir()]
    gone = set(missing)
    bad = [
        *(str(p) for p in load.problems),
        *dict.fromkeys(f"{e.origin}: video {e.video} does not exist" for e in examples
                       if e.video in gone),
        *dict.fromkeys(f"{e.origin}: video {e.video} is a frame folder; give video_fps in "
                       "its data entry" for e in folders),
    ]  # fmt: skip
    print(f"rows that cannot be used: {len(bad)}")
    for line in bad:
        print(f"  {line}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        with warnings.catch_warnings():  # restores Python's own format when main returns
            warnings.showwarning = _show_warning
            return _main(args)
    except KeyboardInterrupt:
        print("craft-train: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except Exception as err:  # an unexpected failure: one line, the traceback only with --debug
        if args.debug:
            raise
        print(
            f"craft-train: {type(err).__name__}: {err} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


def _show_warning(message: Warning | str, category: type[Warning], *args: Any, **kw: Any) -> None:
    """A Python warning as the CLI's own line: `craft-train: warning: ...` (no file:line)."""
    kind = "" if category is UserWarning else f"{category.__name__}: "
    print(f"craft-train: warning: {kind}{message}", file=sys.stderr)


def _print_check(cfg: Any, examples: list, load: Any, missing: list) -> None:
    """`--check`'s report: the mixture's counts per source, then every unusable row."""
    from craft_train.data import mixture_summary

    print(f"config ok: stage {cfg.stage}, {len(examples)} examples after the mixture")
    for source, count in sorted(mixture_summary(examples).items()):
        print(f"  {source}: {count}")
    if load is not None:
        _report_rows(load, missing, examples)


def _warn(text: str) -> None:
    """One warning line, as Python warnings are shown (`_show_warning`)."""
    print(f"craft-train: warning: {text}", file=sys.stderr)


def _load_data(cfg: TrainingConfig, check: bool) -> Any:
    """The data files read (`craft_train.data.load_data`); a run warns once about the rows
    left out. None when no row can be used and `--check` has listed them all."""
    from craft_train.data import NoUsableData, load_data

    try:
        load = load_data(cfg)
    except NoUsableData as err:
        if not check:
            raise
        _report_rows(err.load, [], [])
        print(f"craft-train: data: no usable example in the data files (all "
              f"{len(err.load.problems)} rows listed above cannot be used)", file=sys.stderr)  # fmt: skip
        return None
    if not check:
        for note in load.notes:
            _warn(note)
        if load.problems:
            _warn(f"{len(load.problems)} data rows cannot be used and are left out (first: "
                  f"{load.problems[0]}); `craft-train ... --check` lists them")  # fmt: skip
    return load


def _main(args: argparse.Namespace) -> int:
    if args.command == "configs":
        for name in shipped_configs():
            print(name)
        return 0
    stages: dict[str, int | str] = {"stage1": 1, "stage2": 2, "distill": "distill"}
    stage = stages.get(args.command)
    try:
        cfg = _load(args, stage)
        if args.command == "show-config":
            print(dump_config(cfg), end="")
            return 0
        check_paths(cfg)
        from craft_train.distributed import load_deepspeed_config, resolve_deepspeed
        from craft_train.report import check_reporters
        from craft_train.trainer import load_examples

        check_reporters(cfg)  # installed, logged in: before any model loads
        if cfg.train.deepspeed is not None:
            resolve_deepspeed(load_deepspeed_config(cfg.train.deepspeed), cfg)
        load = None
        if cfg.stage == "distill":
            examples = load_examples(cfg)
        else:
            load = _load_data(cfg, args.check)
            if load is None:
                return 2
            examples = load.examples
        missing = _missing_videos(examples)
        if missing:
            _warn(f"{len(missing)} of {len(examples)} examples name a missing video (first: "
                  f"{missing[0]}); training skips them")  # fmt: skip
        if args.check:
            _print_check(cfg, examples, load, missing)
            return 0
    except ConfigError as err:
        print(f"craft-train: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from craft_train.trainer import CheckpointNotSaved, TrainingDiverged, train

    try:
        result = train(cfg, examples=examples)
    except ConfigError as err:  # found only once the run starts (a resume that does not fit)
        print(f"craft-train: {err}", file=sys.stderr)
        return 2
    except (TrainingDiverged, CheckpointNotSaved) as err:
        print(f"craft-train: {err}", file=sys.stderr)
        return 1
    if result.global_step >= result.total_steps:
        print(
            f"craft-train: stage {cfg.stage} done ({result.global_step} steps); merge module "
            f"in {result.output_dir / 'craft'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

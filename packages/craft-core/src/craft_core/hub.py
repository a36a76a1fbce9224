"""Hugging Face Hub support for CRAFT checkpoints: find the files of a folder or a Hub id, and
write the model card.

    compressor = CraftCompressor.from_pretrained("org/craft-qwen2.5-vl-7b", revision="v1.0")
    card = {"base_model": "Qwen/Qwen2.5-VL-7B-Instruct", "ratios": [4, 8, 16]}
    compressor.save_pretrained("out/", model_card_kwargs=card)     # + README.md, the card
    compressor.push_to_hub("org/craft-qwen2.5-vl-7b", model_card_kwargs=card)

`CraftCompressor` inherits huggingface_hub's `PyTorchModelHubMixin`: `push_to_hub` is the
mixin's own upload of the folder `save_pretrained` writes. Files of a Hub id are fetched with
`huggingface_hub.hf_hub_download`, so its cache (`HF_HOME`, `HF_HUB_CACHE`), offline mode
(`HF_HUB_OFFLINE=1`), token (`HF_TOKEN`, `hf auth login`) and revisions (branch, tag, commit)
behave as they do for any transformers model. Nothing here downloads or uploads by itself.

The checkpoint format is unchanged since 0.1: `config.json` (the `CraftConfig`) and
`model.safetensors` (the merge module's weights and W_rand); `README.md` is the card.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import ModelCard, ModelCardData, constants, hf_hub_download
from huggingface_hub.errors import (
    HFValidationError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id
from safetensors.torch import load_file

from craft_core.config import CraftConfig
from craft_core.runtime import split_legacy

__all__ = ["CARD_NAME", "LIBRARY_NAME", "TAGS", "model_card", "resolve_files", "results_rows"]

LIBRARY_NAME = "craft-core"
"""`library_name` of every CRAFT card (the pip package that loads the checkpoint)."""
TAGS = ["craft", "video", "video-token-compression", "token-merging"]
CARD_NAME = "README.md"
REPO_URL = "https://github.com/craft-vlm/craft"
DOCS_URL = "https://github.com/craft-vlm/craft/tree/main/packages/craft-core#readme"


def resolve_files(
    name_or_path: str | Path,
    filenames: Sequence[str],
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | Path | None = None,
    force_download: bool = False,
    local_files_only: bool = False,
) -> tuple[list[Path], str]:
    """Local paths of `filenames` in a checkpoint, and how to name the checkpoint in messages.

    `name_or_path` is a folder when one exists at that path (it wins over a Hub id of the same
    spelling, as in transformers); otherwise a Hub id ("org/name"), whose files come from
    huggingface_hub's cache or are downloaded into it.

    Raises:
        FileNotFoundError: a folder without the files; neither a folder nor a valid Hub id; a
            Hub repo without the files.
        LocalEntryNotFoundError (a FileNotFoundError): the id is not cached and downloads are
            off (`HF_HUB_OFFLINE=1`, `local_files_only=True`) or the Hub is unreachable.
        RepositoryNotFoundError, RevisionNotFoundError: huggingface_hub's own errors, with a
            hint on tokens and revisions appended.
        ValueError: `revision` given with a local folder (a folder has no revisions).
    """
    path = Path(name_or_path)
    if path.is_dir():
        return _folder_files(path, filenames, revision), str(path)
    repo_id = str(name_or_path)
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        hint = ", a file is not a checkpoint: pass its folder" if path.is_file() else ""
        raise FileNotFoundError(
            f"{repo_id} is not a CRAFT checkpoint: no such folder, and not a Hub id "
            f"('org/name'{hint})"
        ) from None
    download = {
        "revision": revision,
        "cache_dir": cache_dir,
        "force_download": force_download,
        "token": token,
        "local_files_only": local_files_only,
    }
    label = repo_id if revision is None else f"{repo_id}@{revision}"
    return [_hub_file(repo_id, name, label, download) for name in filenames], label


def _folder_files(path: Path, filenames: Sequence[str], revision: str | None) -> list[Path]:
    """`filenames` in the local checkpoint folder `path`, all of them present."""
    if revision is not None:
        raise ValueError(f"revision={revision!r} applies to Hub ids, but {path} is a local folder")
    files = [path / name for name in filenames]
    if not all(f.is_file() for f in files):
        raise FileNotFoundError(
            f"{path} is not a CRAFT checkpoint: it needs {' and '.join(filenames)}"
        )
    return files


def _hub_file(repo_id: str, name: str, label: str, download: dict[str, Any]) -> Path:
    """The local path of file `name` of Hub repo `repo_id` (cached or downloaded), with
    huggingface_hub's errors re-worded for a CRAFT checkpoint. `download`: the keywords of
    `hf_hub_download` (revision, cache_dir, force_download, token, local_files_only)."""
    try:
        return Path(hf_hub_download(repo_id, name, **download))
    except LocalEntryNotFoundError as error:
        raise LocalEntryNotFoundError(_not_cached(repo_id, name, download)) from error
    except RemoteEntryNotFoundError as error:
        raise FileNotFoundError(
            f"Hub repo {label} is not a CRAFT checkpoint: it has no {name}"
        ) from error
    except (RepositoryNotFoundError, RevisionNotFoundError) as error:
        error.append_to_message(
            f"\nCRAFT checkpoint {label!r}: no local folder of that name either. For a "
            "private or gated repo pass token= (or run `hf auth login`); check revision=."
        )
        raise


def _not_cached(repo_id: str, filename: str, download: dict[str, Any]) -> str:
    """huggingface_hub's cache-miss error, re-worded: which id, which switch kept it offline."""
    revision, cache_dir = download["revision"], download["cache_dir"]
    if constants.is_offline_mode():
        why = "HF_HUB_OFFLINE=1 is set, so nothing is downloaded"
        fix = "unset HF_HUB_OFFLINE (or download it once online)"
    elif download["local_files_only"]:
        why = "local_files_only=True, so nothing is downloaded"
        fix = "pass local_files_only=False"
    else:
        why = "the Hub could not be reached"
        fix = "check the network"
    cache = cache_dir if cache_dir is not None else constants.HF_HUB_CACHE
    at = "" if revision is None else f" at revision {revision!r}"
    return (
        f"CRAFT checkpoint {repo_id!r}{at}: {filename} is not in the Hugging Face cache "
        f"({cache}) and {why}. To fetch it, {fix}, e.g. `hf download {repo_id}`; there is no "
        f"local folder named {repo_id!r} either."
    )


def results_rows(table: str) -> list[dict[str, str]]:
    """Rows of the first markdown pipe table in `table` (e.g. craft-eval's `results_table`),
    as {column: cell} dicts for the card's metadata."""
    lines = [line.strip() for line in table.splitlines()]
    rows = [line for line in lines if line.startswith("|") and line.endswith("|")]
    if not rows:
        return []
    cells = [[c.strip() for c in row[1:-1].split("|")] for row in rows]
    header, body = cells[0], [c for c in cells[1:] if not all(set(x) <= set("-: ") for x in c)]
    return [dict(zip(header, row)) for row in body]


def model_card(
    config: CraftConfig,
    *,
    base_model: str | None = None,
    ratios: Sequence[float] | None = None,
    recipe: Mapping[str, Any] | None = None,
    results: str | None = None,
    datasets: Sequence[str] | None = None,
    title: str | None = None,
    repo_id: str | None = None,
    **extra: Any,
) -> ModelCard:
    """The card (README.md) of a CRAFT checkpoint: YAML metadata, then a short body.

    Args:
        config: the checkpoint's `CraftConfig` (gives `hidden_size`).
        base_model: Hub id of the VLM backbone the module was trained for.
        ratios: compression ratios it was trained on (`budget.ratios` of craft-train).
        recipe: the training recipe (stage, steps, lr, data, ...): any JSON-able mapping.
        results: a markdown table of measured results (craft-eval's `results_table`); kept
            in the body, and its rows in the metadata as `measured_results`.
        datasets: Hub ids of the training data.
        title: the card's heading (default: "CRAFT merge module for <base_model>").
        repo_id: the Hub id the card's loading example names.
        extra: more metadata keys (e.g. `license`), written as given.
    """
    rows = results_rows(results) if results else []
    data = ModelCardData(
        library_name=LIBRARY_NAME,
        license=extra.pop("license", "apache-2.0"),
        tags=[*TAGS, "model_hub_mixin", "pytorch_model_hub_mixin"],
        base_model=base_model,
        base_model_relation="adapter" if base_model else None,
        datasets=list(datasets) if datasets else None,
        hidden_size=config.hidden_size,
        ratios_trained=[float(r) for r in ratios] if ratios is not None else None,
        training_recipe=dict(recipe) if recipe is not None else None,
        measured_results=rows or None,
        **extra,
    )
    heading = title or (
        f"CRAFT merge module for {base_model}" if base_model else "CRAFT merge module"
    )
    lines = ["---", data.to_yaml(), "---", "", f"# {heading}", ""]
    lines += _card_usage(config, repo_id) + _card_training(ratios, recipe, results)
    lines += [f"Documentation: {DOCS_URL}", ""]
    return ModelCard("\n".join(lines))


def _card_usage(config: CraftConfig, repo_id: str | None) -> list[str]:
    """The card's first paragraph and loading example (lines)."""
    return [
        "A [CRAFT](" + REPO_URL + ") video-token compressor: it merges a video's visual tokens "
        f"(width D = {config.hidden_size}) before they reach the language model.",
        "",
        "```python",
        "from craft_core import CraftCompressor",
        f'compressor = CraftCompressor.from_pretrained("{repo_id or "<this repo id>"}")',
        "out = compressor(features, coords, ratio=8.0)  # features [N, D], coords [N, 3] (t, h, w)",
        "```",
        "",
    ]


def _card_training(
    ratios: Sequence[float] | None, recipe: Mapping[str, Any] | None, results: str | None
) -> list[str]:
    """The card's sections on how the module was trained and what it measured (lines; none
    for what was not given)."""
    lines: list[str] = []
    if ratios is not None:
        lines += ["Trained at ratios: " + ", ".join(f"{float(r):g}x" for r in ratios) + ".", ""]
    if recipe:
        lines += ["## Training recipe", ""]
        lines += [f"- {key}: {value}" for key, value in recipe.items()] + [""]
    if results:
        lines += ["## Measured results", "", results.strip(), ""]
    return lines


def is_craft_card(path: Path) -> bool:
    """Whether `path` is a card this library wrote (safe to refresh on the next save)."""
    if not path.is_file():
        return False
    try:
        return ModelCard.load(path).data.to_dict().get("library_name") == LIBRARY_NAME
    except Exception:  # an unreadable README is the user's: leave it alone
        return False


def check_state(
    expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor], folder: Any, weights: Any
) -> None:
    """A checkpoint's tensors against the module its config builds: the same names and
    shapes, every value finite; a ValueError naming the checkpoint otherwise."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(k for k in expected if k in state and state[k].shape != expected[k].shape)
    if missing or unexpected or wrong:
        raise ValueError(
            f"checkpoint {folder} does not match its config: missing {missing}, "
            f"unexpected {unexpected}, wrong shapes {wrong}"
        )
    bad = sorted(k for k, v in state.items() if not bool(torch.isfinite(v).all()))
    if bad:
        raise ValueError(f"checkpoint {weights} holds NaN or inf values in {bad}")


def read_checkpoint(config_file: Path, weights_file: Path) -> tuple[CraftConfig, dict[str, Any]]:
    """The config (legacy run options split off, with their warning) and the weights of a
    checkpoint; ValueError naming the file that cannot be read."""
    try:
        fields = json.loads(config_file.read_text())
        if isinstance(fields, dict):
            fields = split_legacy(fields, config_file)
        config = CraftConfig.model_validate(fields)
    except (ValueError, UnicodeDecodeError) as error:  # JSON or a field out of range
        raise ValueError(f"{config_file} is not a valid CRAFT config: {error}") from None
    try:
        state = load_file(str(weights_file))
    except Exception as error:  # safetensors raises its own error types
        raise ValueError(f"{weights_file} is not a readable safetensors file: {error}") from None
    return config, state

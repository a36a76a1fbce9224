"""Hub ids, huggingface_hub's cache and offline mode, model cards, and the unchanged file format.

No network: a Hub id is served from a cache folder built here in huggingface_hub's own layout
(`models--org--name/{blobs,refs,snapshots}`, checked by `scan_cache_dir`), in offline mode.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2 as httpx  # huggingface_hub 2.x builds its errors on httpx2
import pytest
import torch
from huggingface_hub import ModelCard, PyTorchModelHubMixin, constants, scan_cache_dir
from huggingface_hub.errors import (
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
)
from safetensors.torch import save_file

from craft_core import CraftCompressor, CraftConfig
from craft_core.hub import results_rows

REPO = "craft-test/craft-tiny"
COMMIT = "a" * 39 + "1"
OTHER_COMMIT = "b" * 39 + "2"


def trained(hidden_size: int = 32, seed: int = 1) -> CraftCompressor:
    """A compressor whose weights are not the init (so a load that re-inits would differ)."""
    module = CraftCompressor(CraftConfig(hidden_size=hidden_size, rank=16, rope_sections=(2, 3, 3)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return module


def save_03(module: CraftCompressor, folder: Path) -> None:
    """The 0.1-0.3 `save_pretrained`, verbatim: the format old checkpoints are in."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(module.config.model_dump_json(indent=2) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def populate_cache(
    cache: Path, repo_id: str, folder: Path, commit: str, refs: tuple[str, ...] = ("main",)
) -> None:
    """Put `folder`'s files into a huggingface_hub cache as a download of `commit` would:
    blobs named by content hash, snapshot entries as relative symlinks, refs naming the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for file in sorted(folder.iterdir()):
        blob = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, repo / "blobs" / blob)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / blob)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)


def same_bits(a: CraftCompressor, b: CraftCompressor) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(
        sa[k].dtype == sb[k].dtype and sa[k].view(torch.uint8).equal(sb[k].view(torch.uint8))
        for k in sa
    )


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline cache holding REPO at two commits: main (and tag v1) and `old`."""
    cache = tmp_path / "hub"
    save_03(trained(seed=1), tmp_path / "v1")
    save_03(trained(seed=2), tmp_path / "v0")
    populate_cache(cache, REPO, tmp_path / "v1", COMMIT, refs=("main", "v1"))
    populate_cache(cache, REPO, tmp_path / "v0", OTHER_COMMIT, refs=("old",))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_cache_layout_is_huggingface_hubs_own(cache: Path) -> None:
    info = scan_cache_dir(cache)
    assert not info.warnings
    (repo,) = info.repos
    assert repo.repo_id == REPO and repo.repo_type == "model"
    assert {r.commit_hash for r in repo.revisions} == {COMMIT, OTHER_COMMIT}
    assert {ref for r in repo.revisions for ref in r.refs} == {"main", "v1", "old"}


def test_hub_id_loads_from_the_cache_offline_bit_identical(cache: Path, tmp_path: Path) -> None:
    expected_v1 = CraftCompressor.from_pretrained(tmp_path / "v1")
    expected_v0 = CraftCompressor.from_pretrained(tmp_path / "v0")
    assert not same_bits(expected_v1, expected_v0)  # the revisions are told apart
    for revision, expected in [
        (None, expected_v1),
        ("main", expected_v1),
        ("v1", expected_v1),
        (COMMIT, expected_v1),
        ("old", expected_v0),
        (OTHER_COMMIT, expected_v0),
    ]:
        loaded = CraftCompressor.from_pretrained(REPO, revision=revision, cache_dir=cache)
        assert loaded.config == expected.config
        assert same_bits(loaded, expected), revision
    with pytest.raises(ValueError, match="hidden_size 32, but hidden_size 64"):
        CraftCompressor.from_pretrained(REPO, cache_dir=cache, hidden_size=64)


def test_uncached_id_names_the_id_and_the_offline_flag(cache: Path) -> None:
    with pytest.raises(LocalEntryNotFoundError) as caught:
        CraftCompressor.from_pretrained("craft-test/not-cached", cache_dir=cache)
    message = str(caught.value)
    assert "'craft-test/not-cached'" in message and "HF_HUB_OFFLINE=1" in message
    assert str(cache) in message and "hf download craft-test/not-cached" in message
    assert isinstance(caught.value.__cause__, LocalEntryNotFoundError)  # hf's own, chained
    with pytest.raises(LocalEntryNotFoundError, match=r"at revision 'v9'.*HF_HUB_OFFLINE=1"):
        CraftCompressor.from_pretrained(REPO, revision="v9", cache_dir=cache)


def test_local_files_only_is_named_when_online(cache: Path, monkeypatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(LocalEntryNotFoundError, match="local_files_only=True"):
        CraftCompressor.from_pretrained("craft-test/x", cache_dir=cache, local_files_only=True)
    loaded = CraftCompressor.from_pretrained(REPO, cache_dir=cache, local_files_only=True)
    assert loaded.config.hidden_size == 32


def test_folders_ids_and_bad_names(tmp_path: Path, monkeypatch) -> None:
    save_03(trained(), tmp_path / "ckpt")
    with pytest.raises(ValueError, match="revision='v1' applies to Hub ids"):
        CraftCompressor.from_pretrained(tmp_path / "ckpt", revision="v1")
    with pytest.raises(FileNotFoundError, match="not a Hub id"):
        CraftCompressor.from_pretrained(tmp_path / "missing" / "ckpt")
    with pytest.raises(FileNotFoundError, match="a file is not a checkpoint"):
        CraftCompressor.from_pretrained(tmp_path / "ckpt" / "model.safetensors")
    # A folder wins over a Hub id of the same spelling (nothing is looked up).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    shutil.copytree(tmp_path / "ckpt", tmp_path / "org" / "name")
    assert CraftCompressor.from_pretrained("org/name").config.hidden_size == 32


def _http_error(cls: type, message: str) -> Exception:
    request = httpx.Request("GET", "https://huggingface.co/api/models/x")
    return cls(message, response=httpx.Response(404, request=request))


def test_remote_errors_are_huggingface_hubs_own_with_a_hint(monkeypatch) -> None:
    """What the Hub answers is hf's to word (no fake server: its errors are raised here)."""
    import craft_core.hub as hub

    def missing_repo(*args: Any, **kwargs: Any) -> str:
        raise _http_error(RepositoryNotFoundError, "404 Repository Not Found for org/gone.")

    monkeypatch.setattr(hub, "hf_hub_download", missing_repo)
    with pytest.raises(RepositoryNotFoundError, match=r"(?s)org/gone.*pass token="):
        CraftCompressor.from_pretrained("org/gone")

    def no_weights(repo_id: str, filename: str, **kwargs: Any) -> str:
        raise _http_error(RemoteEntryNotFoundError, f"404 {filename}")

    monkeypatch.setattr(hub, "hf_hub_download", no_weights)
    with pytest.raises(FileNotFoundError, match="Hub repo org/other@v2 is not a CRAFT checkpoint"):
        CraftCompressor.from_pretrained("org/other", revision="v2")


def test_offline_env_var_and_hf_home_in_a_fresh_process(tmp_path: Path) -> None:
    """The real switches, read by huggingface_hub at import: HF_HOME and HF_HUB_OFFLINE=1."""
    module = trained(seed=5)
    module.save_pretrained(tmp_path / "ckpt")
    populate_cache(tmp_path / "hf_home" / "hub", REPO, tmp_path / "ckpt", COMMIT)
    script = (
        "import json, sys\n"
        "from craft_core import CraftCompressor\n"
        "from safetensors.torch import save_file\n"
        f"m = CraftCompressor.from_pretrained({REPO!r})\n"
        "save_file(m.state_dict(), sys.argv[1])\n"
        "try:\n"
        "    CraftCompressor.from_pretrained('craft-test/absent')\n"
        "except Exception as e:\n"
        "    print(json.dumps([type(e).__name__, str(e)]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "loaded.safetensors")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    name, message = json.loads(out.stdout.strip().splitlines()[-1])
    assert name == "LocalEntryNotFoundError"
    assert "'craft-test/absent'" in message and "HF_HUB_OFFLINE=1" in message
    assert str(tmp_path / "hf_home" / "hub") in message
    from safetensors.torch import load_file

    loaded = load_file(tmp_path / "loaded.safetensors")
    state = module.state_dict()
    assert loaded.keys() == state.keys()
    assert all(loaded[k].view(torch.uint8).equal(state[k].view(torch.uint8)) for k in state)


TABLE = (
    "| method | mvbench | videomme | avg | Comp. | retention |\n"
    "| --- | --- | --- | --- | --- | --- |\n"
    "| none | 60.2 | 55.0 | 57.6 | - | - |\n"
    "| craft 8x | 58.9 | 54.1 | 56.5 | 8.0x | 98.1% |\n\n"
    "Protocols: mvbench: mc (lmms-eval)."
)
CARD = {
    "base_model": "Qwen/Qwen2.5-VL-7B-Instruct",
    "ratios": [4, 8, 16],
    "recipe": {"stage": 2, "steps": 1200, "lr": 1e-4, "data": ["llava-video-178k"]},
    "results": TABLE,
    "repo_id": "craft-test/craft-qwen",
}


def test_card_parses_back_with_modelcard(tmp_path: Path) -> None:
    module = trained(hidden_size=48)
    module.save_pretrained(tmp_path / "out", model_card_kwargs=CARD)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    card = ModelCard.load(tmp_path / "out" / "README.md")
    meta = card.data.to_dict()
    assert meta["library_name"] == "craft-core" and meta["license"] == "apache-2.0"
    assert meta["base_model"] == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert meta["hidden_size"] == 48
    assert meta["ratios_trained"] == [4.0, 8.0, 16.0]
    assert meta["training_recipe"] == CARD["recipe"]
    assert meta["measured_results"] == [
        {"method": "none", "mvbench": "60.2", "videomme": "55.0", "avg": "57.6", "Comp.": "-",
         "retention": "-"},
        {"method": "craft 8x", "mvbench": "58.9", "videomme": "54.1", "avg": "56.5",
         "Comp.": "8.0x", "retention": "98.1%"},
    ]  # fmt: skip
    assert {"craft", "pytorch_model_hub_mixin"} <= set(meta["tags"])
    assert TABLE.split("\n\n")[0] in card.text
    assert 'from_pretrained("craft-test/craft-qwen")' in card.text
    loaded = CraftCompressor.from_pretrained(tmp_path / "out")
    assert same_bits(loaded, module)


def test_results_rows_reads_a_pipe_table() -> None:
    assert results_rows("no table") == []
    assert results_rows("| a | b |\n|:--|--:|\n| 1 | 2 |") == [{"a": "1", "b": "2"}]


def test_card_is_refreshed_but_a_users_readme_is_kept(tmp_path: Path) -> None:
    module = trained()
    module.save_pretrained(tmp_path / "a", model_card_kwargs={"ratios": [4]})
    module.save_pretrained(tmp_path / "a", model_card_kwargs={"ratios": [8]})
    assert ModelCard.load(tmp_path / "a" / "README.md").data.to_dict()["ratios_trained"] == [8.0]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "README.md").write_text("# my notes\n")
    module.save_pretrained(tmp_path / "b", model_card_kwargs={"ratios": [8]})
    assert (tmp_path / "b" / "README.md").read_text() == "# my notes\n"


def test_files_are_the_03_format_byte_for_byte(tmp_path: Path) -> None:
    """Old checkpoints load bit-identically, and new ones are the same bytes as old ones."""
    module = trained(seed=7)
    save_03(module, tmp_path / "old")
    module.save_pretrained(tmp_path / "new")
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "old" / name).read_bytes() == (tmp_path / "new" / name).read_bytes()
    assert same_bits(CraftCompressor.from_pretrained(tmp_path / "old"), module)


def test_push_to_hub_uploads_the_saved_folder(tmp_path: Path, monkeypatch) -> None:
    """push_to_hub is huggingface_hub's: it uploads what save_pretrained writes (HfApi recorded
    here instead of reaching the Hub)."""
    import huggingface_hub.hub_mixin as hub_mixin

    assert CraftCompressor.push_to_hub is PyTorchModelHubMixin.push_to_hub
    uploaded: dict[str, Any] = {}

    class RecordingApi:
        def __init__(self, token: Any = None) -> None:
            pass

        def create_repo(self, repo_id: str, **kwargs: Any) -> Any:
            return type("Url", (), {"repo_id": repo_id})()

        def upload_folder(self, repo_id: str, folder_path: Path, **kwargs: Any) -> str:
            uploaded.update(
                repo=repo_id, files={p.name: p.read_bytes() for p in Path(folder_path).iterdir()}
            )
            return "commit-url"

    monkeypatch.setattr(hub_mixin, "HfApi", RecordingApi)
    module = trained()
    assert module.push_to_hub(CARD["repo_id"], model_card_kwargs=CARD) == "commit-url"
    module.save_pretrained(tmp_path / "saved", model_card_kwargs=CARD)
    assert uploaded["repo"] == CARD["repo_id"]
    assert uploaded["files"] == {p.name: p.read_bytes() for p in (tmp_path / "saved").iterdir()}

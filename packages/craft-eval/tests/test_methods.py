"""The methods registry and the methods of this package (CRAFT family, random, uniform)."""

from __future__ import annotations

import pytest
import torch

import craft_eval.methods as methods
from craft_core import TokenBudget
from craft_eval.methods import get_method, list_methods, register_method
from craft_eval.methods.registry import unregister_method


def _tokens(n: int = 97, d: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(n, d, generator=g)
    t = torch.arange(n) // 16
    coords = torch.stack([t, (torch.arange(n) % 16) // 4, torch.arange(n) % 4], dim=1)
    return feats, coords


def test_registry_lists_this_issues_methods() -> None:
    names = {m.name for m in list_methods()}
    assert {"craft", "craft-selection", "craft-prune", "random", "uniform"} <= names
    info = {m.name: m for m in list_methods()}
    assert info["craft"].needs == ("checkpoint",)
    assert info["uniform"].kind == "prune"
    assert [m.name for m in list_methods()] == sorted(names)


def test_register_get_and_errors() -> None:
    @register_method("test-identity", kind="none", needs=(), description="keeps everything")
    def build(**_: object) -> object:
        return lambda features, coords, **kw: (features, coords)

    try:
        assert callable(get_method("test-identity"))
        register_method("test-identity", kind="none", description="same factory again")(build)
        with pytest.raises(ValueError, match="already registered"):
            register_method("test-identity", kind="none", description="x")(lambda: None)
    finally:
        unregister_method("test-identity")
    with pytest.raises(KeyError, match="registered methods"):
        get_method("test-identity")
    with pytest.raises(ValueError, match="kind"):
        register_method("x", kind="squash", description="")


@pytest.mark.parametrize("name", ["random", "uniform"])
@pytest.mark.parametrize(("n", "ratio"), [(97, 8.0), (100, 3.0), (5, 2.0), (1, 4.0), (64, 1.0)])
def test_sanity_methods_are_budget_exact(name: str, n: int, ratio: float) -> None:
    feats, coords = _tokens(n)
    out = get_method(name)(feats, coords, ratio=ratio)
    expected = max(1, int(n // ratio))
    assert out.num_kept == expected
    assert torch.equal(out.kept_index, out.kept_index.sort().values)
    assert len(set(out.kept_index.tolist())) == expected
    assert torch.equal(out.features, feats[out.kept_index])
    assert torch.equal(out.coords, coords[out.kept_index])
    assert out.assignment.shape == (n,)
    assert torch.equal(out.assignment[out.kept_index], torch.arange(expected))


def test_random_is_seeded_per_call_and_uniform_is_strided() -> None:
    feats, coords = _tokens(80)
    a = get_method("random", seed=3)(feats, coords, ratio=4.0)
    b = get_method("random", seed=3)(feats, coords, ratio=4.0)
    c = get_method("random", seed=4)(feats, coords, ratio=4.0)
    assert torch.equal(a.kept_index, b.kept_index) and not torch.equal(a.kept_index, c.kept_index)
    u = get_method("uniform")(feats, coords, ratio=8.0)
    assert u.kept_index.tolist() == [4, 12, 20, 28, 36, 44, 52, 60, 68, 76]


def test_sanity_methods_reject_threshold_and_bad_input() -> None:
    feats, coords = _tokens(20)
    with pytest.raises(ValueError, match="no threshold mode"):
        get_method("uniform")(feats, coords, threshold=0.9)
    with pytest.raises(ValueError, match="ratio"):
        get_method("random")(feats, coords, ratio=0.5)
    with pytest.raises(TypeError, match="coords"):
        get_method("uniform")(feats, coords.float(), ratio=2.0)


def test_nearest_kept_assignment() -> None:
    kept = torch.tensor([2, 7])
    assert methods.nearest_kept_assignment(10, kept).tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("name", ["craft", "craft-selection", "craft-prune"])
def test_craft_family_budget_exact_and_lazy(name: str) -> None:
    feats, coords = _tokens(97, d=16)
    method = get_method(name)
    out = method(feats, coords, ratio=8.0)
    assert out.num_kept == 97 // 8
    assert out.info["method"] == name
    assert method.hidden_size == 16


def test_a_fresh_craft_module_does_not_depend_on_what_ran_before() -> None:
    """The untrained `craft` row of a table must not move with the order of the methods: a
    fresh module is the same bits after the global generator was used, and a module of
    another `seed` is not."""
    torch.manual_seed(1)
    first = get_method("craft", hidden_size=16).module.state_dict()
    torch.rand(1000)
    again = get_method("craft", hidden_size=16).module.state_dict()
    other = get_method("craft", hidden_size=16, seed=1).module.state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)


def test_craft_variants_configure_the_module() -> None:
    sel = get_method("craft-selection", hidden_size=16)
    prune = get_method("craft-prune", hidden_size=16)
    assert sel.module.config.weighting == "uniform" and sel.module.config.reduce == "mean"
    assert prune.module.config.reduce == "target"
    feats, coords = _tokens(64, d=16)
    out = prune(feats, coords, ratio=4.0)
    assert torch.allclose(out.features, feats[out.kept_index])  # target pruning keeps rows


def test_craft_from_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from craft_core import CraftCompressor, CraftConfig

    module = CraftCompressor(CraftConfig(hidden_size=16))
    module.save_pretrained(tmp_path / "ckpt")
    method = get_method("craft", checkpoint=tmp_path / "ckpt")
    assert method.hidden_size == 16
    feats, coords = _tokens(50, d=16)
    expected = module(feats, coords, ratio=5.0)
    got = method(feats, coords, ratio=5.0)
    assert torch.allclose(got.features, expected.features)
    assert got.info["checkpoint"] == str(tmp_path / "ckpt")


def test_craft_run_options_reach_the_compressor(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # craft-core's run options (precision, sim_block, ...) are method options too: on a
    # fresh module and on a checkpoint, never written into the config.
    from craft_core import CraftCompressor, CraftConfig

    fresh = get_method("craft", hidden_size=16, precision="fast", sim_block=64)
    assert fresh.module.options.precision == "fast" and fresh.module.options.sim_block == 64
    CraftCompressor(CraftConfig(hidden_size=16)).save_pretrained(tmp_path / "ckpt")
    loaded = get_method("craft", checkpoint=tmp_path / "ckpt", precision="fast", seed=3)
    assert loaded.module.options.precision == "fast" and loaded.module.config.seed == 3
    with pytest.raises(ValueError, match="precision"):
        get_method("craft", hidden_size=16, precision="half")


def test_every_method_names_its_saliency_source(capsys: pytest.CaptureFixture[str]) -> None:
    """`craft-eval methods` says, for each method, what ranks its tokens; the attention
    methods build compressors that ask craft-adapters for the vision tower's attention."""
    import craft_eval.baselines  # noqa: F401  (registers the baselines)
    from craft_eval.cli import main

    info = {m.name: m for m in list_methods()}
    for name in ("visionzip", "fastvid"):
        assert info[name].saliency.startswith("attention")
        assert get_method(name).needs_attention is True
    for name in ("tome", "divprune", "llava-scissor", "dtd", "vidcom2", "craft"):
        assert info[name].saliency.startswith("token features")
        assert getattr(get_method(name), "needs_attention", False) is False
    assert info["random"].saliency == info["uniform"].saliency == "none"
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert out.count("saliency: ") == len(info)
    assert "saliency: attention" in out


@pytest.mark.parametrize("name", ["visionzip", "fastvid"])
def test_attention_methods_record_the_source_that_ran(name: str) -> None:
    feats, coords = _tokens(n=96, d=16)
    method = get_method(name)
    attention = torch.rand(96, generator=torch.Generator().manual_seed(3))
    given = method(feats, coords, ratio=4.0, attention=attention)
    fallback = method(feats, coords, ratio=4.0)
    assert given.info["importance"] == "attention"
    assert fallback.info["importance"] == "l2_norm"
    # the L2 proxy is exactly what ran without attention
    proxy = method(feats, coords, ratio=4.0, importance=feats.norm(dim=-1))
    assert torch.equal(proxy.kept_index, fallback.kept_index)
    assert not torch.equal(given.kept_index, fallback.kept_index)


def test_craft_checkpoint_by_hub_id_offline(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`checkpoint=org/name[@rev]` is resolved by huggingface_hub (offline, from its cache);
    an uncached id fails naming the id, a missing folder or a file is refused before loading."""
    from huggingface_hub import constants

    from craft_core import CraftCompressor, CraftConfig
    from craft_eval.methods.build import build_compressor

    module = CraftCompressor(CraftConfig(hidden_size=16))
    commit = "c" * 40
    snapshot = tmp_path / "hub" / "models--org--tiny-craft" / "snapshots" / commit
    module.save_pretrained(snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "v1").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # no local folder named "org/..."

    feats, coords = _tokens(50, d=16)
    got = build_compressor("craft", {"checkpoint": "org/tiny-craft@v1"})
    assert got is not None
    assert torch.equal(
        got(feats, coords, TokenBudget(ratio=5.0)).features,  # built: the budget object
        module(feats, coords, ratio=5.0).features,  # CRAFT's user call: the keywords
    )
    with pytest.raises(ValueError, match=r"org/tiny-craft@nope.*cannot be loaded"):
        build_compressor("craft", {"checkpoint": "org/tiny-craft@nope"})
    with pytest.raises(ValueError, match=r"org/other.*cannot be loaded.*HF_HUB_OFFLINE"):
        build_compressor("craft", {"checkpoint": "org/other"})
    (tmp_path / "weights.bin").write_bytes(b"x")
    for bad in ("weights.bin", "runs/a/b", "/no/such/folder"):
        with pytest.raises(ValueError, match="no such folder, and not a Hub id"):
            build_compressor("craft", {"checkpoint": bad})

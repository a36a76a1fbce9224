"""Efficiency (the paper's Table 2): prefill latency, KV-cache size, analytical FLOPs.

`measure_efficiency` builds the LANGUAGE MODEL of a real-size architecture from its public
config values (shipped by each backbone's home in craft-adapters,
`craft_adapters/backbones/archs/*.json`, found through its registry) with random weights (nothing is
downloaded), compresses random video tokens of the right count with each method, and times
the prefill of text + surviving video tokens. The vision tower is left out: compression
acts after it, so its cost is the same for every method.

FLOPs (prefill, multiply-add = 2 FLOPs, `L` = text + video tokens that reach the LLM,
`d` hidden, `m` MLP width, `h`/`g` query/KV heads of width `e`, `V` vocabulary):

    full-attention layer : 2 L d (h e (1 + gate) + 2 g e) + 4 L^2 h e + 2 L h e d + 6 L d m
    Gated-DeltaNet layer : 2 L d (2 hk dk + 2 hv dv + 2 hv) + 2 L K (2 hk dk + hv dv)
                           + 6 L hv dk dv + 2 L hv dv d + 6 L d m
    LM head              : 2 d V (last token only, as generate() does)

`gate` = 1 for Qwen3.5's gated attention output, else 0; `hk, hv, dk, dv, K`: linear-attention
key/value heads, their widths and the conv kernel. The attention term counts the full L x L
products (as FastV/VisionZip count them). FLOPs reduction = 1 - F(L_compressed) / F(L_full).
Qwen3.5's linear-attention layers are linear in L and hold a fixed-size state, so only its
full-attention layers (1 in 4) carry the quadratic term and a KV cache that grows with L.

A two-stage method (`flashvid-llm`, `holitom-llm`) is timed WITH its stage inside the LM:
craft-adapters' `InModelDrop` hooks the bare language model (the video rows first in the
prompt, then the text, the question's last token last), so the prefill runs layers before
L on every row, scores the rows in layer L - 1, and runs the later layers, and fills their
KV cache, on the kept rows; FLOPs and the analytical KV count the same split.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


def load_arch(name: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The shipped config of `name` (a key or alias of
    `craft_adapters.registry.reference_archs()`), with text-config `overrides` applied."""
    from craft_adapters.registry import load_reference_arch

    arch = load_reference_arch(name)
    if overrides:
        _check_overrides(name, arch["text_config"], overrides)
        arch["text_config"] = {**arch["text_config"], **overrides}
        if "num_hidden_layers" in overrides and "layer_types" not in overrides:
            arch["text_config"].pop("layer_types", None)
        arch["_overrides"] = dict(overrides)
    _fit_mrope(arch["text_config"])
    arch["text_config"] = flops_config(arch["text_config"], arch["model_type"])
    return arch


def flops_config(text_config: dict[str, Any], model_type: str) -> dict[str, Any]:
    """`text_config` with what the FLOPs count needs from the backbone's adapter besides the
    config's own values: `attn_output_gate` (an attention whose output is gated has a query
    projection twice as wide; `BackboneAdapter.attention_output_gate`)."""
    from craft_adapters.registry import adapter_class

    gate = adapter_class(model_type).attention_output_gate
    return {"attn_output_gate": gate, **text_config}


# Keys an override may add although the shipped text config leaves them to their defaults.
_EXTRA_OVERRIDES = {"head_dim": int, "layer_types": list}


def _check_overrides(name: str, text: dict[str, Any], overrides: dict[str, Any]) -> None:
    """ValueError naming the override whose key the architecture's text config lacks, or
    whose value has another type than the shipped one (an int field takes no bool or text)."""
    for key, value in overrides.items():
        if key not in text and key not in _EXTRA_OVERRIDES:
            known = ", ".join(sorted({*text, *_EXTRA_OVERRIDES}))
            raise ValueError(f"--override {key}: not a text-config field of {name}; known: {known}")
        want = type(text[key]) if key in text else _EXTRA_OVERRIDES[key]
        ok = isinstance(value, want) and not (isinstance(value, bool) and want is not bool)
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            ok = math.isfinite(value)
        if want is float and isinstance(value, float):
            ok = math.isfinite(value)
        if not ok:
            raise ValueError(f"--override {key}={value!r}: expected {want.__name__}")
        if want is int and value < 1:
            raise ValueError(f"--override {key}={value!r}: must be a positive integer")


def _fit_mrope(text_config: dict[str, Any]) -> None:
    """Rescale `mrope_section` to the rotary width when an override changed the head size."""
    rope = text_config.get("rope_parameters") or {}
    sections = rope.get("mrope_section")
    if not sections:
        return
    heads = int(text_config["num_attention_heads"])
    head_dim = int(text_config.get("head_dim") or int(text_config["hidden_size"]) // heads)
    half = int(head_dim * float(rope.get("partial_rotary_factor", 1.0))) // 2
    if sum(sections) == half:
        return
    scaled = [max(1, s * half // sum(sections)) for s in sections]
    scaled[0] += half - sum(scaled)
    text_config["rope_parameters"] = {**rope, "mrope_section": scaled}


def parse_overrides(text: str | None) -> dict[str, Any]:
    """ "hidden_size=64,num_hidden_layers=4" -> {"hidden_size": 64, "num_hidden_layers": 4}.

    ValueError naming `--override` for a token that is not KEY=VALUE (the keys and value
    types are checked against the architecture by `load_arch`)."""
    out: dict[str, Any] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--override {part.strip()!r}: expected KEY=VALUE[,KEY=VALUE...]")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value.strip()
    return out


def layer_types(text_config: dict[str, Any]) -> list[str]:
    n = int(text_config["num_hidden_layers"])
    if text_config.get("layer_types"):
        return list(text_config["layer_types"])
    interval = text_config.get("full_attention_interval")  # hybrid: linear attention between
    if interval:
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
        ]
    return ["full_attention"] * n


def video_tokens(arch: dict[str, Any], num_frames: int) -> int:
    """Video tokens the backbone makes for `num_frames` frames at its `_video` frame size."""
    video = arch["_video"]
    if "tokens_per_frame" in video:
        return num_frames * int(video["tokens_per_frame"]) + int(video["extra_tokens_per_video"])
    grid = int(video["frame_size"]) // int(video["patch_size"]) // int(video["spatial_merge_size"])
    groups = -(-num_frames // int(video["temporal_patch_size"]))
    return groups * grid * grid + int(video["extra_tokens_per_video"])


def video_grid(arch: dict[str, Any], num_frames: int) -> tuple[int, int, int]:
    """(t, h, w) extent of the video tokens (newline token of LLaVA-OV left out)."""
    video = arch["_video"]
    if "tokens_per_frame" in video:
        side = round(int(video["tokens_per_frame"]) ** 0.5)
        return num_frames, side, side
    grid = int(video["frame_size"]) // int(video["patch_size"]) // int(video["spatial_merge_size"])
    return -(-num_frames // int(video["temporal_patch_size"])), grid, grid


def prefill_flops(
    text_config: dict[str, Any], seq_len: int, drop: tuple[int, int] | None = None
) -> float:
    """Analytical prefill FLOPs of the language model for `seq_len` tokens (module
    docstring). `drop = (layer, kept_len)`: a stage inside the model (FlashVID, HoliTom):
    layers before `layer` run on all `seq_len` tokens, the others on `kept_len`, plus the
    score (the last query against every key of layer `layer - 1`, `2 L h e`)."""
    c = text_config
    d = int(c["hidden_size"])
    total = 0.0
    for index, kind in enumerate(layer_types(c)):
        length = seq_len if drop is None or index < drop[0] else drop[1]
        total += _layer_flops(c, kind, float(length))
    if drop is not None:
        h = int(c["num_attention_heads"])
        total += 2 * seq_len * h * int(c.get("head_dim") or d // h)
    return total + 2 * d * int(c["vocab_size"])


def _layer_flops(c: dict[str, Any], kind: str, L: float) -> float:
    """One layer's prefill FLOPs for `L` tokens (module docstring)."""
    d, m = int(c["hidden_size"]), int(c["intermediate_size"])
    h, g = int(c["num_attention_heads"]), int(c["num_key_value_heads"])
    e = int(c.get("head_dim") or d // h)
    mlp = 6 * L * d * m
    if kind == "linear_attention":
        hk, hv = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
        dk, dv = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
        k = int(c.get("linear_conv_kernel_dim", 4))
        return (
            2 * L * d * (2 * hk * dk + 2 * hv * dv + 2 * hv)
            + 2 * L * k * (2 * hk * dk + hv * dv)
            + 6 * L * hv * dk * dv
            + 2 * L * hv * dv * d
            + mlp
        )
    gate = 1 if c.get("attn_output_gate") else 0
    return (
        2 * L * d * (h * e * (1 + gate) + 2 * g * e) + 4 * L * L * h * e + 2 * L * h * e * d + mlp
    )


def flops_reduction(
    text_config: dict[str, Any],
    full_len: int,
    compressed_len: int,
    drop: tuple[int, int] | None = None,
) -> float:
    """1 - F(compressed) / F(full), in [0, 1); `drop` as `prefill_flops`."""
    full = prefill_flops(text_config, full_len)
    return 1.0 - prefill_flops(text_config, compressed_len, drop) / full


def kv_cache_bytes_analytical(
    text_config: dict[str, Any],
    seq_len: int,
    bytes_per: int = 2,
    drop: tuple[int, int] | None = None,
) -> int:
    """Cache of the prompt: K and V of every full-attention layer, plus the fixed conv and
    recurrent states of every linear-attention layer (recurrent state in float32). `drop`
    as `prefill_flops`: the layers from `drop[0]` on cache `drop[1]` tokens."""
    c = text_config
    h = int(c["num_attention_heads"])
    e = int(c.get("head_dim") or int(c["hidden_size"]) // h)
    total = 0
    for index, kind in enumerate(layer_types(c)):
        length = seq_len if drop is None or index < drop[0] else drop[1]
        if kind == "linear_attention":
            hk, hv = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
            dk, dv = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
            k = int(c.get("linear_conv_kernel_dim", 4))
            total += k * (2 * hk * dk + hv * dv) * bytes_per + hv * dk * dv * 4
        else:
            total += 2 * length * int(c["num_key_value_heads"]) * e * bytes_per
    return total


def cache_nbytes(cache: Any, seq_len: int | tuple[int, ...] | None = None) -> tuple[int, int]:
    """(total bytes, bytes of tensors with a dimension equal to `seq_len`, or to one of
    several lengths) held by a transformers cache object, found by walking its attributes
    (every tensor counted once)."""
    lengths = (seq_len,) if isinstance(seq_len, int) else (seq_len or ())
    seen: set[tuple[int, int]] = set()
    total = 0
    growing = 0
    stack: list[Any] = [cache]
    visited: set[int] = set()
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            key = (obj.data_ptr(), obj.nbytes)
            if key in seen or obj.numel() == 0:
                continue
            seen.add(key)
            total += obj.nbytes
            if any(length in obj.shape[-2:] for length in lengths):
                growing += obj.nbytes
            continue
        if id(obj) in visited:
            continue
        visited.add(id(obj))
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("transformers"):
            stack.extend(vars(obj).values())
    return total, growing


def time_call(
    fn: Callable[[], Any], device: torch.device, *, warmup: int = 1, repeats: int = 3
) -> tuple[float, Any]:
    """Median milliseconds of `fn()` over `repeats` runs after `warmup` runs (CUDA events on
    a GPU, wall clock on CPU); also returns the last result."""
    result = None
    for _ in range(warmup):
        result = fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            result = fn()
            times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times), result


@dataclass
class EfficiencyRow:
    method: str
    ratio: float | None
    video_tokens: int
    seq_len: int
    prefill_ms: float
    compress_ms: float | None
    kv_mb: float
    kv_mb_growing: float
    kv_mb_analytical: float
    flops_reduction: float
    #: a two-stage method's layer inside the LM, and the tokens from it on (prefill ms, KV
    #: and FLOPs all with the drop: layers before it on `seq_len` tokens)
    in_model_layer: int | None = None
    in_model_tokens: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def build_text_model(arch: dict[str, Any], device: torch.device, dtype: torch.dtype) -> Any:
    """The language model of `arch`, randomly initialised on `device` (nothing downloaded)."""
    from transformers import AutoConfig, AutoModel

    text = dict(arch["text_config"])
    text.pop("attn_output_gate", None)  # a FLOPs fact (flops_config), not a config field
    model_type = text.pop("model_type")
    config = AutoConfig.for_model(model_type, **text)
    with torch.device(device):
        model = AutoModel.from_config(config, dtype=dtype)
    return model.eval()


def weight_bytes(arch: dict[str, Any], dtype: torch.dtype) -> int:
    """Bytes of the language model's weights in `dtype`, counted on the meta device (nothing
    is allocated)."""
    model = build_text_model(arch, torch.device("meta"), dtype)
    return sum(p.numel() for p in model.parameters()) * (torch.finfo(dtype).bits // 8)


def available_bytes(device: torch.device) -> int | None:
    """Free memory of `device` (CUDA: free device memory; CPU: MemAvailable); None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(arch: dict[str, Any], device: torch.device, dtype: torch.dtype) -> None:
    """Raise MemoryError (before anything is allocated) when the weights alone would take more
    than 80% of the free memory: the process would otherwise be killed without a word."""
    need = weight_bytes(arch, dtype)
    free = available_bytes(device)
    if free is not None and need > 0.8 * free:
        raise MemoryError(
            f"--arch {arch['_name']}: its language model needs {need / 2**30:.1f} GiB in "
            f"{str(dtype).replace('torch.', '')} for the weights alone, and {device} has "
            f"{free / 2**30:.1f} GiB free; use a GPU, --dtype bfloat16, or scale it down with "
            '--override "num_hidden_layers=2"'
        )


def measure_efficiency(
    arch_name: str,
    *,
    num_frames: int = 64,
    ratios: list[float] | tuple[float, ...] = (8.0,),
    methods: list[str] | tuple[str, ...] = ("craft",),
    text_tokens: int = 128,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    warmup: int = 1,
    repeats: int = 3,
    overrides: dict[str, Any] | None = None,
    seed: int = 0,
    progress: bool = True,
    method_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Table 2 for `arch_name`: one row for the uncompressed prompt, one per method x ratio.
    `method_options` go to every method's factory (`{"compile": True}`: CRAFT's compiled
    loop, whose warm-up call pays the compile)."""
    from tqdm.auto import tqdm

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    arch = load_arch(arch_name, overrides)
    check_fits(arch, device, dtype)
    bench = _Bench(arch, build_text_model(arch, device, dtype), num_frames, text_tokens,
                   device, dtype, warmup, repeats, torch.Generator().manual_seed(seed),
                   dict(method_options or {}))  # fmt: skip
    jobs: list[tuple[str, float | None]] = [("none", None)]
    jobs += [(m, float(r)) for m in methods for r in ratios]
    rows = [
        bench.row(method, ratio).as_dict()
        for method, ratio in tqdm(jobs, desc=f"efficiency {arch['_name']}", disable=not progress)
    ]
    return {
        "arch": arch["_name"],
        "arch_key": arch["_key"],
        "overrides": arch.get("_overrides", {}),
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "dtype": str(dtype).replace("torch.", ""),
        "num_frames": num_frames,
        "text_tokens": text_tokens,
        "video_tokens_full": bench.n_video,
        "warmup": warmup,
        "repeats": repeats,
        "timing": "CUDA events, median" if device.type == "cuda" else "wall clock, median",
        "method_options": bench.method_options,
        "rows": rows,
    }


class _Bench:
    """One architecture's language model and one video's random tokens, measured per
    (method, ratio): the compression time, then the prefill of the compressed prompt."""

    def __init__(
        self,
        arch: dict[str, Any],
        model: Any,
        num_frames: int,
        text_tokens: int,
        device: torch.device,
        dtype: torch.dtype,
        warmup: int,
        repeats: int,
        generator: torch.Generator,
        method_options: dict[str, Any],
    ) -> None:
        self.arch, self.model, self.text_tokens = arch, model, text_tokens
        self.device, self.dtype, self.warmup, self.repeats = device, dtype, warmup, repeats
        self.generator = generator
        self.method_options = method_options  # every method's factory options
        self.hidden = int(arch["text_config"]["hidden_size"])
        self.n_video = video_tokens(arch, num_frames)
        t, hh, ww = video_grid(arch, num_frames)
        grid = torch.stack(
            torch.meshgrid(torch.arange(t), torch.arange(hh), torch.arange(ww), indexing="ij"), -1
        ).reshape(-1, 3)
        # only the (t, h, w) grid is compressed; extra tokens (LLaVA-OV's newline) survive
        self.extra_tokens = self.n_video - int(grid.shape[0])
        self.features = torch.randn(grid.shape[0], self.hidden, generator=generator).to(
            device=device, dtype=dtype
        )
        self.coords = grid.to(device)

    def compress(self, method: str, ratio: float | None) -> tuple[float, int, Any]:
        """(median compression ms, video tokens kept, the method's stage inside the LM or
        None) of `method` at `ratio`."""
        from craft_core import TokenBudget
        from craft_eval.methods.build import build_compressor

        timed = build_compressor(
            method, self.method_options, hidden_size=self.hidden, allow_untrained=True
        )
        assert timed is not None
        bare = timed.method  # time the method alone (time_call has its own clock)

        budget = TokenBudget(ratio=ratio)  # a method takes the budget object (craft_core)

        def run() -> Any:
            with torch.inference_mode():
                return bare(self.features, self.coords, budget)

        ms, result = time_call(run, self.device, warmup=self.warmup, repeats=self.repeats)
        stage = getattr(timed, "in_model_stage", None)
        return ms, int(result.num_kept) + self.extra_tokens, stage

    def attach(self, method: str, stage: Any, video: int) -> Any:
        """craft-adapters' `InModelDrop` of `stage` on the bench's language model, the
        first `video` positions of each prefill being the video's; None without a stage."""
        if stage is None:
            return None
        from craft_adapters.in_model import InModelDrop

        count = len(layer_types(self.arch["text_config"]))
        if not 1 <= stage.layer < count:
            raise ValueError(
                f"method {method!r}: layer {stage.layer} is not inside this language model "
                f"({count} layers): --method-arg layer=N"
            )

        def video_rows(sequence: torch.Tensor) -> torch.Tensor:
            return torch.arange(sequence.shape[1], device=sequence.device) < video

        return InModelDrop(self.model, stage.rule, layer=stage.layer, name=method,
                           video_rows=video_rows)  # fmt: skip

    def prefill(self, seq_len: int, drop: Any = None) -> tuple[float, int, int]:
        """(median prefill ms, KV bytes, growing KV bytes) of a `seq_len` prompt (with
        `drop`, an attached `InModelDrop`, its layers from L on cache the kept tokens)."""
        embeds = torch.randn(1, seq_len, self.hidden, generator=self.generator).to(
            device=self.device, dtype=self.dtype
        )
        mask = torch.ones(1, seq_len, dtype=torch.long, device=self.device)

        def run() -> Any:
            with torch.inference_mode():
                return self.model(inputs_embeds=embeds, attention_mask=mask, use_cache=True)

        ms, out = time_call(run, self.device, warmup=self.warmup, repeats=self.repeats)
        lengths = (seq_len,) if drop is None else (seq_len, int(drop.report.kept.numel()))
        total, growing = cache_nbytes(out.past_key_values, lengths)
        return ms, total, growing

    def row(self, method: str, ratio: float | None) -> EfficiencyRow:
        compress_ms, kept, stage = None, self.n_video, None
        if method != "none":
            compress_ms, kept, stage = self.compress(method, ratio)
        text_config = self.arch["text_config"]
        seq_len = self.text_tokens + kept
        drop = self.attach(method, stage, kept)
        try:
            ms, total, growing = self.prefill(seq_len, drop)
        finally:
            if drop is not None:
                drop.remove()
        split = None if drop is None else (drop.layer, int(drop.report.kept.numel()))
        bytes_per = torch.finfo(self.dtype).bits // 8
        analytical = kv_cache_bytes_analytical(text_config, seq_len, bytes_per, split)
        return EfficiencyRow(
            method=method,
            ratio=ratio,
            video_tokens=kept,
            seq_len=seq_len,
            prefill_ms=ms,
            compress_ms=compress_ms,
            kv_mb=total / 2**20,
            kv_mb_growing=growing / 2**20,
            kv_mb_analytical=analytical / 2**20,
            flops_reduction=flops_reduction(
                text_config, self.text_tokens + self.n_video, seq_len, split
            ),
            in_model_layer=None if split is None else split[0],
            in_model_tokens=None if split is None else split[1],
        )


def format_efficiency(result: dict[str, Any]) -> str:
    """Markdown table of a `measure_efficiency` result."""
    lines = [
        f"{result['arch']} ({result['device']}, {result['dtype']}), {result['num_frames']} frames, "
        f"{result['video_tokens_full']} video + {result['text_tokens']} text tokens; "
        f"prefill {result['timing']} of {result['repeats']} after {result['warmup']} warm-up"
        + "".join(f", {k}={v}" for k, v in result.get("method_options", {}).items()),
        "",
        "| method | ratio | video tokens | prefill ms | compress ms | KV MB | KV MB (analytical) | FLOPs reduction |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:g}x"
        comp = "-" if r["compress_ms"] is None else f"{r['compress_ms']:.1f}"
        lines.append(
            f"| {r['method']} | {ratio} | {r['video_tokens']} | {r['prefill_ms']:.1f} | {comp} | "
            f"{r['kv_mb']:.2f} | {r['kv_mb_analytical']:.2f} | {100 * r['flops_reduction']:.1f}% |"
        )
    return "\n".join(lines)

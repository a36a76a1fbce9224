"""Compressed videos through `vllm serve`'s OpenAI API (conftest's `server`: the multiprocess
engine, `--enable-mm-embeds`), sent with the `openai` client as `payload.chat_part` builds
them (vLLM's `video_embeds` content part, base64 tensors).

- Equality: three videos compressed by craft-adapters in threshold mode (through a file) are
  served with the first step's log-probs within `engine.GAP` of craft-adapters' threshold-mode
  `generate()` and the same greedy tokens (engine.compare). Control: a fresh CRAFT module's
  payloads (claiming the checkpoint's digest) are far in those log-probs.
- Prefix cache: a payload's second question is served from vLLM's prefix cache (the same
  payload bytes give the same multimodal hash, so the same KV blocks):
  `prompt_tokens_details.cached_tokens` covers the video's rows and
  `vllm:prefix_cache_hits_total` grows; its first question and a payload of other rows of the
  same shape (the control) get no hit past the text before the video.
- Refusals: every field malformed (NaN / inf / negative / wrong dtype / wrong length / K = 0,
  the made-with record, bytes that are not a `torch.save` tensor: a pickled object, a dict, a
  list, garbage) is a 400 naming the field; after all of them the same server process answers
  the first payload again with the same tokens and log-probs. The pickled object would make a
  folder if it were ever unpickled: the folder never appears.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import engine
import pytest
import test_serve
import tiny
import torch
from conftest import BLOCK, small_config
from craft_vllm.payload import (
    COORDS,
    COUNT,
    GRID,
    MADE_WITH,
    ROWS,
    SECONDS,
    chat_part,
    encode_made_with,
    tensor_base64,
)
from craft_vllm.payload import main as payload_cli

import craft_adapters
from craft_core import CraftCompressor

openai = pytest.importorskip("openai")
THRESHOLD = 0.98  # as test_precompressed.py: keeps 58-62, 41, 59 of 128, 80, 96


@pytest.fixture(scope="module")
def videos() -> list:
    return [tiny.video(16, seed=0), tiny.video(10, seed=1), tiny.video(12, seed=2)]


@pytest.fixture(scope="module")
def payloads(workdir, videos, tmp_path_factory) -> tuple[list, list]:
    """(the checkpoint's compressed videos, a fresh module's claiming its digest)."""
    folder = tmp_path_factory.mktemp("payloads")
    loaded = CraftCompressor.from_pretrained(workdir / "craft")
    made = engine.compress_payloads(workdir / "model", loaded, videos, folder / "trained")
    torch.manual_seed(0)
    fresh = CraftCompressor(small_config())
    other = engine.compress_payloads(workdir / "model", fresh, videos, folder / "fresh")
    return made, engine.made_as(other, made[0])


def openai_client(base: str) -> Any:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=300)


def token_id(text: str) -> int:
    """A token's id as `return_tokens_as_token_ids` writes it ("token_id:123")."""
    return int(text.removeprefix("token_id:"))


def ask(base: str, model: str, part: dict[str, Any]) -> engine.Served:
    """One greedy chat request carrying `part`, as `engine.Served` (token ids, prompt length,
    the first step's top log-probs by token id)."""
    reply = openai_client(base).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [part, {"type": "text", "text": engine.QUESTION}]}],
        max_tokens=engine.NEW_TOKENS,
        temperature=0.0,
        logprobs=True,
        top_logprobs=engine.LOGPROBS,
        extra_body={"return_tokens_as_token_ids": True},
    )
    steps = reply.choices[0].logprobs.content

    first = {token_id(t.token): float(t.logprob) for t in steps[0].top_logprobs}
    return engine.Served([token_id(s.token) for s in steps], reply.usage.prompt_tokens, first)


def test_payloads_served_as_threshold_generate(server, workdir, videos, payloads) -> None:
    made, fresh = payloads
    model = str(workdir / "model")
    served = [ask(server, model, chat_part(v)) for v in made]
    loaded = CraftCompressor.from_pretrained(workdir / "craft")
    reference = engine.adapters_generate(
        workdir / "model", loaded, None, videos, threshold=THRESHOLD
    )
    engine.compare(served, reference)
    kept = [v.features.shape[0] for v in made]
    assert [s.length for s in served] == [engine.text_tokens() + k for k in kept]
    engine.control_gaps([ask(server, model, chat_part(v)) for v in fresh], reference)


def usage(base: str, model: str, part: dict[str, Any], question: str) -> tuple[int, int]:
    """(prompt tokens, of them served from the prefix cache) of one request carrying `part`."""
    reply = openai_client(base).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [part, {"type": "text", "text": question}]}],
        max_tokens=1,
        temperature=0.0,
    )
    return reply.usage.prompt_tokens, reply.usage.prompt_tokens_details.cached_tokens or 0


def test_a_payload_s_second_question_hits_the_prefix_cache(server, workdir, payloads) -> None:
    model, video = str(workdir / "model"), payloads[0][0]
    # rows no request has sent before (a payload of this server's checkpoint all the same)
    new, other = (dataclasses.replace(video, features=video.features * s) for s in (1.5, 0.5))
    k = int(video.features.shape[0])
    before_video, after_video = engine.video_span(k, "And then?")
    first = usage(server, model, chat_part(new), engine.QUESTION)
    hits = test_serve._metric(server, "vllm:prefix_cache_hits_total")
    second = usage(server, model, chat_part(new), "And then?")
    gained = test_serve._metric(server, "vllm:prefix_cache_hits_total") - hits
    control = usage(server, model, chat_part(other), "And then?")
    print(f"prompt, cached tokens: first {first}, second {second}, control {control}")
    assert first[1] < BLOCK and control[1] < BLOCK  # at most the text before the video
    assert second[1] >= after_video // BLOCK * BLOCK > before_video  # blocks of video rows
    assert gained >= second[1]


def with_fields(part: dict[str, Any], **fields: torch.Tensor | None) -> dict[str, Any]:
    """`part` with each named field replaced by that tensor (None: left out)."""
    sent = dict(part["video_embeds"])
    for key, value in fields.items():
        sent.pop(key, None)
        if value is not None:
            sent[key] = tensor_base64(value)
    return {"type": "video_embeds", "video_embeds": sent}


class Planted:
    """An object whose unpickling makes the folder `path` (what a hostile client sends)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (str(self.path),)


def saved_base64(value: Any) -> str:
    """`torch.save(value)` as base64: what a field carries, here holding a non-tensor."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def with_bytes(part: dict[str, Any], field: str, encoded: str) -> dict[str, Any]:
    """`part` with `field`'s base64 replaced by `encoded` (bytes that are no tensor)."""
    return {"type": "video_embeds", "video_embeds": {**part["video_embeds"], field: encoded}}


def unreadable(video: Any, marker: Path) -> dict[str, tuple[dict[str, Any], str]]:
    """Fields whose bytes do not load as a tensor: (content part, a piece of the 400)."""
    part = chat_part(video)
    garbage = base64.b64encode(b"not torch.save bytes").decode()
    return {
        "rows pickled object": (
            with_bytes(part, ROWS, saved_base64(Planted(marker))),
            "video_embeds is not a tensor this server can read (UnpicklingError",
        ),
        "coords a dict": (
            with_bytes(part, COORDS, saved_base64({"coords": video.coords})),
            "craft_coords is not a tensor this server can read",
        ),
        "grid a list": (
            with_bytes(part, GRID, saved_base64([1, 2, 3])),
            "video_grid_thw is not a tensor this server can read",
        ),
        "count garbage": (with_bytes(part, COUNT, garbage), "craft_num_kept is not a tensor"),
    }


def malformed(video: Any) -> dict[str, tuple[dict[str, Any], str]]:
    """Each malformed request: (its content part, a piece of the 400's message)."""
    part, rows, coords = chat_part(video), video.features, video.coords
    k, (t, h, w) = rows.shape[0], video.grid

    def poke(tensor: torch.Tensor, index: tuple[int, ...], value: float) -> torch.Tensor:
        out = tensor.clone()
        out[index] = value
        return out

    swapped = coords.clone()
    swapped[[0, 1]] = coords[[1, 0]]
    grid = torch.tensor([t, 2 * h, 2 * w])
    made = dict(video.metadata)
    return {
        "rows NaN": (
            with_fields(part, **{ROWS: poke(rows, (0, 3), float("nan"))}),
            "video_embeds holds NaN",
        ),
        "rows inf": (
            with_fields(part, **{ROWS: poke(rows, (1, 0), float("inf"))}),
            "video_embeds holds NaN",
        ),
        "rows int": (
            with_fields(part, **{ROWS: rows.long()}),
            "video_embeds must be a floating tensor",
        ),
        "rows short": (with_fields(part, **{ROWS: rows[:-1]}), f"video_embeds must be [K = {k}"),
        "rows narrow": (
            with_fields(part, **{ROWS: rows[:, :64]}),
            f"video_embeds must be [K = {k}",
        ),
        "rows missing": (with_fields(part, **{ROWS: None}), "missing field(s) ['video_embeds']"),
        "K = 0": (
            with_fields(part, **{ROWS: rows[:0], COORDS: coords[:0], COUNT: torch.tensor(0)}),
            "craft_num_kept must be >= 1",
        ),
        "coords negative": (
            with_fields(part, **{COORDS: poke(coords, (0, 1), -1)}),
            "craft_coords: coords must fit",
        ),
        "coords outside": (
            with_fields(part, **{COORDS: poke(coords, (-1, 0), t)}),
            "craft_coords: coords must fit",
        ),
        "coords float": (
            with_fields(part, **{COORDS: coords.float()}),
            "craft_coords must be an integer",
        ),
        "coords short": (
            with_fields(part, **{COORDS: coords[:-1]}),
            f"craft_coords must be [K = {k}",
        ),
        "coords order": (
            with_fields(part, **{COORDS: swapped}),
            "craft_coords: coords must be distinct",
        ),
        "count high": (with_fields(part, **{COUNT: torch.tensor(k + 1)}), "(craft_num_kept)"),
        "count negative": (
            with_fields(part, **{COUNT: torch.tensor(-3)}),
            "craft_num_kept must be >= 1",
        ),
        "count float": (
            with_fields(part, **{COUNT: torch.tensor(float(k))}),
            "craft_num_kept must be an integer",
        ),
        "count NaN": (
            with_fields(part, **{COUNT: torch.tensor(float("nan"))}),
            "craft_num_kept must be an integer",
        ),
        "grid negative": (
            with_fields(part, **{GRID: grid * torch.tensor([-1, 1, 1])}),
            "video_grid_thw [-",
        ),
        "grid odd": (
            with_fields(part, **{GRID: grid + torch.tensor([0, 1, 0])}),
            "multiples of the merge size",
        ),
        "grid float": (
            with_fields(part, **{GRID: grid.float()}),
            "video_grid_thw must be an integer",
        ),
        "grid short": (with_fields(part, **{GRID: grid[:2]}), "video_grid_thw [V, 3]"),
        "grid huge": (
            with_fields(part, **{GRID: torch.tensor([10**6, 2048, 2048])}),
            "over the 4194304",
        ),
        "seconds NaN": (
            with_fields(part, **{SECONDS: torch.tensor(float("nan"))}),
            "second_per_grid_ts holds NaN",
        ),
        "seconds inf": (
            with_fields(part, **{SECONDS: torch.tensor(float("inf"))}),
            "second_per_grid_ts holds NaN",
        ),
        "seconds 1e6": (
            with_fields(part, **{SECONDS: torch.tensor(1e6)}),
            "second_per_grid_ts [1000000.0] spreads",
        ),
        "seconds -1": (
            with_fields(part, **{SECONDS: torch.tensor(-1.0)}),
            "second_per_grid_ts must be > 0",
        ),
        "seconds 0": (
            with_fields(part, **{SECONDS: torch.tensor(0.0)}),
            "second_per_grid_ts must be > 0",
        ),
        "seconds bool": (
            with_fields(part, **{SECONDS: torch.tensor(True)}),
            "second_per_grid_ts must be a real",
        ),
        "seconds two": (
            with_fields(part, **{SECONDS: torch.tensor([1.0, 1.0])}),
            "second_per_grid_ts must be a real tensor of 1 dimension",
        ),
        "unknown field": (
            with_fields(part, craft_extra=torch.zeros(1)),
            "unknown field(s) ['craft_extra']",
        ),
        "other checkpoint": (
            with_fields(part, **{MADE_WITH: encode_made_with({**made, "craft_sha256": "0" * 64})}),
            "made with craft_sha256='0000",
        ),
        "other backbone": (
            with_fields(part, **{MADE_WITH: encode_made_with({**made, "model_type": "qwen3_vl"})}),
            "made with model_type='qwen3_vl'",
        ),
        "no record": (
            with_fields(part, **{MADE_WITH: encode_made_with({})}),
            "its metadata has no",
        ),
        "record float": (
            with_fields(part, **{MADE_WITH: torch.zeros(4)}),
            "craft_made_with must be one video's",
        ),
    }


def post(base: str, body: dict[str, Any]) -> engine.Served:
    """`body` POSTed as curl does (no client library), as `engine.Served`."""
    body = {**body, "max_tokens": engine.NEW_TOKENS, "logprobs": True}
    body |= {"top_logprobs": engine.LOGPROBS, "return_tokens_as_token_ids": True}
    request = urllib.request.Request(
        f"{base}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    reply = json.loads(urllib.request.urlopen(request, timeout=300).read())
    steps = reply["choices"][0]["logprobs"]["content"]

    first = {token_id(t["token"]): float(t["logprob"]) for t in steps[0]["top_logprobs"]}
    return engine.Served(
        [token_id(s["token"]) for s in steps], reply["usage"]["prompt_tokens"], first
    )


def assert_refused(base: str, model: str, cases: dict[str, tuple[dict[str, Any], str]]) -> None:
    """Each of `cases` (name: its content part, a piece of the message) is a 400 naming it,
    and the server process is still running after them."""
    client = openai_client(base)
    for name, (part, expected) in cases.items():
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": [part, {"type": "text", "text": "Hi"}]}],
                max_tokens=2,
            )
        assert expected in str(caught.value), (name, str(caught.value))
    assert base.process.poll() is None  # type: ignore[attr-defined]


def cli_body(path: Path, model: str) -> dict[str, Any]:
    """`python -m craft_vllm.payload path`'s request body (the README's, for curl), asking
    `engine.QUESTION`."""
    command = [sys.executable, "-m", "craft_vllm.payload", str(path), "--model", model]
    command += ["--question", engine.QUESTION]
    run = subprocess.run(command, capture_output=True, check=True, text=True)
    return json.loads(run.stdout)  # type: ignore[no-any-return]


def assert_same_answer(after: engine.Served, before: engine.Served) -> None:
    """The same request answered again: tokens, prompt length, log-probs within 1e-5."""
    assert (after.tokens, after.length) == (before.tokens, before.length)
    assert max(abs(after.first[t] - lp) for t, lp in before.first.items()) <= 1e-5


def test_malformed_payloads_get_a_400_naming_the_field(server, workdir, payloads, tmp_path) -> None:
    model = str(workdir / "model")
    video = payloads[0][0]
    before = ask(server, model, chat_part(video))
    marker = tmp_path / "unpickled"
    assert_refused(server, model, malformed(video) | unreadable(video, marker))
    assert not marker.exists()  # the pickled object was never unpickled
    # the same process still serves: the README's request (python -m craft_vllm.payload's
    # body, POSTed as curl does) gets the first answer again
    file = craft_adapters.save_compressed_video(tmp_path / "clip.craft.safetensors", video)
    assert_same_answer(post(server, cli_body(file, model)), before)


def test_payload_cli_refuses_a_bad_file(tmp_path, capsys) -> None:
    """`python -m craft_vllm.payload` on a file that is not a payload: exit 2, one line. Its
    `main` in this process (`sys.exit(main())` is the module's last line; `cli_body` runs the
    module itself): a fresh Python importing torch and transformers cost ~8 s of CPU."""
    bad = tmp_path / "bad.craft.safetensors"
    bad.write_bytes(b"not safetensors")
    code = payload_cli([str(bad), "--model", "m"])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    assert out.err.count("\n") == 1 and "is not a readable safetensors file" in out.err

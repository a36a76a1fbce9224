"""Test helpers: a scripted model backend (no model), used through the real runner. (A real
small filesystem to fill: `craft_testkit.filesystem`.)"""

from __future__ import annotations

import re
import time

from craft_eval.runner import Generation, VideoDecodeError
from craft_eval.tasks import Item, Prompt


class ScriptedBackend:
    """Opens each video with PyAV (so broken files fail like they do for a model), then
    answers the gold letter for even-numbered calls and a wrong one for odd ones."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls: list[str] = []

    def generate(self, item: Item, prompt: Prompt) -> Generation:
        import av

        try:
            with av.open(item.video) as container:
                frames = sum(1 for _ in container.decode(video=0))
        except (OSError, av.error.FFmpegError) as error:
            raise VideoDecodeError(f"{item.video}: {error}") from error
        self.calls.append(item.id)
        time.sleep(self.delay_s)
        digits = re.search(r"\d+", item.id)
        index = int(digits.group(0)) if digits else 0
        letters = item.letters or "AB"
        wrong = next(x for x in letters if x != item.answer)
        reply = f"The answer is ({item.answer})." if index % 2 == 0 else f"{wrong}. no idea"
        return Generation(
            reply=reply,
            tokens_before=64 * frames,
            tokens_after=8 * frames,
            num_frames=frames,
            compress_ms=1.0,
            prefill_ms=2.0,
        )

"""`craft-train stage1|stage2`: not built yet (issue 6); exits non-zero and says so."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print(
        "craft-train: the two-stage trainer is not implemented yet (see issue 6). "
        "craft-core's CraftCompressor can already be trained from your own loop.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())

"""craft-core: the CRAFT video-token compressor on plain torch tensors.

from craft_core import CraftConfig, CraftCompressor
compressor = CraftCompressor(CraftConfig(hidden_size=2560))
out = compressor(features, coords, ratio=8.0)   # features [N, D], coords [N, 3] (t, h, w)

Every compressor of the project (CRAFT and each baseline) is a `TokenCompressor`:
`(features, coords, budget: TokenBudget, *, importance=None) -> CompressionResult`.
"""

from craft_core.budget import (
    Budget,
    TokenBudget,
    check_tokens,
    default_min_tokens,
    resolve_budget,
    target_token_count,
)
from craft_core.compressor import CraftCompressor
from craft_core.config import CraftConfig
from craft_core.contract import TokenCompressor, budget_of, compress_many
from craft_core.merge import GatedMerge
from craft_core.result import CompressionResult

__version__ = "1.1.0"

__all__ = [
    "Budget",
    "CompressionResult",
    "CraftCompressor",
    "CraftConfig",
    "GatedMerge",
    "TokenBudget",
    "TokenCompressor",
    "budget_of",
    "check_tokens",
    "compress_many",
    "default_min_tokens",
    "resolve_budget",
    "target_token_count",
]

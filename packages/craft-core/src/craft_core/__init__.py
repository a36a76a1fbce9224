"""craft-core: the CRAFT video-token compressor on plain torch tensors."""

from craft_core.budget import Budget, check_tokens, resolve_budget, target_token_count
from craft_core.config import CraftConfig
from craft_core.result import CompressionResult

__version__ = "0.1.0"

__all__ = [
    "Budget",
    "CompressionResult",
    "CraftConfig",
    "check_tokens",
    "resolve_budget",
    "target_token_count",
]

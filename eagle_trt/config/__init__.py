"""eagle_config.yaml: schema (EagleConfig) and loader.

    >>> from eagle_trt.config import load_config
    >>> cfg = load_config("configs/eagle_config.yaml")  # doctest: +SKIP
    >>> cfg.draft_length  # doctest: +SKIP
    6
"""

from eagle_trt.config.loader import (
    describe_fields,
    dump_config,
    format_validation_error,
    load_config,
    override_config,
    parse_config,
)
from eagle_trt.config.schema import DraftConfig, EagleArchitecture, EagleConfig

__all__ = [
    "DraftConfig",
    "EagleArchitecture",
    "EagleConfig",
    "describe_fields",
    "dump_config",
    "format_validation_error",
    "load_config",
    "override_config",
    "parse_config",
]

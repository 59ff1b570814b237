"""Domain errors: one type per failure class, each with a one-line message and an exit code.

The CLI catches `EagleError` and prints `Error: <message>` (plus the hint) on stderr, exits with
`exit_code`, and shows a traceback only when EAGLE_TRT_DEBUG=1.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1  # anything unexpected
EXIT_BAD_INPUT = 2  # bad config, path, file or argument
EXIT_MISSING_DEPENDENCY = 3  # a library or hardware this command needs is absent


class EagleError(Exception):
    """Base of every error eagle-trt reports to the user."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class InputError(EagleError):
    """A path, file, prompt or option the user gave is wrong."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(InputError):
    """eagle_config.yaml (or an option overriding it) is invalid."""


class CheckpointError(InputError):
    """A model, checkpoint or engine on disk is missing, truncated or does not fit."""


class EngineIntegrityError(CheckpointError):
    """An engine dir's files do not match its manifest (tampered, truncated or half-written)."""


class MissingDependencyError(EagleError):
    """An optional library or the hardware a backend needs is not available."""

    exit_code = EXIT_MISSING_DEPENDENCY


class EndpointError(InputError):
    """A serving endpoint the user named (`convert --regenerate-endpoint`) cannot be reached, refuses the request, or
    serves another model than the one being converted."""

"""The few exception types llamarl raises on purpose, so callers can catch one kind per cause."""


class LlamarlError(Exception):
    """Base of every error llamarl raises deliberately."""


class ConfigError(LlamarlError):
    """A config file or override is invalid; the message names the field path."""


class ProtocolError(LlamarlError):
    """A frame or message that crossed a process boundary is malformed, oversized or unknown.

    `reason` is a short machine-readable cause used as the rejection counter's name.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class StaleVersionError(LlamarlError):
    """A policy version write that is not strictly greater than the current one."""


class SyncError(LlamarlError):
    """A weight transfer failed: timeout, dead peer, size or checksum mismatch."""


class NonFiniteError(LlamarlError):
    """The trainer's weights became NaN or infinite; nothing of them is published or saved."""

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


class EmptyContextError(LlamarlError, ValueError):
    """A context of no tokens was given to sample from: the model's first step needs one. Callers
    refuse such a context before it gets here (the agent endpoint answers 400)."""


class NonFiniteError(LlamarlError):
    """The trainer's weights became NaN or infinite; nothing of them is published or saved."""


class ServiceStartError(LlamarlError):
    """A service process (Redis, the broker) did not come up: its own error line and its log.

    `config_error` marks a cause the user's settings must change (exit 2), `port_taken` a port
    another process holds, which a launcher that chose the port may retry with another."""

    def __init__(self, service: str, line: str, log_path: str, *, config_error: bool, port_taken: bool) -> None:
        super().__init__(f"{service} did not start: {line} (log: {log_path})")
        self.config_error = config_error
        self.port_taken = port_taken

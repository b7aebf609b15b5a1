"""What every config section shares: unknown keys refused, field docstrings kept (the reference
is generated from them), frozen values; and the error for fields that conflict."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

USER_NAME = r"[A-Za-z_][\w.]*:[A-Za-z_]\w*"
"""`module:name`: how a config names the user's own code (a reward, an agent, a loss)."""
USER_FUNCTION = f"^{USER_NAME}$"


def built_in_or_user(names: tuple[str, ...]) -> str:
    """The pattern of a field that takes one of `names` or the user's own `module:name`."""
    return f"^({'|'.join(names)}|{USER_NAME})$"


def yaml_off(value: object) -> object:
    """YAML 1.1 reads an unquoted `off` as false: for a field whose choices include "off", the
    word it meant."""
    return "off" if value is False else value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class FieldConflict(ValueError):
    """Fields that are valid alone but not together; the error line names them all, relative
    to the model whose validator raises it."""

    def __init__(self, fields: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.fields = fields
        self.message = message

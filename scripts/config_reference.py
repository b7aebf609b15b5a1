"""Print the config reference (every field, type, default, doc) as Markdown for the README."""

from __future__ import annotations

from pydantic import BaseModel

from llamarl.config import RunConfig

SYMBOLS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def _bound(meta: object) -> str:
    for name, symbol in SYMBOLS.items():
        if hasattr(meta, name):
            return f"{symbol} {getattr(meta, name)}"
    return str(meta).replace("|", "\\|")


def rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out += rows(annotation, f"{prefix}{name}.")
            continue
        bounds = " ".join(_bound(m) for m in field.metadata)
        kind = str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
        kind = kind.replace(" | ", " or ")
        out.append(
            f"| `{prefix}{name}` | {kind} {bounds} | `{field.default!r}` | {field.description or ''} |"
        )
    return out


if __name__ == "__main__":
    print("| field | type and bounds | default | meaning |\n|---|---|---|---|")
    print("\n".join(rows(RunConfig)))

"""Print the config reference (every field, type, default, doc) as a Markdown table.

The table is the "Every field" section of docs/reference/configuration.md; paste this script's
output there when a field changes (`tests/unit/test_docs.py` fails until every row it prints is
on that page). Each row is one line (a field's description is joined into one line) and `<` is
written `&lt;` outside code spans (types and bounds are code), so the table renders as one
table in the docs site.
"""

from __future__ import annotations

import typing

from pydantic import BaseModel

from llamarl.config import RunConfig

SYMBOLS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def _bound(meta: object) -> str:
    for name, symbol in SYMBOLS.items():
        if hasattr(meta, name):
            return f"{symbol} {getattr(meta, name)}"
    return str(meta).replace("|", "\\|")


def _variants(annotation: object) -> list[type[BaseModel]]:
    """The models of a discriminated union (e.g. `sync`), [] for anything else."""
    args = typing.get_args(annotation)
    if args and typing.get_origin(args[0]) is not None and typing.get_args(args[0]):
        args = typing.get_args(args[0])  # Annotated[Union[...], ...]
    return [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]


def _list_item(annotation: object) -> type[BaseModel] | None:
    """The section a `list[Section]` field holds, None for anything else."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list and args and isinstance(args[0], type):
        return args[0] if issubclass(args[0], BaseModel) else None
    return None


def union_rows(variants: list[type[BaseModel]], prefix: str, default: str) -> list[str]:
    """One row for the discriminator (`transport`), then each field once, naming the variants
    that have it."""
    names = [v.model_fields["transport"].default for v in variants]
    out = [
        f"| `{prefix}transport` | `one of {', '.join(repr(n) for n in names)}` | `{default!r}` | "
        "Weight transport; each has only its own fields (below). |"
    ]
    seen: list[str] = []
    for variant in variants:
        for name in variant.model_fields:
            if name != "transport" and name not in seen:
                seen.append(name)
    for name in seen:
        owners = [n for v, n in zip(variants, names, strict=True) if name in v.model_fields]
        model = next(v for v in variants if name in v.model_fields)
        (row,) = rows_of(model, prefix, {name})
        scope = "" if len(owners) == len(variants) else f"({', '.join(owners)} only) "
        head, meaning = row.rsplit(" | ", 1)
        out.append(f"{head} | {scope}{meaning}")
    return out


def rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    return rows_of(model, prefix, set(model.model_fields))


def rows_of(model: type[BaseModel], prefix: str, names: set[str]) -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        if name not in names:
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out += rows(annotation, f"{prefix}{name}.")
            continue
        item = _list_item(annotation)
        if item is not None:  # a list of sections (evaluation.sets): its items' fields
            meaning = _one_line(field.description or "")
            out.append(f"| `{prefix}{name}` | `list of sections` | `[]` | {meaning} |")
            out += rows(item, f"{prefix}{name}[].")
            continue
        variants = _variants(annotation)
        if len(variants) == 1 and field.default is None:  # an optional section (model.lora)
            meaning = _one_line(field.description or "")
            out.append(f"| `{prefix}{name}` | `section or None` | `None` | {meaning} |")
            out += rows(variants[0], f"{prefix}{name}.")
            continue
        if variants:
            out += union_rows(variants, f"{prefix}{name}.", field.default.transport)
            continue
        bounds = " ".join(_bound(m) for m in field.metadata)
        kind = str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
        kind = kind.replace(" | ", " or ")
        meaning = _one_line(field.description or "")
        kind_bounds = f"{kind} {bounds}".strip()
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        shown = "required" if field.is_required() else repr(default)
        out.append(f"| `{prefix}{name}` | `{kind_bounds}` | `{shown}` | {meaning} |")
    return out


def _one_line(text: str) -> str:
    """A description as one table cell: whitespace (line breaks too) joined into single spaces,
    and `<` escaped outside code spans (Markdown would take `<run_id>` for an HTML tag)."""
    parts = " ".join(text.split()).split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


if __name__ == "__main__":
    print("| field | type and bounds | default | meaning |\n|---|---|---|---|")
    print("\n".join(rows(RunConfig)))

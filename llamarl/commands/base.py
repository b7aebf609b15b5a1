"""What every command module shares: the type of a command's function, the subparsers it
registers on, and the help text of `section.field=value` overrides."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Command = Callable[[argparse.Namespace], int]
Subparsers = argparse._SubParsersAction
OVERRIDES_HELP = "section.field=value overrides, above the file and the environment"

"""Thin role entry points: parse config, build the role's parts, loop, close."""

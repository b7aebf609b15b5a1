"""Agents and environments written with other libraries' own APIs, trained by llamarl."""

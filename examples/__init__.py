"""Agents and environments written with other libraries' own APIs, trained by llamarl; a loss and
an advantage of a user's own (`own_algorithm`)."""

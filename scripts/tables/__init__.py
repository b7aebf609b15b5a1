"""The tables and generated sentences of README and docs/, each made from one bench's JSON under
docs/results: scripts/results_tables.py writes and checks them."""

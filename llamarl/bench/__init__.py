"""`llamarl bench`: benchmarks that print measured figures and write JSON. Never tests.

- `async-vs-sync`: one config in both modes, interleaved pairs, speed-up against its bound.
- `weight-sync`: the weight transports against memcpy and raw torch.distributed send/recv, from
  a trainer of 1 and of 2 ranks to 1, 2 and 4 generators.
- `bus`: messages through the broker against raw pyzmq in the same pattern.
- `resume`: stale drops and redone tickets of a run whose trainer is killed, against one that is
  not.
- `profile`: per-role costs on this machine, the input of `llamarl sim`.
- `sim-check`: `llamarl sim`'s predictions against measured async runs of several layouts.
Each ends with one JSON line on stdout (also written to `--out`).
"""

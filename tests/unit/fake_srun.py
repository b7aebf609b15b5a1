"""A stand-in for Slurm's `srun`, for running deploy/slurm/llamarl.sbatch where no Slurm is
(tests/unit/test_cluster_recipes.py): it starts nothing, records each step as a JSON line in
$SRUN_RECORD (srun's options, the command, and the llamarl, gloo and NCCL environment the step
inherits), and answers the script's address probe (`ip -4 -o addr show dev IF`) as node N would:
10.0.0.N+1 on eth0 and ib0, nothing on an interface it has not. Options must be written
`--name=value`, as the script does."""

from __future__ import annotations

import json
import os
import sys

PREFIXES = ("LLAMARL", "GLOO", "NCCL")
INTERFACES = ("eth0", "ib0")


def main(argv: list[str]) -> int:
    num_options = next(i for i, arg in enumerate(argv) if not arg.startswith("-"))
    options, command = argv[:num_options], argv[num_options:]
    env = {k: v for k, v in os.environ.items() if k.startswith(PREFIXES)}
    with open(os.environ["SRUN_RECORD"], "a") as record:
        record.write(json.dumps({"options": options, "command": command, "env": env}) + "\n")
    if command[0] == "ip" and command[-1] in INTERFACES:
        node = next(o for o in options if o.startswith("--nodelist=")).partition("=")[2]
        number = int(node.removeprefix("node"))
        print(f"2: {command[-1]}    inet 10.0.0.{number + 1}/16 brd 10.0.255.255 scope global")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

#!/usr/bin/env bash
# A 2-step RL smoke run of the real pretrained LLM (SmolLM2-135M-Instruct) in both modes, and of
# the worked example (configs/examples/own_model) with `llamarl eval` on its run: imports the
# model once (scripts/import_smollm2.sh: models/smollm2-135m), runs
# configs/smollm2_arithmetic.yaml for 2 steps on 8 held-out prompts and checks each summary (the async run as a split layout: auto would profile first, and might
# take turns colocated, leaving the split path untested). Run by CI after `make test`: 126 s
# on 2 cores with the model already imported; importing it takes about 2 minutes more.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/import_smollm2.sh
for mode in async sync; do
  out=runs/smoke-smollm2-$mode
  rm -rf "$out"
  .venv/bin/llamarl run configs/smollm2_arithmetic.yaml --mode "$mode" run_dir="$out" \
    trainer.num_steps=2 trainer.eval_every=2 trainer.checkpoint_every=0 task.num_eval=8 \
    workers.layout=split > "$out.json"
  .venv/bin/python - "$out" <<'PY'
import json, pathlib, sys
run = pathlib.Path(sys.argv[1])
summary = json.loads(run.joinpath("summary.json").read_text())
assert summary["steps"] == 2, summary
assert run.joinpath("model", "config.json").is_file(), "no final model"
print(f"smoke {summary['mode']}: 2 steps, held-out {summary['initial_accuracy']} -> "
      f"{summary['final_accuracy']}, {summary['wall_s']:.0f} s")
PY
done
# The worked example of docs/own-model.md (configs/examples/own_model): its JSONL data, row-aware
# reward and evaluation set, 2 steps async; then `llamarl eval` on the run must give its last
# held-out accuracy and set metrics.
out=runs/smoke-own-model
rm -rf "$out"
PYTHONPATH=configs/examples/own_model .venv/bin/llamarl run configs/examples/own_model/config.yaml \
  run_dir="$out" trainer.num_steps=2 trainer.eval_every=2 task.num_eval=8 \
  evaluation.sets='[{name: additions, path: configs/examples/own_model/data/eval.jsonl, num_samples: 4, max_prompts: 8}]' \
  workers.layout=split > "$out.json"
PYTHONPATH=configs/examples/own_model .venv/bin/llamarl eval configs/examples/own_model/config.yaml \
  --model "$out" task.num_eval=8 \
  evaluation.sets='[{name: additions, path: configs/examples/own_model/data/eval.jsonl, num_samples: 4, max_prompts: 8}]' \
  > "$out/eval.json"
.venv/bin/python - "$out" <<'PY'
import json, pathlib, sys
run = pathlib.Path(sys.argv[1])
summary = json.loads(run.joinpath("summary.json").read_text())
evaluated = json.loads(run.joinpath("eval.json").read_text())
assert summary["steps"] == 2, summary
assert evaluated["held_out_accuracy"] == summary["final_accuracy"], (evaluated, summary)
assert {k: evaluated[k] for k in summary["final_evaluations"]} == summary["final_evaluations"]
print(f"smoke own model: 2 steps, held-out {summary['final_accuracy']}, "
      f"{summary['final_evaluations']}; llamarl eval agrees")
PY

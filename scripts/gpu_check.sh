#!/usr/bin/env bash
# The checks that need a GPU, in one go, for a machine with one or more: prints the GPUs and
# torch's build, runs the CUDA tests (tests/integration/test_cuda.py: a learner step, sampling, a
# shared-memory version into GPU weights, NCCL shards with 3 GPUs, and the demo's async runs with
# roles on the GPU, which must learn and balance their ledgers) and then reads the figures of
# those runs from their own records into WORK_DIR/figures.json: seconds per RL step (RL time
# less evaluation, over the steps), the trainer's critical-path copy per version (stage) and each
# generator's time per weight pull, and held-out accuracy before and after.
# Usage: bash scripts/gpu_check.sh [WORK_DIR]   (default runs/gpu-check; PYTHON picks the
# interpreter, default .venv/bin/python). Exits non-zero when a test fails.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WORK_DIR=${1:-runs/gpu-check}
rm -rf "$WORK_DIR" && mkdir -p "$WORK_DIR"
nvidia-smi -L
"$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
"$PY" -m pytest -v -rs -p no:cacheprovider tests/integration/test_cuda.py \
  --basetemp "$WORK_DIR/pytest" --junitxml "$WORK_DIR/junit.xml"
status=$?
"$PY" - "$WORK_DIR" <<'PY'
import json, pathlib, sys

work = pathlib.Path(sys.argv[1])
figures = {}
for summary_path in sorted(work.glob("pytest/*/*/summary.json")):  # pytest/<test>/<layout>/
    run, layout = summary_path.parent, summary_path.parent.name
    summary = json.loads(summary_path.read_text())
    timers = {p.stem: json.loads(p.read_text()) for p in (run / "timers").glob("*.json")}
    trainer = timers["trainer"]
    figures[layout] = {
        "steps": summary["steps"],
        "s_per_step": round((summary["rl_wall_s"] - summary["eval_s"]) / summary["steps"], 4),
        "stage_ms_per_step": round(1000 * trainer.get("stage_s", 0.0) / summary["steps"], 2),
        "pull_ms": {name: round(1000 * t["sync_s"] / t["syncs"], 2)
                    for name, t in sorted(timers.items()) if name.startswith("generator")},
        "accuracy": [summary["initial_accuracy"], summary["final_accuracy"]],
        "wall_s": summary["wall_s"],
    }
(work / "figures.json").write_text(json.dumps(figures, indent=1))
print(json.dumps(figures, indent=1))
PY
exit $status

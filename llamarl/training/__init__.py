"""The trainer's computation, apart from the role loop that drives it: the RL optimizer step
(`learner`), the supervised warm start (`sft`), held-out evaluation, checkpoints, the ranks of a
data-parallel trainer (`parallel`) and exporting a run's model."""

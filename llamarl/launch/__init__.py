"""Starting, placing and supervising processes: `llamarl run` on one machine (`local`) or on a Ray
cluster (`ray_actors`), the synchronous baseline that places every role in one process
(`sync_run`), the split of cores between roles (`cores`) and the one process supervisor
(`supervise`)."""

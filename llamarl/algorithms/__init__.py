"""Pure functions: group advantages and policy losses (AIPO, PPO-clip, REINFORCE) on tensors,
overlong shaping (DAPO) on a group's arrays."""

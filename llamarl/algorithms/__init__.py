"""Pure tensor functions: group advantages and policy losses (AIPO, PPO-clip, REINFORCE)."""

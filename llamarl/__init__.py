"""llamarl: fully asynchronous, message-bus RL post-training for Hugging Face causal LMs.

The library holds the role components (`llamarl.roles`) and everything they are built from:
config, the wire protocol, the store and bus interfaces with their Redis/ZeroMQ and in-process
implementations, weight-sync transports, algorithms, the model engine and rewards. It never
imports a worker process module (`workers/`).
"""

__version__ = "0.1.0"

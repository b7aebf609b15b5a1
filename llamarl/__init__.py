"""llamarl: fully asynchronous, message-bus RL post-training for Hugging Face causal LMs.

The library holds everything the role workers share: config, the wire protocol, the bus client,
the Redis version store, algorithms, the model engine, rewards and weight-sync transports.
It never imports a worker.
"""

__version__ = "0.1.0"

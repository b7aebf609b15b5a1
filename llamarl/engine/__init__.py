"""The model engine: tokenizer, model build/load, sampling with behaviour log-probs, scoring."""

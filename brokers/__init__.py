"""The ZeroMQ broker process and the Redis launch helpers used by embedded runs and tests."""

"""What a person or a dashboard sees of a run: structlog set-up (`log`), progress of long phases,
per-step metrics and their sinks (TensorBoard, W&B), the Prometheus export, `llamarl monitor` and
`llamarl plot`."""

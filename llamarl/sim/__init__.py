"""`llamarl sim`: a calibrated discrete-event simulator of sync and async RL runs (step time,
idle fraction per role, staleness) for a layout, from a profile measured on the machine."""

"""`python -m brokers` (same as `llamarl worker broker`): run the ZeroMQ broker until SIGTERM."""

from brokers.service import main

raise SystemExit(main())

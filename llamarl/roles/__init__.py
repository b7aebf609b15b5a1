"""Role logic as library components: generator, reward scorer and trainer loops that receive their
collaborators (store, bus, weight transport, clock) and hold no signal handlers or globals."""

"""What keeps a run alive and honest: checkpoints, injected faults, anomaly guards, the cross-replica
silent-data-corruption check, and the hang watchdog."""

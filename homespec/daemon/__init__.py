"""The daemon: `homespec serve` (FastAPI app factory, pair workers, metrics, systemd notify)."""

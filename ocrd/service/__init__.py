"""The daemon's life under systemd: start, ready, watchdog, reload, drain; logs, metrics and
status."""

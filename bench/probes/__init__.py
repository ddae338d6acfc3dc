"""One-off probes: small measurements behind a single decision, run by hand."""

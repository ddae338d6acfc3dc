"""From inbox to claim: watching, readiness, and the claim of a ready file."""

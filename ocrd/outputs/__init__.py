"""What a conversion leaves behind: Markdown, sidecar, searchable PDF, and the atomic writes
into the outbox, archive and failed folders."""

"""The work ledger: the journal, the schedule, each job's outcome, recovery after a crash, and
retries."""

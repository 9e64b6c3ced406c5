"""The engine: follow the journal, wake on changes, dispatch into queues, execute, complete, keep the cursor and leases, say what went wrong; the state dir's names."""

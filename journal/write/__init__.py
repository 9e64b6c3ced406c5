"""Writing a journal: the one writer, and a journal recreated when deleted under it."""

"""What a journal says, folded: the summary behind ``status``, its index, queries, the best checkpoint, validation."""

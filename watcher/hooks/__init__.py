"""What a hook is and runs: callbacks and commands, a hook's options, one delivery and its result."""

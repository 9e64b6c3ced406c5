"""``ilab-journal backtest``: finished journals replayed through stopping and retention
policies (the watcher's own callbacks and the trainer's retention rule), touching nothing:
``policies`` (options and sweeps), ``replay`` (one journal, read once), ``outcome`` (the
plain results and their table), ``cli`` (the command, found by ``ilab-journal`` through the
``ilab_journal.commands`` entry point)."""

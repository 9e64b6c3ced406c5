"""Files that flow into a run: control commands, reports, and the ``job`` records of scheduler jobs."""

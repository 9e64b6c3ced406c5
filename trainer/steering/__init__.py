"""Steering a run from outside: control commands read from ``control/``
(:mod:`trainer.steering.control_poller`), watcher reports from ``reports/``
(:mod:`trainer.steering.report_inbox`), and what a step boundary does with the agreed
command bits (:mod:`trainer.steering.decisions`). No torch; imports only the config."""

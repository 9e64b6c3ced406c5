"""Alerts: what the watcher tells people when a run goes wrong (docs/alerts.md)."""

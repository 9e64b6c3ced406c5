"""One record: the event names, the envelope and payload schema, the JSON field types."""

"""Asking a journal yes/no questions: ``ilab-journal check``'s expressions (``expect``),
the facts they read (``facts``) and waiting for a run to settle (``settle``)."""

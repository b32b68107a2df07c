"""The operator's commands and their readings of the audit: export, verify, replay, suggestions, status."""

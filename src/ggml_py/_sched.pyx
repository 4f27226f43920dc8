"""Scheduler core (filled in by the scheduler port)."""

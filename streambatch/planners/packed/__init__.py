"""Packed (padding-free) planning: ``planner="bucketed", pack=True``."""

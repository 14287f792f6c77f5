"""gauge: see its issue; filled in by its package's work."""

"""Broker services that act on stored logs over time: retention, compaction, the disk guard."""

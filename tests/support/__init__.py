"""Helpers shared by test modules (and by bench/): private servers, processes, fault proxies, polling,
keyspace snapshots. Not tests themselves; a helper used by two test modules lives here, never in one of them.
"""

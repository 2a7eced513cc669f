"""Integration tests: real redis-server, dockerd and jobpool processes (tests/README.md)."""

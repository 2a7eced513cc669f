"""Unit tests: fakeredis[lua] and a real redis-server, no workers, daemons or signals (tests/README.md)."""

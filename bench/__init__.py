"""The benchmarks, a package run from the repository root (`python3 -m bench.<name>`), so that they import
the test helpers as `tests.support` and each other as `bench.<module>` (BENCHMARKS.md has the figures)."""

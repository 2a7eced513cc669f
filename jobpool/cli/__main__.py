"""`python -m jobpool.cli`: the same command as the installed `jobpool` (tests, benchmarks and `up` start
their processes this way)."""

from . import main

if __name__ == "__main__":
    main()

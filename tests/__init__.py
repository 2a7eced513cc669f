"""The test suite, a package so that its shared helpers import by one name: `tests.support.<module>`.

pytest (its default "prepend" import mode) puts the directory above the topmost package, the repository
root, on sys.path before importing a test module or conftest.py; bench/ runs from that root as
`python3 -m bench.<name>`, so both see the same `tests.support`.
"""

"""A package, so that its conftest.py is `remedies.conftest` and leaves tests/conftest.py the `conftest` that
test modules import from."""

"""Flag knowledge data files (see README.md); a package so importlib.resources can find them."""

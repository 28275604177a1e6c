"""Flag knowledge data files (see README.md), read by path from command/flags.py and command/fromargs.py."""

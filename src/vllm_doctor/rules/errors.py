"""The one error a malformed rule file raises, whatever stage of loading finds it."""


class CatalogError(Exception):
    """A rule file is malformed; the message names the file and the problem in one line."""

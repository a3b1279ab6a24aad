"""Tools the tests use that are not part of the installed package."""

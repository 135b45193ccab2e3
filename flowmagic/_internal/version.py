"""The package version, here so that lower layers can read it without importing the package root."""

__version__ = "0.1.0"

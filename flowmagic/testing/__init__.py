"""Test support that ships with the package: the loopback OpenAI-compatible server
(`python -m flowmagic.testing.loopback`)."""

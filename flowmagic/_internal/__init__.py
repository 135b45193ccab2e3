"""Private helpers shared by every layer (no flowmagic imports above `errors`)."""

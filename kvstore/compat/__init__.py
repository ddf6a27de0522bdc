"""kvstore.compat."""

"""kvstore.sim."""

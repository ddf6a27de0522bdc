"""kvstore.master."""

"""kvstore.model."""

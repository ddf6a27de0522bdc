"""kvstore.conductor."""

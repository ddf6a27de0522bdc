"""kvstore.client."""

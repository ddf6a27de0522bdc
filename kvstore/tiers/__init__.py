"""kvstore.tiers."""

"""kvstore.transfer."""

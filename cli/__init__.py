"""The `kvstore` command line."""

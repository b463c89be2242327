"""A toy openinfer model plugin."""

"""The protocol, written once for both dialects: one module per role."""

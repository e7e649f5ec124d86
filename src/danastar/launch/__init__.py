"""danastar.launch."""

"""danastar.train."""

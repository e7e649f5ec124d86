"""danastar.data."""

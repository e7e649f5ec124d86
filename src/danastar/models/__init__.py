"""danastar.models."""

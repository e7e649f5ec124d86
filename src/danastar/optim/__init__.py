"""danastar.optim."""

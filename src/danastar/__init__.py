"""danastar: log-time optimizers and a pretraining framework for language models."""

__version__ = "0.2.0"

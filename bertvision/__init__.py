"""bertvision: partial fine-tuning, frozen hidden states of every layer, tiny heads."""

__version__ = "0.1.0"

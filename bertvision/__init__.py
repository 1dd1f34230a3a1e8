"""bertvision: partial fine-tuning, frozen hidden states of every layer, tiny heads."""

__version__ = "0.1.0"  # the one place: pyproject.toml reads it, `bertvision --version` prints it

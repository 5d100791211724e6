"""qtool's version, which every file qtool writes records (the lowest module: any layer may read it)."""

__version__ = "0.1.0"

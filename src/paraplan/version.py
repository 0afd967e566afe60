"""paraplan's version, in a leaf module: what prints it (`paraplan --version`) or records it (the
calibration cache's key) imports this, never the package root."""

__version__ = "0.1.0"

"""paraplan: plan, predict and run distributed training of PyTorch models.

The public API is small; see docs/architecture.md for the flow of data.
"""

from paraplan.errors import ParaplanError

__all__ = ["ParaplanError", "__version__"]
__version__ = "0.1.0"

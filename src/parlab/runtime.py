"""What code running on a rank can ask about itself (defined in ``parlab.launch.runtime``)."""
from .launch.runtime import device

__all__ = ["device"]

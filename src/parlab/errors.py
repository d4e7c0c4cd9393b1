"""The exceptions a launch can raise (defined in ``parlab.launch.errors``)."""
from .launch.errors import LaunchError, LaunchTimeout, WorkerError

__all__ = ["LaunchError", "LaunchTimeout", "WorkerError"]

"""The former name of ``parlab.planner.band``: ``from parlab import planner_band`` still gives that module."""
import sys

from .planner import band

sys.modules[__name__] = band

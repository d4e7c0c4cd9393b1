"""The former name of ``parlab.planner.published``: ``from parlab import planner_published`` still gives that module."""
import sys

from .planner import published

sys.modules[__name__] = published

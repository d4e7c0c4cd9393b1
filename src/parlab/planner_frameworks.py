"""The former name of ``parlab.planner.frameworks``: ``from parlab import planner_frameworks`` still gives that module."""
import sys

from .planner import frameworks

sys.modules[__name__] = frameworks

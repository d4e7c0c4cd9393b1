"""nbgrader settings of the instructor's server (found through JUPYTER_CONFIG_PATH, set by the hub).

Only the exchange: everything else about the course (source and release
folders, the cell timeout, parlab's grading steps) is in the repository's
nbgrader_config.py, which nbgrader reads from the course folder the
instructor runs it in (the hub kit puts the course at ~/parlab).
"""
import os

c = get_config()  # noqa: F821 - provided by traitlets
load_subconfig(os.path.join(os.path.dirname(__file__), os.pardir, "exchange_config.py"))  # noqa: F821

# The formgrader (a server extension, started in the home folder) finds the
# course here; nbgrader run from inside ~/parlab finds it anyway.
c.CourseDirectory.root = os.path.expanduser("~/parlab")

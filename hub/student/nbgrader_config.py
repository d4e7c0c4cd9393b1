"""nbgrader settings of a student's server (found through JUPYTER_CONFIG_PATH, set by the hub).

A student's server has no course folder: the repository's nbgrader_config.py
is not there, so nbgrader's Validate button would run with nbgrader's
default 30 s cell timeout, which lab 01's sweep and the 4-rank launches
exceed.  The cell timeout here is the course's (``c.Execute.timeout`` in the
repository's nbgrader_config.py; tests/hub checks that they agree): above
parlab's 120 s launch timeout, so a hang ends as a clean LaunchTimeout.
"""
import os

c = get_config()  # noqa: F821 - provided by traitlets
load_subconfig(os.path.join(os.path.dirname(__file__), os.pardir, "exchange_config.py"))  # noqa: F821
load_subconfig(os.path.join(os.path.dirname(__file__), os.pardir, "validate_config.py"))  # noqa: F821

c.Execute.timeout = 300
c.Execute.interrupt_on_timeout = True

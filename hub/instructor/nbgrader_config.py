"""nbgrader settings of the instructor's server (found through JUPYTER_CONFIG_PATH, set by the hub).

The exchange, and the late policy; everything else about the course (source
and release folders, the cell timeout, parlab's grading steps) is in the
repository's nbgrader_config.py, which nbgrader reads from the course folder
the instructor runs it in (the hub kit puts the course at ~/parlab).
``parlab grade`` reads both, in the same order as ``nbgrader autograde``.
"""
import os
import sys

c = get_config()  # noqa: F821 - provided by traitlets
HUB = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
load_subconfig(os.path.join(HUB, "exchange_config.py"))  # noqa: F821
load_subconfig(os.path.join(HUB, "validate_config.py"))  # noqa: F821

# The formgrader (a server extension, started in the home folder) finds the
# course here; nbgrader run from inside ~/parlab finds it anyway.
c.CourseDirectory.root = os.path.expanduser("~/parlab")

# Late work: a tenth of the notebook's score per started day after the due date
# (hub/late_penalty.py; the reasons are in docs/instructor.md, "Due dates and late work").
# The due date is the gradebook's: nbgrader db assignment add <lab> --duedate "YYYY-MM-DD HH:MM:SS UTC".
if HUB not in sys.path:
    sys.path.insert(0, HUB)
c.AssignLatePenalties.plugin_class = "late_penalty.PenaltyPerStartedDay"
c.PenaltyPerStartedDay.fraction_per_day = 0.1

# Collect checks each inbound folder before taking it (hub/safe_collect.py): its Unix owner must be the
# student its name claims, nothing inside may be a link or a special file, and the submission time is
# the server's (the files' ctime), not the timestamp.txt the student wrote.
c.ExchangeFactory.collect = "safe_collect.SafeExchangeCollect"

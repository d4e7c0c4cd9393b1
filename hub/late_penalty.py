"""The course's late policy: each started day after the due date costs a tenth of the notebook's score.

nbgrader applies it when it autogrades (``AssignLatePenalties``, in
nbgrader's default pipeline and in the course's), whether the instructor runs
``nbgrader autograde`` or ``parlab grade``; ``hub/instructor/nbgrader_config.py``
names it.  nbgrader itself offers only ``none`` (the lateness is recorded, no
penalty) and ``zero`` (a late notebook scores 0); why the course takes this
one instead is in docs/instructor.md ("Due dates and late work").

nbgrader passes the plugin the notebook's score as graded (not its maximum)
and the seconds the submission came after the due date (with the student's
extension, if any).  The penalty here is ``fraction_per_day`` of that score
per started 24 hours: one second late costs 10 %, 24 h and one second 20 %,
and from ten days on the notebook scores 0 (nbgrader never lets a penalty
exceed the score).  A submission before the due date is never passed here.
"""
from __future__ import annotations

import math

from nbgrader.plugins import BasePlugin
from traitlets import Float


class PenaltyPerStartedDay(BasePlugin):
    """``fraction_per_day`` of the notebook's score for each started day late."""

    fraction_per_day = Float(0.1, min=0.0, max=1.0,
                             help="Fraction of the notebook's score taken per started day late").tag(config=True)

    def late_submission_penalty(self, student_id: str, score: float, total_seconds_late: float) -> float:
        days = math.ceil(total_seconds_late / 86400)
        penalty = round(min(1.0, self.fraction_per_day * days) * score, 6)
        self.log.info("%s is %.0f s late (%d started day%s): penalty %g of %g", student_id,
                      total_seconds_late, days, "s" * (days != 1), penalty, score)
        return penalty

"""The nbgrader exchange and course id that students and the instructor share.

Loaded by ``student/nbgrader_config.py`` and ``instructor/nbgrader_config.py``
(``load_subconfig``), so both sides name the same folder.  The hub passes
``PARLAB_EXCHANGE`` to every server (``jupyterhub_config.py``); without it the
exchange is nbgrader's usual ``/srv/nbgrader/exchange``.
"""
import os

c = get_config()  # noqa: F821 - provided by traitlets

c.CourseDirectory.course_id = "parlab"
c.Exchange.root = os.environ.get("PARLAB_EXCHANGE", "/srv/nbgrader/exchange")

"""What nbgrader's Validate runs with on the hub's servers, students' and instructors' alike.

Loaded by ``student/nbgrader_config.py`` and ``instructor/nbgrader_config.py``
(``load_subconfig``).  Validate (the notebook's button, and ``nbgrader
validate``) runs the whole notebook in a kernel of its own, inside the
server's request handler, under the cell timeout.  The kernels it starts get
``PARLAB_VALIDATE=1`` as their first line (``IPKernelApp.exec_lines``), so
that the labs' queue cells stand down (``parlab.launch.offer_queue``) as they
do under autograde: otherwise each Validate with the Slurm queue on would
submit an 8-GPU job and wait for it, failing right answers at the timeout and
holding the server meanwhile.  Scoped to the Validator (``c.Validator.Execute``):
autograde's kernels are not touched.
"""
c = get_config()  # noqa: F821 - provided by traitlets

c.Validator.Execute.extra_arguments = ["--IPKernelApp.exec_lines=import os; os.environ['PARLAB_VALIDATE'] = '1'"]

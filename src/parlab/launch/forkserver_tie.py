"""Preloaded by the multiprocessing fork server that a forked torchrun starts (``fork_server.py``).

That process forks the ranks; importing this module ties it to its parent, torchrun's agent, so that
it dies with the agent (and the ranks, tied to it in turn, with it): a killed kernel leaves nothing.
"""
from .procs import die_with_parent

die_with_parent(None)

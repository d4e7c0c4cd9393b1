"""Preloaded by the multiprocessing fork server that a forked torchrun starts as a new interpreter.

Only where ``fork_server._fork_the_ranks_server`` could not fork it from the agent (which ties it itself).

That process forks the ranks; importing this module ties it to its parent, torchrun's agent, so that
it dies with the agent (and the ranks, tied to it in turn, with it): a killed kernel leaves nothing.
"""
from .procs import die_with_parent

die_with_parent(None)

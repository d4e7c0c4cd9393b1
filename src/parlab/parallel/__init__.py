"""Reference pieces of parallel training that labs and figures share.

- ``parlab.parallel.mesh``  the rank <-> (p, d, t) mapping of a 3-D device mesh
  (TP innermost, then DP, then PP) and the process-group rank lists along each
  axis, in the order ``torch.distributed.device_mesh.init_device_mesh`` uses.

The students' own parallel code lives in their notebooks, not here.
"""

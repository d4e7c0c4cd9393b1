"""Reference pieces of parallel training that labs and figures share.

- ``parlab.parallel.mesh``  the rank <-> (p, d, t) mapping of a 3-D device mesh
  (TP innermost, then DP, then PP) and the process-group rank lists along each
  axis, in the order ``torch.distributed.device_mesh.init_device_mesh`` uses;
  which axes cross nodes on a launch's real nodes.
- ``parlab.parallel.node_layout``  how many nodes a launch has and how many
  ranks each, from torchrun's (``GROUP_WORLD_SIZE``, ``LOCAL_WORLD_SIZE``) or
  Slurm's (``SLURM_NNODES``, ``SLURM_GPUS_ON_NODE``) variables.
- ``parlab.parallel.pp_stages``  parlab's GPT cut into pipeline stages, a stage
  with a controlled (sleeping) cost, forward/backward spans, and a meter of the
  activation bytes autograd holds.
- ``parlab.parallel.pp_schedule``  ideal GPipe / 1F1B / interleaved timetables,
  simulated from each stage's order of passes.
- ``parlab.parallel.tp_reference``  the full layers a tensor-parallel layer must
  reproduce: ``reference_linear`` from a seed and ``randomize_`` (random biases
  and LayerNorm weights), for Lab 03 and its checks.

The students' own parallel code lives in their notebooks, not here.
"""

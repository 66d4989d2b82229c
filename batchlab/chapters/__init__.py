"""The code behind each chapter of the book: one module per notebook, named by the notebook's slug.

Each module holds that chapter's experiments (functions that run the simulator over a grid and return tidy
frames) and its chart builders; a notebook imports its own module, e.g.
``from batchlab.chapters import chunked_prefill as chapter``. Generic chart plumbing lives in
:mod:`batchlab.viz`, run-level metrics in :mod:`batchlab.metrics`, frontier helpers in :mod:`batchlab.sweep`.

- ``static_batching`` (01): padding tax and tail waste of lockstep batches.
- ``dynamic_batching`` (02): static, dynamic and iteration-level batching on one workload.
- ``continuous_batching`` (03): one stream's Gantt chart and batch occupancy under the three policies.
- ``step_time_roofline`` (04): decode step time against batch size, the knee.
- ``piggybacking`` (07): mixed prefill and decode iterations, the token budget's split.
- ``two_knobs`` (08): the ``max_num_seqs`` x ``max_num_batched_tokens`` sweep and its frontier.

The modules are not imported here: importing one chapter loads only what it needs.
"""

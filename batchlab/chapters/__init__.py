"""The code behind each chapter of the book: one module per notebook, named by the notebook's slug.

Each module holds that chapter's experiments (functions that run the simulator over a grid and return tidy
frames) and its chart builders; a notebook imports its own module, e.g.
``from batchlab.chapters import chunked_prefill as chapter``. Generic chart plumbing lives in
:mod:`batchlab.viz`, run-level metrics in :mod:`batchlab.metrics`, frontier helpers in :mod:`batchlab.sweep`.

- ``static_batching`` (01): padding tax and tail waste of lockstep batches as output lengths spread.
- ``dynamic_batching`` (02): static, dynamic and iteration-level batching on one workload; the queue delay.
- ``continuous_batching`` (03): one stream's Gantt chart and batch occupancy under the three policies.
- ``step_time_roofline`` (04): decode step time against batch size and context, the knee.
- ``prefill_spike`` (05): the inter-token gap when a long prompt arrives unchunked.
- ``chunked_prefill`` (06): the token budget's trade between the tallest gap and the newcomer's TTFT.
- ``piggybacking`` (07): mixed prefill and decode iterations, and how the token budget is split.
- ``two_knobs`` (08): the ``max_num_seqs`` x ``max_num_batched_tokens`` sweep and its frontier.
- ``fact_check`` (11): the article's quantitative claims, recomputed.
- ``scenes``: the long-prompt scene that chapters 05, 06, 09 and 11 share.

The modules are not imported here: importing one chapter loads only what it needs.
"""

"""The code behind each chapter of the book: one module per notebook, named by the notebook's slug.

Each module holds that chapter's experiments (functions that run the simulator over a grid and return tidy
frames) and its chart builders; a notebook imports its own module, e.g.
``from batchlab.chapters import chunked_prefill as chapter``. Generic chart plumbing lives in
:mod:`batchlab.viz`, run-level metrics in :mod:`batchlab.metrics`, frontier helpers in :mod:`batchlab.sweep`.
Numbers and verdicts that more than one page states come from :mod:`batchlab.chapters.facts`, computed once, and
the settings they come from (model, GPU, traffic, load) from :mod:`batchlab.chapters.scenes`.

:data:`CHAPTERS` is the reading order: the notebook of chapter ``n`` is ``notebooks/{n:02d}_{slug}.ipynb`` and
the book's sidebar numbers it ``n`` (the tests check all three agree). :data:`SHARED` names the other modules.
The modules are not imported here: importing one chapter loads only what it needs.
"""
from __future__ import annotations

CHAPTERS = {  # slug -> chapter number; the module batchlab.chapters.<slug> holds its experiments and charts
    "static_batching": 1,  # padding tax and tail waste of lockstep batches as output lengths spread
    "dynamic_batching": 2,  # static, dynamic and iteration-level batching on one workload; the queue delay
    "continuous_batching": 3,  # one stream's Gantt chart and batch occupancy under the three policies
    "step_time_roofline": 4,  # decode step time against batch size and context: the knee
    "prefill_spike": 5,  # the inter-token gap when a long prompt arrives unchunked
    "chunked_prefill": 6,  # the token budget's trade between the tallest gap and the newcomer's TTFT
    "piggybacking": 7,  # mixed prefill and decode iterations, and how the token budget is split
    "two_knobs": 8,  # the max_num_seqs x max_num_batched_tokens sweep and its frontier
    "tuning": 9,  # goodput under your own SLO: the tuner and each setting's largest sustainable rate
    "prefix_caching": 10,  # what a cached prefix saves, and how large the KV pool must be to keep it
    "disaggregation": 11,  # replicas behind a router against prefill and decode on separate GPUs
    "cheat_sheet": 12,  # the book's advice: symptom, knob, effect, each row linked to its chart
    "validation": 13,  # the cost model and the whole server against measured H100 kernels and vLLM runs
    "fact_check": 14,  # the article's quantitative claims, recomputed, one verdict each
}

SHARED = {  # the package's other modules: what several chapters read, or one chapter's part of its own
    "facts": "every number or verdict more than one page states, computed once, with the checks on the pages",
    "scenes": "the named settings every fact comes from (model, GPU, traffic, load), and the long-prompt scene",
    "verdicts": "one verdict per claim of the article, read by every chapter that states it",
    "iteration_picker": "chapter 7's iteration picker: one iteration's rows and where its time goes",
    "two_knobs_charts": "chapter 8's chart of the two-knob sweep (its constants re-exported by two_knobs)",
    "tuning_charts": "chapter 9's goodput map over the two knobs (re-exported by batchlab.chapters.tuning)",
    "prefix_caching_charts": "chapter 10's pool and budget charts (re-exported by batchlab.chapters.prefix_caching)",
    "validation_e2e": "chapter 13's whole-server part (re-exported by batchlab.chapters.validation)",
    "validation_v060": "chapter 13's replay of vLLM v0.6.0's published figures (re-exported by validation)",
}


def notebook(slug: str) -> str:
    """The notebook's name without suffix, ``"06_chunked_prefill"`` for ``"chunked_prefill"``."""
    return f"{CHAPTERS[slug]:02d}_{slug}"


def link(slug: str, anchor: str | None = None, text: str | None = None, from_book: bool = False) -> str:
    """An HTML link to a chapter (optionally to a label in it) for tables the pages render: ``chapter 6``.

    ``anchor`` is a MyST label of that page (``(name)=`` before a heading); ``text`` defaults to "chapter N".
    Links are relative to ``notebooks/`` (``from_book``: to ``book/``). Markdown cells link with the
    ``{chapter}`` role instead.
    """
    href = ("../notebooks/" if from_book else "") + notebook(slug) + ".html" + (f"#{anchor}" if anchor else "")
    return f'<a href="{href}">{text or f"chapter {CHAPTERS[slug]}"}</a>'

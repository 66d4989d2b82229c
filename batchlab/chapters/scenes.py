"""The book's named scenes, and the long-prompt scene that chapters 05, 06, 12 and 14 run.

A scene is a setting a number comes from: model, weight type, GPU, traffic, requests and seed
(:class:`Scene`, :data:`SCENES`). Every fact of the book (:mod:`batchlab.chapters.facts`) names its scene, and
every page states the scene of the numbers it shows, glued from :attr:`Scene.text` (:func:`glue_scene`), so a
reader always knows which setup a number belongs to.

The long-prompt scene (``SCENES["spike"]``, the rest of this module): a batch decoding at a long context, then
one long prompt arrives.

A batch of decoders is running, each with ``CONTEXT`` tokens of KV cache, when one ``PROMPT_TOKENS``-token
prompt (the newcomer) arrives. Chapter 05 runs it unchunked (the prefill spike), chapter 06 under each token
budget (the hyperbola), chapter 14 checks the article's 20 ms cadence and 400 ms gap on it, and chapter 12
quotes all three. Every chapter builds the scene here, with these defaults, so a number one chapter quotes for
it is the number the others quote.

How it is built. The decoders arrive at time 0 with one-token prompts, so every policy, and every token budget
larger than the batch, admits all of them in the first iteration; they then decode in lockstep. The newcomer
reaches the engine at the end of the iteration in which each decoder emitted its ``context``-th token, so the
next iteration, the first that can admit it, decodes every sequence at exactly ``context`` cached tokens:
whatever the policy or the budget, the newcomer meets the same batch at the same moment. By default the batch
is the one whose decode step at that context takes the article's 20 ms (:func:`default_decoders`).

Two clocks. Token times are the engine's (the cost model folds the whole client-server round trip into
``request_latency_s``, paid between sending a request and the engine seeing it). The newcomer's client sends it
``request_latency_s`` before the engine sees it: that send is its ``arrival_s``, as in every
:class:`batchlab.SimResult`, and the zero of :func:`decoder_gaps`' time axis, and its ``ttft_s`` is the one
its client measures, the request latency included. What the decoders see is anchored where the engine sees the
newcomer (``SceneRun.seen_s``): the cadence is their gap that ends there, the spike their tallest gap after it.

Two settings of ``policy="chunked"`` are the scene's own (:data:`CHUNKED_SCENE_KNOBS`, both overridable).
It runs vLLM's synchronous scheduler (``async_scheduling=False``): with vLLM 0.33's default async scheduling
the iteration after the newcomer reaches the engine was planned before it came, so it would wait one more
decode step (about 20 ms) under every budget, and Orca's ``continuous`` policy, which has no such delay, would
no longer meet it at the same moment. And ``max_num_seqs`` is vLLM's default capped at the token budget, as a vLLM user
must cap it (vLLM refuses ``max_num_batched_tokens < max_num_seqs``).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..sim import simulate
from ..vllm import seats_for, vllm_defaults
from ..workload import Requests

class Scene(NamedTuple):
    """A named setting: what runs where, on which traffic. Used by every chapter and by the facts."""

    name: str  # key of SCENES
    text: str  # how a page states it, in words
    model: str  # model preset
    gpu: str  # hardware preset
    dtype: str = "bf16"  # weight type
    workload: str | None = None  # request preset (None: the cost model alone, or a stream built here)
    n_requests: int | None = None
    seed: int = 0
    short: str = ""  # the same in a few words, for a table cell

    def cost(self):
        """The calibrated cost model of this scene."""
        from .. import CostModel, get_hardware, get_model

        return CostModel(get_hardware(self.gpu), get_model(self.model), dtype=self.dtype)

    def requests(self, rate_req_s: float | None = None, *, fit_context: bool = False) -> Requests:
        """The scene's request stream (its preset, requests and seed) at ``rate_req_s`` (default: the trace's);
        with ``fit_context``, only the requests that fit the model's context, as vLLM serves them
        (:func:`within_context`)."""
        from ..workload import preset

        if self.workload is None:
            raise ValueError(f"scene {self.name!r} has no request stream")
        stream = preset(self.workload, self.n_requests, rate_req_s=rate_req_s, seed=self.seed)
        return within_context(self.cost(), stream) if fit_context else stream


def within_context(cost, requests):
    """The requests that fit the model's context, each as vLLM serves it.

    A prompt is kept if it is shorter than ``max_model_len`` (vLLM's default: the model's context), and its output
    is clipped to the room the prompt leaves, as vLLM clips ``max_tokens``. vLLM rejects a longer prompt;
    ``continuous`` (Orca, vLLM V0) knows no context limit and would serve it, so a comparison of the policies
    gives all of them this stream and they do the same work. Used by :meth:`Scene.requests` and chapters 2, 7 and 9.

    Parameters
    ----------
    cost : CostModel
        Its model's ``max_position_embeddings`` (tokens) is the context.
    requests : Requests
        A stream without ``prefix_blocks``.

    Returns
    -------
    Requests
        The kept requests, in arrival order, with their arrival times.
    """
    if requests.prefix_blocks is not None:
        raise ValueError("within_context takes a stream without prefix_blocks")
    context = cost.model.max_position_embeddings
    keep = requests.prompt_tokens < context
    prompt = requests.prompt_tokens[keep]
    return Requests(arrival_s=requests.arrival_s[keep], prompt_tokens=prompt,
                    output_tokens=np.minimum(requests.output_tokens[keep], context - prompt))


def _scenes(*scenes: Scene) -> dict[str, Scene]:
    return {s.name: s for s in scenes}


SCENES = _scenes(
    Scene("llama8", "Llama-3-8B in BF16 on one H100 SXM, the cost model alone", "llama-3-8b", "h100-sxm",
          short="Llama-3-8B BF16, one H100 SXM"),
    Scene("llama70", "Llama-3-70B in FP8 on one H100 SXM, the cost model alone", "llama-3-70b", "h100-sxm",
          dtype="fp8", short="Llama-3-70B FP8, one H100 SXM"),
    Scene("spike", "Llama-3-8B in BF16 on one H100 SXM: a batch decoding at 2,048 tokens of context (the batch "
          "whose step takes the article's 20 ms) when one 8,000-token prompt arrives", "llama-3-8b", "h100-sxm",
          short="Llama-3-8B BF16, one H100 SXM, a long prompt joining a decoding batch"),
    Scene("conv", "Llama-3-8B in BF16 on one H100 SXM serving the Azure conversation trace (2023): 3,000 "
          "requests with the trace's length distributions (prompt and output drawn independently) and a gamma "
          "renewal of its burstiness (seed 0), vLLM's defaults but for the knobs named", "llama-3-8b", "h100-sxm",
          workload="azure-conv-2023", n_requests=3000,
          short="Llama-3-8B BF16, one H100 SXM, Azure conversation traffic (synthetic arrivals)"),
    Scene("padding", "Llama-3-8B in BF16 on one H100 SXM: 512 requests queued at once, equal 512-token prompts and "
          "outputs of mean 256 tokens drawn from a lognormal at the chosen spread, in static batches of 32 rows",
          "llama-3-8b", "h100-sxm", short="Llama-3-8B BF16, one H100 SXM, 512 queued requests of varied output"),
    Scene("code", "Llama-3-8B in BF16 on one H100 SXM serving the Azure code trace (2023): 3,000 requests with "
          "the trace's length distributions (drawn independently) and a gamma renewal of its burstiness "
          "(inter-arrival CV about 13, seed 0)", "llama-3-8b", "h100-sxm", workload="azure-code-2023",
          n_requests=3000, short="Llama-3-8B BF16, one H100 SXM, Azure code traffic (synthetic bursts)"),
    Scene("prefix", "Llama-3.1-8B (Llama-3-8B's weights and shapes, a 131,072-token context) in BF16 on one H100 "
          "SXM with vLLM's defaults, prefix caching on and off: Mooncake's conversation trace (its recorded arrivals "
          "and block ids, replayed 5 times slower), and two synthetic workloads, 2,000 requests over 64 shared "
          "system prompts of 4,096 tokens (Poisson arrivals at 4 req/s) and 200 eight-turn chats", "llama-3.1-8b",
          "h100-sxm", short="Llama-3.1-8B BF16, one H100 SXM, Mooncake's trace and shared-prefix workloads"),
    Scene("fleet", "Llama-3-8B in BF16 on four H100 SXM GPUs, one engine each, vLLM's defaults but for the knobs "
          "named: three synthetic workloads with the prompt and output lengths of public traces (ShareGPT, arXiv "
          "summarisation, Azure's 2023 code trace; prompt and output drawn independently from each trace's "
          "quantiles) and Poisson arrivals, 30 s of traffic per run (at least 300 requests, seed 0)", "llama-3-8b",
          "h100-sxm", short="Llama-3-8B BF16, four H100 SXM, Poisson arrivals"),
    Scene("routing", "Llama-3.1-8B in BF16 on four H100 SXM replicas behind a router, vLLM's defaults: Mooncake's "
          "conversation trace at its recorded rate, and 6,000 synthetic requests over 256 shared system prompts of "
          "4,096 tokens (Poisson arrivals at 20 req/s, seed 0)", "llama-3.1-8b", "h100-sxm",
          short="Llama-3.1-8B BF16, four H100 SXM replicas behind a router"),
)


def scene(name: str) -> Scene:
    """``SCENES[name]``, with a ValueError that lists the scenes."""
    if name not in SCENES:
        raise ValueError(f"no scene {name!r}; scenes: {', '.join(SCENES)}")
    return SCENES[name]


def glue_scene(glue, *names: str) -> dict:
    """Glue each scene's words as ``scene_<name>`` (``-`` as ``_``); return them by name."""
    out = {}
    for name in names:
        out[name] = scene(name).text
        glue(f"scene_{name.replace('-', '_')}", out[name], display=False)
    return out


CONTEXT = 2048  # tokens of KV cache per decoder in the iteration that can first admit the newcomer
PROMPT_TOKENS = 8000  # the newcomer's prompt
CADENCE_S = 0.020  # the article's decode cadence (s): the default batch is the one whose decode step takes this
NEWCOMER_OUTPUT_TOKENS = 16  # output tokens of the newcomer (and of any short request behind it)
TAIL_STEPS = 64  # decode steps every decoder still has after the newcomer's prefill, at least

CHUNKED_SCENE_KNOBS = {"async_scheduling": False}  # policy "chunked": the synchronous scheduler (module docstring)

_EPS_S = 1e-9  # token times are sums of step durations: one step's end is bit-equal wherever it is read


def default_decoders(cost, context: int = CONTEXT, cadence_s: float = CADENCE_S) -> int:
    """The scene's batch: the decode batch whose step at ``context`` cached tokens is closest to ``cadence_s``.

    The step is the synchronous engine's, which the scene runs under every policy: it pays all of its CPU work,
    as a cost model with ``cpu_hidden_fraction`` 0 charges it (Llama-3-8B BF16 on an H100 SXM at 2,048 tokens
    and 20 ms, calibrated: the fact ``spike_decoders``); raises ``ValueError`` where no batch reaches the cadence
    (:meth:`batchlab.CostModel.batch_for_step_time`). Used in chapters 05, 06, 12 and 14.
    """
    return cost.replace(cpu_hidden_fraction=0.0).batch_for_step_time(cadence_s, context)


def stream(arrival_s: float, *, n_decoders: int, decoder_output_tokens: int, prompt_tokens: int = PROMPT_TOKENS,
           newcomer_output_tokens: int = NEWCOMER_OUTPUT_TOKENS, behind_s=(), behind_tokens: int = 256,
           newcomer: bool = True) -> Requests:
    """The scene's requests: decoders at time 0, the newcomer at ``arrival_s``, short requests at ``behind_s``.

    Used in chapters 05, 06 and 14 (through :func:`run`).

    Parameters
    ----------
    arrival_s : float
        When the newcomer's client sends it (s).
    n_decoders, decoder_output_tokens : int
        Requests present at time 0 (one-token prompts, so any budget above ``n_decoders`` admits them all in
        the first iteration) and the output tokens each decodes.
    prompt_tokens, newcomer_output_tokens : int
        The newcomer's prompt and output tokens.
    behind_s : sequence of float
        Arrival (send) times (s, sorted, >= ``arrival_s``) of short requests queued behind the newcomer.
    behind_tokens : int
        Prompt tokens of each short request; they output ``newcomer_output_tokens`` tokens.
    newcomer : bool
        False leaves the newcomer out (the counterfactual of chapter 05).

    Returns
    -------
    Requests
        Decoders first (indices 0 .. n_decoders - 1), then the newcomer (if any), then the short requests.
    """
    behind = np.asarray(behind_s, dtype=float)
    one = np.ones(int(newcomer))
    arrival = np.concatenate([np.zeros(n_decoders), one * arrival_s, behind])
    prompt = np.concatenate([np.ones(n_decoders), one * prompt_tokens, np.full(behind.size, behind_tokens)])
    output = np.concatenate([np.full(n_decoders, decoder_output_tokens), one * newcomer_output_tokens,
                             np.full(behind.size, newcomer_output_tokens)])
    return Requests(arrival, prompt.astype(np.int64), output.astype(np.int64))


class SceneRun(NamedTuple):
    """One run of the scene, from :func:`run`."""

    res: object  # SimResult: decoders first, then the newcomer (if any), then the short requests
    arrival_s: float  # s, when the newcomer's client sent it (its arrival_s in res.requests)
    seen_s: float  # s, when the engine saw it: request_latency_s later, the end of the decoders' context-th step
    n_decoders: int
    context: int  # cached tokens of every decoder in the iteration that first can admit the newcomer
    measures: dict  # what the decoders and the newcomer saw (seconds; empty without the newcomer)


def _prefill_steps(cost, policy: str, n_decoders: int, prompt_tokens: int, knobs: dict) -> int:
    """An upper bound on the iterations from the newcomer's arrival to its first token: its chunks, plus one for
    V0's order, plus one under async scheduling (the iteration after the arrival was planned without it).

    A count of iterations, not of seconds: the decoders' outputs are counted in steps whatever each one costs.
    """
    chunk = prompt_tokens
    late = int(policy == "chunked" and bool(knobs.get("async_scheduling", True)))
    if policy == "chunked" and knobs.get("enable_chunked_prefill", True):
        budget = knobs.get("max_num_batched_tokens") or vllm_defaults(cost.hardware)["max_num_batched_tokens"]
        if budget <= n_decoders:
            raise ValueError(f"max_num_batched_tokens={budget} leaves no token for the prompt beside "
                             f"{n_decoders} decodes: it must exceed n_decoders")
        chunk = budget - n_decoders  # every iteration gives the decodes their token first
    return math.ceil(prompt_tokens / chunk) + 1 + late


def run(cost, policy: str = "chunked", *, n_decoders: int | None = None, context: int = CONTEXT,
        prompt_tokens: int = PROMPT_TOKENS, newcomer_output_tokens: int = NEWCOMER_OUTPUT_TOKENS,
        behind_after_s=(), behind_tokens: int = 256, newcomer: bool = True, tail_steps: int = TAIL_STEPS,
        **knobs) -> SceneRun:
    """Run the scene once: decoders at ``context`` tokens of KV cache, then the newcomer arrives.

    A pilot run of the decoders alone gives the moment the engine must see the newcomer: the end of the
    iteration in which each emitted its ``context``-th token. Its client sends it ``cost.request_latency_s``
    earlier (the module docstring's two clocks). The decoders stand for requests that have been running for a
    while, so they all join the first iteration together: the API server's per-token time
    (``frontend_s_per_token``), which would spread a burst of them over a few milliseconds, is left out of the
    scene; every other term of ``cost`` is kept. Used in chapters 05, 06, 12 and 14.

    Parameters
    ----------
    cost : CostModel
    policy : {"chunked", "continuous"}
    n_decoders : int, optional
        Sequences decoding when the newcomer arrives (default :func:`default_decoders`).
    context : int
        Cached tokens of each decoder in the first iteration that can admit the newcomer (>= 2).
    prompt_tokens, newcomer_output_tokens : int
        The newcomer's prompt and output tokens.
    behind_after_s : sequence of float
        Seconds after the newcomer's arrival (its send, sorted, >= 0) at which short requests are sent.
    behind_tokens : int
        Their prompt tokens.
    newcomer : bool
        False runs the same stream without the newcomer.
    tail_steps : int
        Decode steps the decoders have left after the newcomer's prefill, at least.
    **knobs
        Passed to :func:`batchlab.simulate` (``max_num_batched_tokens``, ``enable_chunked_prefill``,
        ``prefill_only_steps``, ``max_num_seqs``, ...). Under ``chunked`` the scene's own settings fill in what
        is not given: :data:`CHUNKED_SCENE_KNOBS` (the synchronous scheduler), and ``max_num_seqs`` of vLLM's
        default for the GPU capped at the token budget.

    Returns
    -------
    SceneRun
        With :func:`measures` of the run.

    Raises
    ------
    ValueError
        If the decoders do not all join the first iteration, or the newcomer can never be served (its prompt
        and output need more KV blocks than the pool holds: raise ``gpu_memory_utilization``).
    """
    cost = cost.replace(frontend_s_per_token=0.0)  # the decoders join together (see above)
    n = default_decoders(cost, context) if n_decoders is None else int(n_decoders)
    if n < 1 or context < 2 or tail_steps < 0:
        raise ValueError("n_decoders must be >= 1, context >= 2 (a decode step before the arrival) and "
                         "tail_steps >= 0")
    if policy == "chunked":
        knobs = {**CHUNKED_SCENE_KNOBS, **knobs}
        budget = knobs.get("max_num_batched_tokens") or vllm_defaults(cost.hardware)["max_num_batched_tokens"]
        knobs.setdefault("max_num_seqs", seats_for(cost, budget))  # vLLM refuses more seats
    output = context + _prefill_steps(cost, policy, n, prompt_tokens, knobs) + tail_steps
    kw = dict(n_decoders=n, decoder_output_tokens=output, prompt_tokens=prompt_tokens,
              newcomer_output_tokens=newcomer_output_tokens, behind_tokens=behind_tokens)
    pilot = simulate(stream(0.0, newcomer=False, **kw), policy, cost, **knobs).token_times[:n]
    reached = np.array([t[context - 1] for t in pilot])
    if reached.min() != reached.max():
        raise ValueError("the decoders were not all admitted in the first iteration: raise max_num_seqs, "
                         "max_num_batched_tokens or the KV pool")
    seen = float(reached[0])
    arrival = seen - cost.request_latency_s
    while arrival + cost.request_latency_s > seen:  # rounded up, the engine would see it one step late
        arrival = float(np.nextafter(arrival, -np.inf))
    behind = arrival + np.asarray(behind_after_s, dtype=float)
    res = simulate(stream(arrival, behind_s=behind, newcomer=newcomer, **kw), policy, cost, **knobs)
    if newcomer and res.requests["rejected"].iloc[n]:
        raise ValueError(f"the newcomer cannot be served: {res.requests['reject_reason'].iloc[n]}")
    return SceneRun(res, arrival, seen, n, context, measures(res, seen, n) if newcomer else {})


def measures(res, seen_s: float, n_decoders: int) -> dict:
    """What the decoders and the newcomer (request ``n_decoders``) saw in one run of the scene.

    ``seen_s`` is when the engine saw the newcomer (:attr:`SceneRun.seen_s`). Used in chapters 05, 06, 12 and 14
    (through :func:`run`).

    Returns
    -------
    dict
        ``itl_max_s``: the decoders' tallest gap between two tokens that spans part of the newcomer's prefill
        (it ends after the engine saw the newcomer and starts before its first token; later gaps grow only with
        the decoders' context). ``ttft_s``: the newcomer's time to first token as its client measures it, from
        its send, so ``request_latency_s`` included. ``cadence_s``: the decoders' gap that ended when the
        engine saw the newcomer, one decode step. ``admit_step`` and ``admit_step_s``: index and duration of
        the first iteration after that which computed prompt tokens (the one right after it, unless async
        scheduling had already planned it). ``chunks``: iterations from then to the newcomer's first token
        that computed part of its prompt (or all of it). ``largest_chunk_tokens``: prompt tokens of the
        largest of them.
    """
    req, steps = res.requests, res.steps
    if not (req["finish_s"].iloc[:n_decoders] > req["first_token_s"].iloc[n_decoders]).all():
        raise RuntimeError("a decoder finished before the newcomer's first token: raise tail_steps")
    ttft = float(req["ttft_s"].iloc[n_decoders])
    first = float(req["first_token_s"].iloc[n_decoders])
    times = res.token_times[0]  # the decoders move in lockstep
    gaps = np.diff(times)
    spans = (times[1:] > seen_s + _EPS_S) & (times[:-1] < first - _EPS_S)
    start = steps["start_s"].to_numpy()
    during = steps[(start >= seen_s - _EPS_S) & (start < first - _EPS_S) & (steps["prefill_tokens"] > 0)]
    return {"itl_max_s": float(gaps[spans].max()), "ttft_s": ttft,
            "cadence_s": float(gaps[np.flatnonzero(times[1:] <= seen_s + _EPS_S)[-1]]),
            "admit_step": int(during.index[0]), "admit_step_s": float(during["duration_s"].iloc[0]),
            "chunks": len(during), "largest_chunk_tokens": int(during["prefill_tokens"].max())}


def decoder_gaps(scene: SceneRun, before_s: float | None = None, after_s: float | None = None) -> pd.DataFrame:
    """The decoders' inter-token gaps around the newcomer, one row per (emission time, gap) with how many had it.

    The decoders move in lockstep, so their gaps coincide and counting them keeps the frame small enough to
    inline in a page. Used in chapters 05 and 06.

    Parameters
    ----------
    scene : SceneRun
    before_s : float, optional
        Keep gaps ending at most this long before the newcomer's arrival (s; default all of them).
    after_s : float, optional
        Keep gaps ending at most this long after the newcomer's first token (s; default all of them).

    Returns
    -------
    DataFrame
        ``time_s`` (emission of the later token minus the newcomer's arrival, its client's send, s; the engine
        sees it at ``request_latency_s``, its first token comes at ``ttft_s``), ``itl_s`` (s) and ``sequences``.
    """
    times = scene.res.token_times[:scene.n_decoders]
    df = pd.DataFrame({"time_s": np.concatenate([t[1:] for t in times]) - scene.arrival_s,
                       "itl_s": np.concatenate([np.diff(t) for t in times])})
    keep = np.ones(len(df), dtype=bool)
    if before_s is not None:
        keep &= df["time_s"].to_numpy() >= -before_s - _EPS_S
    if after_s is not None:
        keep &= df["time_s"].to_numpy() <= scene.measures.get("ttft_s", 0.0) + after_s + _EPS_S
    df = df[keep].round(12)
    return df.groupby(["time_s", "itl_s"], as_index=False).size().rename(columns={"size": "sequences"})


def budget_sweep(cost, max_num_batched_tokens, **scene) -> list[SceneRun]:
    """The scene under ``policy="chunked"`` at each token budget, in the order given.

    Used in chapters 06, 12 and 14.

    Parameters
    ----------
    cost : CostModel
    max_num_batched_tokens : sequence of int
        Token budgets (each above the number of decoders).
    **scene
        Passed to :func:`run` (``n_decoders``, ``context``, ``prompt_tokens``, other knobs).
    """
    return [run(cost, "chunked", max_num_batched_tokens=int(b), **scene) for b in max_num_batched_tokens]

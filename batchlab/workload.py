"""Request streams: the validated ``Requests`` container, seeded generators and trace readers.

Every generator takes ``seed`` (an int or a ``numpy.random.Generator``) and draws everything in NumPy,
so a stream is a pure function of its arguments.
"""
from __future__ import annotations

import math
import dataclasses
from functools import cache

import numpy as np
import pandas as pd

from . import _checks as v
from ._data import DATA_DIR
from ._checks import MAX_ARRIVAL_S, MAX_STREAM_TOKENS, MAX_TOKENS
from .vllm import BLOCK_SIZE


def _rng(seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0:
        return np.random.default_rng(int(seed))
    raise ValueError(f"seed must be an integer >= 0 or a numpy.random.Generator, got {seed!r}")


@dataclasses.dataclass(frozen=True, eq=False)
class Requests:
    """A request stream, sorted by arrival. Validated on construction; the arrays are read-only.

    ``prefix_blocks`` (optional) says which prompts share a prefix, as vLLM's prefix cache sees it: one integer
    sequence per request, the ids of its consecutive blocks of ``prefix_block_tokens`` tokens from the start of
    the prompt. Two requests with the same id at position j have the same tokens up to the end of block j (a
    hash chain, as Mooncake's ``hash_ids`` with 512 tokens per id). The last id may name a partial block (the
    prompt's tail); ids may go on past the prompt into the blocks its output fills, so that a multi-turn chat's
    next prompt, which holds this answer, can find it cached. Stored flat: ``prefix_ids`` and ``prefix_offsets``
    (request i's ids are ``prefix_ids[prefix_offsets[i]:prefix_offsets[i + 1]]``).

    Bounds (each a ``ValueError`` naming the field when broken): every prompt and output holds 1 to 2**40
    (``MAX_TOKENS``, about 1.1e12) tokens, checked before the cast to int64 so nothing wraps; the prompt and output
    tokens of the whole stream sum to at most 2**62 (``MAX_STREAM_TOKENS``), so the kernel's running token sums
    fit in int64; arrivals are seconds since the stream began, 0 to 1e8 (``MAX_ARRIVAL_S``, about 3 years).
    ``datetime64`` arrays, ``datetime`` and ``pandas.Timestamp`` values are converted to seconds since the
    first of them; epoch-like numbers (1.7e9 s, 1.7e18 ns) are refused with a message saying to pass seconds.
    """

    arrival_s: np.ndarray  # seconds since the stream began, non-decreasing, float64
    prompt_tokens: np.ndarray  # tokens in each prompt, >= 1, int64
    output_tokens: np.ndarray  # tokens each request will generate, >= 1, int64
    prefix_blocks: object = None  # None, or one sequence of integer ids >= 0 per request
    prefix_block_tokens: int = BLOCK_SIZE  # tokens per prefix id

    def __post_init__(self):
        arrival = v.arrival_array(self.arrival_s)
        if (np.diff(arrival) < 0).any():
            raise ValueError("arrival_s must be sorted (non-decreasing); sort the stream by arrival first")
        prompt = v.token_array(self.prompt_tokens, "prompt_tokens")
        output = v.token_array(self.output_tokens, "output_tokens")
        if not (arrival.size == prompt.size == output.size):
            raise ValueError(
                f"arrival_s, prompt_tokens and output_tokens must have one length, got "
                f"{arrival.size}, {prompt.size}, {output.size}"
            )
        if arrival.size == 0:
            raise ValueError("a request stream needs at least one request")
        total = int(prompt.sum(dtype=np.float64) + output.sum(dtype=np.float64))  # float: the sum itself cannot wrap
        if total > MAX_STREAM_TOKENS:
            raise ValueError(f"prompt_tokens and output_tokens of the stream must sum to at most 2**62 "
                             f"({MAX_STREAM_TOKENS:.3g}) tokens, got {total:.3g}; split the stream")
        for name, a in (("arrival_s", arrival), ("prompt_tokens", prompt), ("output_tokens", output)):
            a = np.array(a)  # own copy, so freezing it cannot touch the caller's array
            a.flags.writeable = False
            object.__setattr__(self, name, a)
        tokens = self.prefix_block_tokens
        if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or not 1 <= tokens <= 2**20:
            raise ValueError(f"prefix_block_tokens must be an integer from 1 to 2**20, got {tokens!r}")
        object.__setattr__(self, "prefix_block_tokens", int(tokens))
        ids, offsets = _prefix_arrays(self.prefix_blocks, prompt, output, int(tokens))
        for a in (ids, offsets):
            a.flags.writeable = False
        object.__setattr__(self, "prefix_ids", ids)
        object.__setattr__(self, "prefix_offsets", offsets)
        object.__setattr__(self, "prefix_blocks", None if self.prefix_blocks is None else _PrefixView(ids, offsets))

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    @property
    def n_requests(self) -> int:
        """Number of requests."""
        return int(self.arrival_s.size)

    def to_frame(self) -> pd.DataFrame:
        """One row per request."""
        return pd.DataFrame({"arrival_s": self.arrival_s, "prompt_tokens": self.prompt_tokens,
                             "output_tokens": self.output_tokens})

    def head(self, n_requests: int) -> Requests:
        """The first ``n_requests`` requests."""
        k = v.integer("n_requests", n_requests, 1, 2**62)
        return self._select(np.arange(min(k, len(self))), self.arrival_s[:k])

    def _select(self, rows: np.ndarray, arrival_s: np.ndarray) -> Requests:
        """Requests ``rows`` (in that order) with the given arrivals, their prefix ids kept."""
        blocks = None
        if self.prefix_blocks is not None:
            blocks = [self.prefix_ids[self.prefix_offsets[i]:self.prefix_offsets[i + 1]] for i in rows]
        return Requests(arrival_s, self.prompt_tokens[rows], self.output_tokens[rows], blocks,
                        self.prefix_block_tokens)

    def scale_time(self, speedup: float) -> Requests:
        """The same stream with arrivals ``speedup`` times faster (rate times ``speedup``)."""
        speedup = v.real("speedup", speedup, 0, low_open=True, allowed="a finite number > 0")
        return self._select(np.arange(len(self)), self.arrival_s / speedup)


class _PrefixView(tuple):
    """``Requests.prefix_blocks`` as given back: a tuple of read-only id arrays, one per request."""

    def __new__(cls, ids, offsets):
        return super().__new__(cls, (ids[offsets[i]:offsets[i + 1]] for i in range(offsets.size - 1)))


def _prefix_arrays(blocks, prompt, output, tokens) -> tuple[np.ndarray, np.ndarray]:
    """Validate ``prefix_blocks`` and flatten it to (ids, offsets); (empty, zeros) when None."""
    n = prompt.size
    if blocks is None:
        return np.zeros(0, np.int64), np.zeros(n + 1, np.int64)
    if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__len__") or len(blocks) != n:
        got = f"{len(blocks)} sequences" if hasattr(blocks, "__len__") else type(blocks).__name__
        raise ValueError(f"prefix_blocks must hold one sequence of block ids per request ({n}), got {got}")
    lengths = np.zeros(n, np.int64)
    parts = []
    for i, seq in enumerate(blocks):
        a = np.asarray(seq)
        if a.ndim != 1 or (a.size and (a.dtype.kind not in "iu" or a.dtype.kind == "b")):
            raise ValueError(f"prefix_blocks[{i}] must be a one-dimensional sequence of integer ids, got {seq!r:.80}")
        if a.size and a.min() < 0:
            raise ValueError(f"prefix_blocks[{i}] must hold ids >= 0, found {a.min()}")
        most = -(-(int(prompt[i]) + int(output[i])) // tokens)
        if a.size > most:
            raise ValueError(f"prefix_blocks[{i}] has {a.size} ids of {tokens} tokens, more than its prompt and output "
                             f"({prompt[i]} + {output[i]} tokens) fill: at most {most}")
        lengths[i] = a.size
        parts.append(a.astype(np.int64))
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return ids, offsets


# -- lengths -------------------------------------------------------------------------------------

def lengths_lognormal(n_requests: int, mean: float, cv: float, seed=0, max_tokens: int | None = None) -> np.ndarray:
    """``n_requests`` token counts from a lognormal with the given mean and coefficient of variation.

    ``cv = 0`` gives every request exactly ``round(mean)`` tokens. Values are rounded and clipped to
    [1, ``max_tokens``].
    """
    _check_count(n_requests)
    mean = v.real("mean", mean, 1, MAX_TOKENS, allowed=f"a finite number of tokens from 1 to 2**40 ({MAX_TOKENS:,})")
    cv = v.real("cv", cv, 0, allowed="a finite number >= 0")
    hi = _max_tokens(max_tokens)
    rng = _rng(seed)
    if cv == 0:
        x = np.full(n_requests, float(mean))
    else:
        sigma2 = math.log1p(cv * cv)
        x = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), n_requests)
    return np.clip(np.rint(x), 1, hi).astype(np.int64)


def _max_tokens(max_tokens) -> int:
    """The upper clip of generated lengths: ``max_tokens``, or :data:`MAX_TOKENS` when None."""
    return MAX_TOKENS if max_tokens is None else v.integer("max_tokens", max_tokens, 1, MAX_TOKENS)


def lengths_uniform(n_requests: int, low: int, high: int, seed=0) -> np.ndarray:
    """``n_requests`` token counts uniform on the integers [low, high]."""
    _check_count(n_requests)
    low = v.integer("low", low, 1, MAX_TOKENS)
    high = v.integer("high", high, low, MAX_TOKENS)
    return _rng(seed).integers(low, high + 1, n_requests).astype(np.int64)


def lengths_empirical(n_requests: int, quantiles, seed=0) -> np.ndarray:
    """``n_requests`` token counts by inverse CDF from a table of equally spaced quantiles (q0 = min ... q1 = max)."""
    _check_count(n_requests)
    q = np.asarray(quantiles)
    if q.dtype.kind not in "iuf" or q.ndim != 1 or q.size < 2 or not np.isfinite(q).all():
        raise ValueError(f"quantiles must be a non-decreasing array of at least two token counts from 1 to 2**40, "
                         f"got {quantiles!r:.80}")
    q = q.astype(np.float64)
    if (np.diff(q) < 0).any() or q[0] < 1 or q[-1] > MAX_TOKENS:
        raise ValueError("quantiles must be a non-decreasing array of at least two token counts from 1 to 2**40")
    u = _rng(seed).random(n_requests)
    grid = np.linspace(0.0, 1.0, q.size)
    return np.clip(np.rint(np.interp(u, grid, q)), 1, None).astype(np.int64)


# -- arrivals ------------------------------------------------------------------------------------

def arrivals_gamma(n_requests: int, rate_req_s: float, cv: float = 1.0, seed=0) -> np.ndarray:
    """Arrival times (s) of a renewal process with gamma gaps of mean 1 / ``rate_req_s`` seconds and CV ``cv``.

    ``cv = 1`` is Poisson; ``cv > 1`` is bursty; ``cv = 0`` is evenly spaced; ``rate_req_s = inf`` puts every
    request at time 0. The first request arrives at 0.
    """
    _check_count(n_requests)
    rate_req_s = v.real("rate_req_s", rate_req_s, 0, low_open=True, allow_inf=True,
                        allowed="a number > 0 requests/s (inf for all at once)")
    cv = v.real("cv", cv, 0, allowed="a finite number >= 0")
    if math.isinf(rate_req_s):
        return np.zeros(n_requests)
    if (n_requests - 1) / rate_req_s > MAX_ARRIVAL_S:
        raise ValueError(f"rate_req_s={rate_req_s!r} req/s spreads {n_requests} requests over "
                         f"{(n_requests - 1) / rate_req_s:.3g} s on average, past the {MAX_ARRIVAL_S:g} s (about "
                         f"3 years) a stream may span; raise rate_req_s")
    rng = _rng(seed)
    if cv == 0:
        gaps = np.full(n_requests - 1, 1.0 / rate_req_s)
    else:
        shape = 1.0 / (cv * cv)
        gaps = rng.gamma(shape, 1.0 / (rate_req_s * shape), n_requests - 1)
    arrival = np.concatenate([[0.0], np.cumsum(gaps)])
    if arrival[-1] > MAX_ARRIVAL_S:  # a bursty draw can overshoot the mean span checked above
        raise ValueError(f"rate_req_s={rate_req_s!r} req/s with cv={cv!r} drew arrivals past {MAX_ARRIVAL_S:g} s; "
                         f"raise rate_req_s")
    return arrival


def arrivals_poisson(n_requests: int, rate_req_s: float, seed=0) -> np.ndarray:
    """Arrival times (s) of a Poisson process of ``rate`` requests/s, first at 0."""
    return arrivals_gamma(n_requests, rate_req_s, 1.0, seed)


def synthetic(n_requests: int, prompt_mean: float, output_mean: float, prompt_cv: float = 0.0, output_cv: float = 0.0,
              rate_req_s: float = math.inf, arrival_cv: float = 1.0, seed=0, max_tokens: int | None = None) -> Requests:
    """A synthetic stream: lognormal prompt and output lengths, gamma arrivals.

    Parameters
    ----------
    n_requests : int
        Requests.
    prompt_mean, output_mean : float
        Mean tokens per prompt and per output.
    prompt_cv, output_cv : float
        Coefficients of variation of the lengths (0 = all equal).
    rate_req_s : float
        Mean arrival rate in requests/s (inf = everything at time 0).
    arrival_cv : float
        CV of inter-arrival gaps (1 = Poisson, > 1 bursty).
    seed : int or numpy.random.Generator
    max_tokens : int, optional
        Upper clip of each length.
    """
    rng = _rng(seed)
    prompt = lengths_lognormal(n_requests, prompt_mean, prompt_cv, rng, max_tokens)
    output = lengths_lognormal(n_requests, output_mean, output_cv, rng, max_tokens)
    arrival = arrivals_gamma(n_requests, rate_req_s, arrival_cv, rng)
    return Requests(arrival, prompt, output)


def fixed(n_requests: int, prompt_tokens: int, output_tokens: int, rate_req_s: float = math.inf, seed=0) -> Requests:
    """``n_requests`` identical requests, Poisson arrivals at ``rate_req_s`` req/s (inf: all at time 0)."""
    return synthetic(n_requests, prompt_tokens, output_tokens, rate_req_s=rate_req_s, seed=seed)


def _chain_ids(n_tokens: int, block_tokens: int, shared_tokens: int, shared_base: int, own_base: int) -> list[int]:
    """Block ids of a token stream: blocks that end within its first ``shared_tokens`` tokens get the shared
    ids ``shared_base + j``, the others ``own_base + j`` (a hash chain: a block's id names everything before it)."""
    n_blocks = -(-n_tokens // block_tokens)
    return [(shared_base if (j + 1) * block_tokens <= shared_tokens else own_base) + j for j in range(n_blocks)]


def shared_prefix(n_requests: int, n_groups: int, prompts_per_group: int, system_prompt_tokens: int,
                  question_tokens: int, output_tokens: int, rate_req_s: float = math.inf, arrival_cv: float = 1.0,
                  seed=0, prefix_block_tokens: int = BLOCK_SIZE) -> Requests:
    """Prompts that share system prompts, as inference-perf's ``shared_prefix`` workload builds them.

    ``n_groups`` system prompts of ``system_prompt_tokens`` tokens, each followed by ``prompts_per_group``
    questions of ``question_tokens`` tokens: ``n_groups * prompts_per_group`` distinct prompts, shuffled and
    then sent in that order again and again until ``n_requests`` are sent (so after the first round every prompt
    has been seen). Every request generates ``output_tokens`` tokens (``ignore_eos``). ``prefix_blocks`` say
    which blocks are shared: a group's system-prompt blocks, and a repeated prompt's whole prompt.
    """
    for name, value in (("n_groups", n_groups), ("prompts_per_group", prompts_per_group),
                        ("system_prompt_tokens", system_prompt_tokens), ("question_tokens", question_tokens),
                        ("output_tokens", output_tokens)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= 2**31:
            raise ValueError(f"{name} must be an integer from 1 to 2**31, got {value!r}")
    _check_count(n_requests)
    prefix_block_tokens = v.integer("prefix_block_tokens", prefix_block_tokens, 1, 2**20)
    rng = _rng(seed)
    prompt = system_prompt_tokens + question_tokens
    distinct = n_groups * prompts_per_group
    stride = -(-(prompt + output_tokens) // prefix_block_tokens) + 1
    ids = [_chain_ids(prompt, prefix_block_tokens, system_prompt_tokens, (i // prompts_per_group) * stride,
                      (n_groups + i) * stride) for i in range(distinct)]
    order = rng.permutation(distinct)
    chosen = order[np.arange(n_requests) % distinct]
    arrival = arrivals_gamma(n_requests, rate_req_s, arrival_cv, rng)
    return Requests(arrival, np.full(n_requests, prompt), np.full(n_requests, output_tokens),
                    [ids[i] for i in chosen], prefix_block_tokens)


def multi_turn(n_conversations: int, turns: int, system_prompt_tokens: int, user_tokens: int, output_tokens: int,
               rate_req_s: float = math.inf, turn_gap_s: float = 10.0, shared_system_prompt: bool = True,
               seed=0, prefix_block_tokens: int = BLOCK_SIZE) -> Requests:
    """Chats of ``turns`` turns: each turn's prompt is the previous turn's prompt and answer plus a new message.

    Conversation c's turn k asks ``system + (user + answer) * (k - 1) + user`` tokens and gets ``output_tokens``;
    conversations start at ``rate_req_s`` (Poisson) and a conversation's turns follow each other every
    ``turn_gap_s`` seconds (open loop: the gap stands for the user's reading and typing, whatever the server
    does). ``prefix_blocks`` name the conversation's token stream block by block, answers included, so a turn
    finds the previous turn's prompt and answer cached; with ``shared_system_prompt`` every conversation shares
    the system prompt's blocks.
    """
    for name, value in (("n_conversations", n_conversations), ("turns", turns),
                        ("system_prompt_tokens", system_prompt_tokens), ("user_tokens", user_tokens),
                        ("output_tokens", output_tokens)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= 2**31:
            raise ValueError(f"{name} must be an integer from 1 to 2**31, got {value!r}")
    turn_gap_s = v.real("turn_gap_s", turn_gap_s, 0, allowed="finite seconds >= 0")
    shared_system_prompt = v.flag("shared_system_prompt", shared_system_prompt)
    prefix_block_tokens = v.integer("prefix_block_tokens", prefix_block_tokens, 1, 2**20)
    starts = arrivals_gamma(n_conversations, rate_req_s, 1.0, _rng(seed))
    total = system_prompt_tokens + turns * (user_tokens + output_tokens)
    stride = -(-total // prefix_block_tokens) + 1
    rows = []
    for c in range(n_conversations):
        shared = system_prompt_tokens if shared_system_prompt else 0
        stream = _chain_ids(total, prefix_block_tokens, shared, 0, (c + 1) * stride)
        for k in range(turns):
            prompt = system_prompt_tokens + k * (user_tokens + output_tokens) + user_tokens
            n_ids = -(-(prompt + output_tokens) // prefix_block_tokens)
            rows.append((starts[c] + k * turn_gap_s, c, k, prompt, stream[:n_ids]))
    rows.sort(key=lambda row: (row[0], row[1], row[2]))
    return Requests(np.array([row[0] for row in rows]), [row[3] for row in rows],
                    np.full(len(rows), output_tokens), [row[4] for row in rows], prefix_block_tokens)


def _check_count(n_requests) -> None:
    if not isinstance(n_requests, (int, np.integer)) or isinstance(n_requests, bool) or not 1 <= n_requests <= 2**31:
        raise ValueError(f"n_requests must be an integer from 1 to 2**31, got {n_requests!r}")


# -- traces --------------------------------------------------------------------------------------

# -- presets from real traces ---------------------------------------------------------------------

_PRESET_FILE = "workload_quantiles.csv"  # written by scripts/make_workload_quantiles.py; layout in data/README.md


@cache
def _preset_table() -> pd.DataFrame:
    return pd.read_csv(DATA_DIR / _PRESET_FILE).set_index("preset")


def preset_names() -> list[str]:
    """Names accepted by :func:`preset` and :func:`trace_stats`."""
    return list(_preset_table().index)


def _preset_row(name: str) -> pd.Series:
    table = _preset_table()
    if not isinstance(name, str) or name not in table.index:
        raise ValueError(f"preset must be one of {list(table.index)}, got {name!r}")
    return table.loc[name]


def _preset_quantiles(row: pd.Series, column: str) -> np.ndarray:
    return row[[f"{column}_p{p}" for p in range(101)]].to_numpy(dtype=np.float64)


def trace_stats(name: str) -> dict:
    """Summary of the real trace behind preset ``name``, for prose to quote.

    Returns
    -------
    dict
        ``preset``, ``n`` (requests in the trace), ``rate_req_per_s`` and ``interarrival_cv`` (NaN where the trace
        has no timestamps), ``arrivals`` ("trace", "synthetic-poisson" or "none"), ``prompt_tokens_mean``,
        ``prompt_tokens_median``, ``prompt_tokens_p90``, the same three for ``output_tokens``, and ``source``
        ("repo @ commit, path") and ``licence``.
    """
    row = _preset_row(name)
    out = {"preset": name, "n": int(row["n"]), "rate_req_per_s": float(row["rate_req_per_s"]),
           "interarrival_cv": float(row["interarrival_cv"]), "arrivals": str(row["arrivals"])}
    for col in ("prompt_tokens", "output_tokens"):
        out[f"{col}_mean"] = float(row[f"{col}_mean"])
        out[f"{col}_median"] = float(row[f"{col}_p50"])
        out[f"{col}_p90"] = float(row[f"{col}_p90"])
    out["source"] = f"{row['source_repo']} @ {row['source_commit']}, {row['source_path']}"
    out["licence"] = str(row["licence"])
    return out


def preset(name: str, n_requests: int, rate_req_s: float | None = None, seed=0) -> Requests:
    """``n_requests`` requests shaped like the real trace ``name``.

    Prompt and output lengths are drawn independently, each by inverse CDF from the trace's 101 length quantiles
    (linear between them, see :func:`lengths_empirical`); the pairing of a prompt with its output in the trace is
    not kept. Arrivals are a gamma renewal process with the trace's inter-arrival CV (see :func:`arrivals_gamma`).

    Parameters
    ----------
    name : str
        One of :func:`preset_names`: ``azure-code-2023``, ``azure-conv-2023``, ``mooncake-conversation``,
        ``sharegpt`` (its arrivals were synthetic Poisson at 10 req/s), ``arxiv-summarization`` (no timestamps).
    n_requests : int
        Requests.
    rate_req_s : float, optional
        Mean arrival rate in requests/s (inf = everything at time 0). Defaults to the trace's own rate; required
        for ``arxiv-summarization``, whose arrivals are then Poisson (CV 1).
    seed : int or numpy.random.Generator

    Raises
    ------
    ValueError
        Unknown ``name``; bad ``n_requests``, ``rate_req_s`` or ``seed``; ``rate_req_s`` missing for a trace
        without timestamps.
    """
    row = _preset_row(name)
    _check_count(n_requests)
    trace_rate, cv = float(row["rate_req_per_s"]), float(row["interarrival_cv"])
    if rate_req_s is None:
        if not math.isfinite(trace_rate):
            raise ValueError(f"preset {name!r} comes from a trace without timestamps, so it has no arrival rate: "
                             f"pass rate_req_s= (requests/s)")
        rate_req_s = trace_rate
    if not math.isfinite(cv):
        cv = 1.0  # no timestamps to measure burstiness from: Poisson
    rng = _rng(seed)
    prompt = lengths_empirical(n_requests, _preset_quantiles(row, "prompt_tokens"), rng)
    output = lengths_empirical(n_requests, _preset_quantiles(row, "output_tokens"), rng)
    arrival = arrivals_gamma(n_requests, rate_req_s, cv, rng)
    return Requests(arrival, prompt, output)

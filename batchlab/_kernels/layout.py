"""Names of the slots the kernels read and write: plain integer constants, no jitted code.

Numba freezes module-level integers into the compiled code, so the kernels index arrays by these names at no
cost, and Python code (``CostModel.coefficients``, ``SimResult``) uses the same names.
"""
from __future__ import annotations

# -- the cost model's coefficients: one float64 vector, per GPU, filled by CostModel.coefficients() ----------
COEF_NAMES = (
    "gemm_flops_per_token",  # FLOP per new token in the weight GEMMs, 2 P / t
    "weight_bytes",  # bytes of weights streamed once per step, P b_w / t
    "attn_flops_per_work",  # FLOP per unit of attention work, 2 L d / t
    "kv_bytes_per_token",  # KV bytes per cached or new token, k (per GPU)
    "peak_flops",  # FLOP/s, dense peak for the weight dtype
    "hbm_bytes_per_s",  # bytes/s
    "eta_compute",  # fraction of peak FLOP/s in GEMMs
    "eta_memory",  # fraction of HBM bandwidth
    "eta_attn",  # fraction of peak FLOP/s in attention
    "overhead_s",  # seconds per step
    "comm_s_per_token",  # seconds of all-reduce bandwidth per new token (0 at TP 1)
    "comm_s_per_step",  # seconds of all-reduce latency per step (0 at TP 1)
    "elementwise_bytes_per_token",  # activation bytes of norms, RoPE, SiLU-and-mul per token (0: no term)
    "eta_elementwise",  # fraction of HBM bandwidth in the elementwise kernels
    "lm_head_flops_per_row",  # FLOP of the LM head per sampled row, 2 d V / t
    "lm_head_bytes",  # bytes of LM-head weights streamed once in a step that samples, V d 2 / t
    "request_latency_s",  # seconds from a client sending a request to the engine seeing it (serving term)
    "cpu_step_s",  # seconds of CPU work per step (serving term)
    "cpu_seq_s",  # seconds of CPU work per scheduled sequence per step (serving term)
    "cpu_hidden",  # fraction of the step's CPU work async scheduling overlaps with the GPU (serving term)
    "lm_head_flop_rate",  # FLOP/s the LM head achieves: BF16 (never quantised), eta_c F_bf16
    "frontend_s_per_token",  # seconds the API server spends per prompt token, one request at a time (serving)
)
(COEF_GEMM_FLOPS_PER_TOKEN, COEF_WEIGHT_BYTES, COEF_ATTN_FLOPS_PER_WORK, COEF_KV_BYTES_PER_TOKEN, COEF_PEAK_FLOPS,
 COEF_HBM_BYTES_PER_S, COEF_ETA_COMPUTE, COEF_ETA_MEMORY, COEF_ETA_ATTN, COEF_OVERHEAD_S, COEF_COMM_S_PER_TOKEN,
 COEF_COMM_S_PER_STEP, COEF_ELEMENTWISE_BYTES_PER_TOKEN, COEF_ETA_ELEMENTWISE, COEF_LM_HEAD_FLOPS_PER_ROW,
 COEF_LM_HEAD_BYTES, COEF_REQUEST_LATENCY_S, COEF_CPU_STEP_S, COEF_CPU_SEQ_S, COEF_CPU_HIDDEN,
 COEF_LM_HEAD_FLOP_RATE, COEF_FRONTEND_S_PER_TOKEN) = range(len(COEF_NAMES))
N_COEF = len(COEF_NAMES)

# -- policies, step and schedule records, rejections -----------------------------------------------------------
POLICIES = ("static", "dynamic", "continuous", "chunked")
POLICY_STATIC, POLICY_DYNAMIC, POLICY_CONTINUOUS, POLICY_CHUNKED = range(len(POLICIES))

STEP_COLUMNS = (  # one row per iteration, float64
    "start_s", "duration_s", "prefill_tokens", "decode_seqs", "running", "kv_blocks_used",
    "compute_bound", "flops", "hbm_bytes", "kv_blocks_cached",
)
(STEP_START, STEP_DURATION, STEP_PREFILL_TOKENS, STEP_DECODE_SEQS, STEP_RUNNING, STEP_KV_BLOCKS,
 STEP_COMPUTE_BOUND, STEP_FLOPS, STEP_HBM_BYTES, STEP_KV_CACHED) = range(len(STEP_COLUMNS))

SCHED_COLUMNS = ("step", "request", "tokens", "kind")  # one row per request per iteration, int64
SCHED_STEP, SCHED_REQUEST, SCHED_TOKENS, SCHED_KIND = range(len(SCHED_COLUMNS))
KIND_PREFILL, KIND_DECODE, KIND_PREEMPT, KIND_CACHED = 0, 1, 2, 3
KIND_NAMES = ("prefill", "decode", "preempt", "cached")  # cached: tokens an admission found in the prefix cache

# Rejection codes (0 = served); the Python side turns them into sentences.
REJECT_KV, REJECT_BUDGET, REJECT_RECOMPUTE, REJECT_MODEL_LEN = 1, 2, 3, 4

STATUS_OK, STATUS_STUCK, STATUS_PAUSED = 0, 1, 2  # paused: the next plan is at or after the time asked for
STATUS_FULL = 3  # a record has no room for one more iteration: engine.advance grows it and resumes (never returned)

# -- the chunked policy's rules, as bit flags of one integer argument ------------------------------------------
RULE_CHUNKING = 1  # enable_chunked_prefill
RULE_RESERVE_FULL = 2  # scheduler_reserve_full_isl: admit only if the whole prompt's blocks are free
RULE_ASYNC = 4  # async_scheduling: plan step n + 1 while step n runs
RULE_PREFIX_CACHE = 8  # enable_prefix_caching
RULE_THRESHOLD_ALONE = 16  # long_prefill_token_threshold ignored for a request alone (vLLM >= 0.33)
RULE_STOP_UNFIT = 32  # chunking off: a waiting prompt that does not fit the budget left stops admission

# -- the running table: one row per running request, in admission order, so every pass over the running set walks
# contiguous memory (the per-request arrays are too large to stay in cache).
RUN_NAMES = ("req", "prompt", "emit", "comp", "out", "blocks", "tok", "tokpos", "seat", "cached", "hit", "last",
             "risk")
(RUN_REQ, RUN_PROMPT, RUN_EMIT, RUN_COMP, RUN_OUT, RUN_BLOCKS, RUN_TOK, RUN_TOKPOS, RUN_SEAT, RUN_CACHED,
 RUN_HIT, RUN_LAST, RUN_RISK) = range(len(RUN_NAMES))
RUN_COLUMNS = len(RUN_NAMES)  # RUN_SEAT: row of the block table (prefix caching); RUN_CACHED: blocks cached
# RUN_HIT: tokens hit; RUN_LAST: the step of the row's last emitted token; RUN_RISK: 1 if the request may yet be
# rejected (its gaps wait)

# -- the loop's scalar state, one int64 vector so the step helpers can update it in place ------------------------
ST_NAMES = (
    "running",  # rows of the running table in use
    "wait_head",  # ring-buffer head of the waiting queue
    "wait_len",  # requests waiting
    "free_blocks",  # free KV blocks (with prefix caching: cached blocks nobody uses count as free)
    "finished",  # live requests finished or rejected
    "next",  # next live request to send
    "steps",  # iterations recorded
    "sched",  # schedule rows recorded
    "in_flight",  # requests sent and not finished (closed-loop clients)
    "slot_head",  # ring-buffer head of the free client slots' times (closed-loop clients)
    "cached_blocks",  # blocks holding a cached block key (prefix caching)
    "pending",  # finished rows still in the running table (async scheduling holds them one step)
    "seats",  # free rows of the block table (prefix caching)
    "first_held",  # the first row async scheduling still holds after it finished (NO_ROW: none)
    "done",  # requests that emitted their last token, logged in order in the engine's done log
)
(ST_RUNNING, ST_WAIT_HEAD, ST_WAIT_LEN, ST_FREE_BLOCKS, ST_FINISHED, ST_NEXT, ST_STEPS, ST_SCHED, ST_IN_FLIGHT,
 ST_SLOT_HEAD, ST_CACHED_BLOCKS, ST_PENDING, ST_SEATS, ST_FIRST_HELD, ST_DONE) = range(len(ST_NAMES))
N_STATE = len(ST_NAMES)
NO_ROW = 1 << 62  # a row index past the end of every table: "none" (ST_FIRST_HELD)
MAX_COUNT = 1 << 62  # more than any count of requests: where a search for the fewest starts

# -- the loop's clock, one float64 vector so the loop can stop at a time and resume (several engines) -------------
CLOCK_NAMES = ("now", "last_start", "prev_end", "busy")  # s, s, s (NaN: none yet), 1.0 if a step just ran
CLOCK_NOW, CLOCK_LAST_START, CLOCK_PREV_END, CLOCK_BUSY = range(len(CLOCK_NAMES))
N_CLOCK = len(CLOCK_NAMES)

# -- per-request tables: one row per request, so a request's fields share a cache line and every helper takes
# one array for them (each array argument of a jitted call costs reference counting, once per iteration).
REQ_NAMES = (  # int64: prompt, output, token offset, what the loop counts, the request's prefix ids' range
    "prompt", "output", "tok_off", "emitted", "lost", "high_water", "preempt", "reject", "computed", "recomputed",
    "padded", "cached", "last_hit", "prefix_start", "prefix_end", "last_step", "risk", "preloaded",
)
(REQ_PROMPT, REQ_OUTPUT, REQ_TOK_OFF, REQ_EMITTED, REQ_LOST, REQ_HIGH_WATER, REQ_PREEMPT, REQ_REJECT,
 REQ_COMPUTED, REQ_RECOMPUTED, REQ_PADDED, REQ_CACHED, REQ_LAST_HIT, REQ_PREFIX_START,
 REQ_PREFIX_END, REQ_LAST_STEP, REQ_RISK, REQ_PRELOADED) = range(len(REQ_NAMES))
REQ_COLUMNS = len(REQ_NAMES)
TIME_NAMES = ("arrival", "sent", "first", "finish", "sched", "release", "seen", "last")  # float64, seconds
TIME_ARRIVAL, TIME_SENT, TIME_FIRST, TIME_FINISH, TIME_SCHED, TIME_RELEASE, TIME_SEEN, TIME_LAST = range(
    len(TIME_NAMES))
TIME_COLUMNS = len(TIME_NAMES)  # REQ_LAST_STEP and TIME_LAST keep a preempted request's last token
# TIME_SEEN: when the engine saw the request (through the API server: cost.serve_time)
# REQ_RISK: 1 if a preemption could get the request rejected (chunking off, prompt + output over the budget)
# REQ_PRELOADED: 1 if the request arrives with the KV of its prompt (a decode instance of disaggregated serving): its
# admission allocates blocks for prompt + first token and computes nothing of the prompt; a preemption clears it

# -- metrics the loops accumulate as they run (DESIGN section 5) --------------------------------------------------
# Inter-token gaps go into a histogram: bin 0 holds gaps under 2**(ITL_EXP_LO - 1) s, then each octave
# [2**(e - 1), 2**e) s, e = ITL_EXP_LO .. ITL_EXP_HI, is cut into ITL_SUB equal bins, then one bin for the rest. A
# bin keeps its count, the sum of its gaps, the smallest and the largest, so a percentile read from it is off by
# less than one bin's width: under 2**-13 of the value (0.012 %) for gaps from 1 ns to 24 days (see gaps.py).
ITL_SUB = 8192
ITL_EXP_LO, ITL_EXP_HI = -29, 21
ITL_BINS = (ITL_EXP_HI - ITL_EXP_LO + 1) * ITL_SUB + 2
ITL_RELATIVE_ERROR = 1.0 / ITL_SUB
# Run totals, one float64 vector.
TOTAL_NAMES = ("busy_s", "steps", "seq_steps", "itl_s", "itl_count")
TOTAL_BUSY_S, TOTAL_STEPS, TOTAL_SEQ_STEPS, TOTAL_ITL_S, TOTAL_ITL_COUNT = range(len(TOTAL_NAMES))
N_TOTALS = len(TOTAL_NAMES)

# -- the prefix cache -------------------------------------------------------------------------------------------
NO_KEY = -(2**63)  # an empty hash-table slot or a physical block holding no cached key
# A full block only its own request could find again (no prefix id covers it): cached for the LRU order but left
# out of the hash table until that request is preempted, when its blocks are indexed (hashing every decode block
# of every request would cost more than the rest of the loop).
UNINDEXED = NO_KEY + 1
# The block pool is one int64 array: a header, then each section (see kvcache.py).
POOL_HEADER_NAMES = ("slots", "table", "seats")  # header: slots n, hash-table size T (a power of 2), seats S
POOL_SLOTS, POOL_TABLE, POOL_SEATS = range(len(POOL_HEADER_NAMES))
POOL_HEADER = len(POOL_HEADER_NAMES)

# -- several engines (fleet.py) -----------------------------------------------------------------------------------
ROUTERS = ("round_robin", "least_outstanding", "prefix_aware")
ROUTE_ROUND_ROBIN, ROUTE_LEAST_OUTSTANDING, ROUTE_PREFIX = range(len(ROUTERS))

"""Names of the slots the kernels read and write: plain integer constants, no jitted code.

Numba freezes module-level integers into the compiled code, so the kernels index arrays by these names at no
cost, and Python code (``CostModel.coefficients``, ``SimResult``) uses the same names.
"""
from __future__ import annotations

# -- the cost model's coefficients: one float64 vector, per GPU, filled by CostModel.coefficients() ----------
COEF_GEMM_FLOPS_PER_TOKEN = 0  # FLOP per new token in the weight GEMMs, 2 P / t
COEF_WEIGHT_BYTES = 1  # bytes of weights streamed once per step, P b_w / t
COEF_ATTN_FLOPS_PER_WORK = 2  # FLOP per unit of attention work, 2 L d / t
COEF_KV_BYTES_PER_TOKEN = 3  # KV bytes per cached or new token, k (per GPU)
COEF_PEAK_FLOPS = 4  # FLOP/s, dense peak for the weight dtype
COEF_HBM_BYTES_PER_S = 5  # bytes/s
COEF_ETA_COMPUTE = 6  # fraction of peak FLOP/s in GEMMs
COEF_ETA_MEMORY = 7  # fraction of HBM bandwidth
COEF_ETA_ATTN = 8  # fraction of peak FLOP/s in attention
COEF_OVERHEAD_S = 9  # seconds per step
COEF_COMM_S_PER_TOKEN = 10  # seconds of all-reduce bandwidth per new token (0 at TP 1)
COEF_COMM_S_PER_STEP = 11  # seconds of all-reduce latency per step (0 at TP 1)
COEF_ELEMENTWISE_BYTES_PER_TOKEN = 12  # activation bytes of norms, RoPE, SiLU-and-mul per token (0: no term)
COEF_ETA_ELEMENTWISE = 13  # fraction of HBM bandwidth in the elementwise kernels
COEF_LM_HEAD_FLOPS_PER_ROW = 14  # FLOP of the LM head per sampled row, 2 d V / t
COEF_LM_HEAD_BYTES = 15  # bytes of LM-head weights streamed once in a step that samples, V d 2 / t
COEF_REQUEST_LATENCY_S = 16  # seconds from a client sending a request to the engine seeing it (serving term)
COEF_CPU_STEP_S = 17  # seconds of CPU work per step (serving term)
COEF_CPU_SEQ_S = 18  # seconds of CPU work per scheduled sequence per step (serving term)
COEF_CPU_HIDDEN = 19  # fraction of the step's CPU work async scheduling overlaps with the GPU (serving term)
COEF_LM_HEAD_FLOP_RATE = 20  # FLOP/s the LM head achieves: BF16 (never quantised), eta_c F_bf16
COEF_FRONTEND_S_PER_TOKEN = 21  # seconds the API server spends per prompt token, one request at a time (serving)
N_COEF = 22

# -- policies, step and schedule records, rejections -----------------------------------------------------------
POLICIES = ("static", "dynamic", "continuous", "chunked")
POLICY_STATIC, POLICY_DYNAMIC, POLICY_CONTINUOUS, POLICY_CHUNKED = range(4)

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
(RUN_REQ, RUN_PROMPT, RUN_EMIT, RUN_COMP, RUN_OUT, RUN_BLOCKS, RUN_TOK, RUN_TOKPOS, RUN_SEAT, RUN_CACHED,
 RUN_HIT, RUN_LAST, RUN_RISK) = range(13)
RUN_COLUMNS = 13  # RUN_SEAT: row of the block table (prefix caching); RUN_CACHED: blocks cached; RUN_HIT: tokens hit
# RUN_LAST: the step of the row's last emitted token; RUN_RISK: 1 if the request may yet be rejected (its gaps wait)

# -- the loop's scalar state, one int64 vector so the step helpers can update it in place ------------------------
ST_RUNNING = 0  # rows of the running table in use
ST_WAIT_HEAD = 1  # ring-buffer head of the waiting queue
ST_WAIT_LEN = 2  # requests waiting
ST_FREE_BLOCKS = 3  # free KV blocks (with prefix caching: cached blocks nobody uses count as free)
ST_FINISHED = 4  # live requests finished or rejected
ST_NEXT = 5  # next live request to send
ST_STEPS = 6  # iterations recorded
ST_SCHED = 7  # schedule rows recorded
ST_IN_FLIGHT = 8  # requests sent and not finished (closed-loop clients)
ST_SLOT_HEAD = 9  # ring-buffer head of the free client slots' times (closed-loop clients)
ST_CACHED_BLOCKS = 10  # blocks holding a cached block key (prefix caching)
ST_PENDING = 11  # finished rows still in the running table (async scheduling holds them one step)
ST_SEATS = 12  # free rows of the block table (prefix caching)
ST_FIRST_HELD = 13  # the first row async scheduling still holds after it finished (1 << 62: none)
ST_DONE = 14  # requests that emitted their last token, logged in order in the engine's done log
N_STATE = 15

# -- the loop's clock, one float64 vector so the loop can stop at a time and resume (several engines) -------------
CLOCK_NOW, CLOCK_LAST_START, CLOCK_PREV_END, CLOCK_BUSY = range(4)  # s, s, s (NaN: none yet), 1.0 if a step just ran
N_CLOCK = 4

# -- per-request tables: one row per request, so a request's fields share a cache line and every helper takes
# one array for them (each array argument of a jitted call costs reference counting, once per iteration).
(REQ_PROMPT, REQ_OUTPUT, REQ_TOK_OFF, REQ_EMITTED, REQ_LOST, REQ_HIGH_WATER, REQ_PREEMPT, REQ_REJECT,
 REQ_COMPUTED, REQ_RECOMPUTED, REQ_PADDED, REQ_CACHED, REQ_LAST_HIT, REQ_PREFIX_START,
 REQ_PREFIX_END, REQ_LAST_STEP, REQ_RISK, REQ_PRELOADED) = range(18)
REQ_COLUMNS = 18  # int64: prompt, output, token offset, what the loop counts, the request's prefix ids' range
TIME_ARRIVAL, TIME_SENT, TIME_FIRST, TIME_FINISH, TIME_SCHED, TIME_RELEASE, TIME_SEEN, TIME_LAST = range(8)
TIME_COLUMNS = 8  # float64, seconds; REQ_LAST_STEP and TIME_LAST keep a preempted request's last token
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
TOTAL_BUSY_S, TOTAL_STEPS, TOTAL_SEQ_STEPS, TOTAL_ITL_S, TOTAL_ITL_COUNT = range(5)
N_TOTALS = 5

# -- the prefix cache -------------------------------------------------------------------------------------------
NO_KEY = -(2**63)  # an empty hash-table slot or a physical block holding no cached key
# A full block only its own request could find again (no prefix id covers it): cached for the LRU order but left
# out of the hash table until that request is preempted, when its blocks are indexed (hashing every decode block
# of every request would cost more than the rest of the loop).
UNINDEXED = NO_KEY + 1
# The block pool is one int64 array: a header, then each section (see kvcache.py).
POOL_SLOTS, POOL_TABLE, POOL_SEATS = range(3)  # header: slots n, hash-table size T (a power of 2), seats S
POOL_HEADER = 3

# -- several engines (fleet.py) -----------------------------------------------------------------------------------
ROUTERS = ("round_robin", "least_outstanding", "prefix_aware")
ROUTE_ROUND_ROBIN, ROUTE_LEAST_OUTSTANDING, ROUTE_PREFIX = range(3)
# Fields of an engine tuple (engine.new_engine) and of a loop's configuration tuple (engine.run_iterations).
ENGINE_STATE, ENGINE_CLOCK, ENGINE_RUN, ENGINE_POOL, ENGINE_DONE_LOG = 0, 1, 2, 11, 15
ENGINE_ITL, ENGINE_TOTALS = 16, 17
(CONFIG_COEF, CONFIG_CHUNKED, CONFIG_RULES, CONFIG_MAX_NUM_SEQS, CONFIG_BUDGET, CONFIG_THRESHOLD,
 CONFIG_PREFILL_ONLY_STEPS, CONFIG_USABLE_BLOCKS, CONFIG_BLOCK_SIZE, CONFIG_RECORD, CONFIG_PREFIX_TOKENS,
 CONFIG_RECORD_STEPS, CONFIG_MAX_BLOCKS) = range(13)

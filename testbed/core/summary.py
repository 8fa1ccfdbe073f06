"""RunSummary: the one typed result of a run (JSON summary, dashboard, report, sweep, bench all read it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.modes import MODES
from testbed.core.decode import WireConfig
from testbed.core.records import JsonRecord


@dataclass(frozen=True)
class HopSummary(JsonRecord):
    hop: str  # "src->dst"
    configured_ms: float
    measured_ms_p50: float | None
    measured_ms_p99: float | None
    bytes_per_lap: int | None


@dataclass(frozen=True)
class StageSummary(JsonRecord):
    stage: int
    name: str
    emulated_ms: float
    compute_ms_mean: float | None  # with emulated padding
    real_ms_mean: float | None  # the real forward passes


@dataclass(frozen=True)
class TtftSummary(JsonRecord):
    """The first (prefill) lap: measured against C_prefill + T_ring (seed 000, Eq. 5)."""

    prompt_tokens: int
    measured_s: float
    prefill_compute_s: float
    predicted_s: float  # C_prefill + T_ring + serialization (physics.ttft_hops)
    serialization_s: float = 0.0  # the prompt's hidden state at each hop's rate, summed over the hops (and chunks)
    bytes_per_hop: int | None = None  # the whole prompt's (every chunk's) bytes over one hop, mean over the hops
    chunks: int = 1  # decode.prefill_chunk: the prompt went in this many pipelined chunks


@dataclass(frozen=True)
class LinkCheck(JsonRecord):
    """Self-check of one hop from the probe frames sent before the first lap."""

    hop: str
    configured_ms: float
    measured_ms_p50: float
    tolerance_ms: float
    ok: bool


@dataclass(frozen=True)
class DilationSummary(JsonRecord):
    """How a run was time-dilated (testbed.run.dilation, after Gupta et al., NSDI'06).

    The box ran every link delay, jitter, emulated compute and real forward pass `factor` times as long
    (link rates `factor` times lower); every figure of the RunSummary is in the scenario's own time, the
    box's divided by `factor`, so the testbed's fixed costs (wake-ups, sockets, framing) shrink by `factor`.
    """

    factor: float = 1.0
    requested: str = "1"  # "auto" or the number asked for
    needed: float | None = None  # auto: the D that brings the calibrated overhead to target_overhead_pct
    cap: float | None = None  # auto: the largest D allowed (DILATION_MAX, and the run-time budget)
    target_overhead_pct: float | None = None
    overhead_ms: float | None = None  # calibrated: what a lap costs beyond compute and delays, undilated
    compensate: bool = False  # base-path compensation: base_ms subtracted from each dilated delay
    base_ms: tuple[float, ...] = ()  # calibrated one-way latency of each link at zero configured delay
    applied_ms: tuple[float, ...] = ()  # the delay each link got on the box (dilated, compensated)
    reason: str = ""
    lap_ms: float | None = None  # auto: the lap (C + T_ring) the overhead was weighed against
    budget_s: float | None = None  # auto: the run-time budget of the dilated decode (--budget-s)

    @property
    def capped(self) -> bool:
        """Auto wanted a larger D than the budget (or DILATION_MAX) allowed."""
        return self.needed is not None and self.needed > self.factor

    @property
    def expected_error_pct(self) -> float | None:
        """What the calibrated overhead left after dividing by D does to the measured rate, % (negative: slower):
        -(O / D) / (lap + O / D). Not folded into any prediction: shown beside the measured error."""
        if self.overhead_ms is None or not self.lap_ms:
            return None
        left = self.overhead_ms / self.factor
        return -100.0 * left / (self.lap_ms + left)


@dataclass(frozen=True)
class SpecRates(JsonRecord):
    """Measured and predicted figures of a set of speculation rounds (a whole run, or those at one K)."""

    rounds: int
    gamma_measured: float
    gamma_predicted: float  # Gamma(alpha_hat, K), averaged over the rounds' K
    draft_s: float  # per round
    draft_per_token_s: float
    verify_compute_s: float
    round_s: float
    measured_tok_s: float
    predicted_tok_s: float  # Gamma_measured / (K c_d + C + T_ring)
    predicted_tok_s_from_alpha: float  # Gamma(alpha_hat, K) / (K c_d + C + T_ring)


@dataclass(frozen=True, kw_only=True)  # keyword-only: a missing field is an error, never a silent default
class PerKRow(SpecRates):
    k: int
    formula_tok_s: float  # Gamma(alpha_hat, K) / (K c_d + C + T_ring) with the run's c_d and C


@dataclass(frozen=True, kw_only=True)
class SpecSummary(SpecRates):
    k: float  # the K of every round, or their mean when K varied (auto, sweep)
    k_last: int
    k_auto: bool
    draft: str
    drafted: int
    accepted: int
    alpha: float  # estimated: mean of sum_x min(p, q) over drafted positions
    alpha_dialled: float | None  # the calibrated draft's setting
    acceptance_per_position: tuple[float, ...]
    k_star: int  # argmax of Gamma(alpha_hat, K) / (K c_d + C + T_ring) over 1..max(k_max, largest K run)
    k_star_tok_s: float
    # the same from the measured survival curve (acceptance_per_position), which holds for correlated rejections
    k_star_survival: int | None = None
    k_star_survival_tok_s: float | None = None
    plain_predicted_tok_s: float  # 1 / (C + T_ring) with C = verify_compute_s
    per_k: tuple[PerKRow, ...] | None = None  # a K sweep
    k_star_measured: int | None = None
    k_star_predicted: int | None = None


@dataclass(frozen=True)
class StreamsSummary(JsonRecord):
    """M streams in flight (the streams mode): per-stream and aggregate rates next to physics.streams_rates."""

    streams: int
    batching: str
    window_s: float  # the stretch where every stream was decoding: the aggregate is measured over it
    aggregate_tok_s: float
    aggregate_predicted_tok_s: float
    aggregate_error_pct: float
    per_stream_predicted_tok_s: float
    per_stream_tok_s: tuple[float, ...]  # each stream's decode rate: its tokens over its laps' time
    per_stream_p50_tok_s: float
    per_stream_min_tok_s: float
    lap_ms_p50: float  # inter-token time of a stream, over every decode lap of every stream
    lap_ms_p99: float
    ceiling_tok_s: float  # none: 1 / c_max; continuous: the bottleneck batching all M (physics.batching_ceiling)
    stage_compute_ms: tuple[float, ...]  # mean cost of one forward pass (batched: of the whole batch)
    stage_batch_mean: tuple[float, ...]  # mean frames per forward pass
    stage_busy: tuple[float, ...]  # measured fraction of the window each stage computed
    stage_busy_predicted: tuple[float, ...]
    stage_queue_ms_mean: tuple[float, ...]  # how long a frame waited at each stage before its forward pass
    stage_queue_ms_p99: tuple[float, ...]
    texts: tuple[str, ...] = ()  # each stream's generated text

    @property
    def headline(self) -> tuple[float, float, float]:
        """(measured, predicted, error %) that the run's headline shows: the ring's aggregate rate."""
        return self.aggregate_tok_s, self.aggregate_predicted_tok_s, self.aggregate_error_pct

    def calibration_lap(self) -> tuple[float, float]:
        """At zero delay (testbed.run.dilation): (what a stream's lap took beyond physics.streams_rates' lap with the
        measured passes, ms; that lap, s). A lap's M frames cross every hop one by one, so the testbed's cost of a
        lap grows with M, which one frame's calibration (plain decode) does not see."""
        physics_s = self.streams / self.aggregate_predicted_tok_s
        return max(0.0, (self.streams / self.aggregate_tok_s - physics_s) * 1e3), physics_s


@dataclass(frozen=True)
class TreeSummary(JsonRecord):
    """Tree speculation (agents.modes.tree): tokens per lap L(n) and the lap T_lap(n), next to physics.tree_rate."""

    policy: str
    n: float  # nodes drafted per round (mean: a depth cap can leave a tree short)
    rounds: int
    tokens_per_round: float  # L(n): accepted nodes + the one the target adds
    lap_ms: float  # a round: drafting + the verify lap
    draft_ms: float
    compute_ms: float  # the stages' forward passes over the n + 1 nodes, and the head
    ring_ms: float  # measured: every hop, serialization included
    serialization_ms: float  # predicted: each hop's bytes at its rate
    bytes_per_hop: float
    depth_mean: float
    measured_tok_s: float
    predicted_tok_s: float  # tree_rate(L measured, configured links and rates, measured compute + draft)
    error_pct: float

    @property
    def headline(self) -> tuple[float, float, float]:
        return self.measured_tok_s, self.predicted_tok_s, self.error_pct


@dataclass(frozen=True)
class DsdSummary(JsonRecord):
    """Edge drafts, entry verification (agents.modes.dsd): rounds and requests next to physics.dsd_round_s."""

    clients: int
    pipelined: bool
    k: int
    rtt_ms: float
    rounds: int
    tokens_per_round: float  # Gamma, measured
    alpha_hat: float | None
    draft_ms_per_token: float  # t_d, from the rounds drafted after their verdict
    verify_ms: float  # t_v: the entry's verify laps (the ring, its compute and the head)
    queue_ms: float  # a round's wait at the entry behind other clients' rounds
    hit_rate: float  # pipelined: rounds whose drafts were ready from the last round's wait
    round_ms: float  # verdict to verdict, at the edge
    predicted_round_ms: float  # physics.dsd_round_s with the measured t_d, t_v, hit rate (and queueing)
    request_ms: float  # a client's whole request: the prompt sent to the last verdict (mean over the clients)
    predicted_request_ms: float
    request_tokens: float
    aggregate_tok_s: float  # every client's tokens over the stretch where all of them were decoding
    predicted_aggregate_tok_s: float  # min(E Gamma / round, b Gamma / t_v): the clients, or the saturated server
    server_busy: float  # the entry's verify passes over the run's rounds
    batch_mean: float  # clients' rounds per verify pass (decode.batching = "continuous" on a one-node cloud)
    bytes_up_per_round: int
    bytes_down_per_round: int
    error_pct: float  # request latency

    def calibration_lap(self) -> tuple[float, float]:
        """At zero round trip (testbed.run.dilation): (what a round took beyond physics.dsd_round_s, ms; that
        physics, s). A lap of edge speculation is a round."""
        return max(0.0, self.round_ms - self.predicted_round_ms), self.predicted_round_ms / 1e3

    @property
    def headline(self) -> tuple[float, float, float]:
        return (self.aggregate_tok_s, self.predicted_aggregate_tok_s,
                (self.aggregate_tok_s / self.predicted_aggregate_tok_s - 1) * 100)


@dataclass(frozen=True)
class TpSummary(JsonRecord):
    """Tensor parallelism over the links (agents.modes.tp): per-token latency next to physics.tp_token_s, and what PP
    would take on the same links (seed 000, Eq. 8)."""

    allreduce: str
    ranks: int
    layers: int
    tokens: int  # decode tokens measured
    token_ms: float  # mean per-token latency (rank 0: embed to sampled token)
    token_ms_p99: float
    predicted_token_ms: float  # physics.tp_token_s: configured links, measured segment and head compute
    error_pct: float
    segment_ms: float  # mean compute of one segment (half a layer), padding included
    head_ms: float
    comm_ms: float  # mean per token waiting on all-reduces
    messages_per_token: float  # sent by rank 0
    bytes_per_token: float  # sent by rank 0
    pp_predicted_token_ms: float  # C + T_ring on the same links: the configured compute of the stages
    ratio_predicted: float  # predicted_token_ms / pp_predicted_token_ms: the exact ratio for this all-reduce
    ratio_bound: float  # Eq. 8: 4 L / N

    @property
    def headline(self) -> tuple[float, float, float]:
        return 1e3 / self.token_ms, 1e3 / self.predicted_token_ms, self.error_pct


@dataclass(frozen=True)
class AgentUsage(JsonRecord):
    """One agent's CPU and memory over the run (from its run command to its end), as it reported them."""

    stage: int
    name: str
    box_wall_s: float  # on the box's clock (under time dilation D, D times the scenario's)
    cpu_s: float
    max_rss_mb: float
    # the process's own memory at its end (private pages: USS), where RSS also counts the pages an agent shares with
    # the fork server it was forked from (torch, transformers, the byte models); None where not measured
    uss_mb: float | None = None

    @property
    def cpu_share(self) -> float:
        """CPU time over wall time: 1.0 is one core busy all the time."""
        return self.cpu_s / self.box_wall_s if self.box_wall_s > 0 else 0.0


@dataclass(frozen=True)
class RunSummary(JsonRecord):
    """Everything measured in one run next to its prediction (DESIGN.md section 4 names the fields)."""

    scenario: str
    description: str
    shaper: str
    shaper_reason: str
    phase: str
    mode: str
    stages: int
    stage_names: tuple[str, ...]
    hops_ms: tuple[float, ...]  # configured
    tokens: int
    laps: int
    wall_s: float
    compute_s: float | None  # mean C per decode lap, emulated padding included
    compute_real_s: float | None
    t_ring_s: float  # configured
    t_ring_measured_s: float | None
    measured_tok_s: float | None
    predicted_tok_s: float | None  # the wall, or the speculative rate in speculative mode
    error_pct: float | None
    lap_residual_ms: float | None  # entry-node framing per lap
    per_hop: tuple[HopSummary, ...]
    per_stage: tuple[StageSummary, ...]
    overhead_ms_per_hop: float | None
    ttft: TtftSummary | None = None
    self_check: tuple[LinkCheck, ...] | None = None
    spec: SpecSummary | None = None
    streams: StreamsSummary | None = None
    tp: TpSummary | None = None
    tree: TreeSummary | None = None
    dsd: DsdSummary | None = None
    history: tuple[tuple[float, float], ...] = ()  # (seconds since start, recent decode rate)
    metrics_url: str | None = None
    text: str = ""
    token_ids: tuple[int, ...] = ()
    generated_tokens: int | None = None
    shaper_facts: dict = field(default_factory=dict)  # what the backend set up and read back (Shaper.describe())
    dilation: DilationSummary | None = None  # None: not dilated (factor 1)
    agents: tuple[AgentUsage, ...] = ()  # every agent's CPU and memory over the run
    wire: WireConfig = WireConfig()  # how the hidden states travelled (codec)
    serialization_s: float = 0.0  # per decode lap: every hop's bytes at its rate (part of the prediction)
    extra: dict = field(default_factory=dict)  # figures a caller adds (bench, sweep), never read back by the testbed
    # [[network.schedule]]: (at_s, what, happened yet) in the scenario's time; schedule_elapsed_s since the origin
    schedule: tuple[tuple[float, str, bool], ...] = ()
    schedule_elapsed_s: float | None = None

    @property
    def is_speculative(self) -> bool:
        """Its predicted rate is the speculative one (ModeInfo.spec_headline), not the wall."""
        info = MODES.get(self.mode)
        return info is not None and info.spec_headline

    @property
    def wall_predicted_tok_s(self) -> float | None:
        """The plain wall 1/(C + T_ring) as the summarizer predicted it, in either mode (None until known)."""
        if self.spec is not None:
            return self.spec.plain_predicted_tok_s
        return None if self.is_speculative else self.predicted_tok_s

"""The serve study: a scenario served at a sweep of request rates (or a search for the highest rate meeting the
SLO), vLLM's latency figures measured beside the queueing model's, on virtual time unless --shaper says otherwise."""

from __future__ import annotations

import argparse

from agents.modes.serve.workload import ARRIVALS
from testbed.studies.base import Figure, ReportPart, Study, results_of
from testbed.studies.serve import figures, measure


def add_options(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:  # the scenario is optional here: geo-ring unless named
        if action.dest == "scenario":
            action.nargs, action.default = "?", measure.DEFAULT_SCENARIO
            action.help += f" (default {measure.DEFAULT_SCENARIO})"
    parser.add_argument("--rates", metavar="R,R,...",
                        help="request rates to serve, req/s (default: 0.25, 0.5, 0.75, 1 and 1.5 x the queueing "
                             "model's knee; none with --search alone)")
    parser.add_argument("--search", action="store_true",
                        help="find the highest rate whose SLO attainment is at least --attainment: from the knee, "
                             "doubling or halving to a bracket, then bisection to 5%% (needs --goodput)")
    parser.add_argument("--attainment", type=float, default=measure.ATTAINMENT_PCT, metavar="PCT",
                        help=f"the share of requests that must meet every target (default {measure.ATTAINMENT_PCT:g})")
    parser.add_argument("--goodput", nargs="+", metavar="NAME:MS",
                        help="SLO targets as vLLM's --goodput: ttft:MS tpot:MS e2el:MS (any of them; a request is "
                             "good when it meets every one given)")
    parser.add_argument("--against", choices=("virtual",),
                        help="on a real backend, serve every rate again on simulated time and print each latency "
                             "percentile's error against it")
    parser.add_argument("--compare", action="store_true",
                        help="issue 54's comparisons, a row each: geo vs co-located ring (the highest rate each "
                             "serves in the SLO), regional-first placement, speculation on vs off (needs --goodput)")
    workload = parser.add_argument_group("workload ([workload] keys; a flag not given keeps the scenario's value)")
    workload.add_argument("--arrival", choices=[a for a in ARRIVALS if a != "trace"],
                          help="arrivals at each rate: poisson, gamma (with --burstiness) or constant")
    workload.add_argument("--burstiness", type=float, help="gamma's shape, as vLLM's: 1 is Poisson, < 1 burstier")
    workload.add_argument("--requests", type=int, help="requests per rate (workload.requests)")
    workload.add_argument("--duration", type=float, metavar="S",
                          help="every arrival within S seconds instead of a request count (workload.duration_s)")
    workload.add_argument("--prompt-tokens", type=int, help="prompt length (workload.prompt_tokens)")
    workload.add_argument("--output-tokens", type=int, help="output length (workload.output_tokens)")
    workload.add_argument("--max-concurrency", type=int, help="requests in the ring at once, below the cap")
    workload.add_argument("--seed", type=int, help="the workload's seed (the same at every rate)")
    workload.add_argument("--streams", type=int, metavar="CAP",
                          help=f"the ring's cap: requests admitted at once, a KV cache each (decode.streams; "
                               f"default {measure.DEFAULT_CAP} unless the scenario serves)")
    parser.add_argument("--json", help="write the result here (default results/serve-SCENARIO.json); the requests, "
                                       "the markdown table and the figures go beside it")


STUDY = Study("serve", "serving under open-loop traffic: p50/p99 TTFT, TPOT and E2EL, goodput and SLO attainment "
                       "per request rate beside the queueing model; --search the highest rate meeting the SLO",
              add_options, measure.run, measure.show,
              report=ReportPart("serve_rows", "Serving", "serving studies", figures.parse_serve,
                                figures.serve_markdown, (
                                    Figure("fig9_serve_latency.png", results_of(figures.plot_latency)),
                                    Figure("fig10_serve_attainment.png", results_of(figures.plot_attainment),
                                           lambda items: any(r.met is not None for item in items
                                                             for r in item.result.serve_rows)))),
              defaults=(("shaper", "virtual"),))
# No line in `testbed bench`'s studies section: the bench checks a backend against its reference, and the serve
# study's check on a real backend is issue 54's relay sweep against the virtual run (a study of its own, minutes).

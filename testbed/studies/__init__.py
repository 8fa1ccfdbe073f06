"""The studies: each is a folder (its options, measurement, result and report part) plus one line here. The CLI
builds a command for each, the API (`testbed.<name>(...)`) runs each, and `testbed report` reads each one's JSON.

    from testbed.studies import STUDIES
    STUDIES["faults"].run(args, console)
"""

from __future__ import annotations

from testbed.studies import (acceptance, bench, codecs, dsd, faults, overlap, place, probe, regimes, reproduce, search,
                             serve, sweep, tp, transport, tree, weights, whatif)
from testbed.studies.base import Study

# A new study is one folder plus one line here (the order is the CLI's and the report's).
STUDIES: dict[str, Study] = {study.name: study for study in (
    sweep.STUDY,
    regimes.STUDY,
    place.STUDY,
    tp.STUDY,
    tree.STUDY,
    codecs.STUDY,
    dsd.STUDY,
    acceptance.STUDY,
    overlap.STUDY,
    faults.STUDY,
    whatif.STUDY,
    probe.STUDY,
    transport.STUDY,
    weights.STUDY,
    search.STUDY,
    serve.STUDY,
    reproduce.STUDY,
    bench.STUDY,
)}

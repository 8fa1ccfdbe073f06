"""Chooses the shaping backend: "netem" (kernel qdiscs), "userspace" (Trio relay) or "auto", and says why.

    shaper = choose_shaper("auto", links, n_stages, run_id, options=ShaperOptions(loss_rto_ms=200.0))
    print(shaper.name, shaper.reason)
    # userspace  netem: sch_netem not available in this kernel (...); using userspace relay

    backend, lines = plan_lines("auto", links, n_stages, run_id, ShaperOptions())  # applies nothing

"auto" takes the kernel backend when the probe finds CAP_NET_ADMIN, network namespaces, veth and
sch_netem, and the userspace relay otherwise; "netem" insists and raises ShapingError naming the
missing piece. The userspace backend is imported lazily (it needs nothing the probe checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from netem.base import Shaper, ShaperOptions
from netem.probe import Capabilities, probe
from testbed.core.errors import ShapingError
from testbed.core.records import LinkSpec

def _missing_reason(caps: Capabilities) -> str:
    """The plain reason and the probe's every step (for errors, where the steps help)."""
    return f"{caps.plain()} (probe: {caps.detail})"


def _kernel(links: list[LinkSpec], n_stages: int, run_id: str, reason: str, options: ShaperOptions) -> Shaper:
    from netem.kernel import KernelShaper

    shaper = KernelShaper(links, n_stages, run_id, options)
    shaper.reason = reason
    return shaper


def _userspace(links: list[LinkSpec], n_stages: int, run_id: str, reason: str, options: ShaperOptions) -> Shaper:
    try:
        from netem.userspace import UserspaceShaper
    except ImportError as exc:
        raise ShapingError(f"the userspace backend (netem.userspace) cannot be imported: {exc}") from exc
    shaper = UserspaceShaper(links, n_stages, run_id, options)
    shaper.reason = reason
    return shaper


def _virtual(links: list[LinkSpec], n_stages: int, run_id: str, reason: str, options: ShaperOptions) -> Shaper:
    from netem.virtual import VirtualShaper

    shaper = VirtualShaper(links, n_stages, run_id, options)
    shaper.reason = reason
    return shaper


@dataclass(frozen=True)
class Backend:
    """One shaping backend: how it is built, why when asked for by name, and what it needs of this box."""

    name: str
    build: Callable[[list[LinkSpec], int, str, str, ShaperOptions], Shaper]  # (links, n, run_id, reason, options)
    requested: str  # the reason a run gives when --shaper names it
    missing: Callable[[Capabilities], str | None] | None = None  # None: runs anywhere; else why not here (or None)
    simulated: bool = False  # runs on simulated time: exact, so time dilation does not apply


def _netem_missing(caps: Capabilities) -> str | None:
    if caps.netem_ready:
        return None
    return (f"--shaper netem cannot work here: {_missing_reason(caps)}; run as root on a kernel with sch_netem, "
            "inside user-mode-linux (python -m netem.uml -- ...), or use --shaper userspace")


# A new backend is one module plus one line here; the CLI, faults and bench read the choices from it.
BACKENDS: dict[str, Backend] = {backend.name: backend for backend in (
    Backend("netem", _kernel, "netem: requested (--shaper netem); root, netns, veth and sch_netem available",
            _netem_missing),
    Backend("userspace", _userspace, "userspace: requested (--shaper userspace)"),
    Backend("virtual", _virtual, "virtual: requested (--shaper virtual); simulated time, exact", simulated=True),
)}


def kinds() -> tuple[str, ...]:
    """What --shaper takes: "auto" (netem where the kernel has it, else userspace; never virtual) and every backend."""
    return ("auto", *BACKENDS)


KINDS = kinds()  # the built-in choices (a backend registered later is in kinds(), not here)


def choose_shaper(kind: str, links: list[LinkSpec], n_stages: int, run_id: str, *,
                  options: ShaperOptions | None = None,
                  probe_fn: Callable[[], Capabilities] = probe) -> Shaper:
    """The backend for `kind` (one of kinds()), built with `options`, with `.reason` saying which one and why."""
    options = ShaperOptions() if options is None else options
    if kind not in kinds():
        raise ShapingError(f"unknown shaper {kind!r}; valid kinds: {', '.join(kinds())}")
    if kind != "auto":
        backend = BACKENDS[kind]
        why_not = backend.missing(probe_fn()) if backend.missing is not None else None
        if why_not:
            raise ShapingError(why_not)
        return backend.build(links, n_stages, run_id, backend.requested, options)
    caps = probe_fn()
    if caps.netem_ready:
        shaper = _kernel(links, n_stages, run_id, "auto: root, netns, veth and sch_netem available", options)
    else:
        shaper = _userspace(links, n_stages, run_id, f"auto: the userspace relay shapes the links; netem cannot: "
                                                     f"{caps.plain()}", options)
    shaper.probe = caps.detail  # the probe's every step: --verbose and the JSON's shaper_facts carry it
    return shaper


def plan_lines(kind: str, links: list[LinkSpec], n_stages: int, run_id: str,
               options: ShaperOptions | None = None, *,
               probe_fn: Callable[[], Capabilities] = probe) -> tuple[str, list[str]]:
    """(backend name, what it would set up) for `kind`, applying nothing (no root needed).

    The backend is resolved exactly as choose_shaper resolves it ("auto" runs the same probe), and
    the first line is a comment that says which backend and why; the rest are the backend's own
    plan_lines(): ip/ethtool/tc commands for netem, one timing line per directed link for the relay.
    Unlike choose_shaper, "netem" plans even where it could not run (the comment then says why not).
    """
    if kind == "netem":
        caps = probe_fn()
        where = ("root, netns, veth and sch_netem available" if caps.netem_ready
                 else f"could not run here: {_missing_reason(caps)}")
        shaper = _kernel(links, n_stages, run_id, f"netem: requested (--shaper netem); {where}",
                         ShaperOptions() if options is None else options)
    else:
        shaper = choose_shaper(kind, links, n_stages, run_id, options=options, probe_fn=probe_fn)
    warm = (["# TCP: every link a warm long-haul connection (initcwnd/initrwnd and socket buffers below hold a 64 MiB "
             "frame); the entry sends one prompt-sized frame around before the first lap, since Linux caps a fresh "
             "connection's first receive window at 64 KiB; a rate is the payload's, netem's set above it by each "
             "full segment's 66 header bytes"] if shaper.warm_windows else [])
    return shaper.name, [f"# backend {shaper.name}: {shaper.reason}", *warm, *shaper.plan_lines()]

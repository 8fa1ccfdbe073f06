"""[network]: the ring's hops (given, or from the stages' regions) and the extra [[network.links]], as LinkSpecs."""

from __future__ import annotations

from dataclasses import fields

from testbed.core.errors import ConfigError
from testbed.core.records import LinkSpec
from testbed.scenario.regions import RegionMatrix
from testbed.scenario.validate import check_keys, number

NETWORK_KEYS = {"hops_ms", "jitter_ms", "loss_pct", "rate_mbit", "loss_rto_ms", "seed", "links", "schedule",
                "lap_timeout_s", "transport"}
LINK_KEYS = {f.name for f in fields(LinkSpec)} - {"seed"}  # a link's seed follows network.seed


def ring_hops(net: dict, n: int, regions: RegionMatrix | None, placed: list[str], head: str, scale: float,
              source: str) -> list:
    """network.hops_ms (unscaled), or the ring's hops from the region matrix where the stages are placed."""
    if placed and "hops_ms" not in net:  # the matrix's delays are already scaled: undo it, links scale below
        hops = [ms / scale for ms in regions.ring_ms(placed)]
    else:
        hops = net.get("hops_ms", [0.0] * n if n > 1 else [])
    if not isinstance(hops, list):
        raise ConfigError("expected an array of one-way delays in ms", source=source, key="network.hops_ms")
    expected = n if n > 1 else 0
    if len(hops) != expected:
        also = " plus one for the separate head's agent, which sits after the last stage" if head == "separate" else ""
        raise ConfigError(f"expected {expected} ring hop delays (one per stage{also}, stage i -> i+1, the last "
                          f"closing the ring), got {len(hops)}", source=source, key="network.hops_ms")
    return hops


def links_from_dict(net: dict, n: int, regions: RegionMatrix | None, placed: list[str], head: str, scale: float,
                    source: str) -> list[LinkSpec]:
    """Every directed link of an n-agent ring: the ring hops first (stage i -> i + 1), then [[network.links]]; the
    network's jitter, loss and rate are each link's defaults, link k's seed is network.seed + k."""
    hops = ring_hops(net, n, regions, placed, head, scale, source)
    jitter = number(net, "jitter_ms", 0.0, source, "network", maximum=10_000)
    loss = number(net, "loss_pct", 0.0, source, "network", maximum=100)
    rate = number(net, "rate_mbit", 0.0, source, "network", maximum=100_000)
    seed = number(net, "seed", 0, source, "network", integer=True)
    links: list[LinkSpec] = []
    for i, delay in enumerate(hops):
        delay = number({f"hops_ms[{i}]": delay}, f"hops_ms[{i}]", 0, source, "network", maximum=60_000)
        links.append(LinkSpec(i, (i + 1) % n, delay * scale, jitter * scale, loss, rate, seed + i))
    extra = net.get("links", [])
    if not isinstance(extra, list):
        raise ConfigError("expected an array of [[network.links]] tables", source=source, key="network.links")
    seen = {(link.src, link.dst) for link in links}
    for j, lk in enumerate(extra):
        where = f"network.links[{j}]"
        if not isinstance(lk, dict):
            raise ConfigError("expected a table", source=source, key=where)
        check_keys(lk, LINK_KEYS, source, where)
        src = number(lk, "src", -1, source, where, maximum=n - 1, integer=True)
        dst = number(lk, "dst", -1, source, where, maximum=n - 1, integer=True)
        if src == dst:
            raise ConfigError("a link needs two different stages", source=source, key=where)
        if (src, dst) in seen:
            raise ConfigError(f"link {src}->{dst} is already defined (ring hops come from network.hops_ms)",
                              source=source, key=where)
        seen.add((src, dst))
        links.append(LinkSpec(src, dst, number(lk, "delay_ms", 0.0, source, where, maximum=60_000) * scale,
                              number(lk, "jitter_ms", jitter, source, where) * scale,
                              number(lk, "loss_pct", loss, source, where, maximum=100),
                              number(lk, "rate_mbit", rate, source, where), seed + len(links)))
    return links

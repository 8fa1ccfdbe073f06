"""Layer splits of a ring's stages: water filling a total over weights within per-stage caps."""

from __future__ import annotations

SPLITS = ("even", "balanced", "greedy")


def water_fill(total: int, weight: list[float], caps: list[int]) -> list[int]:
    """`total` layers in proportion to `weight`, none above its cap and each at least one: the capped shares fixed,
    the rest shared again; whole layers by largest remainder (within the caps)."""
    n = len(weight)
    share = [0.0] * n
    free = set(range(n))
    left = float(total)
    while free:
        w = sum(weight[i] for i in free)
        over = [i for i in free if left * weight[i] / w > caps[i]]
        if not over:
            for i in free:
                share[i] = left * weight[i] / w
            break
        for i in over:
            share[i] = caps[i]
            left -= caps[i]
            free.discard(i)
    layers = [max(1, min(caps[i], int(share[i]))) for i in range(n)]
    order = sorted(range(n), key=lambda i: -(share[i] - int(share[i])))
    while sum(layers) < total:
        grew = False
        for i in order:
            if sum(layers) < total and layers[i] < caps[i]:
                layers[i] += 1
                grew = True
        if not grew:
            break
    while sum(layers) > total:
        i = max((i for i in range(n) if layers[i] > 1), key=lambda i: layers[i] - share[i])
        layers[i] -= 1
    return layers


"""Deployment catalogues: model geometry, hardware datasheets and cloud-region latencies, every figure sourced."""

from testbed.deploy.catalog import (
    DTYPE_BYTES,
    HardwarePreset,
    ModelPreset,
    Region,
    RegionCatalog,
    hardware,
    hardware_preset,
    model_preset,
    models,
    region,
    regions,
)

__all__ = [
    "DTYPE_BYTES",
    "HardwarePreset",
    "ModelPreset",
    "Region",
    "RegionCatalog",
    "hardware",
    "hardware_preset",
    "model_preset",
    "models",
    "region",
    "regions",
]

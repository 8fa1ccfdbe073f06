"""Runs a command inside user-mode-linux, whose kernel has sch_netem: `python -m netem.uml [--timeout S] -- CMD`."""

from netem.uml.runner import (
    DEFAULT_MEM,
    DEFAULT_TIMEOUT_S,
    EXIT_TIMEOUT,
    EXIT_UML_FAILED,
    EXIT_USAGE,
    GUEST_MODULES,
    GUEST_TOOLS,
    build_xstate_shim,
    find_uml_binary,
    guest_environment,
    host_needs_xstate_shim,
    main,
    missing_guest_tools,
    module_dir,
    module_load_order,
    render_init_script,
    run,
    uml_available,
)

__all__ = [
    "DEFAULT_MEM", "DEFAULT_TIMEOUT_S", "EXIT_TIMEOUT", "EXIT_UML_FAILED", "EXIT_USAGE", "GUEST_MODULES",
    "GUEST_TOOLS", "build_xstate_shim", "find_uml_binary", "guest_environment", "host_needs_xstate_shim", "main",
    "missing_guest_tools", "module_dir", "module_load_order", "render_init_script", "run", "uml_available",
]

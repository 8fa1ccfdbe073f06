"""Boots user-mode-linux (UML) on the host's own filesystem and runs one command inside it.

    python -m netem.uml [--timeout S] [--mem SIZE] [--verbose] -- COMMAND...

UML is a Linux kernel that runs as an ordinary process (Debian package `user-mode-linux`). We boot it
with the host root filesystem (hostfs) and a generated init script; the script mounts proc, sysfs, a
tmpfs on /run and on /dev/shm, brings lo up, loads the modules the kernel backend uses (veth and
sch_netem: netem's rate is its own, no tbf/htb/ifb) with insmod from /usr/lib/uml/modules/<version>
(with their modules.dep dependencies), cds to the caller's directory,
exports the caller's environment, runs COMMAND, writes its exit status to a host file and halts::

    host                                 UML guest (1 vCPU, MEM of RAM, hostfs root = the host's /)
    python -m netem.uml -- CMD   ---->   /tmp/geo-ring-uml-XXXX/init.sh (PID 1) -> CMD
       ^ exit status  <---- status file (hostfs)        COMMAND's stdout+stderr -> console -> our stdout

A hostfs root IS the host filesystem: whatever COMMAND writes lands on the host (so do test
results). /tmp inside the guest is the host's /tmp.

Exit status: COMMAND's own; 124 when --timeout expired (UML's whole process group is killed); 125
when UML itself failed (no status written, e.g. a kernel panic; rerun with --verbose); 2 for a usage
or installation error (user-mode-linux missing).

The XSAVE shim: on hosts with AVX-512 or AMX, UML 6.1 cannot context-switch the guest's FPU state
by itself; we LD_PRELOAD xstate_shim.c (next to this file, compiled with the host's cc into the temp
dir at each start; its header says why and how). Hosts without a C compiler get a clear error.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testbed.core.errors import ShapingError

DEFAULT_TIMEOUT_S = 1800.0
DEFAULT_MEM = "6G"  # 4 agents importing torch (~300-500 MB each) + launcher + page cache; pages are lazy
UML_MODULES_ROOT = Path("/usr/lib/uml/modules")
UML_BINARY_NAMES = ("linux.uml", "linux")
# Loaded in this order; dependencies listed in modules.dep are inserted before each.
GUEST_MODULES = ("veth", "sch_netem")
REQUIRED_MODULES = GUEST_MODULES
GUEST_PATH_DEFAULT = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Commands the guest's init runs (on the host's filesystem, with GUEST_PATH_DEFAULT) -> Debian package.
GUEST_TOOLS = {"insmod": "kmod", "ip": "iproute2", "mount": "mount"}
KILL_GRACE_S = 5.0
XSTATE_SHIM_SOURCE = Path(__file__).with_name("xstate_shim.c")  # shipped as package data
# Not carried into the guest: per-host-session noise, and our own shim (the guest must not load it).
ENV_SKIP = {"LD_PRELOAD", "PWD", "OLDPWD", "SHLVL", "_", "TERM_PROGRAM", "SSH_AUTH_SOCK", "SSH_AGENT_PID",
            "DISPLAY", "XAUTHORITY", "DBUS_SESSION_BUS_ADDRESS", "MAIL"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MEM = re.compile(r"[1-9][0-9]*[KMG]\Z")
EXIT_TIMEOUT = 124
EXIT_UML_FAILED = 125
EXIT_USAGE = 2



def find_uml_binary() -> str | None:
    """Path of the user-mode-linux kernel binary, or None."""
    for name in UML_BINARY_NAMES:
        path = shutil.which(name)
        if path and _is_uml(path):
            return path
    return None


def _is_uml(path: str) -> bool:
    # /usr/bin/linux is an alternatives link; make sure it is the UML kernel, not something else
    real = os.path.realpath(path)
    return real.endswith("linux.uml") or os.path.basename(real).startswith("linux")


def module_dir() -> Path | None:
    """/usr/lib/uml/modules/<version> of the installed UML kernel (the newest when several)."""
    if not UML_MODULES_ROOT.is_dir():
        return None
    versions = sorted((p for p in UML_MODULES_ROOT.iterdir() if (p / "modules.dep").is_file()),
                      key=lambda p: [int(x) if x.isdigit() else x for x in re.split(r"[.\-]", p.name)])
    return versions[-1] if versions else None


def module_load_order(moddir: Path, names: tuple[str, ...] = GUEST_MODULES) -> list[Path]:
    """The .ko files to insmod, dependencies first, from modules.dep (paths relative to moddir)."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (moddir / "modules.dep").read_text().splitlines():
        if ":" not in line:
            continue
        target, _, rest = line.partition(":")
        deps[target] = rest.split()
        by_name[_module_name(target)] = target
    order: list[str] = []

    def visit(rel: str) -> None:
        for dep in deps.get(rel, []):
            visit(dep)
        if rel not in order:
            order.append(rel)

    for name in names:
        if name in by_name:
            visit(by_name[name])
    return [moddir / rel for rel in order]


def _module_name(rel: str) -> str:
    base = os.path.basename(rel)
    for suffix in (".ko.xz", ".ko.gz", ".ko.zst", ".ko"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base.replace("-", "_")


def _compiler() -> str | None:
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


def host_needs_xstate_shim() -> bool:
    """True when the host's XSAVE area is larger than UML 6.1's buffer (AVX-512 or AMX present)."""
    if platform.machine() != "x86_64":
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return bool(re.search(r"^flags\s*:.*\b(avx512f|amx_tile)\b", flags, re.M))


def missing_guest_tools(path: str = GUEST_PATH_DEFAULT) -> dict[str, str]:
    """The commands the guest's init needs that are not on the host filesystem: {command: Debian package}."""
    return {tool: package for tool, package in GUEST_TOOLS.items() if shutil.which(tool, path=path) is None}


def uml_available() -> tuple[bool, str]:
    """Whether `python -m netem.uml` can run here, and why not (without booting it)."""
    binary = find_uml_binary()
    if binary is None:
        return False, "user-mode-linux is not installed (no linux.uml on PATH; apt-get install user-mode-linux)"
    missing = missing_guest_tools()
    if missing:
        # Without insmod the guest boots but cannot load sch_netem/veth: fail here, not in the guest.
        return False, (f"the UML guest's init needs {', '.join(sorted(missing))}, not found on {GUEST_PATH_DEFAULT} "
                       f"(apt-get install {' '.join(sorted(set(missing.values())))})")
    moddir = module_dir()
    if moddir is None:
        return False, f"no UML kernel modules under {UML_MODULES_ROOT} (reinstall user-mode-linux)"
    present = {_module_name(p.name) for p in module_load_order(moddir, REQUIRED_MODULES)}
    missing = [m for m in REQUIRED_MODULES if m not in present]
    if missing:
        return False, f"UML modules missing in {moddir}: {', '.join(missing)}"
    if host_needs_xstate_shim() and _compiler() is None:
        return False, ("this CPU has AVX-512/AMX, which UML 6.1 cannot context-switch by itself, and no C "
                       "compiler (cc) is installed to build the XSAVE shim (apt-get install gcc)")
    return True, f"{binary} with modules {moddir}"


def build_xstate_shim(workdir: Path) -> Path:
    """Compile the XSAVE shim (see the module docstring) into workdir; ShapingError when impossible."""
    cc = _compiler()
    if cc is None:
        raise ShapingError("no C compiler (cc) to build the UML XSAVE shim this AVX-512/AMX host needs "
                           "(apt-get install gcc)")
    if not XSTATE_SHIM_SOURCE.is_file():
        raise ShapingError(f"the UML XSAVE shim's source {XSTATE_SHIM_SOURCE} is missing (reinstall geo-ring)")
    library = workdir / "xstate_shim.so"
    result = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(library), str(XSTATE_SHIM_SOURCE), "-ldl"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise ShapingError(f"building the UML XSAVE shim failed ({cc}): {result.stderr.strip()[-500:]}")
    return library


def guest_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables exported inside the guest: the caller's, minus host-session noise."""
    env = dict(os.environ if environ is None else environ)
    out = {k: v for k, v in env.items() if k not in ENV_SKIP and _ENV_NAME.match(k) and "\0" not in v}
    out.setdefault("PATH", GUEST_PATH_DEFAULT)
    return out


def render_init_script(command: list[str], cwd: str, environ: dict[str, str], modules: list[Path],
                       status_file: Path) -> str:
    """The guest's /sbin/init: a POSIX sh script, every host value quoted with shlex."""
    q = shlex.quote
    lines = [
        "#!/bin/sh",
        "# generated by netem.uml; PID 1 of a user-mode-linux guest",
        f"export PATH={q(GUEST_PATH_DEFAULT)}",
        "mount -t proc proc /proc",
        "mount -t sysfs sysfs /sys",
        "mount -t tmpfs -o mode=0755 tmpfs /run",
        "mkdir -p /dev/shm && mount -t tmpfs -o mode=1777 tmpfs /dev/shm",
        "ip link set lo up",
    ]
    for ko in modules:
        lines.append(f"insmod {q(str(ko))} || echo {q(f'netem.uml: insmod {ko.name} failed')} >&2")
    # COMMAND runs in a subshell with the caller's environment; init keeps its own PATH for halt
    lines.append("(")
    for key in sorted(environ):
        lines.append(f"  export {key}={q(environ[key])}")
    lines += [
        f"  cd {q(cwd)} || exit 1",
        "  exec " + " ".join(q(arg) for arg in command) + " </dev/null",
        ")",
        "status=$?",
        f"echo $status > {q(str(status_file))}",
        "sync",
        "halt -f >/dev/null 2>&1 || poweroff -f",
        "",
    ]
    return "\n".join(lines)


def kernel_command_line(init: Path, mem: str, console_fd: int, workdir: Path) -> list[str]:
    return [
        f"mem={mem}",
        "rootfstype=hostfs",
        "rw",
        f"init={init}",
        "con=null",
        f"con0=null,fd:{console_fd}",
        f"uml_dir={workdir}",  # UML's mconsole/pid dir: inside our temp dir, so it is removed with it
        "quiet",
        "loglevel=3",
    ]


def _mem_bytes(mem: str) -> int:
    return int(mem[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[mem[-1]]


def memory_file_dir(mem: str, fallback: Path) -> str:
    """Where UML keeps its (sparse) RAM file: /dev/shm when it can hold all of `mem`, else on disk.

    A container's /dev/shm is often 64 MB; a guest that outgrows its RAM file dies of SIGBUS.
    """
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize >= _mem_bytes(mem):
            return "/dev/shm"
    except OSError:
        pass
    return str(fallback)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL UML and every guest process (they are host processes in UML's process group)."""
    deadline = time.monotonic() + KILL_GRACE_S
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    while time.monotonic() < deadline:  # until the group is empty (zombies of other parents aside)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def run(command: list[str], *, timeout_s: float = DEFAULT_TIMEOUT_S, mem: str = DEFAULT_MEM,
        verbose: bool = False, cwd: str | None = None) -> int:
    """Boot UML, run `command` inside it, return its exit status (see the module docstring)."""
    if not command:
        raise ShapingError("no command to run inside user-mode-linux")
    if not _MEM.match(mem):
        raise ShapingError(f"--mem must look like 4G or 512M, got {mem!r}")
    ok, reason = uml_available()
    if not ok:
        raise ShapingError(reason)
    binary = find_uml_binary()
    moddir = module_dir()
    assert binary is not None and moddir is not None
    workdir = Path(tempfile.mkdtemp(prefix="geo-ring-uml-"))
    proc: subprocess.Popen | None = None
    log = None
    try:
        status_file = workdir / "status"
        init = workdir / "init.sh"
        init.write_text(render_init_script(command, cwd or os.getcwd(), guest_environment(),
                                           module_load_order(moddir), status_file))
        init.chmod(0o755)
        env = uml_environment(workdir, mem)
        # The guest console writes to our stdout (a dup of it); UML's own host-side chatter
        # (boot checks, panics) goes to a log we show on failure or with --verbose.
        sys.stdout.flush()
        console_fd = os.dup(sys.stdout.fileno())
        log = open(workdir / "uml.log", "w+b")
        try:
            proc = subprocess.Popen(
                [binary, *kernel_command_line(init, mem, console_fd, workdir)],
                stdin=subprocess.DEVNULL, stdout=log if not verbose else None,
                stderr=subprocess.STDOUT if not verbose else None,
                pass_fds=(console_fd,), env=env, start_new_session=True,
            )
        finally:
            os.close(console_fd)
        deadline = time.monotonic() + timeout_s
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            print(f"netem.uml: timed out after {timeout_s:g} s; killed user-mode-linux", file=sys.stderr,
                  flush=True)
            return EXIT_TIMEOUT
        _kill_group(proc)  # guest processes are host processes in UML's group: reap stragglers
        return command_status(status_file, proc.returncode, None if verbose else log)
    except BaseException:
        if proc is not None and proc.poll() is None:
            _kill_group(proc)
        raise
    finally:
        if log is not None:
            log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def uml_environment(workdir: Path, mem: str) -> dict[str, str]:
    """UML's environment: the XSAVE shim preloaded where the host needs it, its memory file under TMPDIR."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if host_needs_xstate_shim():
        env["LD_PRELOAD"] = str(build_xstate_shim(workdir))
    env["TMPDIR"] = memory_file_dir(mem, workdir)
    return env


def command_status(status_file: Path, uml_returncode: int | None, log) -> int:
    """The guest command's exit status, as init wrote it; EXIT_UML_FAILED (with UML's log tail) when there is
    none."""
    try:
        return int(status_file.read_text().strip())
    except (OSError, ValueError):
        print(f"netem.uml: user-mode-linux exited ({uml_returncode}) without the command's status "
              "(kernel panic or init failure); its log follows", file=sys.stderr)
        if log is not None:
            log.seek(0)
            print(log.read()[-4000:].decode(errors="replace"), file=sys.stderr, flush=True)
        return EXIT_UML_FAILED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m netem.uml",
        description="Run COMMAND inside user-mode-linux (which has sch_netem) on the host filesystem.")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds before UML is killed and we exit 124 (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--mem", default=DEFAULT_MEM, help=f"guest RAM, e.g. 4G (default {DEFAULT_MEM})")
    parser.add_argument("--verbose", action="store_true", help="show UML's own boot messages")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("missing COMMAND (use: python -m netem.uml -- COMMAND ...)")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    # SIGTERM (a supervisor's, `timeout`'s, kill's default) unwinds like Ctrl-C: run() then kills UML's whole
    # process group, which would otherwise live on without us (UML is in a session of its own)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return run(command, timeout_s=args.timeout, mem=args.mem, verbose=args.verbose)
    except ShapingError as exc:
        print(f"netem.uml: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


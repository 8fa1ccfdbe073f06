"""Backend selection: auto falls back to userspace with a reason, "netem" names what is missing, bad kinds fail."""

from __future__ import annotations

import os

import pytest

from testbed.core.records import LinkSpec
from netem.probe import Capabilities, probe
from netem.select import KINDS, choose_shaper
from testbed.core.errors import ShapingError

LINKS = [LinkSpec(0, 1, 5.0), LinkSpec(1, 0, 5.0)]

NO_NETEM = Capabilities(True, True, True, False,
                        "CAP_NET_ADMIN: yes; netns: yes; veth: yes; sch_netem: no (sch_netem not available "
                        "in this kernel: NetlinkError ENOENT)")
NOT_ROOT = Capabilities(False, False, False, False, "not root: no CAP_NET_ADMIN (uid 1000)")
NO_VETH = Capabilities(True, True, False, False, "veth: no (EOPNOTSUPP)")
ALL = Capabilities(True, True, True, True, "CAP_NET_ADMIN: yes; netns: yes; veth: yes; sch_netem: yes")


def test_auto_without_netem_picks_userspace_and_says_why_once_in_plain_words():
    shaper = choose_shaper("auto", LINKS, 2, "abcdef00", probe_fn=lambda: NO_NETEM)
    assert shaper.name == "userspace"
    assert shaper.reason == ("auto: the userspace relay shapes the links; netem cannot: this kernel has no sch_netem "
                             "(modprobe sch_netem; make test-netem runs netem in user-mode-linux)")
    assert shaper.probe == NO_NETEM.detail and shaper.describe()["probe"] == NO_NETEM.detail  # the JSON has it all
    assert shaper.reason.count("(") == 1 and "NetlinkError" not in shaper.reason


def test_auto_with_netem_picks_the_kernel_backend():
    shaper = choose_shaper("auto", LINKS, 2, "abcdef00", probe_fn=lambda: ALL)
    assert shaper.name == "netem" and "sch_netem" in shaper.reason
    assert shaper.plan.prefix == "grabcde"  # planned, nothing applied yet


@pytest.mark.parametrize("caps, piece", [(NO_NETEM, "sch_netem"), (NOT_ROOT, "root"), (NO_VETH, "veth")])
def test_netem_where_it_cannot_work_names_the_missing_piece(caps, piece):
    with pytest.raises(ShapingError, match=piece):
        choose_shaper("netem", LINKS, 2, "abcdef00", probe_fn=lambda: caps)


def test_unknown_kind_lists_the_valid_ones():
    with pytest.raises(ShapingError) as info:
        choose_shaper("tc", LINKS, 2, "abcdef00", probe_fn=lambda: ALL)
    for kind in KINDS:
        assert kind in str(info.value)


def test_userspace_needs_no_probe():
    def boom() -> Capabilities:
        raise AssertionError("probe must not run for --shaper userspace")

    assert choose_shaper("userspace", LINKS, 2, "abcdef00", probe_fn=boom).name == "userspace"


def test_real_probe_on_this_machine_is_consistent():
    caps = probe()  # creates and removes a throw-away namespace when root; never raises
    assert isinstance(caps.detail, str) and caps.detail
    shaper = choose_shaper("auto", LINKS, 2, "abcdef00", probe_fn=lambda: caps)
    if caps.netem_ready:
        assert shaper.name == "netem"
    else:
        assert shaper.name == "userspace" and shaper.reason.startswith("auto: the userspace relay")
        with pytest.raises(ShapingError, match=caps.missing()[0].split()[0]):
            choose_shaper("netem", LINKS, 2, "abcdef00", probe_fn=lambda: caps)


# ------------------------------------------------------------------------------------------------
# where the netem suite runs when the kernel lacks netem: user-mode-linux (netem.uml)

def test_uml_init_script_quotes_everything(tmp_path):
    import shlex

    from netem.uml import render_init_script

    env = {"PLAIN": "x", "TRICKY": "a 'b' \"c\" $d `e` \\f\nnewline; rm -rf /"}
    script = render_init_script(["python", "-c", "print('hi $USER')"], "/work/dir with space", env,
                                [tmp_path / "sch_netem.ko"], tmp_path / "status")
    exports = {}
    for line in shlex.split(script, comments=True, posix=True):
        if "=" in line and line.split("=", 1)[0] in env:
            key, value = line.split("=", 1)
            exports[key] = value
    assert exports == env
    assert "exec python -c 'print('\"'\"'hi $USER'\"'\"')'" in script
    assert f"insmod {tmp_path / 'sch_netem.ko'}" in script and "cd '/work/dir with space'" in script
    assert script.rstrip().endswith("poweroff -f")


def test_uml_module_order_puts_dependencies_first(tmp_path):
    from netem.uml import module_load_order

    (tmp_path / "modules.dep").write_text(
        "kernel/net/sched/sch_netem.ko:\n"
        "kernel/drivers/net/veth.ko: kernel/net/core/fake_dep.ko\n"
        "kernel/net/core/fake_dep.ko:\n"
        "kernel/net/sched/sch_cake.ko:\n")
    order = [p.name for p in module_load_order(tmp_path, ("veth", "sch_netem", "not_there"))]
    assert order == ["fake_dep.ko", "veth.ko", "sch_netem.ko"]


def test_uml_guest_environment_drops_host_only_variables():
    from netem.uml import guest_environment

    env = guest_environment({"LD_PRELOAD": "/x.so", "VIRTUAL_ENV": "/v", "BAD-NAME": "1", "PATH": "/bin"})
    assert env == {"VIRTUAL_ENV": "/v", "PATH": "/bin"}
    assert "PATH" in guest_environment({})


def test_uml_prerequisites_name_the_missing_guest_tool_and_its_package(tmp_path):
    from netem.uml import missing_guest_tools

    def fake_tool(name):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)

    fake_tool("ip")
    assert missing_guest_tools(str(tmp_path)) == {"insmod": "kmod", "mount": "mount"}
    fake_tool("insmod")
    fake_tool("mount")
    assert missing_guest_tools(str(tmp_path)) == {}


def skip_unless_uml_can_boot() -> None:
    from netem.uml import uml_available

    ok, reason = uml_available()
    if not ok:
        pytest.skip(reason)
    with open("/proc/cpuinfo") as f:
        if "User Mode Linux" in f.read():
            pytest.skip("already inside user-mode-linux")


def proc_stats() -> list[tuple[int, int, int, str]]:
    """(pid, ppid, session, state) of every process, from /proc (no procps needed)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out.append((int(entry), int(fields[1]), int(fields[3]), fields[0]))
    return out


@pytest.mark.fidelity
def test_uml_runs_a_command_and_returns_its_status(tmp_path):
    from netem.uml import run

    skip_unless_uml_can_boot()
    marker = tmp_path / "seen"
    status = run(["sh", "-c", f"grep -q sch_netem /proc/modules && touch {marker}; exit 3"], timeout_s=120)
    assert status == 3 and marker.exists()


@pytest.mark.fidelity
def test_uml_stopped_by_sigterm_takes_its_guest_with_it(tmp_path):
    """`timeout`, a supervisor or a plain kill sends SIGTERM: python -m netem.uml then kills UML's process group
    (UML runs in a session of its own), so no guest is left running."""
    import signal
    import subprocess
    import sys
    import time

    skip_unless_uml_can_boot()
    started = tmp_path / "started"
    proc = subprocess.Popen([sys.executable, "-m", "netem.uml", "--timeout", "120", "--", "sh", "-c",
                             f"touch {started}; sleep 100"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert started.exists(), "the guest never ran its command"
    # UML leads a session of its own (its pid): its guest's processes are in it
    uml = next(pid for pid, ppid, _, _ in proc_stats() if ppid == proc.pid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    alive = [(pid, state) for pid, _, session, state in proc_stats() if session == uml and state != "Z"]
    assert not alive, f"UML's session {uml} outlived netem.uml: {alive}"


def test_a_backend_is_one_line_in_backends_and_every_chooser_sees_it(monkeypatch):
    from netem import select
    from netem.virtual import VirtualShaper
    from testbed import cli
    from testbed.studies.faults.measure import shapers_of

    def build(links, n_stages, run_id, reason, options):
        shaper = VirtualShaper(links, n_stages, run_id, options)
        shaper.reason = reason
        return shaper

    monkeypatch.setitem(select.BACKENDS, "recording", select.Backend("recording", build, "recording: requested"))
    probed = []
    shaper = choose_shaper("recording", LINKS, 2, "abcdef00", probe_fn=lambda: probed.append(1) or ALL)
    assert isinstance(shaper, VirtualShaper) and shaper.reason == "recording: requested" and not probed
    assert "recording" in select.kinds() and "recording" not in KINDS  # KINDS: the built-in ones
    args = cli.build_parser().parse_args(["run", "geo-ring", "--shaper", "recording"])
    assert args.shaper == "recording"
    assert shapers_of(type("Args", (), {"shapers": "userspace,recording", "shaper": "auto"})()) == \
        ["userspace", "recording"]
    monkeypatch.delitem(select.BACKENDS, "recording")
    with pytest.raises(ShapingError, match="unknown shaper 'recording'"):
        choose_shaper("recording", LINKS, 2, "abcdef00", probe_fn=lambda: ALL)

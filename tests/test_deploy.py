"""What will my deployment do (issue 28): the emulated geometry on the wire, compute from hardware, and whatif."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import tomllib
import sys
from pathlib import Path

import numpy as np
import pytest
import trio

from agents.process import wire
from agents.process.reader import FrameReader
from testbed.scenario.config import load_scenario, scenario_from_dict
from testbed.core.decode import WireConfig
from testbed.core.errors import ConfigError, WireError
from testbed.core.roofline import Roofline
from testbed.deploy.catalog import hardware_preset, model_preset
from testbed.launch.launcher import run_scenario

pytestmark = pytest.mark.exact

SEED_700B = WireConfig(width=16384, value_bytes=2)  # the seed paper's 700B-class hidden state in bf16: 32 KiB a token
ROOT = Path(__file__).resolve().parent.parent


def hidden(n_tok: int = 1, width: int = 128) -> wire.Frame:
    x = np.arange(n_tok * width, dtype=np.float32).reshape(1, n_tok, width) / 100
    return wire.Frame(wire.Kind.HIDDEN, lap=3, pos=7, tensor=x)


# --- the wire ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec, payload", [("f32", 32768), ("f16", 32768), ("int8-block", 16384 + 4 * 256)])
def test_a_hidden_frame_carries_the_geometry_s_bytes_under_each_codec(codec, payload):
    config = WireConfig(codec=codec, width=16384, value_bytes=2)
    data = wire.encode(hidden(), config)
    assert len(data) == wire.HEADER.size + payload
    assert wire.payload_bytes(hidden().tensor, config, wire.Kind.HIDDEN) == payload
    back = wire.decode(data, config)
    assert back.tensor.shape == (1, 1, 128)
    tolerance = {"f32": 0, "f16": 1e-2, "int8-block": 2e-2}[codec]
    np.testing.assert_allclose(back.tensor, hidden().tensor, atol=tolerance * 2)


def test_a_block_of_positions_scales_its_padding_and_other_kinds_carry_none():
    assert len(wire.encode(hidden(5), SEED_700B)) == wire.HEADER.size + 5 * 32768
    ids = wire.Frame(wire.Kind.TOKEN, tensor=np.array([7], np.int32))
    assert len(wire.encode(ids, SEED_700B)) == len(wire.encode(ids))
    kv = wire.Frame(wire.Kind.KV, tensor=np.zeros((2, 1, 1, 128), np.float32))
    assert wire.payload_bytes(kv.tensor, SEED_700B, wire.Kind.KV) == 2 * 128 * 4


def test_the_receiver_refuses_padding_its_geometry_does_not_imply():
    data = bytearray(wire.encode(hidden(), SEED_700B))
    with pytest.raises(WireError, match="padding of 32256 bytes.*carries 0"):
        wire.decode(bytes(data))  # a receiver without the geometry: no frame may be larger than its tensor
    with pytest.raises(WireError, match="carries 15872"):
        wire.decode(bytes(data), WireConfig(width=8192, value_bytes=2))  # a smaller geometry: bounded by it
    data[-1] = 1
    with pytest.raises(WireError, match="not all zero"):
        wire.decode(bytes(data), SEED_700B)


async def test_a_frame_reader_drops_the_padding():
    send, receive = trio.testing.memory_stream_pair()
    reader = FrameReader(receive, now=lambda: 0.0, codec=SEED_700B)
    await send.send_all(wire.encode(hidden(2), SEED_700B) * 2)
    for _ in range(2):
        frame, _at = await reader.read()
        np.testing.assert_array_equal(frame.tensor, hidden(2).tensor)


# --- the roofline -----------------------------------------------------------------------------------------------


def test_the_roofline_is_memory_bound_until_its_ridge_then_compute_bound():
    r = Roofline(weight_bytes=2e9, flops_per_token=2e9, kv_bytes_per_position=1e5, memory_bw_bytes_s=1e12,
                 flop_s=1e14)
    assert r.ridge_tokens == pytest.approx(100)
    assert r.seconds(1) == pytest.approx(2e-3)
    assert r.seconds(50) == pytest.approx(2e-3)  # below the ridge: the weights' read
    assert r.seconds(400) == pytest.approx(400 * 2e9 / 1e14)  # above: the FLOPs
    assert r.seconds(1, 4, 1000) == pytest.approx(2e-3 + 4 * 1000 * 1e5 / 1e12)  # each stream reads its KV
    assert r.scaled(3).seconds(1) == pytest.approx(3 * r.seconds(1))
    moe = Roofline(1e9, 2e9, 0, 1e12, 1e15, total_weight_bytes=8e9)  # a token reads its experts only
    assert moe.seconds(1) == pytest.approx(1e-3) and moe.seconds(1, 4) == pytest.approx(4e-3)
    assert moe.seconds(1, 100) == pytest.approx(8e-3)  # every expert read once


# --- scenarios --------------------------------------------------------------------------------------------------


def ring(geometry: dict | None = None, stages: list[dict] | None = None, **top) -> dict:
    stages = stages or [{"name": n} for n in ("a", "b", "c")]
    hops = [10.0 * (i + 1) for i in range(len(stages))] if len(stages) > 1 else []
    raw = {"stages": stages, "network": {"hops_ms": hops}, "decode": {"tokens": 6, "temperature": 0.0}, **top}
    if geometry is not None:
        raw["geometry"] = geometry
    return raw


def test_a_geometry_preset_sets_the_wire_and_explicit_keys_override_it():
    sc = scenario_from_dict(ring({"preset": "seed-700b"}))
    assert (sc.wire.width, sc.wire.value_bytes) == (16384, 2)
    sc = scenario_from_dict(ring({"preset": "llama-3.1-70b", "dtype": "fp8"}))
    assert (sc.wire.width, sc.wire.value_bytes, sc.geometry.layers) == (8192, 1, 80)


def test_compute_from_hardware_follows_the_stage_s_share_of_the_model():
    hw = [{"name": n, "hardware": "h100-sxm", "devices": 8} for n in ("a", "b", "c")]
    sc = scenario_from_dict(ring({"preset": "llama-3.1-70b"}, hw))
    preset, h100 = model_preset("llama-3.1-70b"), hardware_preset("h100-sxm")
    head = preset.vocab * preset.d_model
    layer_params = (preset.params - 2 * head) / preset.layers
    bandwidth = h100.memory_bw_gbs * 1e9 * h100.mem_efficiency * 8
    for i, layers in enumerate((27, 27, 26)):  # 80 layers over three stages; the entry also reads the LM head
        weights = (layers * layer_params + (head if i == 0 else 0)) * 2
        assert sc.stages[i].cost_ms() == pytest.approx(weights / bandwidth * 1e3, rel=1e-12)
    assert sc.emulated_compute_s == pytest.approx(sum(st.cost_ms() for st in sc.stages) / 1e3)
    assert sc.stages[1].cost_ms(1, 1, 1000) > sc.stages[1].cost_ms()  # the context's KV is read too
    fixed = scenario_from_dict(ring({"preset": "llama-3.1-70b"}, [dict(hw[0], compute_ms=5.0)] + hw[1:]))
    assert fixed.stages[0].cost_ms() == 5.0  # compute_ms still overrides
    dilated = sc.dilated(4.0)
    assert dilated.stages[2].cost_ms() == pytest.approx(4 * sc.stages[2].cost_ms())


def test_a_preset_s_prefill_costs_compute_per_position_on_the_default_hardware():
    """Issue 55: a [geometry] stage without hardware prefilled for free past its first position. It now costs its
    share's FLOPs a position on the fewest PREFILL_HARDWARE that hold the share; prefill_ms_per_token, when set,
    overrides (0: off); a stage whose compute_ms is pinned on named hardware prefills on that hardware."""
    from testbed.deploy.rules import PREFILL_HARDWARE

    sc = scenario_from_dict(ring({"preset": "seed-700b"}, [{"name": n, "compute_ms": 11.0} for n in "abc"]))
    preset, h100 = model_preset("seed-700b"), hardware_preset(PREFILL_HARDWARE)
    head = preset.vocab * preset.d_model
    layer_params = (preset.params - 2 * head) / preset.layers
    flop_s = h100.peak_flops("bf16") * h100.flop_efficiency
    for i, (layers, fits) in enumerate(((34, 7), (33, 6), (33, 6))):  # the entry also holds the head and embedding
        share = layers * layer_params + (head if i == 0 else 0)
        devices = math.ceil((share + (head if i == 0 else 0)) * 2 / h100.memory_bytes)
        assert devices == fits
        assert sc.stages[i].prefill_ms_per_token == pytest.approx(2 * share / (devices * flop_s) * 1e3, rel=1e-12)
    prefill_2000 = sum(st.cost_ms(2000) - st.cost_ms() for st in sc.stages) / 1e3
    assert 0.5 < prefill_2000 < 2.0  # seed 000: a 2,000-token prefill of a big model takes 1-2 s
    assert sc.stages[0].cost_ms() == 11.0  # the decode's C is what the scenario says
    off = scenario_from_dict(ring({"preset": "seed-700b"}, [{"name": n, "compute_ms": 11.0,
                                                             "prefill_ms_per_token": 0} for n in "abc"]))
    assert [st.prefill_ms_per_token for st in off.stages] == [0.0] * 3
    scaled = scenario_from_dict(ring({"preset": "seed-700b"}, [{"name": n, "compute_ms": 11.0} for n in "abc"],
                                     scale=2.0))
    assert scaled.stages[1].prefill_ms_per_token == pytest.approx(2 * sc.stages[1].prefill_ms_per_token)
    pinned = scenario_from_dict(ring({"preset": "llama-3.1-70b"}, [{"name": "a", "hardware": "h100-sxm", "devices": 8,
                                                                    "compute_ms": 5.0}]))
    roofline = scenario_from_dict(ring({"preset": "llama-3.1-70b"}, [{"name": "a", "hardware": "h100-sxm",
                                                                      "devices": 8}])).stages[0].roofline
    assert pinned.stages[0].prefill_ms_per_token == pytest.approx(roofline.flops_per_token / roofline.flop_s * 1e3)
    assert scenario_from_dict(ring()).stages[0].prefill_ms_per_token == 0.0  # no geometry: as the scenario says


def test_a_scenario_s_own_hardware_table_is_a_preset_too():
    own = {"fpga": {"source": "ours", "memory_gb": 512, "memory_bw_gbs": 1000, "tflops_bf16": 100, "tflops_fp8": 0,
                    "mem_efficiency": 1.0, "flop_efficiency": 1.0, "efficiency_source": "a stated guess"}}
    sc = scenario_from_dict(ring({"preset": "llama-3.1-8b"}, [{"name": "a", "hardware": "fpga"}], hardware=own))
    preset = model_preset("llama-3.1-8b")
    read = preset.active_params - preset.vocab * preset.d_model  # every weight but the embedding (a row lookup)
    assert sc.stages[0].cost_ms() == pytest.approx(read * 2 / 1e12 * 1e3, rel=1e-9)


@pytest.mark.parametrize("raw, key, words", [
    (ring({"preset": "llama-9"}), "geometry.preset", "known: "),
    (ring({"d_model": 1000, "layers": 8, "heads": 12, "params_b": 1.0}), "geometry.d_model", "not a multiple of heads"),
    (ring({"d_model": 1024, "layers": 8}), "geometry.heads", "without a preset needs"),
    (ring({"preset": "llama-3.1-8b", "layers": 2}), "stages", "3 stages compute but the geometry has 2 layers"),
    (ring({"preset": "llama-3.1-8b"}, [{"name": "a", "hardware": "h100-sxm", "devices": 0}]), "stages[0].devices",
     "expected an integer in \\[1, "),
    (ring(None, [{"name": "a", "hardware": "h100-sxm"}]), "stages[0].hardware", "needs a \\[geometry\\]"),
    (ring({"preset": "llama-3.1-8b"}, [{"name": "a", "hardware": "tpu-v9"}]), "stages[0].hardware", "known: "),
    (ring({"preset": "llama-3.1-405b"}, [{"name": "a", "hardware": "rtx-4090"}]), "stages[0].devices", "add devices"),
    (ring({"preset": "llama-3.1-8b"}, hardware={"x": {"source": "s"}}), "hardware.x", "missing"),
    (dict(ring(), decode={"prompt_tokens": 2048}), "decode.prompt_tokens", "a longer prompt is emulated"),
    (dict(ring({"preset": "llama-3.1-8b"}), decode={"prompt_tokens": 200_000}), "decode.prompt_tokens", "131072"),
    (dict(ring({"preset": "llama-3.1-8b"}), decode={"prompt_tokens": 2048, "prefill_chunk": 64}),
     "decode.prefill_chunk", "one block"),
])
def test_bad_geometry_and_hardware_name_the_key(raw, key, words):
    with pytest.raises(ConfigError, match=words) as info:
        scenario_from_dict(raw, "s.toml")
    assert info.value.key.startswith(key), info.value


# --- on a ring, exactly (virtual time) ----------------------------------------------------------------------------


@pytest.mark.parametrize("rate_mbit, prompt", [(2240.0, 2048), (10.0, 512), (10.0, 0)])
async def test_the_seed_paper_s_700b_geometry_on_the_geo_ring(rate_mbit, prompt):
    """Section 3's claim at its own size: a decode lap carries 32 KiB + framing on every hop, a 2,048-token prompt
    64 MiB (the model computes its last 128 positions, the wire and the prefill cost carry all of them); the wall and
    TTFT (C_prefill + T_ring + the prompt's 32 KiB a position at the hop's rate) hold exactly, at 280 MB/s and where
    the byte term dominates (10 Mbit/s)."""
    sc = load_scenario("geo-ring", ["geometry.preset=\"seed-700b\"", f"network.rate_mbit={rate_mbit}",
                                    "decode.tokens=6", f"decode.prompt_tokens={prompt}",
                                    "stages.*.prefill_ms_per_token=0.01"])
    summary = await run_scenario(sc, "virtual", log=lambda m: None)
    for i, hop in enumerate(summary.per_hop):
        assert hop.bytes_per_lap == 32768 + wire.HEADER.size + (i + 1) * wire.STAMP.size
    assert summary.measured_tok_s == pytest.approx(summary.predicted_tok_s, rel=1e-6)
    rate = rate_mbit * 1e6 / 8
    assert prompt == 0 or summary.ttft.prompt_tokens == prompt
    prompt = summary.ttft.prompt_tokens
    assert summary.ttft.prefill_compute_s == pytest.approx(3 * (11 + 0.01 * (prompt - 1)) / 1e3, rel=1e-9)
    xmit = sum((prompt * 32768 + wire.HEADER.size + (i + 1) * wire.STAMP.size) / rate for i in range(3))
    independent = summary.ttft.prefill_compute_s + sc.t_ring_s + xmit
    assert summary.ttft.measured_s == pytest.approx(independent, rel=1e-6)
    lap = summary.compute_s + sc.t_ring_s + sum((32768 + wire.HEADER.size + (i + 1) * wire.STAMP.size) / rate
                                                for i in range(3))
    assert summary.measured_tok_s == pytest.approx(1 / lap, rel=1e-6)


async def test_the_warm_up_frame_opens_every_hop_before_the_first_lap_and_is_not_recorded(monkeypatch):
    """On a backend whose links are the kernel's TCP (Shaper.warm_windows: netem) the entry sends one prompt-sized
    PROBE around before the first lap (tests/test_netem_geometry.py shows what it buys there). Run here on the
    virtual backend with the flag set: the frame goes around, every hop, and the laps and TTFT stay exact."""
    from agents.process.ring import RingClient
    from netem.virtual import VirtualShaper

    warmed = []
    original = RingClient.warm

    async def recording(self, nbytes):
        await original(self, nbytes)
        warmed.append(nbytes)  # only once it came back around the ring

    monkeypatch.setattr(VirtualShaper, "warm_windows", True)
    monkeypatch.setattr(RingClient, "warm", recording)
    sc = load_scenario("geo-ring", ["geometry.preset=\"seed-700b\"", "network.rate_mbit=2240", "decode.tokens=4",
                                    "decode.prompt_tokens=512"])
    summary = await run_scenario(sc, "virtual", log=lambda m: None)
    assert warmed == [512 * 32768]  # the prompt's hidden state, once, from the entry
    assert summary.ttft.measured_s == pytest.approx(summary.ttft.predicted_s, rel=1e-6)
    assert summary.measured_tok_s == pytest.approx(summary.predicted_tok_s, rel=1e-6)
    monkeypatch.setattr(VirtualShaper, "warm_windows", False)
    assert (await run_scenario(sc, "virtual", log=lambda m: None)).laps == summary.laps and len(warmed) == 1


def test_a_frame_is_warmed_when_it_and_its_header_outgrow_the_first_window():
    """A fresh connection sends at most 65,535 bytes before the first ACK: the codecs study's 128-token f32 prompt
    (65,536 bytes of payload) is warmed; a frame with room for its header and stamps is not."""
    from agents.process import wire
    from agents.process.ring import fits_first_window

    assert not fits_first_window(128 * 128 * 4, 3)
    room = 65_535 - wire.HEADER.size - 3 * wire.STAMP.size
    assert fits_first_window(room, 3) and not fits_first_window(room + 1, 3) and not fits_first_window(room, 4)


def whatif(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", "whatif", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_whatif_measured_on_virtual_time_equals_its_closed_form(tmp_path):
    out = tmp_path / "whatif.json"
    done = whatif("--model", "llama-3.1-70b", "--hardware", "h100-sxm,8", "--regions", "hong-kong,ireland,virginia",
                  "--draft", "llama-3.1-8b", "--rate-mbit", "1000", "--measure", "--shaper", "virtual", "--json",
                  str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["measured_tok_s"] == pytest.approx(result["predicted_tok_s"], rel=1e-6)
    assert result["ttft_measured_s"] == pytest.approx(result["ttft_predicted_s"], rel=1e-6)
    assert result["hop_bytes_measured"][0] == result["decode_frame_bytes"] == 16384 + wire.HEADER.size + wire.STAMP.size
    assert 1 <= result["spec_k"] and result["spec_predicted_tok_s"] > result["predicted_tok_s"]
    assert all(ms >= floor for ms, floor in zip(result["hops_ms"], result["fiber_floor_ms"]))
    assert math.isclose(sum(s["share"] for s in result["breakdown"]), 1.0)
    assert "upgrade first" in done.stdout


def test_whatif_links_default_to_one_flow_s_rate_between_regions(tmp_path):
    """A ring's hop is one TCP flow: by default whatif gives every link what the region catalogue says one flow
    between two regions gets (5 Gbps on AWS, sourced); --rate-mbit 0 is unlimited. The 2,048-token prompt's 32 MiB
    hidden state then takes its serialization on each of the three hops."""
    from agents.process import wire
    from testbed.deploy.catalog import regions

    runs = {}
    for rate in (None, "0"):
        out = tmp_path / f"whatif-{rate}.json"
        done = whatif("--model", "llama-3.1-70b", "--hardware", "h100-sxm,8", "--regions",
                      "hong-kong,ireland,virginia", *(["--rate-mbit", rate] if rate else []), "--json", str(out))
        assert done.returncode == 0, done.stderr
        runs[rate] = json.loads(out.read_text())
    assert runs[None]["rate_mbit"] == regions().flow_rate_mbit == 5000.0 and "Gbps" in regions().flow_rate_source
    assert runs["0"]["rate_mbit"] == 0.0
    prompt_bytes = 2048 * 8192 * 2  # P x d_model x bf16
    # each hop's frame: its header and one stamp per stage it has passed (agents.process.wire), then the hidden state
    framed = sum(wire.HEADER.size + stamps * wire.STAMP.size + prompt_bytes for stamps in (1, 2, 3))
    serialization = framed / (5000e6 / 8)
    assert runs[None]["ttft_predicted_s"] - runs["0"]["ttft_predicted_s"] == pytest.approx(serialization, rel=1e-6)


def test_whatif_shows_a_preset_s_prefill_compute_and_where_it_comes_from(tmp_path):
    """Without --hardware a deployment runs on the default hardware (the fewest per stage that hold a share): its
    TTFT shows the prefill compute the rooflines give, and says on what."""
    out = tmp_path / "whatif.json"
    done = whatif("--model", "seed-700b", "--regions", "frankfurt,ireland,london", "--prompt", "1024",
                  "--json", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert (result["hardware"], result["devices"]) == ("h100-sxm", 7)
    assert 0.3 < result["prefill_compute_s"] < result["ttft_predicted_s"]
    said = " ".join(done.stdout.split())
    assert "of which prefill compute s" in said and "7 x h100-sxm a stage (the default hardware" in said


@pytest.mark.parametrize("args, words", [
    (["--model", "llama-9", "--hardware", "h100-sxm", "--regions", "ireland"], "--model: unknown model preset"),
    (["--model", "llama-3.1-8b", "--hardware", "h100-sxm,0", "--regions", "ireland"], "--hardware: expected"),
    (["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--regions", "ireland,atlantis"], "--regions: unknown"),
])
def test_whatif_bad_input_exits_2_naming_the_option(args, words):
    done = whatif(*args)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2 and words in said, said


# --- published deployments -----------------------------------------------------------------------------------------


def test_every_published_row_is_reproduced_or_said_why_not():
    from testbed.studies.reproduce.rows import NOT_EXPRESSED, ROWS

    published = ROOT.parent / "shared" / "PUBLISHED.md"
    numbers = {int(line.split("|")[1]) for line in published.read_text().splitlines()
               if line.startswith("| ") and line.split("|")[1].strip().isdigit()} if published.exists() else set()
    said = {row.number for row in ROWS} | {number for number, _, _ in NOT_EXPRESSED}
    assert numbers <= said and said <= set(range(1, 16))
    assert all(row.source for row in ROWS)


def test_reproduce_measures_each_row_as_its_closed_form(tmp_path):
    out = tmp_path / "reproduce.json"
    done = subprocess.run([sys.executable, "-m", "testbed", "reproduce", "--measure", "--shaper", "virtual", "--json",
                           str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["number"]: r for r in json.loads(out.read_text())["reproduced_rows"]}
    for row in rows.values():
        assert row["measured_tok_s"] == pytest.approx(row["predicted_tok_s"], rel=1e-6)
    assert rows[1]["predicted_tok_s"] == pytest.approx(25.4, rel=1e-9)  # it gives the compute the others use
    frame = 2048 * 4 + wire.HEADER.size  # TinyLlama's hidden state in f32, on 1 Gbit/s, both hops
    ser = sum((frame + (i + 1) * wire.STAMP.size) / 125e6 for i in range(2))
    assert rows[7]["predicted_tok_s"] == pytest.approx(1 / (1 / 63 + 2 * 0.1e-3 + ser), rel=1e-9)
    assert rows[7]["why_apart"] and "row 8 (distributed-llama" in done.stdout


def test_a_long_prompt_on_a_slow_link_gets_the_time_its_lap_needs():
    slow = load_scenario("geo-ring", ["geometry.preset=\"seed-700b\"", "network.rate_mbit=10",
                                      "decode.prompt_tokens=2048"])
    crossing = (2048 * 32768) / (10e6 / 8)  # 53.7 s a hop
    assert slow.lap_timeout_s == pytest.approx(3 * (3 * crossing + 0.28))
    assert load_scenario("geo-ring").lap_timeout_s == 120.0  # the default where nothing is that slow
    assert load_scenario("geo-ring", ["network.lap_timeout_s=5", "geometry.preset=\"seed-700b\"",
                                      "network.rate_mbit=10", "decode.prompt_tokens=2048"]).lap_timeout_s == 5.0


# --- a measured profile in place of the roofline ---------------------------------------------------------------------

PROFILE = """source = "a test's own numbers"
tokens = [1, 101]
batch = [1, 5]
ms = [[20.0, 24.0],
      [70.0, 90.0]]
"""


def test_a_measured_profile_interpolates_between_and_beyond_its_points():
    from testbed.core.roofline import MeasuredProfile
    from testbed.deploy.profile import parse_profile

    profile = parse_profile(tomllib.loads(PROFILE), "p.toml")
    assert profile.seconds(1, 1) == pytest.approx(0.020) and profile.seconds(101, 5) == pytest.approx(0.090)
    assert profile.seconds(51, 1) == pytest.approx(0.045)  # halfway along T at b = 1
    assert profile.seconds(51, 3) == pytest.approx((0.022 + 0.080) / 2)  # bilinear: the cell's centre
    assert profile.seconds(201, 1) == pytest.approx(0.120)  # the last segment extended
    assert profile.scaled(2.0).seconds(51, 3) == pytest.approx(2 * profile.seconds(51, 3))
    flat = MeasuredProfile("one point", (1.0,), (1.0,), ((12.0,),))
    assert flat.seconds(1000, 64) == pytest.approx(0.012)
    assert Roofline(profile=profile).seconds(51, 3, context=10_000) == profile.seconds(51, 3)  # no KV term added


async def test_stages_with_a_measured_profile_run_exactly_on_it(tmp_path):
    from agents.process.spec import AgentSpec

    (tmp_path / "stage.toml").write_text(PROFILE)
    scenario_file = tmp_path / "ring.toml"
    sc = scenario_from_dict({"stages": [{"name": "a", "profile": "stage.toml"}, {"name": "b", "profile": "stage.toml"},
                                        {"name": "c", "compute_ms": 5.0, "profile": "stage.toml"}],
                             "network": {"hops_ms": [10.0, 20.0, 30.0]},
                             "decode": {"tokens": 6, "temperature": 0.0}}, str(scenario_file))
    assert sc.stages[2].roofline is None  # compute_ms still overrides
    assert sc.stages[0].cost_ms(1, 1) == pytest.approx(20.0) and sc.stages[0].cost_ms(51, 3) == pytest.approx(51.0)
    spec = AgentSpec(0, 3, "a", 0, 2, 0.0, sc.decode, "x:y", roofline=sc.stages[0].roofline)
    assert AgentSpec.from_json(spec.to_json()) == spec  # it travels to the agents as JSON
    summary = await run_scenario(sc, "virtual", log=lambda m: None)
    assert summary.measured_tok_s == pytest.approx(1 / ((20 + 20 + 5) / 1e3 + 0.060), rel=1e-6)
    assert summary.measured_tok_s == pytest.approx(summary.predicted_tok_s, rel=1e-6)
    prompt = summary.ttft.prompt_tokens
    assert summary.ttft.prefill_compute_s == pytest.approx(2 * (20 + 50 * (prompt - 1) / 100) / 1e3 + 0.005, rel=1e-9)
    doubled = scenario_from_dict({"scale": 2.0, "stages": [{"profile": str(tmp_path / "stage.toml")}]}, "<test>")
    assert doubled.stages[0].cost_ms(1, 1) == pytest.approx(40.0)  # scale slows the profile as it does compute_ms


@pytest.mark.parametrize("text, key, words", [
    (None, "stages[0].profile", "cannot read the profile"),
    ('source = "x"\ntokens = [1]\nbatch = [1]\n', "ms", "missing key"),
    ('source = "x"\ntokens = [8, 1]\nbatch = [1]\nms = [[1.0], [2.0]]\n', "tokens", "strictly ascending"),
    ('source = "x"\ntokens = [1, 8]\nbatch = [1]\nms = [[1.0]]\n', "ms", "expected 2 rows"),
    ('source = "x"\ntokens = [1]\nbatch = [1]\nms = [[-1.0]]\n', "ms[0][0]", "expected a number in [0, 3.6e+06]"),
    ('source = ""\ntokens = [1]\nbatch = [1]\nms = [[1.0]]\n', "source", "non-empty"),
])
def test_a_bad_profile_names_its_file_and_key(tmp_path, text, key, words):
    if text is not None:
        (tmp_path / "p.toml").write_text(text)
    with pytest.raises(ConfigError) as info:
        scenario_from_dict({"stages": [{"profile": str(tmp_path / "p.toml")}]}, "<test>")
    assert info.value.key == key and words in str(info.value)


# --- KV shipping and TP's all-reduces at the geometry's size ------------------------------------------------------


async def test_shipped_kv_carries_the_geometry_s_k_and_v_of_each_stage_s_layers():
    """placement.kv = "ship" with llama-3.1-70b's geometry: each stage's KV frame is K and V of its share of the 80
    layers (27, 27, 26: 2 x 8 KV heads x 128 x bf16 = 4 KiB a layer a position), ahead of the 16 KiB hidden state."""
    sc = load_scenario("geo-ring", ['placement.kv="ship"', 'geometry.preset="llama-3.1-70b"', "decode.tokens=6",
                                    "network.rate_mbit=1000"])
    assert sc.wire.stage_layers == (27, 27, 26) and sc.wire.kv_layer_bytes == 2 * 8 * 128 * 2
    summary = await run_scenario(sc, "virtual", log=lambda m: None)
    for i, hop in enumerate(summary.per_hop):
        hidden = 8192 * 2 + wire.HEADER.size + (i + 1) * wire.STAMP.size
        assert hop.bytes_per_lap == hidden + wire.HEADER.size + sc.wire.stage_layers[i] * 4096
    assert summary.measured_tok_s == pytest.approx(summary.predicted_tok_s, rel=1e-6)
    assert summary.ttft.measured_s == pytest.approx(summary.ttft.predicted_s, rel=1e-6)


async def test_tp_all_reduce_messages_carry_the_geometry_s_share_of_the_hidden_state():
    """parallel = "tp" with a geometry: a ring all-reduce message is a 1/N chunk of the partial sum, so it carries
    that chunk of the geometry's 8,192-wide bf16 hidden state; the per-token prediction holds exactly."""
    base = ['parallel="tp"', "decode.tokens=5", "network.rate_mbit=1000"]
    own = await run_scenario(load_scenario("geo-ring", base), "virtual", log=lambda m: None)
    sc = load_scenario("geo-ring", [*base, 'geometry.preset="llama-3.1-70b"'])
    big = await run_scenario(sc, "virtual", log=lambda m: None)
    assert big.tp.messages_per_token == own.tp.messages_per_token
    chunk = 128 // 3  # np.array_split of the 128-wide partial: 43, 43, 42 values
    frame = wire.HEADER.size + wire.STAMP.size
    assert own.tp.bytes_per_token / own.tp.messages_per_token < frame + 4 * (chunk + 1)
    assert frame + (chunk * 8192 // 128) * 2 <= big.tp.bytes_per_token / big.tp.messages_per_token \
        <= frame + ((chunk + 1) * 8192 // 128) * 2
    assert big.tp.token_ms == pytest.approx(big.tp.predicted_token_ms, rel=1e-6)


def test_a_kv_frame_s_padding_is_bounded_by_a_stage_s_share_of_the_geometry():
    geometry = WireConfig(width=8192, value_bytes=2, own_width=128, kv_layer_bytes=4096, stage_layers=(27, 27, 26))
    kv = np.zeros((2, 2, 3, 128), np.float32)  # [2, L, T, C] of the computing model
    data = wire.encode(wire.Frame(wire.Kind.KV, flags=27, tensor=kv), geometry)
    assert len(data) == wire.HEADER.size + 3 * 27 * 4096  # 3 positions on 27 layers
    assert wire.decode(data, geometry).tensor.shape == kv.shape
    with pytest.raises(WireError, match="padding"):  # a sender claiming more layers than any stage holds
        wire.decode_header(wire.encode(wire.Frame(wire.Kind.KV, flags=28, tensor=kv), dataclasses.replace(
            geometry, stage_layers=(28,))), geometry)
    with pytest.raises(WireError, match="padding"):  # padded, to a receiver without the geometry
        wire.decode_header(data, WireConfig())


def test_the_warm_up_frame_is_the_prompt_s_hidden_state_on_the_wire():
    from agents.process.agent import prompt_frame_bytes
    from agents.process.shared import shared_model
    from agents.process.spec import AgentSpec

    model = shared_model("target", (0, 0, True))
    for overrides, expected in ((["decode.prompt_tokens=240"], 240 * 128 * 4),  # the byte model's own: 120 KiB
                                (['geometry.preset="seed-700b"', "decode.prompt_tokens=2048"], 2048 * 32768)):
        sc = load_scenario("geo-ring", overrides)
        spec = AgentSpec(0, 3, "a", 0, 2, 0.0, sc.decode, "x:y", wire=sc.wire)
        assert prompt_frame_bytes(spec, model) == expected

"""`meshscale scale`: strong and weak scaling rows, the published trend, and bad device lists."""

import io
import json
import sys

import pytest

from meshscale.cli import main
from meshscale.errors import UserError
from meshscale.plan.scaling import parse_devices, scale
from meshscale.specs.cluster import PRESETS as CLUSTERS
from meshscale.specs.layout import Layout
from meshscale.specs.model import PRESETS as MODELS

KEYS = {"devices", "layout", "step_time_s", "tokens_per_s", "tokens_per_s_per_device", "mfu", "efficiency",
        "marginal_tokens_per_s_per_device", "exposed_comm_fraction", "usd_per_million_tokens", "joules_per_token"}


def test_device_lists():
    assert parse_devices("64..512") == [64, 128, 256, 512]
    assert parse_devices("8, 24,64") == [8, 24, 64]
    for bad in ("128,64", "64,64", "0..8", "512..64", "a,b", ""):
        with pytest.raises(UserError):
            parse_devices(bad)


def test_strong_scaling_of_llama2_7b_matches_fernandez_2024():
    """Fernandez et al. 2024 (arXiv:2411.13055): at a fixed global batch on H100, 128 -> 2,048 GPUs, per-GPU
    throughput falls (37% measured) and the best layout leaves pure FSDP for FSDP with model parallelism once
    the batch per device falls below FSDP's critical batch. At 128 the planner picks pure data parallelism:
    ZeRO-1 (Megatron-Core's few large gradient buckets; FSDP's per-micro-batch gathers take their SMs' share from
    the compute they hide behind) where the paper ran FSDP."""
    rows = scale(MODELS["llama2-7b"], CLUSTERS["h100-80gb"], [128, 512, 2048], global_batch_tokens=4 * 2**20)
    first, last = rows[0], rows[-1]
    start = Layout.parse(first.layout)
    assert start.zero in (1, 3) and start.tp * start.pp * start.cp == 1  # pure data parallel at 128
    winner = Layout.parse(last.layout)
    assert winner.tp * winner.pp * winner.cp > 1 and last.change  # model parallel at 2,048, with the reason
    assert last.tokens_per_s_per_device < 0.85 * first.tokens_per_s_per_device
    assert last.exposed_comm_fraction > first.exposed_comm_fraction
    assert [r.efficiency for r in rows] == sorted((r.efficiency for r in rows), reverse=True)
    assert last.usd_per_million_tokens > first.usd_per_million_tokens
    assert last.joules_per_token > first.joules_per_token


def test_weak_scaling_holds_tokens_per_device(capsys):
    main(["scale", "--model", "llama2-7b", "--cluster", "h100-80gb", "--devices", "64..256",
          "--tokens-per-device", "8192", "--json", "--mtbf-hours", "50000"])
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "weak"
    rows = out["rows"]
    assert [r["devices"] for r in rows] == [64, 128, 256]
    assert all(KEYS <= set(r) for r in rows)
    assert all(r["global_batch"] * 4096 == 8192 * r["devices"] for r in rows)
    assert all(r["efficiency"] > 0.9 for r in rows)
    assert rows[0]["marginal_tokens_per_s_per_device"] is None
    # failures grow with the device count, so goodput-adjusted throughput grows more slowly than throughput
    ettr = [r["goodput"]["ettr"] for r in rows]
    assert ettr == sorted(ettr, reverse=True) and rows[-1]["goodput"]["tokens_per_s"] < rows[-1]["tokens_per_s"]


def test_strong_scaling_table_marks_layout_changes(capsys):
    main(["scale", "--model", "llama2-7b", "--cluster", "h100-80gb", "--devices", "256,1024",
          "--global-batch-tokens", "4194304"])
    out = capsys.readouterr().out
    assert "strong scaling" in out and "the winner changes" in out


@pytest.mark.parametrize("devices", ["256,128", "128..64"])
def test_bad_device_list_is_one_line_exit_2(devices, capsys):
    with pytest.raises(SystemExit) as e:
        main(["scale", "--model", "llama2-7b", "--cluster", "h100-80gb", "--devices", devices,
              "--global-batch-tokens", "4194304"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("command, shown", [
    (["scale", "--model", "tiny", "--cluster", "h100-80gb", "--devices", "8,16", "--global-batch-tokens", "256K"],
     "planning"),
    (["budget", "--model", "tiny", "--tokens", "1B", "--deadline-days", "9", "--cluster", "h100-80gb",
      "--global-batch-tokens", "256K", "--devices", "8,16"], "planning"),
    (["plan", "--model", "tiny", "--cluster", "h100-80gb", "--devices", "16", "--global-batch", "32"],
     "searching the layouts of 16 devices")])
def test_planning_shows_progress_on_a_terminal_only(command, shown, monkeypatch, capsys):
    """scale and budget plan one layout search per device count, plan searches once: a terminal sees how far
    they are; a pipe or a log sees nothing but the result."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(command + ["--json"]) == 0
    assert shown in terminal.getvalue()
    monkeypatch.undo()
    assert main(command + ["--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out.splitlines()[-1])["schema_version"] == 1

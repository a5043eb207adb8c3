"""`meshscale predict` and `meshscale plan` from the command line: JSON, bad input, speed, no torch."""

import json
import os
import subprocess
import sys

import pytest

from meshscale.specs.layout import Layout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


from clirun import run_cli as cli  # noqa: E402


SEED = ["--model", "llama2-13b", "--cluster", "tpu-v5p", "--devices", "4096", "--global-batch-tokens", "3145728",
        "--seq", "32768"]


def test_predict_json_is_one_object():  # its speed is benchmarks/plan_speed.py's to measure
    r = cli("predict", *SEED, "--layout", "fsdp=32,cp=32,tp=4,recompute=full", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["layout"].startswith("dp=32,zero=3,tp=4,cp=32") and d["fits"]
    assert d["memory_per_device_bytes"]["total"] < 96e9


def test_predict_human_output_names_each_part():
    r = cli("predict", "--model", "llama3-8b", "--cluster", "h100-80gb", "--devices", "16", "--layout",
            "tp=8,mbs=1,recompute=selective", "--global-batch", "32")
    assert r.returncode == 0, r.stderr
    for word in ("compute", "all_reduce", "nvlink", "activations", "MFU", "bound"):
        assert word in r.stdout


def test_planning_side_never_imports_torch_and_predict_not_even_numpy():
    # predict is the command people loop over; numpy (the search's) is 70 ms of a 200 ms run
    code = ("import sys; from meshscale.cli import main\n"
            "try: main(['predict','--model','tiny','--cluster','local-cpu','--layout','dp=2',"
            "'--global-batch','4','--json'])\n"
            "except SystemExit: pass\n"
            "assert 'numpy' not in sys.modules, 'predict imported numpy'\n"
            "main(['plan','--model','tiny','--cluster','local-cpu','--devices','2','--global-batch','4','--json'])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--model", "nope"], "unknown model preset"),
    (["--cluster", "nope"], "unknown cluster preset"),
    (["--model", "llama2-13b", "--layout", "tp=16"], "tp=16 must divide heads"),
    (["--layout", "tp=8,pp=3"], "does not divide"),
    (["--layout", "tp==8"], "layout"),
    (["--global-batch", "7"], "does not split"),
    (["--global-batch-tokens", "1000"], "multiple of the sequence length"),
    (["--global-batch-tokens", "4X"], "is not a positive count"),
    (["--steps", "-1"], "is not a positive whole number"),
    (["--lora", "0"], "--lora '0': give RANK[:MODULES[:DROPOUT]]"),
    (["--lora", "16:ffn"], "lora_modules must be one of attention, qkv, mlp, all"),
    (["--lora", "16:all:1.5"], "lora_dropout must be in [0, 1)"),
    (["--model", "mixtral-8x7b", "--lora", "16:mlp"], "adapters on MoE experts are not costed"),
    (["--packed-samples", "4096"], "packed_samples must be a sample length in tokens shorter than the sequence"),
    (["--model", "gpt-oss-120b", "--packed-samples", "256"], "packed samples are costed for causal attention"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    base = {"--model": "llama2-7b", "--cluster": "h100-80gb", "--layout": "tp=8", "--global-batch": "32"}
    if "--global-batch-tokens" in args:
        del base["--global-batch"]
    base.update(dict(zip(args[::2], args[1::2])))
    flat = [x for kv in base.items() for x in kv]
    r = cli("predict", "--devices", "16", *flat)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_a_token_count_takes_a_binary_suffix():
    """--global-batch-tokens 256K is 262,144 tokens (32 sequences of 8,192), as nccl-tests reads 1M as 2^20."""
    args = ["predict", "--model", "llama3-8b", "--cluster", "h100-80gb", "--layout", "dp=8", "--json"]
    plain, suffixed = (json.loads(cli(*args, "--global-batch-tokens", n).stdout) for n in ("262144", "256K"))
    assert suffixed == plain and plain["global_batch"] == 32


def test_plan_json_and_emit_torchrun():
    args = ["--model", "llama3-8b", "--cluster", "h100-80gb", "--devices", "16", "--global-batch", "64"]
    r = cli("plan", *args, "--json", "--top", "3")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["evaluated"] > 0 and len(d["ranked"]) == 3
    assert all("layout" in p and "step_time_s" in p for p in d["ranked"])
    times = [p["step_time_s"] for p in d["ranked"]]
    assert times == sorted(times)
    r = cli("plan", *args, "--emit", "torchrun")
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert line.startswith("torchrun --nnodes 2 --nproc-per-node 8 ")
    assert f"-m meshscale train --model llama3-8b --layout {d['ranked'][0]['layout']} --global-batch 64" in line


def test_emit_runs_the_winner_or_falls_back_to_a_layout_the_trainer_runs():
    # a context-parallel winner, which the trainer runs: emitted as it is, with the steps and data to run
    args = ("--model", "llama3-70b", "--cluster", "h100-80gb", "--devices", "64", "--global-batch", "256")
    winner = json.loads(cli("plan", *args, "--json").stdout)["ranked"][0]["layout"]
    r = cli("plan", *args, "--emit", "torchrun", "--steps", "30", "--data", "corpus dir/")
    assert r.returncode == 0, r.stderr
    (command,) = r.stdout.strip().splitlines()
    layout = Layout.parse(command.split("--layout ")[1].split()[0])
    assert str(layout) == winner and layout.cp > 1 and layout.devices == 64
    assert command.endswith("--steps 30 --data 'corpus dir/'")
    d = json.loads(cli("plan", *args, "--emit", "torchrun", "--json").stdout)  # --json: one object, the line in it
    assert d["schema_version"] == 1 and d["emit"]["command"] == command.replace("30", "1000").split(" --data")[0]
    # a TPU slice runs no torchrun: one line pointing at MaxText
    r = cli("plan", "--model", "llama2-13b", "--cluster", "tpu-v5p", "--devices", "256", "--global-batch", "256",
            "--emit", "torchrun")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--emit maxtext" in r.stderr
    mixtral = ("plan", "--model", "mixtral-8x7b", "--cluster", "h100-80gb", "--devices", "64", "--global-batch", "256")
    winner = json.loads(cli(*mixtral, "--json").stdout)["ranked"][0]["layout"]
    r = cli(*mixtral, "--emit", "torchrun")
    assert r.returncode == 0, r.stderr
    [command] = r.stdout.strip().splitlines()  # the trainer runs MoE models: the true winner, no fallback
    assert f"--layout {winner} " in command
    r = cli("plan", "--model", "deepseek-v3", "--cluster", "h100-80gb", "--devices", "1024", "--global-batch",
            "1024", "--emit", "torchrun")
    assert r.returncode == 2 and "multi-head latent attention" in r.stderr


def test_plan_nothing_fits_is_one_line_exit_2():
    r = cli("plan", "--model", "llama3-405b", "--cluster", "h100-80gb", "--devices", "8", "--global-batch", "8")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing fits" in lines[0] and "GB" in lines[0]


def test_plan_human_output_explains():
    r = cli("plan", "--model", "llama2-13b", "--cluster", "tpu-v5p", "--devices", "4096",
            "--global-batch-tokens", "3145728", "--seq", "32768")
    assert r.returncode == 0, r.stderr
    assert "costed" in r.stdout and "Pure DP is rejected for memory" in r.stdout

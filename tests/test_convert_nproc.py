"""`convert --nproc N`: its own launcher (ranks that meet through a file store, a signal passed on once, a failed
rank stopping the others), the checkpoint 2 ranks write equal to one process's, and every process of the run
listening on the loopback alone."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from train_support import (ENV, assert_loopback_only, finish, is_loopback, one_thread, tcp_entry,  # noqa: F401
                           wait_for, watch_listeners)
from train_support import varied_chats as chats  # noqa: F401

from eagle_trt.convert.distributed import World
from eagle_trt.convert.launch import STORE_ENV, rank_env, run_ranks
from eagle_trt.convert.train import load_feature_cache, read_checkpoint


def test_listener_check_sees_wildcard_and_loopback():
    wildcard = "   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0  0 1147 1 0 100 0 0 10 0"
    loop4 = "   1: 0100007F:80D7 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0  0 2291 1 0 100 0 0 10 0"
    any6 = "   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 77 1"
    loop6 = "   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 78 1"
    mapped = "   0: 0000000000000000FFFF00000100007F:1F90 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 79 1"
    assert tcp_entry(wildcard) == (ipaddress.ip_address("0.0.0.0"), 2024, "0A", "1147")
    assert tcp_entry(loop4) == (ipaddress.ip_address("127.0.0.1"), 32983, "0A", "2291")
    assert [tcp_entry(x)[0] for x in (any6, loop6, mapped)] == list(map(ipaddress.ip_address, [
        "::", "::1", "::ffff:127.0.0.1"]))
    assert [is_loopback(tcp_entry(x)[0]) for x in (wildcard, loop4, any6, loop6, mapped)] == [
        False, True, False, True, True]
    with pytest.raises(AssertionError):
        assert_loopback_only({("127.0.0.1", 32983), ("0.0.0.0", 2024)})
    with pytest.raises(AssertionError):
        assert_loopback_only(set())
    assert_loopback_only({("127.0.0.1", 32983), ("::1", 8080)})



def test_convert_nproc_2_matches_one_process(tiny_model_dir, chats, tmp_path):
    # fp32 products: bf16 ones (auto's choice on an AMX CPU) round a half batch's sums otherwise than a whole one's.
    args = ["--data", str(chats), "--steps", "12", "--draft-vocab-size", "64", "--seq-len", "48", "--lr", "3e-3",
            "--precision", "float32", "--no-calibrate-kv", "--json"]
    runs = {}
    for n in (1, 2):
        with (tmp_path / f"out{n}").open("w+") as out, (tmp_path / f"err{n}").open("w+") as err:  # no pipe to fill
            proc = subprocess.Popen([sys.executable, "-m", "eagle_trt", "convert", str(tiny_model_dir), "-o",
                                     str(tmp_path / f"o{n}"), "--work-dir", str(tmp_path / f"w{n}"), "--nproc", str(n),
                                     *args], env=ENV, stdout=out, stderr=err, text=True)
            seen = watch_listeners(proc)  # the launcher and its ranks, while they run
            finish(proc, 60)
            assert proc.returncode == 0, (tmp_path / f"err{n}").read_text()[-3000:]
            runs[n] = json.loads((tmp_path / f"out{n}").read_text())
    assert_loopback_only(seen)
    one, two = runs[1], runs[2]
    assert two["training"]["config"]["world_size"] == 2 and one["training"]["config"]["world_size"] == 1
    for tree in ("chain", "dynamic"):  # the same greedy tau on the held-out prompts
        assert two["validation"][tree]["per_prompt"] == one["validation"][tree]["per_prompt"]
    h1 = read_checkpoint(tmp_path / "w1" / "checkpoint.safetensors")[1]["history"]
    h2 = read_checkpoint(tmp_path / "w2" / "checkpoint.safetensors")[1]["history"]
    assert [h["loss"] for h in h2] == pytest.approx([h["loss"] for h in h1], rel=1e-4)
    # Each rank wrote its shard of the feature cache; joined, it is the one process's cache, sequence by sequence.
    c1 = load_feature_cache(tmp_path / "w1" / "cache", one_key(tmp_path / "w1"))
    c2 = load_feature_cache(tmp_path / "w2" / "cache", one_key(tmp_path / "w1"))
    assert c2.meta["shards"] == ["shard-r000-00000.safetensors", "shard-r001-00000.safetensors"]
    assert len(c1) == len(c2) and torch.equal(c1.predicted_counts, c2.predicted_counts)
    for i in range(len(c1)):
        a, b = c1.sequence(i), c2.sequence(i)
        assert torch.equal(a["input_ids"], b["input_ids"])
        torch.testing.assert_close(b["aux"].float(), a["aux"].float(), rtol=0, atol=2e-2)


def test_sigterm_to_convert_nproc_saves_and_resume_goes_on_with_one_process(tiny_model_dir, chats, tmp_path):
    """SIGTERM to the `convert --nproc 2` launcher reaches both ranks once: exit 143, one line from rank 0, a
    checkpoint; `convert --resume` as one process continues from its global step to the end."""
    work, out = tmp_path / "w", tmp_path / "o"
    cmd = [sys.executable, "-m", "eagle_trt", "convert", str(tiny_model_dir), "-o", str(out), "--work-dir", str(work),
           "--data", str(chats), "--steps", "30", "--draft-vocab-size", "64", "--seq-len", "48",
           "--checkpoint-every", "2", "--no-calibrate-kv", "--no-validate", "--json"]
    proc = subprocess.Popen([*cmd, "--nproc", "2"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    ckpt = work / "checkpoint.safetensors"
    wait_for(ckpt, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = finish(proc, 240)
    assert proc.returncode == 143, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("Terminated: training interrupted")]
    assert len(said) == 1 and "Traceback" not in err, err[-3000:]
    stopped = read_checkpoint(ckpt)[1]["step"]
    assert 2 <= stopped < 30 and not out.exists()
    r = subprocess.run([*cmd, "--resume"], env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    training = json.loads(r.stdout)["training"]
    assert training["resumed_from"] == stopped and training["steps"] == 30
    assert training["config"]["world_size"] == 1


def one_key(work: Path) -> str:
    return json.loads((work / "cache" / "meta.json").read_text())["key"]


# A rank for the launcher's own tests: it reports its environment and session; rank 1 fails (exit 3) once rank 0
# is ready, rank 0 sleeps; on SIGTERM rank 0 notes it and exits ("exit") or goes on sleeping ("ignore").
RANK_SCRIPT = """
import json, os, signal, sys, time
d, rank, how = sys.argv[1], int(os.environ["RANK"]), sys.argv[2]
def on_term(signum, frame):
    open(f"{d}/{how}-term", "w").close()
    if how == "exit":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "EAGLE_TRT_DIST_STORE",
         "GLOO_SOCKET_IFNAME")
with open(f"{d}/{how}-{rank}.tmp", "w") as f:
    json.dump({"env": {k: os.environ.get(k) for k in names}, "session_leader": os.getsid(0) == os.getpid(),
               "pid": os.getpid()}, f)
os.replace(f"{d}/{how}-{rank}.tmp", f"{d}/{how}-{rank}.json")
if rank == 1:
    while not os.path.exists(f"{d}/{how}-0.json"):
        time.sleep(0.01)
    sys.exit(3)
time.sleep(60)
"""


def test_launcher_stops_the_others_when_one_rank_fails(tmp_path, monkeypatch):
    """A rank that fails ends the run with its code: the rank left waiting gets SIGTERM after the grace, and is killed
    after the shutdown timeout if it does not exit. Every rank has torchrun's names, its own session and a store
    file in a private dir that is gone afterwards."""
    from eagle_trt.convert import launch
    from eagle_trt.errors import InputError

    monkeypatch.setattr(launch, "FAILURE_GRACE_S", 0.5)
    monkeypatch.setenv("EAGLE_TRT_SHUTDOWN_TIMEOUT_S", "1")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    for how in ("exit", "ignore"):
        t0 = time.monotonic()
        assert run_ranks(2, [sys.executable, "-c", RANK_SCRIPT, str(tmp_path), how]) == 3
        took = time.monotonic() - t0
        assert (tmp_path / f"{how}-term").exists() and took < 30, took  # SIGTERM reached rank 0; it did not sleep on
        assert how == "exit" or took >= 1.5, took  # "ignore": killed no sooner than the grace + the shutdown timeout
        ranks = [json.loads((tmp_path / f"{how}-{r}.json").read_text()) for r in (0, 1)]
        for r, seen in enumerate(ranks):
            with pytest.raises(ProcessLookupError):
                os.kill(seen["pid"], 0)
            assert seen["session_leader"]
            store = Path(seen["env"].pop(STORE_ENV))
            assert store.is_absolute() and not store.parent.exists()
            assert seen["env"] == {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                                   "GROUP_RANK": "0", "GLOO_SOCKET_IFNAME": "lo"}
        assert ranks[0]["env"] == {**ranks[1]["env"], "RANK": "0", "LOCAL_RANK": "0"}
    for name, value in rank_env(1, 2, tmp_path / "store", {}).items():
        monkeypatch.setenv(name, value)
    assert World.from_env() == World(1, 2, 1)
    monkeypatch.setenv("EAGLE_TRT_SHUTDOWN_TIMEOUT_S", "soon")
    with pytest.raises(InputError, match="EAGLE_TRT_SHUTDOWN_TIMEOUT_S must be a number of seconds; got 'soon'"):
        run_ranks(2, [sys.executable, "-c", "pass"])


def test_nproc_refused_where_it_cannot_work(tiny_model_dir, chats, tmp_path):
    for extra, said in ((["--steps", "3", "--nproc", "0"], "--nproc must be >= 1"),
                        (["--nproc", "2"], "add --steps N or --epochs N")):
        r = subprocess.run([sys.executable, "-m", "eagle_trt", "convert", str(tiny_model_dir), "-o",
                            str(tmp_path / "o"), *extra], env=ENV, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not (tmp_path / "o").exists()
    from eagle_trt.convert import convert_model
    from eagle_trt.errors import InputError

    os.environ.update(WORLD_SIZE="2", RANK="1")
    try:
        with pytest.raises(InputError, match="only to train a head"):
            convert_model(tiny_model_dir, tmp_path / "x", steps=0, progress=False)
        with pytest.raises(InputError, match="only to train a head"):
            convert_model(tiny_model_dir, tmp_path / "x", draft_model=tiny_model_dir, progress=False)
        with pytest.raises(InputError, match="--batch-size 1 is the global batch"):
            convert_model(tiny_model_dir, tmp_path / "x", steps=3, data=[chats], batch_size=1, progress=False)
    finally:
        del os.environ["WORLD_SIZE"], os.environ["RANK"]


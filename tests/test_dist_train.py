"""Head training on torch.distributed (gloo, 2 ranks of 1 thread each): the same global batch gives one process's loss
curve and head, a SIGTERM on one rank stops every rank with a checkpoint that a single process resumes, and
`convert --nproc 2` writes the checkpoint one process writes; every process of a 2-rank run listens on the loopback
alone.

Tolerances: the loss curves of 1 and 2 ranks agree to 1e-4 relative per step and the heads to 1e-4 absolute (they
differ only in float summation order: the split batch is reweighted to the global token mean, see train_ddp.py);
greedy tau on the held-out prompts is equal.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from eagle_trt.convert.attach import attach_eagle3
from eagle_trt.convert.data import build_dataset
from eagle_trt.convert.distributed import World, rank_share, rank_span
from eagle_trt.convert.launch import STORE_ENV, rank_env, run_ranks
from eagle_trt.convert.draft_vocab import d2t_from_vocab, load_d2t, ranking, select_draft_vocab
from eagle_trt.convert.load_target import load_target
from eagle_trt.convert.train import (TrainConfig, build_feature_cache, load_feature_cache, read_checkpoint,
                                     samples_seen, train_head)
from eagle_trt.convert.train_ddp import StepShare

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "dist_train_worker.py"
WORDS = "the cat sat on a mat and then ran to the big red house where a dog slept all day".split()
# A collective that waits on a rank which never comes fails after EAGLE_TRT_DIST_TIMEOUT_S: a broken stop protocol
# fails the test instead of leaving processes behind.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "EAGLE_TRT_DIST_TIMEOUT_S": "90",
       "EAGLE_TRT_SHUTDOWN_TIMEOUT_S": "20",
       "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
STEPS = 40


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    with path.open("w") as f:
        for i in range(30):
            q = " ".join(rng.choice(WORDS) for _ in range(6))
            a = " ".join(rng.choice(WORDS) for _ in range(4 + i))  # lengths differ: ranks hold unequal tokens
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
                    + "\n")
    return path


@pytest.fixture(scope="module")
def cache(tiny_model_dir, chats, tmp_path_factory):
    _, tok, _ = load_target(tiny_model_dir)
    model, _, _ = load_target(tiny_model_dir)
    ds = build_dataset([chats], tok, seq_len=48, n_val=2, progress=False)
    return build_feature_cache(model, ds.sequences, [1, 3, 4], tmp_path_factory.mktemp("work") / "cache", key="k",
                               progress=False)


def fresh_model(tiny_model_dir, cache):
    """What tests/dist_train_worker.py trains."""
    model, _, _ = load_target(tiny_model_dir)
    model = attach_eagle3(model, 64)
    load_d2t(model, d2t_from_vocab(select_draft_vocab(ranking(cache.predicted_counts, cache.seen_counts), 64,
                                                      always=[257])))
    return model


def cfg(steps=STEPS):
    return TrainConfig(steps=steps, batch_size=4, lr=1e-3, checkpoint_every=100)


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir, cache, tmp_path_factory):
    """The reference: one process, STEPS steps."""
    model = fresh_model(tiny_model_dir, cache)
    result = train_head(model, cache, cfg(), tmp_path_factory.mktemp("ref") / "c.safetensors", progress=False)
    return result.history, {k: v.detach().clone() for k, v in model.eagle_module.state_dict().items()}


# convert --nproc's own launcher in a process of its own, running its command as 2 ranks.
LAUNCHER = "import sys; from eagle_trt.convert.launch import run_ranks; sys.exit(run_ranks(2, sys.argv[1:]))"


def two_ranks(*args) -> subprocess.Popen:
    """tests/dist_train_worker.py ARGS as 2 ranks, started as `convert --nproc 2` starts its workers."""
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, sys.executable, str(WORKER), *map(str, args)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# ---- what listens --------------------------------------------------------------------------------------
def tcp_entry(line: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int, str, str]:
    """(local address, port, state, inode) of a /proc/net/tcp or tcp6 line: the address is printed as 32-bit words
    in the host's byte order."""
    fields = line.split()
    ip_hex, port_hex = fields[1].split(":")
    packed = b"".join(struct.pack("=I", int(ip_hex[i:i + 8], 16)) for i in range(0, len(ip_hex), 8))
    return ipaddress.ip_address(packed), int(port_hex, 16), fields[3], fields[9]


def is_loopback(ip) -> bool:
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def process_tree(pid: int) -> set[int]:
    """pid and its descendants alive now."""
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue  # exited
        for t in tasks:
            try:
                todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except OSError:
                pass
    return out


def listeners(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in state LISTEN (0A) that one of `pids` holds open."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            ip, port, state, inode = tcp_entry(line)
            if state == "0A" and inode in inodes:
                out.add((str(ip), port))
    return out


def watch_listeners(proc: subprocess.Popen, timeout: float = 300) -> set[tuple[str, int]]:
    """Every listener the process and its children held while it ran (sampled every 50 ms until it exits)."""
    seen, deadline = set(), time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= listeners(process_tree(proc.pid))
        time.sleep(0.05)
    return seen


def assert_loopback_only(seen: set[tuple[str, int]]) -> None:
    assert seen, "no listener seen: gloo's own listener on the loopback should have been"
    assert all(is_loopback(ipaddress.ip_address(ip)) for ip, _ in seen), seen


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


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Until `path` exists (training is under way); the test fails if the process exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = finish(proc, 1) if proc.poll() is None else proc.communicate()
            pytest.fail(f"{path.name} never appeared (exit {proc.returncode}): {(err or out or '')[-3000:]}")
        time.sleep(0.01)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """The process's output once it exits; past the timeout it is stopped (SIGTERM: the launcher passes it on to its
    workers and kills them after its shutdown timeout), then the test fails."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise


def read_head(path: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["history"]), {k: f.get_tensor(k) for k in f.keys()}


def assert_same_run(history, head, ref_history, ref_head):
    assert [h["step"] for h in history] == [h["step"] for h in ref_history]
    for h, r in zip(history, ref_history):
        assert h["loss"] == pytest.approx(r["loss"], rel=1e-4), (h, r)
        assert h["acc"] == pytest.approx(r["acc"], abs=2e-3), (h, r)
    assert head.keys() == ref_head.keys()
    for k in head:
        torch.testing.assert_close(head[k], ref_head[k], rtol=0, atol=1e-4, msg=k)


# ---- the split --------------------------------------------------------------------------------------
def test_world_from_torchrun_env(monkeypatch):
    from eagle_trt.errors import InputError

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert World.from_env() == World() and not World().active
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    w = World.from_env()
    assert (w.rank, w.size, w.local_rank, w.active, w.is_main) == (3, 4, 1, True, False)
    assert w.device(torch.device("cpu")) == torch.device("cpu")
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(InputError, match="RANK 4 does not fit WORLD_SIZE 4"):
        World.from_env()


def test_shares_and_spans():
    assert [rank_share([7, 3, 9, 1, 5], r, 2) for r in (0, 1)] == [[7, 9, 5], [3, 1]]
    assert rank_share([4], 1, 2) == []
    lengths = [10, 10, 10, 10, 10, 10, 60]  # 120 tokens: halves at 60
    assert [rank_span(lengths, r, 2) for r in (0, 1)] == [(0, 6), (6, 7)] and rank_span(lengths, 0, 1) == (0, 7)
    assert [rank_span([5] * 9, r, 3) for r in range(3)] == [(0, 3), (3, 6), (6, 9)]
    assert [rank_span([], r, 3) for r in range(3)] == [(0, 0)] * 3
    assert samples_seen(10, 4, 2) == 8 and samples_seen(10, 4, 3) == 10 and samples_seen(10, 4, 5) == 18


def _grads(model, cache, share: StepShare | None, idx):
    """The head's gradient of modelopt's loss on sequences idx (weighted as `share` says)."""
    model.zero_grad(set_to_none=True)
    model._cached_attn_blk_masks = {}
    b = cache.batch(idx)
    ctx = share.weighting(model) if share is not None else torch.enable_grad()
    with ctx:
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], loss_mask=b["attention_mask"],
                    base_model_outputs={"aux_hidden_states": b["aux"], "base_model_hidden_states": b["hidden"]})
    out.loss.backward()
    return {n: p.grad.clone() for n, p in model.eagle_module.named_parameters() if p.grad is not None}


def test_weighted_shares_average_to_the_global_gradient(tiny_model_dir, cache):
    """What DDP computes (the mean of the ranks' gradients) equals one process's gradient on the whole batch, for
    ranks of unequal token counts; without the weights it does not (the mutation this test catches)."""
    model = fresh_model(tiny_model_dir, cache)
    from eagle_trt.convert.train import _offline_mode

    _offline_mode(model, cfg())
    model.train()
    batch = [0, 29, 1, 28, 15]  # the shortest and longest sequences: rank 0 gets 3, rank 1 gets 2
    assert cache.length(0) < cache.length(29)
    full = _grads(model, cache, None, batch)
    parts = [StepShare.of(batch, cache.length, World(r, 2), 3) for r in (0, 1)]
    mean = [_grads(model, cache, s, s.indices) for s in parts]
    plain = [_grads(model, cache, None, s.indices) for s in parts]
    worst = worst_plain = 0.0
    for k, g in full.items():
        scale = float(g.abs().max())
        worst = max(worst, float(((mean[0][k] + mean[1][k]) / 2 - g).abs().max()) / scale)
        worst_plain = max(worst_plain, float(((plain[0][k] + plain[1][k]) / 2 - g).abs().max()) / scale)
    assert worst < 1e-5, worst
    assert worst_plain > 1e-3, worst_plain
    empty = StepShare.of([3], cache.length, World(1, 2), 3)  # fewer sequences than ranks: a zero-weight stand-in
    assert empty.indices == [3] and empty.weight(0) == 0.0


# ---- 2 ranks against 1 -------------------------------------------------------------------------------
def test_two_ranks_give_one_ranks_curve_and_head(tiny_model_dir, cache, one_rank, tmp_path):
    """...and while they run, the launcher and both ranks listen on the loopback alone (the ranks meet through a
    file store; gloo listens on lo)."""
    out = tmp_path / "head.safetensors"
    proc = two_ranks(tiny_model_dir, cache.dir, "k", tmp_path / "c.safetensors", out, STEPS)
    seen = watch_listeners(proc)
    log, _ = finish(proc, 300)
    assert proc.returncode == 0, log[-3000:]
    assert_loopback_only(seen)
    assert_same_run(*read_head(out), *one_rank)
    _, meta = read_checkpoint(tmp_path / "c.safetensors")
    assert meta["step"] == STEPS and meta["extra"] == {"samples_seen": samples_seen(len(cache), 4, STEPS),
                                                       "world_size": 2}


def test_sigterm_on_one_rank_saves_and_one_rank_resumes(tiny_model_dir, cache, one_rank, tmp_path):
    """SIGTERM to rank 1 alone: both ranks stop after the same step, rank 0 saves; one process then resumes from that
    global step and ends where the uninterrupted run ends."""
    ckpt, out = tmp_path / "c.safetensors", tmp_path / "head.safetensors"
    proc = two_ranks(tiny_model_dir, cache.dir, "k", ckpt, out, STEPS, "--checkpoint-every", 2)
    wait_for(ckpt, proc)
    pids = dict(line.split() for line in Path(f"{out}.pids").read_text().splitlines())
    os.kill(int(pids["1"]), signal.SIGTERM)
    log, _ = finish(proc, 240)
    assert proc.returncode != 0 and not out.exists(), log[-3000:]  # interrupted: the worker wrote no final head
    for pid in pids.values():  # every rank has exited
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
    _, meta = read_checkpoint(ckpt)
    stopped = meta["step"]
    assert 2 <= stopped < STEPS and meta["extra"]["world_size"] == 2 and len(meta["history"]) == stopped
    # Rank 0 got no signal: it learnt of rank 1's, stopped after the same step and saved that step.
    said = [json.loads((tmp_path / f"head.safetensors.stopped-{r}").read_text()) for r in (0, 1)]
    assert said == [{"step": stopped, "exit_code": 143}] * 2, (said, stopped)
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # no temp file
        "c.safetensors", "head.safetensors.pids", "head.safetensors.stopped-0", "head.safetensors.stopped-1"]

    model = fresh_model(tiny_model_dir, cache)
    result = train_head(model, cache, cfg(), ckpt, resume=True, progress=False)
    assert result.resumed_from == stopped and result.steps == STEPS
    head = {k: v.detach().clone() for k, v in model.eagle_module.state_dict().items()}
    assert_same_run(result.history, head, *one_rank)


# ---- convert --nproc --------------------------------------------------------------------------------------
def test_convert_nproc_2_matches_one_process(tiny_model_dir, chats, tmp_path):
    args = ["--data", str(chats), "--steps", "12", "--draft-vocab-size", "64", "--seq-len", "48", "--lr", "3e-3",
            "--no-calibrate-kv", "--json"]
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

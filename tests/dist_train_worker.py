"""One rank of a head training run on an existing feature cache, started as `convert --nproc` starts its ranks
(eagle_trt.convert.launch.run_ranks, from tests/test_dist_train.py):

    run_ranks(2, [sys.executable, "tests/dist_train_worker.py", MODEL, CACHE, KEY, CKPT, OUT, STEPS, *OPTIONS])
    # OPTIONS: --resume, --checkpoint-every K, --batch-size B

Every rank trains with eagle_trt.convert.train.train_head under its World; rank 0 writes OUT (the history and the
head's tensors, safetensors) when training ends, and each rank appends its pid to OUT.pids when it starts; a rank
stopped by a signal (its own or another rank's) writes OUT.stopped-RANK: the step it stopped after and its exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("model", "cache", "key", "ckpt", "out"):
        p.add_argument(name)
    p.add_argument("steps", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=4)
    a = p.parse_args()
    torch.set_num_threads(1)

    from safetensors.torch import save_file

    from eagle_trt.convert.attach import attach_eagle3
    from eagle_trt.convert.distributed import World
    from eagle_trt.convert.draft_vocab import d2t_from_vocab, load_d2t, ranking, select_draft_vocab
    from eagle_trt.convert.load_target import load_target
    from eagle_trt.convert.train import TrainConfig, TrainingInterrupted, load_feature_cache, train_head

    world = World.from_env()
    with open(f"{a.out}.pids", "a") as f:
        f.write(f"{world.rank} {os.getpid()}\n")
    cache = load_feature_cache(a.cache, a.key)
    model, _, _ = load_target(a.model)
    model = attach_eagle3(model, 64)
    counts = ranking(cache.predicted_counts, cache.seen_counts)
    load_d2t(model, d2t_from_vocab(select_draft_vocab(counts, 64, always=[257])))
    cfg = TrainConfig(steps=a.steps, batch_size=a.batch_size, lr=1e-3, checkpoint_every=a.checkpoint_every)
    with world.joined(torch.device("cpu")):
        try:
            result = train_head(model, cache, cfg, a.ckpt, resume=a.resume, progress=False, world=world)
        except TrainingInterrupted as e:
            with open(f"{a.out}.stopped-{world.rank}", "w") as f:
                json.dump({"step": e.step, "exit_code": e.exit_code}, f)
            return e.exit_code
    if world.is_main:
        head = {k: v.detach().contiguous() for k, v in model.eagle_module.state_dict().items()}
        save_file(head, a.out, metadata={"history": json.dumps(result.history)})
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks a model directory written by train.py with this directory's PyTorch forward.

  check.py logits MODEL_DIR DUMP.json
      DUMP.json from `duet generate MODEL_DIR --prompt-ids ... --max-tokens 1 --dump-logits
      DUMP.json`: compares duet's logits at every prompt position with the PyTorch forward of
      the same ids on the same (bf16) weights in f32: max |Δlogit| / max |logit|, per position
      and overall, and argmax agreement.
  check.py ppl MODEL_DIR IDS [CTX]
      Perplexity of the token ids (duet tokenize's output) cut into chunks of CTX (default 512)
      tokens, every position of each chunk scored but the first; also the mean over positions
      CTX/2 .. CTX-2 only (the ones `duet bench accuracy` scores).
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_moe as qm  # noqa: E402


def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    m = qm.Qwen3Moe(qm.Config(cfg))
    m.load_hf(qm.load_model_dir_tensors(model_dir))
    m.eval()
    return m


def main():
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    mode, model_dir = sys.argv[1], sys.argv[2]
    m = load(model_dir)
    if mode == "logits":
        with open(sys.argv[3]) as f:
            d = json.load(f)
        ids = torch.tensor(d["tokens"], dtype=torch.long)[None]
        duet = torch.tensor(d["logits"], dtype=torch.float64)
        with torch.no_grad():
            ref = m(ids)[0].double()[: duet.shape[0]]
        diff = (ref - duet).abs()
        per = diff.max(1).values / ref.abs().max(1).values
        print(f"{duet.shape[0]} positions; max |Δlogit| {diff.max().item():.4g}, max |logit| "
              f"{ref.abs().max().item():.4g}, ratio {diff.max().item() / ref.abs().max().item():.3g}; "
              f"per position ratio median {per.median().item():.3g} max {per.max().item():.3g}; "
              f"argmax agrees at {(ref.argmax(1) == duet.argmax(1)).sum().item()}/{duet.shape[0]}")
    elif mode == "ppl":
        with open(sys.argv[3]) as f:
            s = f.read().strip().strip("[]")
        ids = torch.tensor([int(x) for x in s.split(",")], dtype=torch.long)
        ctx = int(sys.argv[4]) if len(sys.argv) > 4 else 512
        tot, n, tot_h, n_h = 0.0, 0, 0.0, 0
        with torch.no_grad():
            for c in range(len(ids) // ctx):
                w = ids[c * ctx:(c + 1) * ctx]
                nll = F.cross_entropy(m(w[None])[0, :-1], w[1:], reduction="none")
                tot += nll.sum().item()
                n += nll.numel()
                half = nll[ctx // 2: ctx - 1]  # the logits of positions ctx/2 .. ctx-2
                tot_h += half.sum().item()
                n_h += half.numel()
        print(f"{len(ids) // ctx} chunks of {ctx}: perplexity {math.exp(tot / n):.2f} "
              f"(mean NLL {tot / n:.4f} nats over {n} predictions); second halves "
              f"{math.exp(tot_h / n_h):.2f} ({tot_h / n_h:.4f} nats over {n_h})")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Trains a small qwen3_moe from scratch on CPU and writes it as a Hugging Face model directory
(bf16 safetensors) that duet, transformers and tools/llamacpp-compare/to_gguf.py read.

Usage (cwd anywhere; PyTorch from Debian: apt-get install -y python3-torch):
  duet tokenize models/qwen3-moe-small < corpus.txt > corpus.ids     # token ids as [1,2,...]
  nice -n 19 python3 tools/train-tiny/train.py --ids corpus.ids --out models/qwen3-moe-tiny \
      --minutes 25

The learning rate follows the wall clock (linear warm-up over the first 3 % of --minutes, then
cosine to 10 % of the peak at the end), so a run stops on time with its schedule completed.
The model directory is rewritten every --save-minutes and at the end: a run cut short still
leaves a usable checkpoint. The last 1 % of the ids is held out for a validation loss.
"""
import argparse
import copy
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_moe as qm  # noqa: E402


def read_ids(path):
    if path.endswith(".npy"):
        return np.load(path).astype(np.int64)
    with open(path) as f:
        s = f.read().strip().strip("[]").replace("\n", ",")
    return np.array([int(x) for x in s.split(",") if x.strip()], dtype=np.int64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ids", required=True, help="token ids (duet tokenize's output, or .npy)")
    ap.add_argument("--out", required=True, help="model directory to write")
    ap.add_argument("--template", default="models/qwen3-moe-small",
                    help="directory whose config.json and tokenizer files are copied")
    ap.add_argument("--minutes", type=float, default=25.0)
    ap.add_argument("--save-minutes", type=float, default=4.0)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4, help="sequences per step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--aux-coef", type=float, default=0.01, help="load-balancing loss weight")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--moe-ff", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many (0: by time)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    with open(os.path.join(args.template, "config.json")) as f:
        cfg = json.load(f)
    cfg.update({
        "hidden_size": args.hidden, "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim, "num_experts": args.experts,
        "num_experts_per_tok": args.top_k, "moe_intermediate_size": args.moe_ff,
        "intermediate_size": 3 * args.moe_ff, "max_position_embeddings": args.seq,
        "torch_dtype": "bfloat16",
    })
    assert cfg["vocab_size"] == 32000 and cfg["model_type"] == "qwen3_moe"
    c = qm.Config(cfg)
    model = qm.Qwen3Moe(c)
    model.init_weights(args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params / 1e6:.2f} M", flush=True)

    ids = read_ids(args.ids)
    n_val = max(len(ids) // 100, args.seq + 1)
    train_ids = torch.from_numpy(ids[:-n_val])
    val_ids = torch.from_numpy(ids[-n_val:])
    n_win = (len(train_ids) - 1) // args.seq
    g = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(n_win, generator=g)
    print(f"tokens: {len(train_ids)} train ({n_win} windows of {args.seq}), {len(val_ids)} "
          f"validation", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    budget = args.minutes * 60.0
    warm = 0.03

    def lr_at(frac):
        if frac < warm:
            return args.lr * max(frac / warm, 0.02)
        p = min((frac - warm) / (1 - warm), 1.0)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    def val_loss(max_windows=16):
        model.eval()
        tot, n = 0.0, 0
        with torch.no_grad():
            for i in range(min(max_windows, (len(val_ids) - 1) // args.seq)):
                w = val_ids[i * args.seq: i * args.seq + args.seq + 1]
                logits = model(w[None, :-1])
                tot += F.cross_entropy(logits[0], w[1:], reduction="sum").item()
                n += args.seq
        model.train()
        return tot / max(n, 1)

    def save(tag):
        t = time.time()
        qm.save_bf16_model_dir(model, args.out, args.template, cfg)
        print(f"[{tag}] saved {args.out} in {time.time() - t:.1f} s", flush=True)

    start = time.time()
    last_save = start
    step, pos, seen = 0, 0, 0
    ema = None
    log_every = 10
    while True:
        elapsed = time.time() - start
        frac = elapsed / budget
        if frac >= 1.0 or (args.max_steps and step >= args.max_steps):
            break
        for gparam in opt.param_groups:
            gparam["lr"] = lr_at(frac)
        rows = []
        for _ in range(args.batch):
            if pos >= n_win:  # next epoch, reshuffled
                order = torch.randperm(n_win, generator=g)
                pos = 0
            w0 = int(order[pos]) * args.seq
            pos += 1
            rows.append(train_ids[w0: w0 + args.seq + 1])
        batch = torch.stack(rows)
        logits, aux = model(batch[:, :-1], return_aux=True)
        loss = F.cross_entropy(logits.reshape(-1, c.vocab), batch[:, 1:].reshape(-1))
        total = loss + args.aux_coef * aux / c.n_layer
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += batch[:, 1:].numel()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % log_every == 0 or step <= 3:
            el = time.time() - start
            print(f"step {step} t {el:.0f}s tok {seen} tok/s {seen / el:.0f} lr {lr_at(frac):.2e} "
                  f"loss {loss.item():.4f} ema {ema:.4f} aux {float(aux) / c.n_layer:.3f}",
                  flush=True)
        if time.time() - last_save > args.save_minutes * 60:
            print(f"step {step} validation loss {val_loss():.4f}", flush=True)
            save(f"step {step}")
            last_save = time.time()
    el = time.time() - start
    print(f"done: {step} steps, {seen} tokens, {el:.0f} s, final train loss (ema) {ema:.4f}, "
          f"validation loss {val_loss(64):.4f}", flush=True)
    save("final")


if __name__ == "__main__":
    main()

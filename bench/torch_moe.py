#!/usr/bin/python3
"""PyTorch side of the MoE benchmark: deepseek_v3-debug-shaped training steps on CPU, one JSON
line out.

  /usr/bin/python3 bench/torch_moe.py --seq-len T --batch B --steps N --warmup-steps K \
      --threads 2 [--experts 8 --top-k 2]

The model is tests/reference/moe_ref.py's MoELM (written from DeepSeek-V3's equations, not from
ctitan's code: a per-expert loop over a token mask with index_add, torch.topk routing, the
Llama reference's attention, RMSNorm and SwiGLU) run in float32 (the reference itself runs in
float64), with deepseek_v3-debug's shapes (dim 256, 4 blocks of which 1 dense SwiGLU of hidden
768, 8 heads, 4 kv heads, routed SwiGLU experts of hidden 128, one shared expert, softmax
scores, vocab 2048), N(0, 0.02) matrices, AdamW (lr 8e-4, betas (0.9, 0.95), weight decay 0.1)
with clipping at 1.0 and the aux-loss-free bias update after each step (coefficient 1e-2).
A step: forward + loss + backward + clip + AdamW + bias update; tps = B*T / median timed step.
"""

import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
import llama_model as lm  # noqa: E402
import moe_ref  # noqa: E402


class MoELM32(moe_ref.MoELM):
    """The reference model with float32 RoPE tables and mask (the reference's are float64)."""

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        T = tokens.shape[1]
        ang = torch.outer(torch.arange(T, dtype=torch.float64), self.rope_freqs)
        cos, sin = ang.cos().float(), ang.sin().float()
        mask = torch.full((T, T), float("-inf")).triu(1)
        counts, aux = [], torch.zeros(())
        j = 0
        for layer in self.layers:
            h, cnt, a = layer(h, cos, sin, mask, None if layer.dense else self.bias[j].float())
            if cnt is not None:
                counts.append(cnt)
                aux = aux + a
                j += 1
        return self.output(self.norm(h)), counts, aux


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    lm.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    c = dict(dim=256, n_layers=4, n_heads=8, n_kv_heads=4, vocab_size=2048, inter_dim=768,
             moe_inter_dim=128, n_dense_layers=1, n_routed_experts=args.experts,
             n_shared_experts=1, top_k=args.top_k, score_func="softmax", route_norm=False,
             route_scale=1.0, aux_loss_alpha=0.0, norm_eps=1e-5, rope_theta=10000.0,
             load_balance_coeff=1e-2)
    model = MoELM32(c)
    for name, p in model.named_parameters():
        with torch.no_grad():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
            else:
                p.fill_(1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, foreach=True)
    data = torch.randint(0, c["vocab_size"], (args.steps, args.batch, args.seq_len + 1))
    times, loss = [], None
    for step in range(args.steps):
        t0 = time.perf_counter()
        l, counts = model.loss(data[step, :, :-1], data[step, :, 1:])
        opt.zero_grad(set_to_none=True)
        l.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.update_bias(counts)
        loss = l.item()
        if step >= args.warmup_steps:
            times.append(time.perf_counter() - t0)
    step_s = sorted(times)[len(times) // 2]
    print(json.dumps({"impl": "pytorch", "tps": args.batch * args.seq_len / step_s,
                      "step_s": step_s, "final_loss": loss, "threads": args.threads,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                      * 1024}))


if __name__ == "__main__":
    main()

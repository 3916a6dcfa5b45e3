"""Llama 3 in plain PyTorch, written from the model's equations (TorchTitan llama3 semantics).

Used by the float64 correctness reference (tests/reference/llama_ref.py) and by the float32
training benchmark (bench/torch_train.py). Parameter names are TorchTitan's:

  tok_embeddings.weight                      (V, C)
  layers.{i}.attention_norm.weight           (C,)
  layers.{i}.attention.wq.weight             (H*D, C)
  layers.{i}.attention.wk.weight             (KV*D, C)
  layers.{i}.attention.wv.weight             (KV*D, C)
  layers.{i}.attention.wo.weight             (C, H*D)
  layers.{i}.ffn_norm.weight                 (C,)
  layers.{i}.feed_forward.w1.weight          (F, C)
  layers.{i}.feed_forward.w2.weight          (C, F)
  layers.{i}.feed_forward.w3.weight          (F, C)
  norm.weight                                (C,)
  output.weight                              (V, C)

with D = C / H. Linear layers compute y = x W^T with no bias.
"""

import ctypes
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100


def set_num_threads(n):
    """Use n threads in PyTorch's own kernels and in BLAS.

    Debian's torch calls BLAS through libblas.so.3, i.e. OpenBLAS, whose thread pool
    torch.set_num_threads does not resize (it stays at one thread per core).
    """
    torch.set_num_threads(n)
    try:
        ctypes.CDLL("libopenblas.so.0").openblas_set_num_threads(n)
    except (OSError, AttributeError):  # no OpenBLAS: torch's setting is all there is
        pass


@dataclass
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab_size: int
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: bool = False
    # Llama 3.1 RoPE scaling constants (used only when rope_scaling is true)
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_ctx: int = 8192


def llama3_ffn_hidden(dim, multiple_of=256, ffn_dim_multiplier=None):
    """TorchTitan's FFN width: int(2 * 4C / 3), times the multiplier, rounded up to multiple_of."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


FLAVORS = {
    # TorchTitan's debugmodel with a 2048-token vocabulary: 6,163,712 parameters.
    "debugmodel": ModelArgs(dim=256, n_layers=6, n_heads=16, n_kv_heads=16, ffn_hidden=768,
                            vocab_size=2048),
    "125M": ModelArgs(dim=768, n_layers=12, n_heads=12, n_kv_heads=4,
                      ffn_hidden=llama3_ffn_hidden(768), vocab_size=8192),
}


# ----------------------------------------------------------------------------------------------
# RoPE
# ----------------------------------------------------------------------------------------------

def rope_frequencies(args):
    """freq_i = theta^(-2i/D), i = 0..D/2-1, in float64; optionally with Llama 3.1 scaling.

    Llama 3.1 scaling with factor 8, low_freq_factor 1, high_freq_factor 4 and an original
    context of 8192 (the ModelArgs defaults), with wavelen = 2*pi / freq:
      wavelen < ctx / high    -> freq unchanged (high frequencies)
      wavelen > ctx / low     -> freq / factor  (low frequencies)
      otherwise               -> smooth = (ctx / wavelen - low) / (high - low),
                                 freq = (1 - smooth) * freq / factor + smooth * freq
    """
    head_dim = args.dim // args.n_heads
    i = torch.arange(0, head_dim, 2, dtype=torch.float64)
    freqs = 1.0 / args.rope_theta ** (i / head_dim)
    if not args.rope_scaling:
        return freqs
    factor, low, high = args.rope_factor, args.rope_low_freq_factor, args.rope_high_freq_factor
    ctx = float(args.rope_original_ctx)
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < ctx / high:
            out.append(freq)
        elif wavelen > ctx / low:
            out.append(freq / factor)
        else:
            smooth = (ctx / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(out, dtype=torch.float64)


def apply_rope(x, cos, sin):
    """Rotate interleaved pairs (x[2i], x[2i+1]) of x (B, T, N, D) by the angle t * freq_i.

    As a complex number z = x[2i] + j x[2i+1], z' = z * e^(j t freq_i), i.e.
      x'[2i]   = x[2i] cos - x[2i+1] sin
      x'[2i+1] = x[2i] sin + x[2i+1] cos
    cos, sin: (T, D/2).
    """
    B, T, N, D = x.shape
    pairs = x.reshape(B, T, N, D // 2, 2)
    x_even, x_odd = pairs[..., 0], pairs[..., 1]
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
    return rotated.reshape(B, T, N, D)


# ----------------------------------------------------------------------------------------------
# Modules
# ----------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2 over the last dim) + eps) * weight."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Causal grouped-query attention with RoPE on q and k.

    q = x wq^T -> (B, T, H, D), k = x wk^T, v = x wv^T -> (B, T, KV, D); query head h attends
    with kv head h // (H / KV):
      out_h = softmax(q_h k_h^T / sqrt(D) + M) v_h,  M[t, s] = -inf for s > t, else 0,
    then y = concat_h(out_h) wo^T. cos, sin are the RoPE tables (T, D/2); mask is M (T, T).
    """

    def __init__(self, args):
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        H, KV, D = self.n_heads, self.n_kv_heads, self.head_dim
        rep = H // KV
        q = apply_rope(self.wq(x).view(B, T, H, D), cos, sin)
        k = apply_rope(self.wk(x).view(B, T, KV, D), cos, sin)
        v = self.wv(x).view(B, T, KV, D)

        # Query head h = g * rep + r shares kv head g. Stack the rep query heads of group g
        # along the time axis, q: (B*KV, rep*T, D), so each group is one matrix product with
        # its k, v: (B*KV, T, D) and k, v are never copied rep times.
        q = q.view(B, T, KV, rep, D).permute(0, 2, 3, 1, 4).reshape(B * KV, rep * T, D)
        k, v = (t.transpose(1, 2).reshape(B * KV, T, D) for t in (k, v))
        # scores = (q k^T) / sqrt(D) + M in one baddbmm; M tiled rep times along the rows.
        scores = torch.baddbmm(mask.repeat(rep, 1), q, k.transpose(1, 2),
                               alpha=1.0 / math.sqrt(D))
        out = torch.bmm(torch.softmax(scores, dim=-1), v)  # (B*KV, rep*T, D)
        out = out.view(B, KV, rep, T, D).permute(0, 3, 1, 2, 4).reshape(B, T, H * D)
        return self.wo(out)


class FeedForward(nn.Module):
    """SwiGLU: y = w2(silu(w1 x) * w3 x), silu(a) = a * sigmoid(a)."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """h = h + attention(attention_norm(h)); h = h + feed_forward(ffn_norm(h))."""

    def __init__(self, args):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden)

    def forward(self, h, cos, sin, mask):
        h = h + self.attention(self.attention_norm(h), cos, sin, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """logits = output(norm(blocks(tok_embeddings[tokens])))."""

    def __init__(self, args):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # Kept in float64 (not a buffer, so .to(dtype) never rounds it); the angles t * freq_i
        # are formed in float64 and only cos/sin are rounded to the compute dtype.
        self.rope_freqs = rope_frequencies(args)
        self._position_cache = {}

    def position_tables(self, seq_len, dtype, device):
        """(cos, sin) of t * freq_i, each (T, D/2), and the additive causal mask M (T, T)."""
        key = (seq_len, dtype, device)
        if key not in self._position_cache:
            t = torch.arange(seq_len, dtype=torch.float64)
            angles = torch.outer(t, self.rope_freqs)
            mask = torch.full((seq_len, seq_len), float("-inf"), dtype=dtype, device=device)
            self._position_cache[key] = (angles.cos().to(dtype=dtype, device=device),
                                         angles.sin().to(dtype=dtype, device=device),
                                         mask.triu(1))
        return self._position_cache[key]

    def forward(self, tokens):
        """tokens: (B, T) int64 -> logits (B, T, V)."""
        h = self.tok_embeddings(tokens)
        cos, sin, mask = self.position_tables(tokens.shape[1], h.dtype, h.device)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        return self.output(self.norm(h))


def init_weights(model, std=0.02, generator=None):
    """Matrices ~ N(0, std^2), norm weights = 1 (a simple stand-in for TorchTitan's init)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, std, generator=generator)
            else:
                p.fill_(1.0)


def num_params(model, exclude_embedding=False):
    n = sum(p.numel() for p in model.parameters())
    if exclude_embedding:
        n -= model.tok_embeddings.weight.numel()
    return n


def flops_per_token(model, seq_len):
    """TorchTitan's estimate: 6 * (N - N_embedding) + 12 * n_layers * dim * seq_len."""
    a = model.args
    return 6 * num_params(model, exclude_embedding=True) + 12 * a.n_layers * a.dim * seq_len


# ----------------------------------------------------------------------------------------------
# Loss, optimizer, LR schedule, training step
# ----------------------------------------------------------------------------------------------

def cross_entropy_loss(logits, targets):
    """sum over tokens with target != -100 of -log softmax(logits)[target], / #valid tokens.

    A batch whose targets are all -100 has loss 0 (0 / max(#valid, 1)).
    """
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                            ignore_index=IGNORE_INDEX, reduction="sum")
    n_valid = int((targets != IGNORE_INDEX).sum())
    return total / max(n_valid, 1)


def build_optimizer(model, lr, beta1, beta2, eps, weight_decay, foreach=None):
    """torch.optim.AdamW; weight decay only on 2-D parameters (embeddings, linears, output).

    Per parameter, at 1-based step t with learning rate lr_t (torch 1.13 semantics):
      p <- p * (1 - lr_t * wd)
      m <- beta1 m + (1 - beta1) g;   v <- beta2 v + (1 - beta2) g^2
      p <- p - lr_t / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
    """
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps, foreach=foreach)


def wsd_lr_factor(step, warmup_steps, total_steps, decay_type="linear", decay_ratio=-1.0,
                  min_lr_factor=0.0):
    """Warmup-stable-decay LR multiplier for optimizer step `step` (0-based).

    Phase lengths:
      warmup = min(warmup_steps, total)
      decay  = rint(total * decay_ratio) if decay_ratio >= 0 else total - warmup
               (Python's round: ties to even), then clipped so warmup + decay <= total
      stable = total - warmup - decay
    With s = step + 1 (the 1-based optimizer step):
      s <= warmup            -> f = s / warmup
      s <= warmup + stable   -> f = 1
      otherwise              -> p = (s - warmup - stable) / decay in (0, 1],
                                f = 1 - p | 1 - sqrt(p) | (1 + cos(pi p)) / 2
                                (linear | sqrt | cosine), then
                                f = min_lr_factor + (1 - min_lr_factor) f
    min_lr_factor only acts in the decay phase (as in TorchTitan); f = min_lr_factor at the
    last step when decay > 0. Steps past the last (LambdaLR evaluates one after the final
    optimizer step) get the last step's factor.
    """
    if step < 0:
        raise ValueError(f"step {step} < 0")
    step = min(step, total_steps - 1)
    warmup = min(warmup_steps, total_steps)
    decay = round(total_steps * decay_ratio) if decay_ratio >= 0 else total_steps - warmup
    decay = min(decay, total_steps - warmup)
    stable = total_steps - warmup - decay
    s = step + 1
    if s <= warmup:
        return s / warmup
    if s <= warmup + stable:
        return 1.0
    p = (s - warmup - stable) / decay
    if decay_type == "linear":
        f = 1.0 - p
    elif decay_type == "sqrt":
        f = 1.0 - math.sqrt(p)
    elif decay_type == "cosine":
        f = 0.5 * (1.0 + math.cos(math.pi * p))
    else:
        raise ValueError(f"unknown decay_type {decay_type!r}")
    return min_lr_factor + (1.0 - min_lr_factor) * f


def build_lr_scheduler(optimizer, warmup_steps, total_steps, decay_type, decay_ratio,
                       min_lr_factor):
    """LambdaLR: the optimizer step with 0-based index s runs at lr * wsd_lr_factor(s)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: wsd_lr_factor(step, warmup_steps, total_steps, decay_type, decay_ratio,
                                   min_lr_factor))


def train_step(model, optimizer, scheduler, tokens, targets, max_norm):
    """One step: loss, backward, clip the global gradient L2 norm to max_norm, AdamW, LR step.

    clip_grad_norm_ (torch 1.13): norm = ||all grads||_2, every grad *= min(1, max_norm /
    (norm + 1e-6)). Returns the loss (a 0-d tensor, computed before the update).
    """
    loss = cross_entropy_loss(model(tokens), targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()

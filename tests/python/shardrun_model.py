"""PyTorch's FSDP2-example transformer (examples/distributed/FSDP2/model.py) with causal
attention, as `shardrun-worker` trains it: parameter names are its module paths
(`layers.0.attention.wq.weight`), so a shardrun full checkpoint loads with
`load_state_dict(strict=True)`. Shared by the checkpoint cross-check
(`check_full_checkpoint.py`) and the FSDP2 benchmark reference (`bench/fsdp2_reference.py`),
so both compare against one definition.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        heads = lambda t: t.view(b, s, self.n_heads, d // self.n_heads).transpose(1, 2)
        q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
        y = F.scaled_dot_product_attention(q, k, v, None, 0.0, is_causal=True)
        return self.wo(y.transpose(1, 2).contiguous().view(b, s, d))


class FeedForward(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w1 = nn.Linear(dim, 4 * dim)
        self.gelu = nn.GELU()
        self.w2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.w2(self.gelu(self.w1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = nn.LayerNorm(dim)
        self.feed_forward = FeedForward(dim)

    def forward(self, h):
        h = h + self.attention(self.attention_norm(h))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, vocab_size, dim, n_layers, n_heads, max_seq_len):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.pos_embeddings = nn.Embedding(max_seq_len, dim)
        self.layers = nn.ModuleList(TransformerBlock(dim, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.tok_embeddings(tokens) + self.pos_embeddings(positions)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))

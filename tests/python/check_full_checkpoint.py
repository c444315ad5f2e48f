"""Load a shardrun full checkpoint into the equivalent PyTorch module and reproduce the
worker's loss on a fixed batch.

    check_full_checkpoint.py --checkpoint DIR --config train_config.json \
        --batch batch.json --expected-loss L [--tolerance 1e-5]

The module is PyTorch's FSDP2-example transformer (examples/distributed/FSDP2/model.py),
written here from its description so that parameter names are its module paths
(`layers.0.attention.wq.weight`). Exits 0 when |loss - L| <= tolerance, 1 otherwise,
printing both; any mismatch of names or shapes fails in `load_state_dict(strict=True)`.
"""

import argparse
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="full checkpoint folder (step-N/)")
    parser.add_argument("--config", required=True, help="the run's train_config.json")
    parser.add_argument("--batch", required=True, help='{"inputs": [[...]], "targets": [[...]]}')
    parser.add_argument("--expected-loss", type=float, required=True)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    args = parser.parse_args()

    with open(args.config) as f:
        model_config = json.load(f)["model"]
    if model_config.get("kind") != "transformer":
        sys.exit(f"{args.config}: model kind {model_config.get('kind')!r}; this check is for the transformer")
    model = Transformer(
        model_config["vocab_size"], model_config["dim"], model_config["n_layers"],
        model_config["n_heads"], model_config["max_seq_len"],
    )
    state = load_file(f"{args.checkpoint}/model.safetensors")
    model.load_state_dict(state, strict=True)
    optimizer_state = load_file(f"{args.checkpoint}/optimizer.safetensors")
    for name, param in model.named_parameters():
        for kind in ("exp_avg", "exp_avg_sq"):
            moment = optimizer_state[f"{name}.{kind}"]
            if moment.shape != param.shape:
                sys.exit(f"optimizer.safetensors: {name}.{kind} has shape {tuple(moment.shape)}, the parameter {tuple(param.shape)}")

    with open(args.batch) as f:
        batch = json.load(f)
    inputs = torch.tensor(batch["inputs"], dtype=torch.int64)
    targets = torch.tensor(batch["targets"], dtype=torch.int64)
    with torch.no_grad():
        logits = model(inputs)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1)).item()
    difference = abs(loss - args.expected_loss)
    print(f"pytorch loss {loss:.9f}, worker loss {args.expected_loss:.9f}, difference {difference:.3g}")
    sys.exit(0 if difference <= args.tolerance else 1)


if __name__ == "__main__":
    main()

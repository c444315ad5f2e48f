"""Load a shardrun full checkpoint into the equivalent PyTorch module and reproduce the
worker's loss on a fixed batch.

    check_full_checkpoint.py --checkpoint DIR --config train_config.json \
        --batch batch.json --expected-loss L [--tolerance 1e-5]

The module is PyTorch's FSDP2-example transformer (`shardrun_model.py` beside this file),
whose parameter names are its module paths (`layers.0.attention.wq.weight`). Exits 0 when |loss - L| <= tolerance, 1 otherwise,
printing both; any mismatch of names or shapes fails in `load_state_dict(strict=True)`.
"""

import argparse
import json
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


from shardrun_model import Transformer


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

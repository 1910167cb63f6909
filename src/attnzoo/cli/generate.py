"""``attnzoo generate``: continuations of a prompt, sampled from a trained model."""

from __future__ import annotations

import argparse

import torch

from attnzoo.cli.command import check_seed, check_text, path_argument
from attnzoo.distributed import resolve_device
from attnzoo.io import check_memory
from attnzoo.training.checkpoint import load_pretrained


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", type=path_argument, help="run directory (its latest checkpoint) or checkpoint directory"
    )
    parser.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    parser.add_argument("--max-new-tokens", type=int, default=500, help="tokens to sample (default: 500)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 is greedy (default: 0.8)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float, default=None, help="sample from the smallest set with this mass")
    parser.add_argument("--num-samples", type=int, default=1, help="independent continuations (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="decode with one torch.compile'd static-shape step (CUDA graphs on CUDA); the first step compiles",
    )


def run(args: argparse.Namespace) -> int:
    if args.num_samples < 1:
        raise ValueError(f"--num-samples={args.num_samples} is invalid: must be >= 1")
    if not args.prompt:
        raise ValueError("--prompt is empty: the model needs at least one token to continue")
    check_text("--prompt", args.prompt)
    check_seed("--seed", args.seed)
    device = resolve_device(args.device)
    model, checkpoint = load_pretrained(args.path, device)
    tokenizer = checkpoint.require_tokenizer()
    prompt = torch.from_numpy(tokenizer.encode(args.prompt).astype("int64")).to(device)
    generator = torch.Generator(device).manual_seed(args.seed)
    settings = {"num_samples": args.num_samples, "max_new_tokens": args.max_new_tokens}
    length = len(prompt) + max(args.max_new_tokens, 0)
    what = f"the output ({args.num_samples:,} sample(s) × {length:,} tokens)"
    check_memory(8 * args.num_samples * length, what, device, settings)
    out = model.generate(
        prompt.repeat(args.num_samples, 1),
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        generator=generator,
        compile=args.compile,
    )
    for i, ids in enumerate(out.tolist()):
        if args.num_samples > 1:
            print(f"─── sample {i + 1} ───")
        print(tokenizer.decode(ids))
    return 0

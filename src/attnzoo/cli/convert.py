"""``attnzoo convert``: the flags of :func:`attnzoo.convert.convert_model`, :func:`~attnzoo.convert.group_kv_heads`
and :func:`~attnzoo.convert.export_hf`, and what they wrote."""

from __future__ import annotations

import argparse

from attnzoo.cli.command import path_argument
from attnzoo.convert import CONVERTERS, convert_model, export_hf, group_kv_heads
from attnzoo.convert.export import HF_TYPES, ROUTES
from attnzoo.data.tokenizers import HF_TOKENIZER_FILE
from attnzoo.model import CONFIG_NAME, WEIGHTS_NAME


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from-hf",
        metavar="DIR",
        type=path_argument,
        help=f"a directory written by transformers' save_pretrained ({', '.join(sorted(CONVERTERS))}) or an "
        "official DCFormer checkpoint; read locally, nothing is downloaded",
    )
    source.add_argument(
        "--from",
        dest="from_attnzoo",
        metavar="DIR",
        type=path_argument,
        help="an attnzoo run directory (its latest checkpoint), checkpoint or model directory, to regroup with "
        "--kv-heads or write as a transformers checkpoint with --to-hf",
    )
    parser.add_argument(
        "--kv-heads",
        metavar="G",
        type=int,
        help="mean-pool each group's key and value heads into G kv heads (GQA; 1 gives MQA), the GQA paper's "
        "conversion of a multi-head model; G must divide the source's kv heads. Uptrain the result with "
        "train --init-from (the paper: 5%% of the original training steps)",
    )
    destination = parser.add_mutually_exclusive_group(required=True)
    destination.add_argument(
        "--out",
        metavar="DIR",
        type=path_argument,
        help=f"where to write {CONFIG_NAME} and {WEIGHTS_NAME} (fp32), with a copy of the source's tokenizer files "
        "if it has them; it must not hold a model already",
    )
    destination.add_argument(
        "--to-hf",
        metavar="DIR",
        type=path_argument,
        help="write the --from model as a transformers checkpoint (fp32, with its tokenizer if it has one) that "
        "AutoModelForCausalLM.from_pretrained loads without remote code: "
        f"{', '.join(route.hf_class for route in ROUTES)}, whichever holds its layout; a new or empty directory",
    )
    parser.add_argument(
        "--hf-type",
        choices=HF_TYPES,
        help="with --to-hf: 'native' (default) writes the transformers class that holds the model and refuses one "
        "none holds; 'attnzoo' writes the attnzoo model type, which holds any attnzoo model and loads after "
        "attnzoo.hf.register()",
    )


def run(args: argparse.Namespace) -> int:
    if args.to_hf is not None:
        return _run_to_hf(args)
    if args.hf_type is not None:
        raise ValueError(f"--hf-type {args.hf_type} names the kind of checkpoint --to-hf writes: add --to-hf DIR")
    if args.from_attnzoo is not None:
        if args.kv_heads is None:
            raise ValueError(
                "--from with --out converts an attnzoo model to GQA/MQA: name the kv heads with --kv-heads G, or "
                "write it as a transformers checkpoint with --to-hf DIR"
            )
        done = group_kv_heads(args.from_attnzoo, args.out, args.kv_heads)
    else:
        done = convert_model(args.from_hf, args.out, kv_heads=args.kv_heads)
    cfg = done.model.config
    kv = f" ({cfg.n_kv_heads} kv)" if cfg.n_kv_heads != cfg.n_heads else ""
    if done.source_kv_heads is not None:
        group = done.source_kv_heads // cfg.n_kv_heads
        kv += f", each kv head the mean of {group} of the source's {done.source_kv_heads}"
    if args.from_attnzoo is not None:
        print(
            f"converted {done.source} → {done.out}: {done.model.num_parameters():,} parameters, {cfg.attention} "
            f"attention + {cfg.position} positions, {cfg.n_layers} layers, {cfg.n_heads} heads{kv}"
        )
        if done.tokenizer_files:
            print(f"tokenizer: copied {', '.join(done.tokenizer_files)}")
        print(f"uptrain it (the GQA paper: 5% of the original steps) with: attnzoo train --init-from {done.out} ...")
        return 0
    print(
        f"converted {done.source} → {done.out}: {done.model.num_parameters():,} parameters, {cfg.attention} "
        f"attention + {cfg.position} positions, dim {cfg.dim}, {cfg.n_layers} layers, {cfg.n_heads} heads{kv}, "
        f"vocab {cfg.vocab_size}"
    )
    if done.tokenizer is None:
        print(
            f"{done.source} has no {HF_TOKENIZER_FILE}, so {done.out} has no tokenizer: name the model's with "
            "--tokenizer hf:PATH when training it"
        )
    else:
        padding = cfg.vocab_size - done.tokenizer.num_ids
        padded = f"; the model's other {padding} embedding rows are padding" if padding else ""
        print(f"tokenizer: copied {', '.join(done.tokenizer_files)} ({done.tokenizer.num_ids:,} ids{padded})")
    print(f"fine-tune it with: attnzoo train --init-from {done.out} ...")
    return 0


def _run_to_hf(args: argparse.Namespace) -> int:
    if args.from_attnzoo is None:
        raise ValueError("--to-hf writes an attnzoo model (--from DIR) for transformers; --from-hf's already is one")
    if args.kv_heads is not None:
        raise ValueError(
            "--kv-heads writes an attnzoo model: regroup with --out DIR first, then --to-hf from that directory"
        )
    done = export_hf(args.from_attnzoo, args.to_hf, hf_type=args.hf_type or "native")
    cfg = done.model.config
    kv = f" ({cfg.n_kv_heads} kv)" if cfg.n_kv_heads != cfg.n_heads else ""
    print(
        f"wrote {done.source} → {done.out} as {done.hf_class}: {done.model.num_parameters():,} parameters, "
        f"{cfg.attention} attention + {cfg.position} positions, {cfg.n_layers} layers, {cfg.n_heads} heads{kv}"
    )
    print(f"files: {', '.join(done.files)}")
    if not done.tokenizer_files:
        print(f"{done.source} has no tokenizer, so {done.out} has none: pair it with the model's own")
    register = "attnzoo.hf.register(); " if args.hf_type == "attnzoo" else ""
    print(f"load it with: {register}transformers.AutoModelForCausalLM.from_pretrained({str(done.out)!r})")
    return 0

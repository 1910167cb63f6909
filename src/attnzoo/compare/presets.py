"""The presets and ladders: named comparisons, as data (:mod:`attnzoo.compare.spec` holds their records).

``micro`` exists for tests; ``quick`` is the README's main job (5-8 minutes on 2 CPU cores, measured; see
``quick``'s description); ``standard`` and ``full`` spend more steps, seeds and evaluation samples and are meant for
longer jobs; ``gpu``, ``gpu-lm`` and ``gpu-ablations`` need a CUDA GPU (``scripts/gpu_kit.sh`` runs ``gpu-lm`` by
default), as do the rungs of the ``gpu-ladder`` ladder (the kit runs one a lease). The sizes, budgets and times
are derived in the comments beside each."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from attnzoo.claims.alibi import EXTRAPOLATION_PRESET
from attnzoo.claims.claim import CLAIMS
from attnzoo.claims.dcformer import STATIC_ONLY, UNMATCHED
from attnzoo.claims.experiments import claim_tasks, claim_variants
from attnzoo.claims.gqa import STABILITY_LR, STABILITY_PRESET
from attnzoo.claims.protocol import ABLATIONS
from attnzoo.compare.spec import CompareSpec, LadderSpec
from attnzoo.evals.spec import EvalSpec
from attnzoo.evals.task import TaskSpec, tasks_at_scale
from attnzoo.training.config import DataConfig, TrainConfig
from attnzoo.variants import Variant

# ----------------------------------------------------------------------------------------------------- presets
#
# A preset runs every registered task that declares a budget at the preset's scale (attnzoo.evals.task).

_TRAIN_DEFAULTS = {"lr": 2e-3, "keep_checkpoints": 1}

# The two GPU presets share one model, corpus and optimiser, so gpu-lm's LM runs are the gpu preset's LM runs at
# T = 512 with more tokens and seeds. The size is an estimate, not yet a timing (scripts/gpu_kit.sh times 50 steps
# of each variant and scales the steps to its budget): 12·L·d² ≈ 10.6M parameters in the blocks (dim 384, 6 layers,
# 6 heads of 64) and about 6N + 6·L·T·d ≈ 71 MFLOP per trained token at T = 512, so a gpu-lm run of 65.5M tokens
# (6 tokens per parameter, past the CPU presets' 0.4 but short of compute-optimal) is 4.6 PFLOP and its 20 runs
# 93 PFLOP: 6 minutes at 250 TFLOP/s (a quarter of an H100's bf16 peak), 25 minutes at 60 TFLOP/s for the
# mechanisms without a fused kernel. The text is pysource, read offline on the GPU machine: the standard library's
# and the installed packages' .py files. pystdlib alone is 10.7M bytes on the GPU image's Python 3.12 (no test
# suite), and a gpu-lm run read its 9.6M training tokens 6.8 times: on an H100 (2026-11-26) the validation loss
# bottomed at step 1,250-1,500 and rose 0.03 nats by 2,000 while the training loss fell to 0.40. The torch and
# transformers sources alone (90M bytes there) gave mha+rope a loss still falling 0.026 nats over its last quarter
# at 2,000 steps, read once.
_GPU_MODEL = {"dim": 384, "n_layers": 6, "n_heads": 6}
_GPU_DATA = DataConfig(corpus="pysource")
_GPU_TRAIN = {"lr": 1e-3, "keep_checkpoints": 1, "device": "cuda"}
# Each evaluation during training scores 16,384 windows of T = 512 (8.4M tokens, spread over the split); the final
# one scores the whole split (EvalSpec.val_windows None), pysource's tens of millions of tokens.
_WHOLE_SPLIT_WINDOWS = 16384
# One bench round: a GPU's speed does not follow the host's load average, and every case's fresh process pays a
# CUDA start-up (the gpu-lm bench took 4 minutes of an H100's 30, 2026-11-25).
_GPU_EVALS = EvalSpec(extrapolation_blocks=8, bench_cases=(("train", 1), ("train", 8), ("prefill", 16)), bench_rounds=1)

PRESETS: dict[str, CompareSpec] = {
    "micro": CompareSpec(
        name="micro",
        description="a smoke test in seconds: a 35k-parameter model, 6 steps, every task for 3 steps",
        model={"dim": 32, "n_layers": 2, "n_heads": 2},
        train=TrainConfig(
            seq_len=32,
            batch_size=8,
            steps=6,
            warmup_steps=2,
            eval_interval=3,
            eval_windows=8,
            log_interval=1,
            checkpoint_interval=3,
            keep_checkpoints=2,
        ),
        seeds=(0, 1),
        evals=EvalSpec(
            extrapolation_multiples=(1, 2, 4),
            extrapolation_blocks=2,
            map_tokens=16,
            bench_cases=(("train", 1),),
            bench_repeats=2,
            bench_warmup=0,
            bench_rounds=1,
        ),
        tasks=tasks_at_scale("micro"),
    ),
    "quick": CompareSpec(
        name="quick",
        description=(
            "about 5-8 minutes on 2 CPU cores: the 0.84M-parameter default model, 2 seeds × 250 steps × 16 × 64 "
            "tokens per variant, extrapolation to 16×, throughput, attention maps and the random-walk task"
        ),
        model={"dim": 128, "n_layers": 4, "n_heads": 4},
        train=TrainConfig(
            seq_len=64,
            batch_size=16,
            steps=250,
            warmup_steps=25,
            eval_interval=50,
            eval_windows=256,
            log_interval=10,
            checkpoint_interval=50,
            **_TRAIN_DEFAULTS,
        ),
        seeds=(0, 1),
        tasks=tasks_at_scale("quick"),
    ),
    "claims-one-size": CompareSpec(
        name="claims-one-size",
        description=(
            "every paper claim's experiment that a CPU can run, at one size (no primary can be decided at one; the "
            "claims ladder decides them), 60 minutes on 2 CPU cores (measured 2026-11-26 with "
            "/usr/bin/time -v, with two more MHA budgets than now: 23 of them language models, 14 passkey, 11 "
            "composition): 10 language-model variants "
            "× 3 seeds × 800 steps × 16 × 256 tokens of a 0.12M-parameter model with extrapolation to 16× (4,096 "
            "tokens), and the needles, passkey, denoising, graph and composition tasks with 5 seeds for the variants "
            "whose claims use them"
        ),
        # Issue 23: T ≥ 256, so that 16× reaches 4,096. A model this small learns more per second, not to a flat
        # loss: the calibration (dim 64, 2 layers, T = 256, lr 3e-3) still fell 0.029 nats over the last quarter of
        # 800 steps (3.3M tokens), 0.053 of 1,200 and about 0.02 of 4,800 (19.7M tokens, 400 s at 1 thread), so no
        # language-model claim passes the 0.02 gate at a size whose 36 runs fit in an hour; the ALiBi
        # extrapolation claims (gate 0.1) do.
        model={"dim": 64, "n_layers": 2, "n_heads": 4},
        train=TrainConfig(
            seq_len=256,
            batch_size=16,
            steps=800,
            warmup_steps=40,
            eval_interval=200,  # 50, 75 and 100% of training: the points the gap-stability gate reads
            eval_windows=1024,  # the gate's least (the split has 1,975 windows of 256)
            log_interval=20,
            checkpoint_interval=200,
            lr=3e-3,
            keep_checkpoints=1,
        ),
        seeds=(0, 1, 2),
        variants=claim_variants(one_size=True),
        evals=EvalSpec(bench_repeats=3),
        tasks=claim_tasks("claims"),
        task_seeds=(0, 1, 2, 3, 4),
    ),
    "gpu": CompareSpec(
        name="gpu",
        description=(
            "every claim on one CUDA GPU (sized from its token budget when it had 8 variants; not yet timed on a "
            "GPU): the claims' language-model variants × 3 seeds × 2,000 steps × 64 × 256 tokens of gpu-lm's "
            "10.7M-parameter model on pysource in bf16 autocast, and the claims' tasks at their standard and full "
            "budgets"
        ),
        model=_GPU_MODEL,
        train=TrainConfig(
            data=_GPU_DATA,
            seq_len=256,
            batch_size=64,
            steps=2000,
            warmup_steps=200,
            eval_interval=250,
            eval_windows=512,
            checkpoint_interval=500,
            **_GPU_TRAIN,
        ),
        seeds=(0, 1, 2),
        variants=claim_variants(one_size=True),
        evals=_GPU_EVALS,
        tasks=claim_tasks("standard"),
    ),
    "gpu-lm": CompareSpec(
        name="gpu-lm",
        description=(
            "the LM-loss claims on one CUDA GPU, what scripts/gpu_kit.sh runs (sized by the estimate in spec.py; "
            "the kit scales its steps to the time measured): mha, diff, selective and dcmha × 5 seeds × 2,000 "
            "steps × 64 × 512 tokens (65.5M per run) of a 10.7M-parameter model on pysource in bf16 autocast, "
            "the whole validation split scored"
        ),
        model=_GPU_MODEL,
        train=TrainConfig(
            data=_GPU_DATA,
            seq_len=512,
            batch_size=64,
            steps=2000,
            warmup_steps=200,
            eval_interval=500,
            eval_windows=_WHOLE_SPLIT_WINDOWS,
            checkpoint_interval=250,
            **_GPU_TRAIN,
        ),
        seeds=(0, 1, 2, 3, 4),
        variants=("mha+rope", "diff+rope", "selective+rope", "dcmha+rope"),
        evals=dataclasses.replace(_GPU_EVALS, bench_repeats=3),
    ),
    "standard": CompareSpec(
        name="standard",
        description=(
            "5-6 hours on 2 CPU cores (estimated from the quick calibration): 3 seeds × 1,500 steps × 16 × 128 "
            "tokens, longer evaluations, and MQAR, random walks and passkey retrieval trained from scratch"
        ),
        model={"dim": 128, "n_layers": 4, "n_heads": 4},
        train=TrainConfig(
            seq_len=128,
            batch_size=16,
            steps=1500,
            warmup_steps=100,
            eval_interval=100,
            eval_windows=512,
            checkpoint_interval=250,
            **_TRAIN_DEFAULTS,
        ),
        seeds=(0, 1, 2),
        evals=EvalSpec(extrapolation_blocks=8, bench_cases=(("train", 1), ("train", 8), ("prefill", 8))),
        tasks=tasks_at_scale("standard"),
    ),
    "full": CompareSpec(
        name="full",
        description=(
            "days on 2 CPU cores (estimated; meant for a GPU): a 3.3M-parameter model, 5 seeds × 4,000 steps × "
            "32 × 128 tokens, and every task at its full budget"
        ),
        model={"dim": 256, "n_layers": 4, "n_heads": 8},
        train=TrainConfig(
            seq_len=128,
            batch_size=32,
            steps=4000,
            warmup_steps=200,
            eval_interval=200,
            eval_windows=1024,
            checkpoint_interval=500,
            lr=1e-3,
            keep_checkpoints=1,
        ),
        seeds=(0, 1, 2, 3, 4),
        evals=EvalSpec(
            extrapolation_blocks=16,
            bench_cases=(("train", 1), ("train", 8), ("prefill", 16)),
            bench_repeats=7,
        ),
        tasks=tasks_at_scale("full"),
    ),
}


def _rung(
    ladder: str,
    name: str,
    model: dict[str, Any],
    steps: int,
    variants: tuple[str, ...],
    seeds: tuple[int, ...],
    train: dict[str, Any],
    tasks: tuple[TaskSpec, ...] = (),
) -> CompareSpec:
    """One size of a ladder: sequences of 256 tokens, warmup 5% of the steps, evaluations at every quarter (the
    gap-stability gate's 50, 75 and 100%) on 1,024 windows, no throughput bench (a ladder judges losses). ``train``
    holds what a ladder sets for all its sizes: its corpus, batch, learning rate and device. ``tasks`` (whose
    models do not depend on the rung's size) run with the rung's seeds."""
    return CompareSpec(
        name=name,
        description=f"{ladder} rung {name}",
        model=model,
        train=TrainConfig(
            seq_len=256,
            steps=steps,
            warmup_steps=steps // 20,
            eval_interval=steps // 4,
            eval_windows=1024,
            log_interval=20,
            checkpoint_interval=steps // 4,
            keep_checkpoints=1,
            **train,
        ),
        seeds=seeds,
        variants=variants,
        evals=EvalSpec(extrapolation_multiples=(1, 2), extrapolation_blocks=4, bench_cases=()),
        tasks=tasks,
    )


# The GPU ladder (issue 35): two sizes 2× apart with heads of 48, each rung one command of at most 8 minutes of a
# 15-minute H100 lease, machine start excluded, run by scripts/gpu_kit.sh --preset gpu-ladder --rung NAME
# (docs/jobs/gpu.md). Sizes: dim 192 with 4 heads of 48, 3 layers (1,377,600 parameters; the largest matched variant,
# selective, 1,378,758) and 6 layers with a SwiGLU width of 528 for 2× (2,761,152; selective 2,763,468). Four heads,
# not the example of 3 heads of 64: Diff pairs MHA's heads into heads of twice the size, so 3 heads gave it
# one head of 128 over 128 of the 192 dimensions (its MLP widened to match), a handicap no verdict should rest on; 4
# heads of 64 (dim 256) pair evenly, but their 2× rung estimates 6.6 minutes of training, more than a lease's call
# holds beside the machine's start. Heads of 48 sit between the CPU ladder's 24 and DCFormer's 64; the report states
# the head size each claim was judged at. Tokens: 888 and 1,780 steps × 128 × 256 = 29.1M and 58.3M, 21.1 tokens per
# parameter of the largest variant, so the kit may shrink a rung by a few percent and still meet gate (a)'s 20.
# Passes: pysource on the GPU image is at least the standard library's and torch's and transformers' sources (10.7M +
# 90.4M bytes, gpu-2026-11-26b), so at least 91M training tokens: at most 0.32 and 0.64 passes (the kit's corpus stage
# records the real figure). Learning rate 2e-3, between gpu-lm's 1e-3 at 10.7M and the CPU ladder's 3e-3 at 0.25M; T =
# 256 as the CPU ladder, with 128 sequences a step for gpu-lm's 32,768 tokens. Estimated time (not yet measured):
# gpu-lm's timed steps on an H100 (benchmarks/results/gpu-2026-11-25/timing.json, 32,768 tokens a step at 10.7M
# parameters: mha 34.0, diff 47.8, selective 38.7, dcmha 92.6 ms), each scaled by the ratio of FLOPs per token
# (attnzoo.model.training_flops_per_token) to the rung's: 3 seeds × 4 variants train in 1.2 and 4.8 minutes,
# evaluations a few seconds on top. Scaling by FLOPs flatters small models (their kernels are short, so launches and
# memory traffic weigh more), so each is a lower bound; the kit times 50 steps of each variant first and shrinks the
# steps rather than overrun, and the small rung's timing.json measures what the large one will cost.
_GPU_LADDER_TRAIN = {"data": _GPU_DATA, "batch_size": 128, "lr": 2e-3, "device": "cuda"}
_GPU_LADDER_RUN = (("mha+rope", "diff+rope", "selective+rope", "dcmha+rope"), (0, 1, 2), _GPU_LADDER_TRAIN)
_GPU_LADDER_SIZES = (
    ("small", {"dim": 192, "n_layers": 3, "n_heads": 4}, 888),
    ("large", {"dim": 192, "n_layers": 6, "n_heads": 4, "mlp_hidden_dim": 528}, 1780),
)
# ALiBi's claims on a GPU (issue 35): no CPU size of the ladder gets a sinusoidal model below the trigram level
# (SINUSOIDAL_CALIBRATION in attnzoo.claims.alibi), so its claims against sinusoidal positions run here, at the GPU
# ladder's two sizes and budgets: ALiBi and sinusoidal positions at L = 256, sinusoidal trained at 2L on the same
# tokens (+len2: 64 sequences of 512 a step) for alibi.short_matches_long, and RoPE, the baseline of the others.
# Every run is scored at L, 2L and 16L on the same tokens; the bench times ALiBi at L against sinusoidal at 2L, the
# claim's speed and memory. Estimated by the GPU ladder's method, ALiBi's and sinusoidal's models at MHA + RoPE's
# measured time per FLOP (no H100 step of them is stored), the sinusoidal one at 2L by its FLOPs at 2L: 3 seeds × 4
# variants train in 0.8 and 3.2 minutes, a lower bound as the GPU ladder's; the kit times 50 steps of each first.
_GPU_ALIBI_RUN = (("mha+rope", "mha+alibi", "mha+sinusoidal", "mha+sinusoidal+len2"), (0, 1, 2), _GPU_LADDER_TRAIN)
_GPU_ALIBI_EVALS = EvalSpec(
    extrapolation_multiples=(1, 2, 16), extrapolation_blocks=4, bench_cases=(("train", 1), ("train", 2)), bench_rounds=1
)


# The primaries' language models at two sizes 2× apart, each at about 21 tokens per parameter (Chinchilla's 20)
# read at most 1.15 times: 123,200 parameters (dim 64, 2 layers, 4 heads of 16) on 640 × 16 × 256 = 2.6M tokens and
# 250,848 (dim 96, 2 layers, 4 heads of 24, a SwiGLU width of 264 for 2× the smaller) on 1,280 steps, 5.2M tokens of
# Shakespeare's 4.55M-token training split. Four heads at both sizes: Diff pairs them into two of twice the size,
# and DCMHA composes four. Why not smaller: a 60,912-parameter rung (dim 48, heads of 12) at 21 tokens per
# parameter reached 2.41 nats/byte (mha, seed 0, 2026-11-27), far above the trigram level (2.03), so it cannot pass
# the competent-model gate. Five seeds: at three, Diff's and DCFormer's multiples were contradicted at each size but
# not after Holm's adjustment (0.054, 0.061; docs/ladder at 83ab204), and at 3 seeds of the small rung only,
# selective attention's gap there moved 0.011 over the last quarter (gate (c)), so its primary lost its second size.
# Cost, measured from clean clones with --executor local --jobs 2 and /usr/bin/time -v on 2 AMD EPYC cores: 53 min
# 20 s (1ee93ce, tasks included, 2026-11-29, 191% CPU, 721 MB peak; the small rung 13.8 min, the large 39.3 min) and
# 1 h 36 min 24 s (1d8af96, no tasks, 2026-11-28) on a machine whose runs trained 1.8× slower: the 90 minutes hold on
# the first and not on the second. With MQA uptrained beside GQA at α = 5, 10 and 20% on both rungs: 1 h 35 min 33 s
# (f743cb9, 2026-11-29, 682 MB), over the 90 minutes. So MQA is uptrained only where its claim is judged: at the large
# rung and Ainslie et al.'s α = 5% (gqa.mqa_behind_gqa). At the small rung both uptrained models stayed above the
# trigram level (MQA 2.2795, GQA 2.0606 against 2.027), so the claim was not measurable there, and MQA's 10 and 20%
# traced no claim; the runs' own times put the cut at 8.3 of those 95.5 minutes. GQA keeps its trace at both sizes.
# So cut: 1 h 21 min 9 s (d033df6, 2026-11-29, 191% CPU, 696 MB; MHA's 0.25M runs 249 s each, 300 s on 1d8af96's draw)
# and 1 h 5 min 20 s on 2 Xeon cores (9459c02, 2026-12-02, 193% CPU, 1.75 GB; MHA's 0.25M runs 188 s each).
_LADDER_MODELS = ("mha+rope", "diff+rope", "selective+rope", "dcmha+rope")
# GQA (2 kv heads) uptrained from each seed's MHA: Ainslie et al.'s α, and twice and 4× it
_GQA_UPTRAINED = tuple(f"mha+rope+kv2+up{fraction:g}" for fraction in (0.05, 0.1, 0.2))
_MQA_UPTRAINED = ("mha+rope+kv1+up0.05",)
_LADDER_SEEDS = (0, 1, 2, 3, 4)
_LADDER_TRAIN = {"batch_size": 16, "lr": 3e-3}
# Selective attention's two synthetic tasks ride on the largest rung: their runs take seconds (denoising 6.8 s, graph
# 0.9 s a run in the claims run of c76947c) and their baselines passed the task gate there on 5 of 5 seeds; the
# passkey, needles and composition tasks take about a minute a run and did not (docs/claims-one-size).
_LADDER_TASKS = tuple(task for task in claim_tasks("claims") if task.name in ("denoising", "graph"))
LADDERS: dict[str, LadderSpec] = {
    "claims": LadderSpec(
        name="claims",
        description=(
            "the papers' claims by their own protocol, the primaries at two sizes 2× apart (0.12M and 0.25M "
            "parameters, 21 tokens per parameter): MHA, Diff, selective, DCMHA, GQA uptrained with 5, 10 and 20% of "
            "the steps, at the larger size MQA with 5% × 5 seeds, evaluated at 50, 75 and 100% of training on 1,024 "
            "windows, and selective attention's denoising and graph tasks; meant for 90 minutes on 2 cores with "
            "--executor local --jobs 2 (65 minutes measured on 2 Xeon cores, 81 on 2 EPYC cores; by machine: "
            "docs/jobs/compare.md); the ablations and the learning-rate sweep are its rungs' parts (claims-ablations, "
            "claims-unmatched, claims-lr) or stand alone (claims-static, claims-stability)"
        ),
        rungs=(
            _rung(
                "claims",
                "small",
                {"dim": 64, "n_layers": 2, "n_heads": 4},
                640,
                (*_LADDER_MODELS, *_GQA_UPTRAINED),
                _LADDER_SEEDS,
                _LADDER_TRAIN,
            ),
            _rung(
                "claims",
                "large",
                {"dim": 96, "n_layers": 2, "n_heads": 4, "mlp_hidden_dim": 264},
                1280,
                (*_LADDER_MODELS, *_GQA_UPTRAINED, *_MQA_UPTRAINED),
                _LADDER_SEEDS,
                _LADDER_TRAIN,
                tasks=_LADDER_TASKS,
            ),
        ),
    ),
    "gpu-ladder": LadderSpec(
        name="gpu-ladder",
        description=(
            "the primary language-model claims on one CUDA GPU at two sizes 2× apart, heads of 48 (1.38M and 2.76M "
            "parameters, 21 tokens per parameter, pysource read at most once): MHA, Diff, selective and DCMHA × 3 "
            "seeds, one rung per 15-minute lease (scripts/gpu_kit.sh --preset gpu-ladder --rung small, then large); "
            "estimated 1.2 and 4.8 minutes of H100 training (scaled from gpu-lm's timed steps by FLOPs per token)"
        ),
        rungs=tuple(_rung("gpu-ladder", *size, *_GPU_LADDER_RUN) for size in _GPU_LADDER_SIZES),
    ),
    "gpu-alibi": LadderSpec(
        name="gpu-alibi",
        description=(
            "ALiBi's claims on one CUDA GPU at the GPU ladder's two sizes (1.38M and 2.76M parameters, heads of 48, "
            "21 tokens per parameter, pysource): RoPE, ALiBi and sinusoidal positions at L = 256, and sinusoidal "
            "trained at 2L on the same tokens, × 3 seeds, scored at L, 2L and 16L, with ALiBi's training speed and "
            "memory at L against sinusoidal's at 2L; one rung per 15-minute lease (scripts/gpu_kit.sh --preset "
            "gpu-alibi --rung small, then large); estimated 0.8 and 3.2 minutes of H100 training (scaled from "
            "gpu-lm's timed MHA steps by FLOPs per token)"
        ),
        rungs=tuple(
            dataclasses.replace(_rung("gpu-alibi", *size, *_GPU_ALIBI_RUN), evals=_GPU_ALIBI_EVALS)
            for size in _GPU_LADDER_SIZES
        ),
    ),
}


def _at_rung(rung: CompareSpec, name: str, description: str, variants: tuple[str, ...], **changes: Any) -> CompareSpec:
    """A comparison at a claims-ladder rung's model, schedule and seeds (a part of it, or one standing alone) that
    trains ``variants`` and no task; ``changes`` replace more of the rung's fields."""
    fields = {"tasks": (), **changes}
    return dataclasses.replace(rung, name=name, description=description, variants=Variant.parse_all(variants), **fields)


_SMALL, _LARGE = LADDERS["claims"].rungs


# Each ladder model at its own best learning rate (issue 53; attnzoo.claims.learning_rate): every claims-ladder run
# trains at 3e-3, the rate chosen for MHA, and a one-seed sweep (benchmarks/results/lr_sweep.md) had DCMHA best at
# 1e-2. The sweep is a part of the small rung (stored in the ladder's folder): each model at ×0.5, ×1 and ×2 that
# rate (+lr0.5, +lr2) × seeds 0 and 1. It trains its own ×1 runs: read against the rung's, trained on another CPU,
# DCMHA's ×0.5 looked best by 0.021 nats, and DCMHA retrained at ×1 on the sweep's machine ended 0.032 and 0.018 nats
# below the rung's at seeds 0 and 1 (−0.028 to +0.032 over 5 seeds: chaos between CPUs, not a shift), below its
# ×0.5. Each model's best multiple by validation loss then trains at the large rung (own_lr_rung: only the models
# whose best is not ×1, 3 seeds), where every primary is re-judged at each model's own rate beside the shared rate
# on the same seeds. Estimated from the stored ladder's per-run training times
# (docs/claims/*/results.json, d033df6's machine; small rung: MHA 77 s, Diff 79, selective 90, DCMHA 88; large: 249,
# 260, 283, 271) scaled by each rung's measured wall ÷ summed training under --executor local --jobs 2 (0.67 and
# 0.63): the sweep's 24 runs 22 minutes; the large rung 8.5 minutes per model that moves (7.8–8.9): 31 minutes when one
# moves, 56 if all four do, past the 45-minute budget: then nothing cheaper stays honest (a verdict needs 3 seeds at
# the large rung), so the run's own estimate, printed after the sweep, is what to decide on. Measured from a clean
# clone of 3f8d706 on the 2-core Xeon that ran the ladder in 65 minutes, nothing else running: 16 min 20 s; every
# model's best was ×1 (docs/claims/lr-sweep), so no large-rung run was needed. ALiBi joined the sweep after that run
# (30 runs, 17 min 10 s from a clean clone of 2c93b9a): alibi.in_distribution_vs_rope was decided at the shared rate,
# ALiBi never swept. Then the models of the other decided exploratory claims did (GQA from scratch, DCMHA's post- and
# pre-composition alone: 18 runs, 10 min 25 s from a clean clone of 50c06a7 with the first 30 merged by --merge-from;
# post-composition alone is best at ×2, every other model at ×1). A model outside the ladder is swept
# so that its verdicts say whether its own rate would move them; its own rate trains at no larger rung.
_SWEPT_MODELS = (
    *_LADDER_MODELS,
    "mha+alibi",
    "mha+rope+kv2",
    "dcmha[pre_compose=false]+rope",
    "dcmha[post_compose=false]+rope",
)
_LR_SWEEP = tuple(f"{model}+lr{multiple:g}" for model in _SWEPT_MODELS for multiple in (0.5, 2))
PRESETS["claims-lr"] = _at_rung(
    _SMALL,
    "claims-lr",
    (
        "each claims-ladder model's peak learning rate swept at the small rung (0.12M parameters), a part of it: "
        "MHA, Diff, selective, DCMHA, ALiBi, GQA from scratch and DCMHA's post- and pre-composition alone at ×0.5, "
        "×1 and ×2 the shared 3e-3 (+lr0.5, +lr2) × seeds 0 and 1; each ladder model's best multiple by validation "
        "loss then trains at the large rung (own_lr_rung) to re-judge every primary at each model's own rate; 27.6 "
        "minutes measured on 2 Xeon cores with --executor local --jobs 2 (in two runs of 30 and 18), and 8.5 more "
        "per ladder model whose best is not ×1"
    ),
    (*_SWEPT_MODELS, *_LR_SWEEP),
    seeds=(0, 1),
)
OWN_LR_SEEDS = (0, 1, 2)

# gqa.mqa_less_stable (issue 53): MQA against GQA, both from scratch, at a peak learning rate near the stability edge,
# counting loss spikes by the rule its claim states (attnzoo.claims.gqa.SPIKE_RULE), at the claims ladder's small
# rung × 5 seeds. The rate, 2e-2, is twice the largest at which benchmarks/results/lr_sweep.md trained every model
# (1e-2; one seed): a guess at the edge. Estimated from the small rung's MHA runs (77 s each, wall ÷ summed training
# 0.67 under --executor local --jobs 2): 10 runs, 8.6 minutes on 2 cores; measured from a clean clone of 389b882 on
# the Xeon: 8 min 27 s (a 4-minute test run beside it for part of the time). No run of either model spiked; both
# degraded, 5 of the 10 seeds ending above the trigram level.
PRESETS[STABILITY_PRESET] = _at_rung(
    _SMALL,
    STABILITY_PRESET,
    (
        "gqa.mqa_less_stable: MQA (one kv head) against GQA (two), both from scratch at the claims ladder's small "
        f"rung (0.12M parameters) at a peak learning rate of {STABILITY_LR:g} near the stability edge, × 5 seeds, "
        "loss spikes counted by the claim's stated rule; 8.5 minutes measured on 2 Xeon cores with --executor local "
        "--jobs 2"
    ),
    ("mha+rope+kv2", "mha+rope+kv1"),
    train=dataclasses.replace(_SMALL.train, lr=STABILITY_LR),
)


# A rung's parts (issue 53): comparisons at a ladder rung's model and schedule, run apart from the ladder and stored
# in its folder, where attnzoo.results.ladder.load_ladder merges each into its rung (the rung's record and runs, the
# part's variants added; the ladder's report names each part's commits and machine). So the ladder keeps its 90
# minutes, and each check costs its own runs only. The learning-rate sweep (claims-lr) is one. DCMHA's static
# composition alone (Talking-Heads Attention, the paper's Table 9 branch 1) is judged against the dynamic one trained
# beside it, on one machine and commit, so dcmha.dynamic_beats_static reads its own comparison (its report), as
# claims-stability's claim does: 10 runs at the small rung, estimated 9.8 minutes on 2 cores (its DCMHA runs, 88 s,
# wall ÷ summed training 0.67); measured from a clean clone of c440d57 on the Xeon: 6 min 5 s. No sweep had trained
# the static composition, so both models also train at ×0.5 and ×2 the shared rate (attnzoo.claims.learning_rate):
# the comparison holds its own sweep, and its report judges the claim at each model's own best rate as well: 30 runs,
# measured from a clean clone of d0617e4 on the 2-core EPYC: 17 min 40 s (both models best at ×1).
_STATIC_MODELS = ("dcmha+rope", STATIC_ONLY)
PRESETS["claims-static"] = _at_rung(
    _SMALL,
    "claims-static",
    (
        "dcmha.dynamic_beats_static at the claims ladder's small rung (0.12M parameters): DCMHA against its static "
        "composition alone (the paper's branch 1, Talking-Heads Attention), both matched to MHA, each at ×0.5, ×1 "
        "and ×2 the shared rate × 5 seeds, so the verdict is checked at each model's own best rate; 17.7 "
        "minutes measured on 2 EPYC cores with --executor local --jobs 2"
    ),
    (*_STATIC_MODELS, *(f"{model}+lr{multiple:g}" for model in _STATIC_MODELS for multiple in (0.5, 2))),
)
# alibi.extrapolation_vs_rope: RoPE and ALiBi at the small rung's model and schedule, scored at 16L (4,096 tokens) as
# well as the rung's L and 2L, on the same tokens. It stands alone, as claims-static does, since a part of a rung
# scores what the rung scores: its own report judges the claim on its own RoPE runs, which on one machine and commit
# equal the rung's. Estimated from the stored runs' training times on the Xeon (small rung MHA 60-70 s, ALiBi 50-56 s;
# wall ÷ summed training 0.67): 10 runs, 7 minutes on 2 cores, the 16L scoring seconds on top. Measured from a clean
# clone of a1abb8c on the Xeon: 5 min 16 s.
# Like claims-static it holds its own sweep: both models at ×0.5, ×1 and ×2 the shared rate, so its report checks
# the verdicts at each model's own best rate: 30 runs, measured from a clean clone of f9e0d47 on the 2-core EPYC:
# 17 min 53 s (both models best at ×1).
_EXTRAPOLATION_MODELS = ("mha+rope", "mha+alibi")
PRESETS[EXTRAPOLATION_PRESET] = _at_rung(
    _SMALL,
    EXTRAPOLATION_PRESET,
    (
        "alibi.extrapolation_vs_rope at the claims ladder's small rung (0.12M parameters): RoPE against ALiBi, each "
        "at ×0.5, ×1 and ×2 the shared rate × 5 seeds, so the verdict is checked at each model's own best rate, "
        "each scored at L, 2L and 16L (4,096 tokens) on the same tokens; 17.9 minutes measured on 2 EPYC cores with "
        "--executor local --jobs 2"
    ),
    (*_EXTRAPOLATION_MODELS, *(f"{m}+lr{multiple:g}" for m in _EXTRAPOLATION_MODELS for multiple in (0.5, 2))),
    evals=dataclasses.replace(_SMALL.evals, extrapolation_multiples=(1, 2, 16)),
)
# DCMHA as DCFormer pairs it, its composition on top of MHA's MLP (dcmha.compute_equivalence_unmatched): a part of
# the large rung, read off the ladder's MHA across the sizes: 5 runs, estimated 14.2 minutes on 2 cores (the large
# rung's DCMHA runs, 271 s each, wall ÷ summed training 0.63); measured from a clean clone of 389b882 on the Xeon:
# 10 min 22 s (its runs 173-200 s each, the fifth alone on one core).
PRESETS["claims-unmatched"] = _at_rung(
    _LARGE,
    "claims-unmatched",
    (
        "dcmha.compute_equivalence_unmatched, a part of the claims ladder's large rung (0.25M parameters): DCMHA "
        "with its composition on top of MHA's MLP, as DCFormer pairs them, × 5 seeds, judged against the ladder's "
        "MHA across the sizes when stored in the ladder's folder; 10.4 minutes measured on 2 Xeon cores with "
        "--executor local --jobs 2"
    ),
    (UNMATCHED,),
)


# The exploratory claims whose models the ladder does not train (issue 53), a part of the small rung, read against
# the rung's MHA, DCMHA and selective runs: GQA from scratch (gqa.close_to_mha), ALiBi (alibi.in_distribution_vs_rope)
# and the one-size ablations (attnzoo.claims.protocol.ABLATIONS: DCMHA's post- and pre-composition alone and its
# query-wise composition, selective attention without its position temperature). A CPU step of each at this size
# costs about what MHA's does (thread CPU time of one training step at the rung's model and batch on the Xeon,
# 9459c02: MHA 119 ms, DCMHA 177, query-wise 147, post alone 129, pre alone 128, selective without its position
# temperature 148, ALiBi 104, GQA 112), so the ablations need no GPU at this size. Estimated from the small rung's
# per-run times (MHA 77 s, DCMHA 88, selective 90; wall ÷ summed training 0.67): 30 runs, 28 minutes on 2 cores.
# Measured from a clean clone of 441201d on the Xeon that ran the ladder in 65 minutes: 20 min 16 s.
_SMALL_RUNG_EXTRAS = ("mha+rope+kv2", "mha+alibi", *(v for v in claim_variants(ABLATIONS) if v not in _LADDER_MODELS))
PRESETS["claims-ablations"] = _at_rung(
    _SMALL,
    "claims-ablations",
    (
        "the exploratory claims whose models the claims ladder does not train, a part of its small rung (0.12M "
        "parameters): GQA (2 kv heads) from scratch, ALiBi, DCMHA's post- and pre-composition alone and its "
        "query-wise composition, selective attention without its position temperature × 5 seeds, judged against "
        "the rung's MHA, DCMHA and selective runs when stored in the ladder's folder; 20 minutes measured on 2 "
        "Xeon cores with --executor local --jobs 2"
    ),
    _SMALL_RUNG_EXTRAS,
)


# The small rung's exploratory claims that its seeds could not decide, at the large rung (0.25M parameters), a part
# of it. dcmha.post_beats_pre was stopped by gate (d) alone (post-composition alone had 3 seeds above the trigram
# level, pre-composition alone 1), while post-alone minus pre-alone was positive on every seed (+0.0005 to +0.078
# nats, docs/claims/ablations). gqa.close_to_mha was inconclusive (−0.022 [−0.095, +0.050]) and
# dcmha.query_wise_slightly_worse stopped by gate (c) (its gap moved 0.0105): MHA's five seeds spread 0.15 nats at
# the small rung and 0.008 at the large, where every model beats the trigram level. So the same models train there,
# read against each other and the rung's MHA and DCMHA. Estimated from the large rung's runs on the Xeon (DCMHA
# 206-231 s each, MHA 184-195; wall ÷ summed training 0.63): 20 runs, 27 minutes on 2 cores. Measured from clean
# clones on the Xeon in two halves: post- and pre-composition alone at 389b882 (10 runs, 15 min 47 s), then GQA and
# query-wise at 7e787f4 with the first half merged (--merge-from, --pool-commits; 10 runs, 15 min 54 s): 31 min 41 s.
_LARGE_RUNG_CLAIMS = ("dcmha.post_beats_pre", "gqa.close_to_mha", "dcmha.query_wise_slightly_worse")
_LARGE_RUNG_EXTRAS = tuple(
    dict.fromkeys(
        label
        for claim in _LARGE_RUNG_CLAIMS
        for label in (CLAIMS[claim].variant, CLAIMS[claim].baseline)
        if label not in _LARGE.variant_labels
    )
)
PRESETS["claims-ablations-large"] = _at_rung(
    _LARGE,
    "claims-ablations-large",
    (
        "the small rung's undecided exploratory claims at the claims ladder's large rung (0.25M parameters), a part "
        "of it: DCMHA's post- and pre-composition alone, GQA (2 kv heads) from scratch and DCMHA's query-wise "
        "composition × 5 seeds, read against each other and the rung's MHA and DCMHA when stored in the ladder's "
        "folder; 32 minutes measured on 2 Xeon cores with --executor local --jobs 2"
    ),
    _LARGE_RUNG_EXTRAS,
)


# What trains at the large rung: the ladder's models and its ablations part's (claims-ablations-large).
_AT_LARGE_RUNG = (*_LADDER_MODELS, *_LARGE_RUNG_EXTRAS)


def own_lr_rung(best: Mapping[str, float]) -> CompareSpec | None:
    """The claims ladder's large rung with each model it trains (its own or its ablations part's) whose best
    learning-rate multiple (``best``, from :func:`attnzoo.claims.learning_rate.best_learning_rates`) is not ×1 at
    that multiple, × :data:`OWN_LR_SEEDS`; None when every one's best is ×1, so the rung's own runs answer the
    check. A swept model the rung does not train (ALiBi) stays out. Run it with ``run_compare(own_lr_rung(best),
    out)``."""
    moved = [
        dataclasses.replace(Variant.parse(model), lr=multiple)
        for model, multiple in best.items()
        if multiple != 1 and model in _AT_LARGE_RUNG
    ]
    if not moved:
        return None
    return dataclasses.replace(
        _LARGE,
        name="claims-lr-large",
        description="claims-lr: the claims ladder's large rung, each model whose best learning rate is not ×1 at it",
        variants=tuple(moved),
        seeds=OWN_LR_SEEDS,
        tasks=(),
    )


# The one-size ablations (issue 35) on a GPU: the claims registered for this preset (attnzoo.claims.protocol.
# ABLATIONS: DCMHA post- against pre-composition and query-wise alone, selective attention with and without its
# position temperature) at the GPU ladder's small rung, 3 seeds, one call of a lease (scripts/gpu_kit.sh --preset
# gpu-ablations). Its seven variants, four of them DCMHA, estimate 2.7 minutes of H100 training by the GPU ladder's
# method (gpu-lm's timed steps scaled by FLOPs per token, a lower bound); the kit times them first and shrinks the
# steps rather than overrun.
PRESETS["gpu-ablations"] = dataclasses.replace(
    LADDERS["gpu-ladder"].rungs[0],
    name="gpu-ablations",
    description=(
        "DCFormer's and selective attention's ablations on one CUDA GPU at one size, the GPU ladder's small rung "
        "(1.38M parameters, heads of 48, 21 tokens per parameter, pysource): MHA, DCMHA whole, post- and "
        "pre-composition alone and query-wise, selective attention with and without its position temperature × 3 "
        "seeds; estimated 2.7 minutes of H100 training"
    ),
    variants=Variant.parse_all(claim_variants(ABLATIONS)),
)

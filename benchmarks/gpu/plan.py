"""The lease's plan: how each case is run and timed (:class:`Settings`), the sizes, and every case in the order
they run (:func:`plan_cases`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import bench_dcmha_triton

from attnzoo import ModelConfig
from attnzoo.variants import Variant, matched_configs

from gpu import kit

MEASURED, SKIPPED, ERROR, CUT_OFF, NOT_RUN = "measured", "skipped", "error", "cut off", "not run"
# Issue 36's priority: the mechanisms' training, the DCMHA layer against flash attention, decoding, the nanoGPT anchor
GROUPS = (1, 4, 3, 2, 5)
MECHANISMS = ("mha", "dcmha", "diff", "selective")
# The kernels timed by name besides each mechanism's default ("auto"; DCMHA's is its Triton kernel, so it runs named).
NAMED_KERNELS = {"dcmha": ("dcmha-triton", "chunked"), "diff": ("diff-halves", "diff-stacked")}
# Eager first, every mechanism, since a compile costs what several eager cases do; DCMHA on the chunked PyTorch path
# before its kernel (the cheap route, the one the official DCFormer code takes), and the kernel's cases after
# the other mechanisms', since its first call autotunes it (a compile per config); Diff's one-call layouts come last
# when compiled, where the budget may cut them before selective.
EAGER_ORDER = (
    "mha",
    "dcmha[chunked]",
    "diff",
    "diff[diff-halves]",
    "diff[diff-stacked]",
    "selective",
    "dcmha[dcmha-triton]",
)
COMPILED_ORDER = (
    "mha",
    "dcmha[chunked]",
    "diff",
    "selective",
    "dcmha[dcmha-triton]",
    "diff[diff-halves]",
    "diff[diff-stacked]",
)
# The DCMHA layer against MHA on flash attention (bench_dcmha_triton's paths), eager, then compiled (the Triton kernel
# as a custom operator inside the layer's graph).
LAYER_PATHS = (
    ("mha-flash", False),
    ("dcmha-triton", False),
    ("dcmha-pytorch", False),
    ("dcmha-triton", True),
    ("mha-flash", True),
    ("dcmha-pytorch", True),
)
RATIO_SIZES = ("gpu-lm", "185m")  # the sizes whose training cases are ratios to MHA's
DECODE_PATHS = ("eager", "compiled")
DECODE_BATCHES = (1, 16)


@dataclass(frozen=True)
class Settings:
    """How every case is run and timed."""

    device: str
    dtype: str  # training's autocast dtype and decoding's weights: "bfloat16" on CUDA, "float32" in the dry run
    compile_backend: str  # torch.compile's: "inductor"; the dry run's "eager" traces with dynamo alone
    warmup_steps: int  # untimed training steps, the first of which compiles
    rounds: int  # timed rounds of a training case: the spread is theirs
    steps_per_round: int
    decode_context: int
    decode_new_tokens: int
    decode_repeats: int
    test_args: tuple[str, ...]  # narrows the tests' pytest (kit.gpu_tests_command)


@dataclass(frozen=True)
class Sizes:
    lm: ModelConfig  # the gpu-lm baseline (MHA), which every mechanism is matched to
    lm_batch: int
    anchor: ModelConfig  # the nanoGPT-124M-like MHA
    anchor_batch: int
    large: ModelConfig  # the 185M MHA of the earlier leases' speed checks, which DCMHA is matched to there
    large_batch: int
    seq_len: int
    layer_dim: int  # the DCMHA layer bench's: one layer of layer_heads heads at layer_seq_len
    layer_heads: int
    layer_seq_len: int
    layer_batch: int


@dataclass(frozen=True)
class Case:
    name: str
    group: int
    kind: str  # "train", "layer" or "decode"
    size: str  # "gpu-lm", "nanogpt-124m", "185m" or "dcmha-layer"
    label: str  # the mechanism, with the kernel it names: "mha", "dcmha[chunked]"; a layer case's path
    config: ModelConfig
    batch_size: int
    seq_len: int
    compiled: bool

    @property
    def mode(self) -> str:
        return "compiled" if self.compiled else "eager"

    @property
    def similar(self) -> tuple[str, str, bool]:
        """The cases whose time predicts this one's."""
        return self.kind, self.size, self.compiled


GPU_SETTINGS = Settings("cuda", "bfloat16", "inductor", 3, 5, 5, 512, 64, 3, ())
DRY_RUN_SETTINGS = Settings("cpu", "float32", "eager", 2, 2, 1, 16, 8, 1, kit.DRY_RUN_TESTS)
GPU_SIZES = Sizes(
    lm=ModelConfig(vocab_size=256, dim=384, n_layers=6, n_heads=6, max_seq_len=1024),
    lm_batch=32,
    anchor=ModelConfig(
        vocab_size=50304,
        dim=768,
        n_layers=12,
        n_heads=12,
        mlp="gelu",
        norm="layernorm",
        position="learned",
        max_seq_len=1024,
    ),
    anchor_batch=12,
    # gpu_check's speed plan (benchmarks/gpu/check/plan.py): MHA's MFU there was 22.7-24.4% eager.
    large=ModelConfig(vocab_size=32768, dim=1024, n_layers=12, n_heads=16, max_seq_len=1024),
    large_batch=16,
    seq_len=1024,
    layer_dim=bench_dcmha_triton.DIM,
    layer_heads=bench_dcmha_triton.HEADS,
    layer_seq_len=2048,
    layer_batch=8,  # bench_dcmha_triton's 16,384 tokens a step
)
DRY_RUN_SIZES = Sizes(
    lm=ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, max_seq_len=32),
    lm_batch=2,
    anchor=ModelConfig(
        vocab_size=128, dim=48, n_layers=2, n_heads=2, mlp="gelu", norm="layernorm", position="learned", max_seq_len=32
    ),
    anchor_batch=2,
    large=ModelConfig(vocab_size=128, dim=64, n_layers=2, n_heads=4, max_seq_len=32),
    large_batch=2,
    seq_len=32,
    layer_dim=64,
    layer_heads=4,
    layer_seq_len=48,
    layer_batch=2,
)


def plan_cases(sizes: Sizes, groups: Sequence[int] = GROUPS) -> list[Case]:
    """Every case, in the order they run: ``groups`` in the order given."""
    matched = matched_configs([Variant(m, "rope") for m in MECHANISMS], sizes.lm)
    large_dcmha = matched_configs([Variant("dcmha", "rope")], sizes.large)["dcmha+rope"]
    auto = {mechanism: matched[f"{mechanism}+rope"] for mechanism in MECHANISMS}
    by_label = {label: cfg for label, cfg in auto.items() if label != "dcmha"}
    for mechanism, kernels in NAMED_KERNELS.items():
        for kernel in kernels:
            by_label[f"{mechanism}[{kernel}]"] = dataclasses.replace(auto[mechanism], attn_backend=kernel)

    def train(size: str, label: str, cfg: ModelConfig, batch: int, compiled: bool, group: int) -> Case:
        mode = "compiled" if compiled else "eager"
        return Case(f"{size} {label} {mode}", group, "train", size, label, cfg, batch, sizes.seq_len, compiled)

    def layer(path: str, compiled: bool) -> Case:
        cfg = bench_dcmha_triton.layer_config(path, "G", sizes.layer_seq_len, sizes.layer_dim, sizes.layer_heads)
        mode = "compiled" if compiled else "eager"
        return Case(f"layer {path} {mode}", 4, "layer", "dcmha-layer", path, cfg, sizes.layer_batch,
                    sizes.layer_seq_len, compiled)  # fmt: skip

    cases = {
        1: [train("gpu-lm", label, by_label[label], sizes.lm_batch, False, 1) for label in EAGER_ORDER]
        + [train("gpu-lm", label, by_label[label], sizes.lm_batch, True, 1) for label in COMPILED_ORDER],
        4: [layer(path, compiled) for path, compiled in LAYER_PATHS],
        3: [
            Case(f"decode {mechanism} batch {batch}", 3, "decode", "gpu-lm", mechanism, cfg, batch, 0, True)
            for mechanism, cfg in auto.items()
            for batch in DECODE_BATCHES
        ],
        2: [train("nanogpt-124m", "mha", sizes.anchor, sizes.anchor_batch, compiled, 2) for compiled in (False, True)]
        + [
            train("185m", label, cfg, sizes.large_batch, compiled, 2)
            for label, cfg, compiled in (
                ("mha", sizes.large, True),
                ("dcmha[chunked]", dataclasses.replace(large_dcmha, attn_backend="chunked"), True),
                ("mha", sizes.large, False),
                ("dcmha[dcmha-triton]", dataclasses.replace(large_dcmha, attn_backend="dcmha-triton"), False),
            )
        ],
    }
    return [case for group in groups for case in cases.get(group, [])]

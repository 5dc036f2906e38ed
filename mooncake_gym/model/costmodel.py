"""Cost model: the single source of every time in mooncake-gym.

Prefill compute time, KV-cache load time from a storage tier, KV transfer time between
instances and decode time all come from here; the simulators and the baselines' estimates call
these functions and never carry a second formula.

Every assumed constant lives in this module, in the block below, with its source; the NVLink
all-reduce figures per GPU kind and TP degree in ``interconnect.json`` beside it.

One forward iteration by component is :func:`iteration_breakdown` (``from
mooncake_gym.model.costmodel import iteration_breakdown``; the old top-level path
``mooncake_gym.costmodel`` still resolves, with the DeprecationWarning of every moved module).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

# --------------------------------------------------------------------------------------------
# Assumed constants (one place; each with its source)
# --------------------------------------------------------------------------------------------
BYTES_PER_BF16 = 2
#: Peak dense BF16 throughput per GPU, FLOP/s. A100/A800: 312 TFLOPS (NVIDIA A100 datasheet;
#: Mooncake v3 §8 uses A800-SXM4-80GB). H100/H800 SXM: 989 TFLOPS dense (NVIDIA H100 datasheet).
GPU_PEAK_BF16_FLOPS = {
    "A100": 312e12,
    "A800": 312e12,
    "H100": 989e12,
    "H800": 989e12,
}
#: Model FLOPs utilisation of prefill. The lecture's script assumes 60 % (lecture.md).
DEFAULT_MFU = 0.6
#: Node-level bandwidths (bytes/s) of the places a KV cache can be read from, for an 8-GPU node.
#: One GPU gets 1/8 of a node's figure (lecture.md, demo 1).
NODE_TIER_BANDWIDTH = {
    # HBM2e of 8 A800-80GB, 2.0 TB/s each (NVIDIA A100 80GB datasheet); a cache already in GPU
    # memory needs no load, this figure only makes the tier complete.
    "gpu": 8 * 2.0e12,
    # Host-to-device bandwidth B_h2d = 128 GB/s per node (Mooncake FAST'25, Table 1).
    "dram": 128e9,
    # Assumption: 8 PCIe 4.0 NVMe drives at 5 GB/s sustained sequential read each (datasheets of
    # e.g. Samsung PM1733 quote 7 GB/s peak; 5 GB/s is a sustained, conservative figure).
    "ssd": 8 * 5e9,
    # Another machine's DRAM over RDMA: 800 Gbps per node (Mooncake v3 §2, FAST'25 Table 1:
    # B_nic = 800 Gbps = 4 x 200 Gbps NICs).
    "rdma": 800e9 / 8,
}
TIERS = tuple(NODE_TIER_BANDWIDTH)
#: The SSD tier of a node's KV store (``ClusterPreset.ssd_cache_blocks``, off by default): PCIe 4.0
#: NVMe drives of 3.84 TB reading 7.0 GB/s sequentially each (Samsung PM1733 datasheet: 7,000 MB/s
#: sequential read; the PCIe 4.0 x4 ceiling is about 7.9 GB/s), ``NVME_DRIVES_PER_NODE`` of them per
#: node (an assumption; Mooncake's papers publish no drive count). Demo 1's ``"ssd"`` tier above keeps
#: the lecture's conservative 5 GB/s per drive.
NVME_READ_BANDWIDTH = 7.0e9
NVME_DRIVE_BYTES = 3.84e12
NVME_DRIVES_PER_NODE = 4
GPUS_PER_NODE = 8
#: Fixed latency of one inter-instance KV transfer (connection set-up, descriptor exchange).
#: Assumption: 1 ms, the order of magnitude of an RDMA transfer engine's per-batch set-up cost.
DEFAULT_TRANSFER_LATENCY_S = 1e-3
#: Fixed per-request prefill overhead (scheduling, kernel launch). Assumption: 0 by default, so
#: that demo 1's figures are the pure compute times the lecture prints; set it per instance.
DEFAULT_PREFILL_OVERHEAD_S = 0.0
#: Tokens per KV block in Mooncake's public traces (traces/README.md; FAST'25 §4).
BLOCK_TOKENS = 512

# -- figures of the realistic presets (``InstanceSpec(realistic=True)``; the lecture's toy uses none) --
GIB = 2**30
#: GPU memory (HBM) per GPU, bytes: 80 GB on A100/A800-SXM4-80GB and H100/H800-SXM5 (NVIDIA
#: datasheets; 81,920 MiB as nvidia-smi reports it).
GPU_HBM_BYTES = {"A100": 80 * GIB, "A800": 80 * GIB, "H100": 80 * GIB, "H800": 80 * GIB}
#: Peak HBM bandwidth per GPU, bytes/s: A100/A800 80GB SXM 2,039 GB/s (NVIDIA A100 datasheet);
#: H100/H800 SXM5 3.35 TB/s (NVIDIA H100 datasheet).
GPU_HBM_BANDWIDTH = {"A100": 2.039e12, "A800": 2.039e12, "H100": 3.35e12, "H800": 3.35e12}
#: All-reduce over NVLink inside a node, per GPU kind and tensor-parallel degree: ``{gpu: {"busbw":
#: {tp: bytes/s}, "latency_s": {tp: s}}}``, read from ``interconnect.json`` beside this module (each
#: figure with its published source there: nccl-tests runs on 8x A100 / H100 / H800 and NVIDIA's
#: figures). Not fitted to end-to-end latencies (docs/calibration.md checks them against nccl-tests
#: tables they were not taken from). Another GPU is added by adding an entry to that file.
INTERCONNECT_PATH = Path(__file__).with_name("interconnect.json")


def _load_interconnect(path: Path = INTERCONNECT_PATH) -> dict:
    raw = json.loads(path.read_text())
    table = {}
    for gpu, entry in raw["gpus"].items():
        table[gpu] = {key: {int(tp): float(v) for tp, v in entry[key].items()} for key in ("busbw", "latency_s")}
    return table


INTERCONNECT: dict[str, dict[str, dict[int, float]]] = _load_interconnect()


def allreduce_figures(gpu: str, tp: int) -> tuple[float, float]:
    """``(latency_s, busbw)`` of one NVLink all-reduce among ``tp`` GPUs of kind ``gpu``: the listed
    TP degree, or the nearest listed one above it (the largest if none)."""
    entry = INTERCONNECT.get(gpu)
    if entry is None:
        raise ValueError(f"gpu: no interconnect figures for {gpu!r}; expected one of {sorted(INTERCONNECT)}")
    out = []
    for key in ("latency_s", "busbw"):
        by_tp = entry[key]
        above = [d for d in by_tp if d >= tp]
        out.append(by_tp[min(above) if above else max(by_tp)])
    return out[0], out[1]


def allreduce_s(gpu: str, tp: int, nbytes: float) -> float:
    """Seconds of one all-reduce of ``nbytes`` bytes among ``tp`` GPUs: per-call latency plus the
    ring's ``2 (tp - 1) / tp x nbytes`` over the bus bandwidth (nccl-tests' definition of busbw);
    0 on one GPU."""
    if tp <= 1:
        return 0.0
    latency, busbw = allreduce_figures(gpu, tp)
    return latency + 2 * (tp - 1) / tp * nbytes / busbw


#: Share of peak HBM bandwidth that streaming the weights reaches in decode. Calibrated: 0.7
#: (gpt-fast measures 56-73 % of A100's 2,039 GB/s for LLaMA2-70B at batch 1; docs/calibration.md).
DEFAULT_MEMORY_EFFICIENCY = 0.7
#: Fixed cost of one model iteration of the lecture's InstanceSpec default (its decode steps are
#: not used: the lecture's decode reserves a fixed TBT). The realistic presets take an engine's
#: figure from ``ENGINE_OVERHEAD_S``.
DEFAULT_ITERATION_OVERHEAD_S = 4e-3
#: The serving engine's own cost per model iteration (scheduling, input preparation, kernel launches
#: of a step not captured in a CUDA graph, sampling, detokenisation), seconds: a named parameter of
#: the realistic presets, bracketing the published range. ``fast``: fitted to lmdeploy's (TurboMind)
#: LLaMA2-70B decode on 4x A100; ``slow``: fitted to the fit half of Splitwise's profile (its own
#: engine). docs/calibration.md (``python -m mooncake_gym.analysis.calibration``) refits both.
ENGINE_OVERHEAD_S = {"fast": 7.4e-3, "slow": 22.7e-3}
#: The serving engine's attention kernels: their FLOPs at this share of ``mfu``. ``fast``: a
#: FlashAttention-2 engine: FlashAttention-2's forward pass reaches 50-73 % of A100's peak FLOP/s
#: (Dao, "FlashAttention-2", 2023, §4.1); 50 % of peak at the fitted MFU of 0.8 is 0.625 (not fitted:
#: no fast engine's long-prompt figures are in the calibration). ``slow``: fitted to Splitwise's
#: profile, whose prompt times grow much faster than their FLOPs (docs/calibration.md).
ENGINE_ATTENTION_EFFICIENCY = {"fast": 0.625, "slow": 0.0878}
#: The engine the realistic presets assume.
DEFAULT_ENGINE = "fast"
#: The realistic presets' efficiencies, fitted to the fit half of docs/calibration.md's points
#: (``mooncake_gym.analysis.calibration.fit``; the validation half was held back):
#: MFU of the linear layers' GEMMs (Vidur's profiled GEMMs on A100 reach 77 %; TensorRT-LLM's
#: LLaMA2-70B prefill of 2,048 tokens on 4x A100 reaches 61 % end to end, overheads included).
REALISTIC_MFU = 0.8
#: Share of peak HBM bandwidth of the weights' streaming and the element-wise kernels (the fit's
#: upper bound, 0.9: STREAM-like kernels reach about 90 % of peak).
REALISTIC_MEMORY_EFFICIENCY = 0.9
#: Share of peak HBM bandwidth of decode's KV reads (paged attention over many short sequences).
REALISTIC_KV_READ_EFFICIENCY = 0.249
#: Fixed per-request prefill overhead of the realistic presets (tokenisation, scheduling, the first
#: token's sampling and its return). Assumption: 20 ms.
REALISTIC_PREFILL_OVERHEAD_S = 20e-3
#: Prefill chunk size of the realistic presets, tokens: a prompt is prefilled in chunks of this many
#: tokens, each one model iteration (chunked prefill; Mooncake v3 §5.1 prefills long contexts in
#: chunks, pipelined over several nodes: the pipelining is left out). Assumption: 8,192.
DEFAULT_CHUNK_TOKENS = 8192
#: Realistic presets: attention's FLOPs run at this share of ``mfu`` (attention kernels reach a
#: lower utilisation than the linear layers' GEMMs). Calibrated: 0.25 (docs/calibration.md; long
#: prompts' prefill grows faster than their linear FLOPs in Splitwise's profile).
DEFAULT_ATTENTION_EFFICIENCY = 0.25
#: Share of peak HBM bandwidth that decode's KV reads (paged attention over many short sequences)
#: reach, below the weights' streaming. Calibrated (docs/calibration.md): lmdeploy's LLaMA2-70B
#: decode on 4x A100 slows by about 0.38 ms per request of 3,072 tokens of context.
DEFAULT_KV_READ_EFFICIENCY = 0.35
#: Share of GPU memory left out of the KV cache (activations, CUDA graphs, fragmentation): vLLM's
#: default ``gpu_memory_utilization`` is 0.9.
DEFAULT_MEMORY_RESERVE = 0.1


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer with grouped-query attention and an MLP of ``mlp_matrices``
    ``d_model x d_ff`` matrices (3: gated, as LLaMA's SwiGLU; 2: BLOOM's GELU MLP)."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_ff: int
    vocab: int
    tied_embeddings: bool
    mlp_matrices: int = 3

    # derived figures are cached_property (computed once per frozen config): the cost model is on
    # the simulators' hot path
    @cached_property
    def params_per_layer(self) -> int:
        """Weights of one layer: Q, K, V, O projections and the MLP (norms ignored)."""
        q = self.d_model * self.n_heads * self.d_head
        kv = 2 * self.d_model * self.n_kv_heads * self.d_head
        o = self.n_heads * self.d_head * self.d_model
        mlp = self.mlp_matrices * self.d_model * self.d_ff
        return q + kv + o + mlp

    @property
    def n_params(self) -> int:
        """Total parameter count including embeddings (and the LM head unless tied)."""
        embeddings = self.vocab * self.d_model * (1 if self.tied_embeddings else 2)
        return self.n_layers * self.params_per_layer + embeddings

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token over all layers, in BF16."""
        return 2 * self.n_layers * self.n_kv_heads * self.d_head * BYTES_PER_BF16

    @cached_property
    def flop_coefficients(self) -> tuple[float, float]:
        """``(linear, attention)``: prefilling tokens ``h..n`` of an ``n``-token prompt takes
        ``linear * (n - h) + attention * (n (n + 1) - h (h + 1))`` FLOPs per layer (see
        :meth:`prefill_flops`)."""
        return 2.0 * self.params_per_layer, 2.0 * self.n_heads * self.d_head

    def elementwise_bytes_per_token(self, tp: int) -> int:
        """HBM bytes one GPU of a ``tp``-way tensor-parallel group reads and writes per token per layer
        in the element-wise kernels, in BF16: two RMS norms (read + write ``d_model``), two residual
        adds (two reads, one write), rotary embedding of this GPU's Q and K heads (read + write) and
        the MLP's activation (gate and up read, product written: ``3 d_ff / tp``)."""
        norms_and_residuals = (2 * 2 + 2 * 3) * self.d_model
        rotary = 2 * (self.n_heads + self.n_kv_heads) * self.d_head // tp
        activation = 3 * self.d_ff // tp
        return BYTES_PER_BF16 * (norms_and_residuals + rotary + activation)

    def prefill_flops(self, n_tokens: int, cached_tokens: int = 0) -> float:
        """FLOPs to prefill tokens ``cached_tokens..n_tokens`` of an ``n_tokens`` prompt.

        Linear layers: 2 FLOPs per weight per computed token. Causal attention: token i (0-based)
        attends to i + 1 keys, costing 4 * n_heads * d_head FLOPs per key (QK^T and AV) per layer.
        The LM head runs on the last token only and is negligible; it is left out.
        """
        check_prefill_tokens(n_tokens, cached_tokens)
        h, n = cached_tokens, n_tokens
        linear, attention = self.flop_coefficients
        # sum_{i=h}^{n-1} (i + 1) = (n (n + 1) - h (h + 1)) / 2
        return self.n_layers * (linear * (n - h) + attention * (n * (n + 1) - h * (h + 1)))


def check_prefill_tokens(n_tokens: int, cached_tokens: int) -> None:
    """``ValueError`` unless ``0 <= cached_tokens <= n_tokens``."""
    if n_tokens < 0:
        raise ValueError(f"n_tokens: expected >= 0, got {n_tokens}")
    if not 0 <= cached_tokens <= n_tokens:
        raise ValueError(f"cached_tokens: expected 0 <= cached_tokens <= n_tokens = {n_tokens}, got {cached_tokens}")


MODELS: dict[str, ModelConfig] = {
    # lecture.md's table, exactly.
    "llama2-70b": ModelConfig("LLaMA2-70B", 80, 8192, 64, 8, 128, 28672, 32000, False),
    "opt-13b": ModelConfig("OPT-13B", 40, 5120, 40, 40, 128, 13653, 50272, True),
    # Meta's public config.json of Llama-3-70B and Llama-3-8B (GQA, 128k vocabulary).
    "llama3-70b": ModelConfig("LLaMA3-70B", 80, 8192, 64, 8, 128, 28672, 128256, False),
    "llama3-8b": ModelConfig("LLaMA3-8B", 32, 4096, 32, 8, 128, 14336, 128256, False),
    # BigScience's public config.json of BLOOM-176B: 70 layers, hidden 14,336, 112 heads of 128
    # (multi-head attention), a 4x GELU MLP of two matrices, 250,880-token vocabulary, tied embeddings.
    "bloom-176b": ModelConfig("BLOOM-176B", 70, 14336, 112, 112, 128, 57344, 250880, True, 2),
}


def get_model(name: str | ModelConfig) -> ModelConfig:
    """Look a model preset up by name (case-insensitive); a ModelConfig passes through."""
    if isinstance(name, ModelConfig):
        return name
    key = str(name).lower()
    if key not in MODELS:
        raise ValueError(f"model: unknown preset {name!r}; expected one of {sorted(MODELS)}")
    return MODELS[key]


# --------------------------------------------------------------------------------------------
# Hardware and the cost model
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InstanceSpec:
    """One serving instance: ``n_gpus`` GPUs of one kind (one tensor-parallel group) at ``mfu``.

    With ``realistic=False`` (the lecture's toy, the default) prefill is pure compute at ``mfu``
    plus ``prefill_overhead_s``. With ``realistic=True`` a prefill runs as model iterations of at
    most ``chunk_tokens`` tokens (chunked prefill), each the sum of
    :meth:`CostModel.iteration_breakdown`: linear layers, attention, element-wise kernels, the
    tensor-parallel all-reduces over NVLink and ``iteration_overhead_s`` (the engine's cost per
    iteration). Decode iterations (:meth:`CostModel.decode_step_s`) always use that realistic model.
    ``memory_efficiency`` is the share of peak HBM bandwidth the weights' and element-wise kernels'
    traffic reaches, ``kv_read_efficiency`` that of the KV reads, ``attention_efficiency`` the share
    of ``mfu`` attention's FLOPs reach; ``memory_reserve`` the share of GPU memory not available to
    the KV cache.
    """

    gpu: str = "A800"
    n_gpus: int = 8
    mfu: float = DEFAULT_MFU
    prefill_overhead_s: float = DEFAULT_PREFILL_OVERHEAD_S
    realistic: bool = False
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    iteration_overhead_s: float = DEFAULT_ITERATION_OVERHEAD_S
    memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY
    memory_reserve: float = DEFAULT_MEMORY_RESERVE
    attention_efficiency: float = DEFAULT_ATTENTION_EFFICIENCY
    kv_read_efficiency: float = DEFAULT_KV_READ_EFFICIENCY

    def __post_init__(self):
        for name in ("attention_efficiency", "kv_read_efficiency"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ValueError(f"{name}: expected 0 < {name} <= 1, got {v!r}")
        if not isinstance(self.realistic, bool):
            raise ValueError(f"realistic: expected True or False, got {self.realistic!r}")
        if not (isinstance(self.chunk_tokens, int) and 1 <= self.chunk_tokens <= 10**7):
            raise ValueError(f"chunk_tokens: expected an integer in 1..10**7, got {self.chunk_tokens!r}")
        if not 0 <= self.iteration_overhead_s <= 1:
            raise ValueError(f"iteration_overhead_s: expected 0..1 seconds, got {self.iteration_overhead_s!r}")
        if not 0 < self.memory_efficiency <= 1:
            raise ValueError(f"memory_efficiency: expected 0 < memory_efficiency <= 1, got {self.memory_efficiency!r}")
        if not 0 <= self.memory_reserve < 1:
            raise ValueError(f"memory_reserve: expected 0 <= memory_reserve < 1, got {self.memory_reserve!r}")
        if self.gpu not in GPU_PEAK_BF16_FLOPS:
            raise ValueError(f"gpu: unknown {self.gpu!r}; expected one of {sorted(GPU_PEAK_BF16_FLOPS)}")
        if not 1 <= self.n_gpus <= GPUS_PER_NODE:
            raise ValueError(f"n_gpus: expected 1..{GPUS_PER_NODE}, got {self.n_gpus}")
        if not 0 < self.mfu <= 1:
            raise ValueError(f"mfu: expected 0 < mfu <= 1, got {self.mfu}")
        if self.prefill_overhead_s < 0:
            raise ValueError(f"prefill_overhead_s: expected >= 0, got {self.prefill_overhead_s}")

    @cached_property
    def effective_flops(self) -> float:
        return self.n_gpus * GPU_PEAK_BF16_FLOPS[self.gpu] * self.mfu

    def tier_bandwidth(self, tier: str) -> float:
        """Bytes/s this instance reads from ``tier``: its GPUs' share of the node figure."""
        bandwidth = self._tier_bandwidths.get(tier)
        if bandwidth is None:
            raise ValueError(f"tier: unknown {tier!r}; expected one of {list(TIERS)}")
        return bandwidth

    @cached_property
    def _tier_bandwidths(self) -> dict:
        return {tier: node * self.n_gpus / GPUS_PER_NODE for tier, node in NODE_TIER_BANDWIDTH.items()}

    @cached_property
    def memory_bandwidth(self) -> float:
        """Bytes/s the instance's GPUs read from HBM together, at ``memory_efficiency``."""
        return self.n_gpus * GPU_HBM_BANDWIDTH[self.gpu] * self.memory_efficiency

    @property
    def memory_bytes(self) -> int:
        return self.n_gpus * GPU_HBM_BYTES[self.gpu]


@dataclass(frozen=True)
class CostModel:
    """Times of prefill, KV load, KV transfer and decode for one model on one instance kind."""

    model: ModelConfig = field(default_factory=lambda: MODELS["llama2-70b"])
    instance: InstanceSpec = field(default_factory=InstanceSpec)
    transfer_latency_s: float = DEFAULT_TRANSFER_LATENCY_S
    block_tokens: int = BLOCK_TOKENS

    @classmethod
    def preset(cls, model: str = "llama2-70b", gpu: str = "A800", n_gpus: int = 8, **kw) -> "CostModel":
        return cls(get_model(model), InstanceSpec(gpu=gpu, n_gpus=n_gpus, **kw))

    @classmethod
    def realistic(cls, model: str = "llama2-70b", gpu: str = "A800", n_gpus: int = 8, engine: str = DEFAULT_ENGINE,
                  **kw) -> "CostModel":
        """The realistic model of an instance: chunked prefill with tensor-parallel all-reduces and
        the ``engine``'s iteration overhead and attention efficiency (``ENGINE_OVERHEAD_S``,
        ``ENGINE_ATTENTION_EFFICIENCY``: ``"fast"`` or ``"slow"``), a
        per-request overhead of ``REALISTIC_PREFILL_OVERHEAD_S``; the efficiencies are the calibrated
        ``REALISTIC_*`` constants unless given."""
        if engine not in ENGINE_OVERHEAD_S:
            raise ValueError(f"engine: expected one of {sorted(ENGINE_OVERHEAD_S)}, got {engine!r}")
        kw.setdefault("iteration_overhead_s", ENGINE_OVERHEAD_S[engine])
        kw.setdefault("prefill_overhead_s", REALISTIC_PREFILL_OVERHEAD_S)
        kw.setdefault("mfu", REALISTIC_MFU)
        kw.setdefault("memory_efficiency", REALISTIC_MEMORY_EFFICIENCY)
        kw.setdefault("attention_efficiency", ENGINE_ATTENTION_EFFICIENCY[engine])
        kw.setdefault("kv_read_efficiency", REALISTIC_KV_READ_EFFICIENCY)
        return cls.preset(model, gpu, n_gpus, realistic=True, **kw)

    # -- memory -----------------------------------------------------------------------------
    @cached_property
    def weights_bytes(self) -> int:
        """Bytes of the model's weights in BF16 (spread over the instance's GPUs)."""
        return self.model.n_params * BYTES_PER_BF16

    @cached_property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache the instance's GPUs hold: GPU memory less ``memory_reserve`` less the
        weights, over ``kv_bytes_per_token``. ``ValueError`` if the weights do not fit."""
        free = self.instance.memory_bytes * (1 - self.instance.memory_reserve) - self.weights_bytes
        tokens = int(free // self.model.kv_bytes_per_token)
        if tokens < 1:
            raise ValueError(f"instance: {self.model.name} ({self.weights_bytes / GIB:.0f} GiB of weights) does not "
                             f"fit in {self.instance.n_gpus} x {self.instance.gpu} with a "
                             f"{self.instance.memory_reserve:.0%} reserve")
        return tokens

    # -- one model iteration (realistic model) --------------------------------------------
    @cached_property
    def allreduce_coefficients(self) -> tuple[float, float]:
        """``(fixed, per_token)``: the tensor-parallel all-reduces of one iteration over ``t`` tokens
        take ``fixed + per_token * t`` seconds. Megatron-style TP all-reduces the activations
        (``t x d_model`` BF16 values) twice per layer (after attention's output projection and after
        the MLP), each :func:`allreduce_s`: the interconnect's per-call latency plus
        ``2 (p - 1) / p x bytes / busbw`` (``INTERCONNECT``). 0 on one GPU."""
        p = self.instance.n_gpus
        if p == 1:
            return 0.0, 0.0
        latency, busbw = allreduce_figures(self.instance.gpu, p)
        calls = 2 * self.model.n_layers
        per_token = calls * self.model.d_model * BYTES_PER_BF16 * 2 * (p - 1) / p / busbw
        return calls * latency, per_token

    @cached_property
    def component_coefficients(self) -> dict:
        """The constants of :meth:`iteration_breakdown`, seconds, summed over layers, for the whole
        instance (its ``n_gpus`` working in parallel):

        - ``weights_s``: reading the weights once from HBM at ``memory_efficiency``;
        - ``linear_token_s``: the linear layers' FLOPs of one token at ``mfu`` of peak;
        - ``attention_pair_s``: attention's FLOPs of one unit of ``e (e + 1) - p (p + 1)`` (half a
          query-key pair: QK^T and AV are ``4 n_heads d_head`` FLOPs a pair) at ``attention_efficiency
          x mfu``;
        - ``kv_token_s``: reading one token's K and V (all layers) at ``kv_read_efficiency`` of peak HBM;
        - ``elementwise_token_s``: one token's element-wise traffic
          (:meth:`ModelConfig.elementwise_bytes_per_token`) at ``memory_efficiency``;
        - ``allreduce_fixed_s``, ``allreduce_token_s``: :attr:`allreduce_coefficients`;
        - ``overhead_s``: the engine's ``iteration_overhead_s``."""
        inst, m = self.instance, self.model
        peak_hbm = inst.n_gpus * GPU_HBM_BANDWIDTH[inst.gpu]
        linear, attention = m.flop_coefficients
        ar_fixed, ar_token = self.allreduce_coefficients
        per_gpu_hbm = GPU_HBM_BANDWIDTH[inst.gpu] * inst.memory_efficiency
        return {
            "weights_s": self.weights_bytes / inst.memory_bandwidth,
            "linear_token_s": m.n_layers * linear / inst.effective_flops,
            "attention_pair_s": m.n_layers * attention / (inst.effective_flops * inst.attention_efficiency),
            "kv_token_s": m.kv_bytes_per_token / (peak_hbm * inst.kv_read_efficiency),
            "elementwise_token_s": m.n_layers * m.elementwise_bytes_per_token(inst.n_gpus) / per_gpu_hbm,
            "allreduce_fixed_s": ar_fixed,
            "allreduce_token_s": ar_token,
            "overhead_s": inst.iteration_overhead_s,
        }

    def iteration_breakdown(self, new_tokens: int, context_tokens: float = 0, batch: int = 1) -> dict:
        """Seconds of one forward iteration of this instance, by component, summed over layers:
        ``batch`` requests each compute ``new_tokens / batch`` tokens over ``context_tokens`` tokens
        already in their KV (a prefill chunk: ``batch=1``, ``context_tokens`` the prefix; a decode
        step: ``new_tokens = batch``, ``context_tokens`` the mean context).

        - ``linear``: QKV, output and MLP GEMMs: the larger of their FLOPs and the weights' read
          (a roofline: a small batch is bound by streaming the weights);
        - ``attention``: the larger of attention's FLOPs (each new token attends to the context and
          the new tokens before it) and the read of the KV it attends to;
        - ``elementwise``: norms, activation, rotary, residual adds: their HBM traffic;
        - ``all_reduce``: two all-reduces per layer of the new tokens' activations (0 on one GPU);
        - ``overhead``: the engine's per-iteration cost.

        The prefill chunks of :class:`PrefillTime` and :meth:`decode_step_s` are closed forms of
        these sums (tested)."""
        if not (isinstance(batch, int) and 1 <= batch <= 10**6):
            raise ValueError(f"batch: expected an integer in 1..10**6, got {batch!r}")
        if not (isinstance(new_tokens, int) and batch <= new_tokens <= 10**8 and new_tokens % batch == 0):
            raise ValueError(f"new_tokens: expected a multiple of batch = {batch} in {batch}..10**8, got {new_tokens!r}")
        if not 0 <= context_tokens <= 10**8:
            raise ValueError(f"context_tokens: expected 0..10**8 tokens, got {context_tokens!r}")
        co = self.component_coefficients
        n = new_tokens // batch
        pairs2 = batch * (2 * n * context_tokens + n * (n + 1))  # e (e + 1) - p (p + 1) per request, summed
        keys = batch * context_tokens + new_tokens
        linear = co["linear_token_s"] * new_tokens
        attention = co["attention_pair_s"] * pairs2
        kv = co["kv_token_s"] * keys
        return {
            "linear": linear if linear > co["weights_s"] else co["weights_s"],
            "attention": attention if attention > kv else kv,
            "elementwise": co["elementwise_token_s"] * new_tokens,
            "all_reduce": co["allreduce_fixed_s"] + co["allreduce_token_s"] * new_tokens,
            "overhead": co["overhead_s"],
        }

    def decode_step_coefficients(self, batch: int) -> tuple[float, float]:
        """``(fixed, per_context_token)``: a decode iteration of ``batch`` requests holding
        ``K`` tokens of context in all takes ``fixed + per_context_token * K`` seconds
        (:meth:`decode_step_s`). Between two changes of the batch the step time therefore grows
        linearly, by ``batch * per_context_token`` per iteration, which lets the simulator advance a
        batch analytically. The closed form of ``sum(iteration_breakdown(batch, K / batch, batch))``:
        attention's FLOPs and its KV read both grow with the ``K + batch`` keys attended."""
        co = self.component_coefficients
        weights_s, linear_s = co["weights_s"], co["linear_token_s"] * batch
        per_key = 2 * co["attention_pair_s"]
        if co["kv_token_s"] > per_key:
            per_key = co["kv_token_s"]
        fixed = (co["overhead_s"] + (weights_s if weights_s > linear_s else linear_s) + per_key * batch
                 + co["elementwise_token_s"] * batch + co["allreduce_fixed_s"] + co["allreduce_token_s"] * batch)
        return fixed, per_key

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """Time of one decode iteration producing one token for each of ``batch`` requests whose
        contexts total ``context_tokens`` tokens: the sum of :meth:`iteration_breakdown` with
        ``new_tokens = batch`` (weights read, KV read at ``kv_read_efficiency`` or attention's FLOPs,
        element-wise kernels, all-reduces, engine overhead). 0 for an empty batch."""
        if batch < 0 or context_tokens < 0:
            raise ValueError(f"batch, context_tokens: expected >= 0, got {batch}, {context_tokens}")
        if batch == 0:
            return 0.0
        fixed, per_token = self.decode_step_coefficients(batch)
        return fixed + per_token * context_tokens

    def with_overhead(self, prefill_overhead_s: float) -> "CostModel":
        return replace(self, instance=replace(self.instance, prefill_overhead_s=prefill_overhead_s))

    # -- compute ---------------------------------------------------------------------------
    def compute_s(self, n_tokens: int, cached_tokens: int = 0) -> float:
        """Pure compute time of prefilling the uncached tokens (no overhead, no load)."""
        return self.model.prefill_flops(n_tokens, cached_tokens) / self.instance.effective_flops

    def load_s(self, tokens: int, tier: str = "dram") -> float:
        """Time to read ``tokens`` tokens of KV from ``tier`` into this instance's GPUs."""
        bandwidth = self.instance.tier_bandwidth(tier)  # validates ``tier`` even when nothing is loaded
        if tier == "gpu" or tokens <= 0:
            return 0.0
        return tokens * self.model.kv_bytes_per_token / bandwidth

    def prefill_s(self, n_tokens: int, cached_tokens: int = 0, tier: str = "dram", overlap: bool = True) -> float:
        """Prefill time of an ``n_tokens`` prompt whose first ``cached_tokens`` are cached in ``tier``.

        With layer-wise overlap (Mooncake v3 §5.2) the load of layer l+1 hides behind the compute of
        layer l. With L equal layers the pipeline takes load/L (first layer's load), then L - 1 steps
        of max(compute, load)/L, then compute/L (last layer's compute): max(compute, load) +
        min(compute, load)/L. When compute dominates this is max(compute, load) plus one layer's
        load; it is never more than load then compute. Without overlap, load then compute. A fixed
        per-request overhead is added in both cases. ``compute`` is :meth:`compute_s` and ``load``
        :meth:`load_s`; the arithmetic is :class:`PrefillTime`'s.
        """
        check_prefill_tokens(n_tokens, cached_tokens)
        return self.prefill_time(tier, overlap)(n_tokens, cached_tokens)

    def prefill_time(self, tier: str = "dram", overlap: bool = True) -> "PrefillTime":
        """:meth:`prefill_s` for one tier and overlap setting, as a callable ``(n_tokens,
        cached_tokens) -> s`` that checks nothing (the simulators call it at every arrival)."""
        key = (tier, bool(overlap))
        f = self._prefill_times.get(key)
        if f is None:
            f = self._prefill_times[key] = PrefillTime(self, tier, overlap)
        return f

    @cached_property
    def _prefill_times(self) -> dict:
        return {}

    def recompute_s_per_token(self, context_tokens: int = 8192) -> float:
        """Prefill compute time of a ``context_tokens`` prompt without cache, per token (demo 1)."""
        return self.compute_s(context_tokens, 0) / context_tokens

    # -- network ----------------------------------------------------------------------------
    def kv_bytes(self, tokens: int) -> int:
        return tokens * self.model.kv_bytes_per_token

    def transfer_s(self, tokens: int) -> float:
        """Time to copy ``tokens`` tokens of KV from another instance over RDMA (bytes/bw + latency)."""
        if tokens <= 0:
            return 0.0
        return self.kv_bytes(tokens) / NODE_TIER_BANDWIDTH["rdma"] + self.transfer_latency_s

    # -- KV storage tiers (Mooncake Store: DRAM, SSD, another node's over RDMA) --------------------
    def tier_load_s(self, dram_tokens: int, ssd_tokens: int, ssd_bandwidth: float) -> float:
        """Seconds to read a cached prefix into this instance's GPUs: ``dram_tokens`` from its node's
        DRAM (``tier_bandwidth("dram")``), then ``ssd_tokens`` from its SSD tier at ``ssd_bandwidth``
        bytes/s per node (this instance's GPUs' share, as every tier). What ``PrefillTime.with_load``
        overlaps with the compute; with no SSD tokens it is ``prefill_s``'s DRAM load exactly."""
        kv = self.model.kv_bytes_per_token
        load = dram_tokens * kv / self.instance.tier_bandwidth("dram") if dram_tokens > 0 else 0.0
        if ssd_tokens > 0:
            load += ssd_tokens * kv / (ssd_bandwidth * self.instance.n_gpus / GPUS_PER_NODE)
        return load

    def remote_read_s(self, dram_tokens: int, ssd_tokens: int, ssd_bandwidth: float) -> float:
        """Seconds to copy a prefix held by another node over RDMA (:meth:`transfer_s`'s model):
        ``dram_tokens`` from its DRAM at the NIC's rate, ``ssd_tokens`` from its SSD tier streamed at
        the slower of the NIC and ``ssd_bandwidth`` (bytes/s per node), one transfer latency."""
        if dram_tokens + ssd_tokens <= 0:
            return 0.0
        return self.remote_read_bytes(dram_tokens, ssd_tokens, ssd_bandwidth) / NODE_TIER_BANDWIDTH["rdma"] \
            + self.transfer_latency_s

    def remote_read_bytes(self, dram_tokens: int, ssd_tokens: int, ssd_bandwidth: float) -> float:
        """:meth:`remote_read_s`'s bytes as the NIC sees them: the SSD part counted at the NIC's rate
        (its bytes x NIC / SSD bandwidth when the SSD is the slower), so that a copy sharing NICs
        (``mooncake_gym.sim.network``) takes the stated time when it has a whole NIC."""
        rdma = NODE_TIER_BANDWIDTH["rdma"]
        nbytes = float(self.kv_bytes(dram_tokens))
        if ssd_tokens > 0:
            nbytes += self.kv_bytes(ssd_tokens) * (rdma / ssd_bandwidth if ssd_bandwidth < rdma else 1.0)
        return nbytes

    # -- decode -----------------------------------------------------------------------------
    @staticmethod
    def decode_s(output_tokens: float, tbt_s: float) -> float:
        """Decode time of ``output_tokens`` tokens at a time-between-tokens of ``tbt_s``."""
        return output_tokens * tbt_s

    # -- blocks -----------------------------------------------------------------------------
    def hit_tokens(self, hit_blocks: int, input_tokens: int) -> int:
        """Tokens covered by ``hit_blocks`` leading blocks; at least one token is always computed."""
        return max(0, min(hit_blocks * self.block_tokens, input_tokens - 1))


#: Most ``(n_tokens, cached_tokens)`` pairs a :class:`PrefillTime` remembers (:meth:`PrefillTime.cached`).
PREFILL_MEMO_SIZE = 1 << 18


class PrefillTime:
    """``CostModel.prefill_s(n_tokens, cached_tokens, tier, overlap)`` with the cost model's
    constants bound and no argument checks: ``PrefillTime(cost, tier, overlap)(n, h)``. It is the
    one implementation of prefill time (``prefill_s`` checks its arguments and calls it); compute is
    ``ModelConfig.prefill_flops / effective_flops`` (``CostModel.compute_s``) and load
    ``tokens * kv_bytes_per_token / bandwidth`` (``CostModel.load_s``), term for term, so the
    results are theirs to the last bit (tested).

    Fields (flat floats, ints and bools, which a native port reads): ``n_layers``, ``linear`` and
    ``attention`` (``ModelConfig.flop_coefficients``), ``flops`` (effective FLOP/s), ``kv_bytes``
    (per token), ``bandwidth`` (the tier's bytes/s), ``loads``, ``overlap``, ``overhead_s`` (per
    request), ``realistic``, ``chunk`` (tokens per iteration), and of the realistic chunk loop:
    ``weights_s`` (the weights' read), ``step_fixed_s`` (engine overhead + the all-reduces' latency
    per iteration), ``ar_token_s`` (all-reduce seconds per token), ``attention_efficiency``, and
    (new with the component model) ``kv_token_s`` (reading one key's KV; an iteration over tokens
    ``p..e`` reads ``e`` keys) and ``elementwise_token_s`` (element-wise kernels per token)."""

    __slots__ = ("n_layers", "linear", "attention", "flops", "kv_bytes", "bandwidth", "loads", "overlap",
                 "overhead_s", "realistic", "chunk", "weights_s", "step_fixed_s", "ar_token_s", "attention_efficiency",
                 "kv_token_s", "elementwise_token_s", "_memo")

    def __init__(self, cost: "CostModel", tier: str = "dram", overlap: bool = True):
        m = cost.model
        self.n_layers = m.n_layers
        self.linear, self.attention = m.flop_coefficients
        self.flops = cost.instance.effective_flops
        self.kv_bytes = m.kv_bytes_per_token
        self.bandwidth = cost.instance.tier_bandwidth(tier)  # validates ``tier``
        self.loads = tier != "gpu"  # a cache already in GPU memory needs no load
        self.overlap = bool(overlap)
        self.overhead_s = cost.instance.prefill_overhead_s
        inst = cost.instance
        self.realistic = inst.realistic
        self.chunk = inst.chunk_tokens
        co = cost.component_coefficients
        self.weights_s = co["weights_s"]
        self.ar_token_s = co["allreduce_token_s"]
        self.step_fixed_s = co["overhead_s"] + co["allreduce_fixed_s"]
        self.attention_efficiency = inst.attention_efficiency
        self.kv_token_s = co["kv_token_s"]
        self.elementwise_token_s = co["elementwise_token_s"]
        self._memo: dict[tuple[int, int], float] = {}

    def cached(self, n: int, h: int) -> float:
        """``self(n, h)``, remembered: a pure function of ``(n, h)`` (the constants are a frozen
        cost model's), and the routing simulator asks for the same pairs again and again (every
        instance without a hit, requests of the same length, i.i.d. episodes drawn from one trace).
        ``n`` and ``h`` must be Python ints (a numpy integer would key the same entry but give a
        numpy float). At most ``PREFILL_MEMO_SIZE`` pairs are kept (then it starts afresh)."""
        memo = self._memo
        t = memo.get((n, h))
        if t is None:
            if len(memo) >= PREFILL_MEMO_SIZE:
                memo.clear()
            t = memo[n, h] = self(n, h)
        return t

    def _chunked_compute(self, n: int, h: int) -> float:
        """Realistic model: tokens ``h..n`` in iterations of at most ``chunk`` tokens, each the sum
        of ``CostModel.iteration_breakdown(e - p, p)`` for its tokens ``p..e`` (tested equal):
        max(linear FLOPs, weights' read) + max(attention FLOPs, read of the ``e`` keys' KV) +
        element-wise traffic + all-reduces + the iteration overhead."""
        layers, linear, flops, w = self.n_layers, self.linear, self.flops, self.weights_s
        attention = self.attention / self.attention_efficiency
        per_token = self.ar_token_s + self.elementwise_token_s
        kv = self.kv_token_s
        busy = 0.0
        p = h
        while p < n:
            e = p + self.chunk
            if e > n:
                e = n
            c = layers * linear * (e - p) / flops
            a = layers * attention * (e * (e + 1) - p * (p + 1)) / flops
            r = kv * e
            busy += (c if c > w else w) + (a if a > r else r) + self.step_fixed_s + per_token * (e - p)
            p = e
        return busy

    def chunk_compute_s(self, p: int, e: int) -> float:
        """Realistic model: the linear layers' FLOPs time of prefilling tokens ``p..e`` of one prompt,
        the part of :meth:`_chunked_compute`'s term that an iteration's chunks share with the
        weights' read (:meth:`iteration_s`)."""
        return self.n_layers * self.linear * (e - p) / self.flops

    def chunk_attention_s(self, p: int, e: int) -> float:
        """Realistic model: the attention of tokens ``p..e`` of one prompt over its ``e`` keys:
        max(attention FLOPs, the read of their KV), one prompt's part of an iteration (the same
        operations as :meth:`_chunked_compute`)."""
        a = self.n_layers * (self.attention / self.attention_efficiency) * (e * (e + 1) - p * (p + 1)) / self.flops
        r = self.kv_token_s * e
        return a if a > r else r

    def iteration_s(self, compute_s: float, tokens: int, attention_s: float = 0.0) -> float:
        """Realistic model: one model iteration of ``tokens`` new tokens (several prompts' chunks)
        whose linear FLOPs take ``compute_s`` and attention ``attention_s`` (the sums of
        :meth:`chunk_compute_s` and :meth:`chunk_attention_s` over its chunks): max(linear, the
        weights' read) + attention + the iteration overhead + all-reduces and element-wise traffic
        per token, as each iteration of :meth:`_chunked_compute`."""
        w = self.weights_s
        return ((compute_s if compute_s > w else w) + attention_s + self.step_fixed_s
                + (self.ar_token_s + self.elementwise_token_s) * tokens)

    def __call__(self, n: int, h: int) -> float:
        load = h * self.kv_bytes / self.bandwidth if h > 0 and self.loads else 0.0
        return self.with_load(self.compute(n, h), load)

    def compute(self, n: int, h: int) -> float:
        """The compute of prefilling tokens ``h..n`` (realistic: the chunked iterations)."""
        if self.realistic:
            return self._chunked_compute(n, h)
        return self.n_layers * (self.linear * (n - h) + self.attention * (n * (n + 1) - h * (h + 1))) / self.flops

    def with_load(self, compute: float, load: float) -> float:
        """The prefill time of ``compute`` seconds of compute whose cached prefix takes ``load``
        seconds to read (``CostModel.prefill_s``'s layer-wise overlap, or load then compute), plus
        the per-request overhead. The KV tiers (``CostModel.tier_load_s``) give ``load``."""
        if self.overlap:  # max(compute, load) + min(compute, load) / L, without the builtins' calls
            layers = self.n_layers
            busy = compute + load / layers if compute >= load else load + compute / layers
        else:
            busy = compute + load
        return busy + self.overhead_s


def iteration_breakdown(model: str | ModelConfig, gpu: str, tp: int, new_tokens: int, context_tokens: float = 0,
                        batch: int = 1, engine: str = DEFAULT_ENGINE, **instance) -> dict:
    """Seconds of one forward iteration of one instance of ``tp`` GPUs of kind ``gpu`` serving
    ``model`` (names as the presets use them: ``'llama2-70b'``, ``'A100'``), summed over layers, as
    ``{'linear', 'attention', 'elementwise', 'all_reduce', 'overhead'}``: the realistic cost model's
    :meth:`CostModel.iteration_breakdown`. A prefill chunk: ``new_tokens`` the chunk,
    ``context_tokens`` the prefix already in KV; a decode step: ``new_tokens = batch`` requests each
    adding one token over ``context_tokens`` of mean context. ``engine`` and ``instance`` (fields of
    :class:`InstanceSpec`) as :meth:`CostModel.realistic` takes them."""
    cost = CostModel.realistic(model, gpu, tp, engine=engine, **instance)
    return cost.iteration_breakdown(new_tokens, context_tokens, batch)


def ceil_blocks(tokens: int, block_tokens: int = BLOCK_TOKENS) -> int:
    return math.ceil(tokens / block_tokens)

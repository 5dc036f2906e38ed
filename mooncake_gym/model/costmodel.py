"""Cost model: the single source of every time in mooncake-gym.

Prefill compute time, KV-cache load time from a storage tier, KV transfer time between
instances and decode time all come from here; the simulators and the baselines' estimates call
these functions and never carry a second formula.

Every assumed constant lives in this module, in the block below, with its source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property

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
#: All-reduce bus bandwidth over NVLink inside one 8-GPU node for the activation-sized messages of
#: tensor parallelism (1-100 MB), bytes/s. nccl-tests reach about 200 GB/s on 8x A100 and 480 GB/s
#: on 8x H100 (NVLink SHARP) only for messages of gigabytes (nccl-tests issues #149 and #212);
#: Vidur's measured all-reduce kernels on a DGX-A100 take 0.179 ms for 10 MiB (about 100 GB/s of
#: bus bandwidth). Calibrated to 115 GB/s on A100, 175 GB/s on H100 (docs/calibration.md); A800
#: and H800 are export variants with NVLink cut to 400 GB/s: scaled by 400/600 and 400/900.
NVLINK_ALLREDUCE_BUSBW = {"A100": 115e9, "A800": 77e9, "H100": 175e9, "H800": 78e9}
#: Fixed latency of one small all-reduce over NVLink (NCCL's low-latency protocol), seconds.
#: Assumption: 10 us, the order nccl-tests reports for kilobyte messages on 8 GPUs.
ALLREDUCE_LATENCY_S = 10e-6
#: Share of peak HBM bandwidth that streaming the weights reaches in decode. Calibrated: 0.7
#: (gpt-fast measures 56-73 % of A100's 2,039 GB/s for LLaMA2-70B at batch 1; docs/calibration.md).
DEFAULT_MEMORY_EFFICIENCY = 0.7
#: Fixed cost of one model iteration (a decode step, or one chunk of a prefill): scheduling, input
#: preparation, kernel launches and sampling. Calibrated: 4 ms (docs/calibration.md; vLLM's v0.6.0
#: blog reports CPU overheads of this order, which overlapped schedulers then hid).
DEFAULT_ITERATION_OVERHEAD_S = 4e-3
#: MFU of the realistic presets' linear layers. Calibrated: 0.65 (TensorRT-LLM's LLaMA2-70B prefill
#: of 2,048 tokens on 4x A100 reaches 61 % end to end, Vidur's GEMMs 77 %; docs/calibration.md).
REALISTIC_MFU = 0.65
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
    """A decoder-only transformer with a gated (three-matrix) MLP and grouped-query attention."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_ff: int
    vocab: int
    tied_embeddings: bool

    # derived figures are cached_property (computed once per frozen config): the cost model is on
    # the simulators' hot path
    @cached_property
    def params_per_layer(self) -> int:
        """Weights of one layer: Q, K, V, O projections and the gated MLP (norms ignored)."""
        q = self.d_model * self.n_heads * self.d_head
        kv = 2 * self.d_model * self.n_kv_heads * self.d_head
        o = self.n_heads * self.d_head * self.d_model
        mlp = 3 * self.d_model * self.d_ff
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
    most ``chunk_tokens`` tokens (chunked prefill), each taking the larger of its compute and its
    weight read, plus the tensor-parallel all-reduces over NVLink and ``iteration_overhead_s``.
    Decode iterations (:meth:`CostModel.decode_step_s`) always use that realistic model.
    ``memory_efficiency`` is the share of peak HBM bandwidth reached; ``memory_reserve`` the share of
    GPU memory not available to the KV cache.
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
    def realistic(cls, model: str = "llama2-70b", gpu: str = "A800", n_gpus: int = 8, **kw) -> "CostModel":
        """The realistic model of an instance: chunked prefill with tensor-parallel all-reduces and
        iteration overhead, a per-request overhead of ``REALISTIC_PREFILL_OVERHEAD_S``."""
        kw.setdefault("prefill_overhead_s", REALISTIC_PREFILL_OVERHEAD_S)
        kw.setdefault("mfu", REALISTIC_MFU)
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
        (``t x d_model`` BF16 values) twice per layer; a ring all-reduce of B bytes over p GPUs takes
        ``2 (p - 1) / p x B / busbw`` plus a fixed latency. 0 on one GPU."""
        p = self.instance.n_gpus
        if p == 1:
            return 0.0, 0.0
        calls = 2 * self.model.n_layers
        per_token = calls * self.model.d_model * BYTES_PER_BF16 * 2 * (p - 1) / p / NVLINK_ALLREDUCE_BUSBW[self.instance.gpu]
        return calls * ALLREDUCE_LATENCY_S, per_token

    def decode_step_coefficients(self, batch: int) -> tuple[float, float]:
        """``(fixed, per_context_token)``: a decode iteration of ``batch`` requests holding
        ``K`` tokens of context in all takes ``fixed + per_context_token * K`` seconds
        (:meth:`decode_step_s`). Between two changes of the batch the step time therefore grows
        linearly, by ``batch * per_context_token`` per iteration, which lets the simulator advance a
        batch analytically."""
        inst = self.instance
        weights_s = self.weights_bytes / inst.memory_bandwidth
        linear_s = batch * self.model.flop_coefficients[0] * self.model.n_layers / inst.effective_flops
        ar_fixed, ar_token = self.allreduce_coefficients
        fixed = inst.iteration_overhead_s + (weights_s if weights_s > linear_s else linear_s) + ar_fixed + ar_token * batch
        kv_bandwidth = inst.memory_bandwidth / inst.memory_efficiency * inst.kv_read_efficiency
        return fixed, self.model.kv_bytes_per_token / kv_bandwidth

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """Time of one decode iteration producing one token for each of ``batch`` requests whose
        contexts total ``context_tokens`` tokens (roofline of a memory-bound step):
        ``iteration_overhead + max(weights read, linear-layer compute of the batch)
        + KV read of the contexts + TP all-reduces``. Attention's FLOPs (about 1/15 of its KV read's
        time on these GPUs) are left out. 0 for an empty batch."""
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
    results are theirs to the last bit (tested)."""

    __slots__ = ("n_layers", "linear", "attention", "flops", "kv_bytes", "bandwidth", "loads", "overlap",
                 "overhead_s", "realistic", "chunk", "weights_s", "step_fixed_s", "ar_token_s", "attention_efficiency",
                 "_memo")

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
        self.weights_s = cost.weights_bytes / inst.memory_bandwidth
        ar_fixed, self.ar_token_s = cost.allreduce_coefficients
        self.step_fixed_s = inst.iteration_overhead_s + ar_fixed
        self.attention_efficiency = inst.attention_efficiency
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
        """Realistic model: tokens ``h..n`` in iterations of at most ``chunk`` tokens, each taking
        max(its compute, the weights' read) + its all-reduces + the iteration overhead."""
        layers, linear, flops, w = self.n_layers, self.linear, self.flops, self.weights_s
        attention = self.attention / self.attention_efficiency
        busy = 0.0
        p = h
        while p < n:
            e = p + self.chunk
            if e > n:
                e = n
            c = layers * (linear * (e - p) + attention * (e * (e + 1) - p * (p + 1))) / flops
            busy += (c if c > w else w) + self.step_fixed_s + self.ar_token_s * (e - p)
            p = e
        return busy

    def chunk_compute_s(self, p: int, e: int) -> float:
        """Realistic model: the FLOPs time of prefilling tokens ``p..e`` of one prompt (its context
        the ``p`` tokens before), one term of :meth:`_chunked_compute` (the same operations)."""
        attention = self.attention / self.attention_efficiency
        return self.n_layers * (self.linear * (e - p) + attention * (e * (e + 1) - p * (p + 1))) / self.flops

    def iteration_s(self, compute_s: float, tokens: int) -> float:
        """Realistic model: one model iteration of ``tokens`` new tokens (several prompts' chunks)
        whose FLOPs take ``compute_s``: max(compute, the weights' read) + its all-reduces + the
        iteration overhead, as each iteration of :meth:`_chunked_compute`."""
        w = self.weights_s
        return (compute_s if compute_s > w else w) + self.step_fixed_s + self.ar_token_s * tokens

    def __call__(self, n: int, h: int) -> float:
        layers = self.n_layers
        if self.realistic:
            compute = self._chunked_compute(n, h)
        else:
            compute = layers * (self.linear * (n - h) + self.attention * (n * (n + 1) - h * (h + 1))) / self.flops
        load = h * self.kv_bytes / self.bandwidth if h > 0 and self.loads else 0.0
        if self.overlap:  # max(compute, load) + min(compute, load) / L, without the builtins' calls
            busy = compute + load / layers if compute >= load else load + compute / layers
        else:
            busy = compute + load
        return busy + self.overhead_s


def ceil_blocks(tokens: int, block_tokens: int = BLOCK_TOKENS) -> int:
    return math.ceil(tokens / block_tokens)

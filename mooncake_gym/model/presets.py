"""Cluster presets: the lecture's toy and realistic Mooncake-like clusters.

A preset fixes the hardware and model of the prefill and decode instances (through the cost
model), the pool sizes, the prefix-cache size and the SLOs. ``lecture`` keeps the course's toy
constants, under which the lecture's demos and the v0 environments run; ``mooncake`` is the
paper's testbed (Mooncake v3 §8: 8x A800-SXM4-80GB nodes, dummy LLaMA2-70B, 8 prefill + 8 decode
instances, TTFT SLO 30 s, TBT SLO 100 ms); ``h100`` the same cluster of H100 nodes serving
LLaMA3-70B. Every figure of the cost model is in ``mooncake_gym.model.costmodel`` with its source.

:class:`RoutingConfig` (and :func:`parse_instances`) is the prefill pool's shape alone, the routing
problem's cluster: data of the model layer, which ``mooncake_gym.sim.routing`` re-exports.

A user's presets, GPUs and models are TOML files (:func:`load_preset_file`, ``--preset-file``;
docs/presets.md), read and checked in the last section of this module.
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from mooncake_gym._files import check_input_file
from mooncake_gym._moved import renamed
from mooncake_gym._native import mypyc_attr
from mooncake_gym.model import costmodel
from mooncake_gym.model.costmodel import (BLOCK_TOKENS, NVME_DRIVE_BYTES, NVME_DRIVES_PER_NODE, NVME_READ_BANDWIDTH,
                                          CostModel, InstanceSpec, get_model)
from mooncake_gym.model.limits import LIMITS, check

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, packaged (pyproject: tomli; python_version < "3.11")
    import tomli as tomllib

DECODE_MODELS = ("batching", "reserve")
#: What a decode instance does with a request it preempts (``ClusterPreset.preemption``).
PREEMPTION_MODES = ("abort", "recompute", "swap")
#: The engines' mechanisms on the realistic presets: chunked prefill batching with a budget of 8,192
#: tokens per iteration (SGLang's default ``chunked_prefill_size`` on large GPUs and vLLM's
#: ``max_num_batched_tokens`` for online serving; the cost model's chunk) and preemption by
#: recomputation (vLLM's default: "Preempted requests are recomputed when sufficient KV cache space
#: becomes available again", docs.vllm.ai, Optimization and Tuning); KV transfers sharing each node's
#: NIC (one 800 Gbps NIC set per node, Mooncake v3 §2 and FAST'25 Table 1).
ENGINE = dict(prefill_token_budget=8192, preemption="recompute", shared_nics=True)
#: Chunked pipeline parallelism, opt-in (``preset.with_(**PIPELINE)``): groups of 4 prefill nodes for
#: prompts of 32,768 tokens or more (Mooncake v3 §5.1 groups "every X nodes" and publishes no X: 4
#: and a prompt that fills 4 chunks are assumptions). Not a default of the realistic presets: the
#: model holds the group whole while the prompt's chunks fill and drain the pipeline, so the bubbles
#: an engine fills with other work are lost here, and Mooncake's public trace's prefill capacity
#: falls from 5.63 to 4.37 requests/s (docs/cluster.md).
PIPELINE = dict(pipeline_nodes=4, pipeline_min_tokens=32_768)
#: The same fields with the mechanisms off (``preset.with_(**NO_ENGINE)``): one request at a time per
#: prefill instance, FIFO, each copy with a whole NIC, preempted requests aborted.
NO_ENGINE = dict(prefill_token_budget=0, preemption="abort", shared_nics=False, pipeline_nodes=1, pipeline_min_tokens=0)
#: Where a prefill node reads cached KV from (``ClusterPreset.kv_store``): ``"local"``, its own DRAM and
#: SSD tiers (another node's only through a router's pull); ``"global"``, Mooncake Store's pool: any
#: node's DRAM or SSD, over RDMA (FAST'25 Figure 10's global cache).
KV_STORES = ("local", "global")
#: How a prefill node's DRAM cache evicts (``ClusterPreset.eviction``; ``sim.prefixcache``): least
#: recently used, or randomized leaf eviction (RLT, Wu, Silwal and Zhang, ICLR'26).
EVICTIONS = ("lru", "rlt")
#: The SSD tier's read bandwidth per node by default: ``NVME_DRIVES_PER_NODE`` PCIe 4.0 NVMe drives at
#: 7.0 GB/s each (``mooncake_gym.model.costmodel``), 28 GB/s.
SSD_TIER_BANDWIDTH = NVME_DRIVES_PER_NODE * NVME_READ_BANDWIDTH
#: An SSD tier below each prefill node's DRAM cache, opt-in (``preset.with_(**SSD_TIER)``): the
#: ``NVME_DRIVES_PER_NODE`` drives' 15.36 TB in 512-token blocks of LLaMA-70B KV (327,680 bytes per
#: token: 91,552 blocks) at their 28 GB/s. Not a default of any preset (docs/cluster.md, "KV tiers").
SSD_TIER = dict(ssd_cache_blocks=int(NVME_DRIVES_PER_NODE * NVME_DRIVE_BYTES
                                    // (BLOCK_TOKENS * get_model("llama2-70b").kv_bytes_per_token)),
                ssd_read_bandwidth=SSD_TIER_BANDWIDTH)


@mypyc_attr(native_class=False)  # a frozen dataclass set in __post_init__
@dataclass(frozen=True)
class RoutingConfig:
    """The prefill pool's shape and SLO (the routing problem's cluster).

    n_instances: prefill instances (default 8, as in lecture demo 2 and Mooncake Figure 8; with
        ``instances``, their number).
    cache_blocks: capacity of each instance's local prefix cache in 512-token blocks (default 3,000),
        or one capacity per instance (a heterogeneous pool).
    ttft_slo_s: TTFT service-level objective for attainment (default 5 s, as in the lecture).
    instances: None (default: every instance is the cost model's own ``InstanceSpec``) or one
        :class:`~mooncake_gym.model.costmodel.InstanceSpec` per instance, for a heterogeneous pool: a GPU
        name (``"H800"``) stands for ``InstanceSpec(gpu=name)`` (8 GPUs at 60 % MFU), and a string
        such as ``"4xH800+4xA800"`` for that list. Each instance then prefills at its own speed
        (``CostModel`` with that instance); the served model, block size and RDMA are the cluster's.
    ssd_cache_blocks, ssd_read_bandwidth, kv_store, eviction: the KV store's tiers and eviction
        (:class:`ClusterPreset`'s fields of the same names).
    """

    n_instances: int | None = None
    cache_blocks: int | tuple[int, ...] = 3000
    ttft_slo_s: float = 5.0
    instances: tuple[InstanceSpec, ...] | None = None
    ssd_cache_blocks: int = 0
    ssd_read_bandwidth: float = SSD_TIER_BANDWIDTH
    kv_store: str = "local"
    eviction: str = "lru"

    def __post_init__(self):
        if self.instances is not None:
            object.__setattr__(self, "instances", parse_instances(self.instances))
        n = self.n_instances
        if n is None:
            n = 8 if self.instances is None else len(self.instances)
            object.__setattr__(self, "n_instances", n)
        check("n_instances", n)  # the ranges of mooncake_gym.model.limits
        if self.instances is not None and len(self.instances) != n:
            raise ValueError(f"n_instances: expected len(instances) = {len(self.instances)} (or leave it out), got {n}")
        blocks = self.cache_blocks
        if isinstance(blocks, (list, tuple, np.ndarray)):
            blocks = tuple(blocks)
            if len(blocks) != n:
                raise ValueError(f"cache_blocks: expected one integer per instance ({n}), got {len(blocks)}")
            for i, b in enumerate(blocks):
                check("cache_blocks", b, f"cache_blocks[{i}]")
            object.__setattr__(self, "cache_blocks", blocks)
        else:
            check("cache_blocks", blocks)
        check("ttft_slo_s", self.ttft_slo_s)
        check_store(self.ssd_cache_blocks, self.ssd_read_bandwidth, self.kv_store, self.eviction)

    @property
    def tiered(self) -> bool:
        """Whether a hit may come from elsewhere than the instance's own DRAM (an SSD tier, or the
        global store)."""
        return self.ssd_cache_blocks > 0 or self.kv_store == "global"

    def instance_cache_blocks(self) -> tuple[int, ...]:
        """Each instance's prefix-cache capacity in blocks."""
        b = self.cache_blocks
        n = self.n_instances
        assert n is not None  # set by __post_init__
        return tuple(int(x) for x in b) if isinstance(b, tuple) else (int(b),) * n

    def instance_costs(self, cost: CostModel) -> tuple[CostModel, ...]:
        """Each instance's cost model: ``cost`` itself, or ``cost`` with that instance's ``InstanceSpec``."""
        n = self.n_instances
        assert n is not None  # set by __post_init__
        if self.instances is None:
            return (cost,) * n
        return tuple(replace(cost, instance=spec) for spec in self.instances)


@dataclass(frozen=True)
class PrefillBatching:
    """How each prefill instance runs its queue instead of one request at a time (the routing
    simulator's ``batching=``; :meth:`ClusterPreset.prefill_batching`).

    token_budget: the new tokens one model iteration takes from the instance's queue (chunked
        prefill batching as vLLM's ``max_num_batched_tokens`` / SGLang's ``chunked_prefill_size``:
        ``mooncake_gym.sim.prefill.PrefillEngine``; realistic cost models only).
    pipeline_nodes, pipeline_min_tokens: 1 (default: no pipeline) or the instances of a pipelined
        prefill group (consecutive instances; the last group holds what is left) over which a prompt
        of at least ``pipeline_min_tokens`` computed tokens is prefilled by chunked pipeline
        parallelism (Mooncake v3 §5.1), its chunks of ``token_budget`` tokens.
    """

    token_budget: int = 8192
    pipeline_nodes: int = 1
    pipeline_min_tokens: int = 0

    def __post_init__(self):
        check_token_budget(self.token_budget, "token_budget")
        if not self.token_budget:
            raise ValueError("token_budget: expected at least 1 token per iteration (no batching: batching=None)")
        check_pipeline(self.pipeline_nodes, self.pipeline_min_tokens, self.token_budget)


def check_store(ssd_blocks, ssd_bandwidth, kv_store, eviction) -> None:
    """The KV store's fields: ``ssd_cache_blocks`` 0..10**9, ``ssd_read_bandwidth`` bytes/s > 0,
    ``kv_store`` one of :data:`KV_STORES`, ``eviction`` one of :data:`EVICTIONS`."""
    if not (isinstance(ssd_blocks, int) and not isinstance(ssd_blocks, bool) and 0 <= ssd_blocks <= 10**9):
        raise ValueError(f"ssd_cache_blocks: expected an integer in 0..10**9 (0: no SSD tier), got {ssd_blocks!r}")
    if not (isinstance(ssd_bandwidth, (int, float)) and not isinstance(ssd_bandwidth, bool)
            and 0 < ssd_bandwidth < 1e15):
        raise ValueError(f"ssd_read_bandwidth: expected bytes/s per node in (0, 1e15), got {ssd_bandwidth!r}")
    if kv_store not in KV_STORES:
        raise ValueError(f"kv_store: expected one of {KV_STORES}, got {kv_store!r}")
    if eviction not in EVICTIONS:
        raise ValueError(f"eviction: expected one of {EVICTIONS}, got {eviction!r}")


def check_token_budget(budget, name: str = "prefill_token_budget") -> None:
    """``prefill_token_budget``: 0 (no batching) or the new tokens of one prefill iteration."""
    if not (isinstance(budget, int) and not isinstance(budget, bool) and 0 <= budget <= 10**7):
        raise ValueError(f"{name}: expected an integer in 0..10**7 (0: one request at a time), "
                         f"got {budget!r}")


def check_pipeline(nodes, min_tokens, budget: int) -> None:
    """``pipeline_nodes`` (1: none) in 1..1024, needing a token budget; ``pipeline_min_tokens`` >= 0."""
    if not (isinstance(nodes, int) and not isinstance(nodes, bool) and 1 <= nodes <= 1024):
        raise ValueError(f"pipeline_nodes: expected an integer in 1..1024 (1: no pipeline), got {nodes!r}")
    if not (isinstance(min_tokens, int) and not isinstance(min_tokens, bool) and 0 <= min_tokens <= 10**9):
        raise ValueError(f"pipeline_min_tokens: expected an integer in 0..10**9, got {min_tokens!r}")
    if nodes > 1 and not budget:
        raise ValueError("pipeline_nodes: chunked pipeline parallelism needs prefill_token_budget (its chunk)")


_POOL_PART = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?([A-Za-z0-9]+)\s*$")


def parse_instances(instances) -> tuple[InstanceSpec, ...]:
    """One ``InstanceSpec`` per instance from ``"4xH800+4xA800"``, or a sequence of GPU names and
    ``InstanceSpec`` objects (a GPU name is ``InstanceSpec(gpu=name)``). ``ValueError`` names
    ``instances`` otherwise."""
    most = LIMITS["n_instances"].hi
    if isinstance(instances, str):
        if len(instances) > 10_000:
            raise ValueError(f"instances: expected e.g. '4xH800+4xA800', got a string of {len(instances):,} characters")
        items = []
        for part in instances.split("+"):
            m = _POOL_PART.match(part)
            if not m or (m.group(1) is not None and int(m.group(1)) < 1):
                raise ValueError(f"instances: expected e.g. '4xH800+4xA800' (COUNTxGPU joined by '+'), "
                                 f"got {instances!r}")
            count = int(m.group(1) or 1)
            if len(items) + count > most:  # bounded before the pool is expanded
                raise ValueError(f"instances: expected at most {most:g} instances in all, got {instances!r}")
            items += [m.group(2).upper()] * count
    elif isinstance(instances, (list, tuple)):
        if len(instances) > most:
            raise ValueError(f"instances: expected at most {most:g} instances, got {len(instances):,}")
        items = list(instances)
    else:
        raise ValueError(f"instances: expected a string like '4xH800+4xA800' or a list of GPU names / InstanceSpec, "
                         f"got {type(instances).__name__}")
    if not items:
        raise ValueError("instances: expected at least one instance")
    specs = []
    for i, item in enumerate(items):
        if isinstance(item, InstanceSpec):
            specs.append(item)
        elif isinstance(item, str):
            try:
                specs.append(InstanceSpec(gpu=item.upper()))
            except ValueError as e:
                raise ValueError(f"instances[{i}]: {e}") from None
        else:
            raise ValueError(f"instances[{i}]: expected a GPU name or an InstanceSpec, got {item!r}")
    return tuple(specs)



@dataclass(frozen=True)
class ClusterPreset:
    """One cluster: prefill and decode instances, caches and SLOs.

    - ``prefill_cost`` / ``decode_cost``: the cost models of a prefill / decode instance.
    - ``n_prefill``, ``n_decode``: instances per pool (Mooncake Figure 8 and Table 3: 8 + 8).
    - ``cache_blocks``: each prefill instance's prefix cache (DRAM) in 512-token blocks.
    - ``ttft_slo_s``, ``tbt_slo_s``: the SLOs (v3 §8.1.3: 30 s and 100 ms).
    - ``decode_model``: ``"batching"`` (continuous batching, KV growing token by token, step time
      from the cost model) or ``"reserve"`` (the lecture's toy: input + output reserved, fixed TBT).
    - ``decode_capacity_tokens``: the setting of the KV tokens per decode instance (``None``: the
      cost model's ``kv_capacity_tokens``, GPU memory less a reserve less the weights); the value in
      use is :attr:`decode_capacity_per_instance`, the name the views give it too.
    - ``tbt_s``: the fixed time per token of the ``reserve`` model.
    - ``max_running``: the most requests one decode instance runs at once (an engine's cap on its
      batch, vLLM's ``max_num_seqs``; its default there is 256), counting those whose KV is on its
      way; None: no cap (the ``reserve`` model and the lecture).
    - ``prefill_gpus``: None (every prefill instance is ``prefill_cost``'s) or one GPU name per
      prefill instance, as a sequence or a string such as ``"4xH800+4xA800"``: a pool of several GPU
      generations, each instance ``prefill_cost``'s with that GPU (its FLOPs, HBM bandwidth and
      NVLink all-reduce bandwidth from ``mooncake_gym.model.costmodel``'s per-GPU tables; the model, MFU,
      chunking and overheads the same), as ``RoutingConfig(instances=...)`` builds them.
    - ``prefill_token_budget``: 0 (one request at a time per prefill instance, FIFO) or the new
      tokens each prefill iteration takes from the queue's head, possibly a chunk of a long prompt
      and several short ones (chunked prefill as vLLM and SGLang run it; see ``PrefillBatching``).
    - ``preemption``: what a decode instance does with the request it evicts when its KV runs out:
      ``"abort"`` (it ends, outcome ``PREEMPTED``), ``"recompute"`` (vLLM's default: its KV is
      dropped, it waits at the head of the instance's queue and, once there is room, its prompt and
      the tokens made so far are prefilled again on the instance, stalling that iteration) or
      ``"swap"`` (its KV is copied to host memory and back over PCIe).
    - ``shared_nics``: KV transfers (prefix pulls between prefill nodes, prompt KV copies from
      prefill to decode nodes) share each node's NIC with the others it sends or receives at the
      same time (``mooncake_gym.sim.network``); False: each copy has a whole NIC. Needs
      ``prefill_token_budget``.
    - ``pipeline_nodes``, ``pipeline_min_tokens``: chunked pipeline parallelism (Mooncake v3 §5.1):
      the prefill pool in groups of ``pipeline_nodes`` consecutive instances; a prompt of at least
      ``pipeline_min_tokens`` computed tokens is prefilled over its instance's whole group, its
      chunks (``prefill_token_budget``) pipelined through the group's stages (``PrefillBatching``,
      ``prefill.PrefillEngine``). 1: none.
    - ``ssd_cache_blocks``: blocks of the SSD tier below each prefill node's DRAM cache (0: none, the
      default): the blocks the DRAM cache evicts are demoted there, it evicts by LRU, and a hit in it
      loads at ``ssd_read_bandwidth`` (bytes/s per node), overlapped layer by layer with the compute
      (``SSD_TIER``: 4 NVMe drives).
    - ``kv_store``: ``"local"`` (default: a node reads its own tiers) or ``"global"`` (Mooncake Store:
      any node reads any node's DRAM or SSD blocks over RDMA; :data:`KV_STORES`).
    - ``eviction``: the DRAM cache's eviction, ``"lru"`` (default) or ``"rlt"`` (randomized leaf
      eviction, drawn from the run's seed; :data:`EVICTIONS`).
    """

    name: str
    description: str
    prefill_cost: CostModel = field(default_factory=CostModel)
    decode_cost: CostModel = field(default_factory=CostModel)
    n_prefill: int = 8
    n_decode: int = 8
    cache_blocks: int = 3000
    ttft_slo_s: float = 30.0
    tbt_slo_s: float = 0.1
    decode_model: str = "batching"
    decode_capacity_tokens: int | None = None
    tbt_s: float = 0.05
    prefill_gpus: tuple[str, ...] | None = None
    prefill_token_budget: int = 0
    preemption: str = "abort"
    shared_nics: bool = False
    pipeline_nodes: int = 1
    pipeline_min_tokens: int = 0
    max_running: int | None = None
    ssd_cache_blocks: int = 0
    ssd_read_bandwidth: float = SSD_TIER_BANDWIDTH
    kv_store: str = "local"
    eviction: str = "lru"

    def __post_init__(self):
        check_store(self.ssd_cache_blocks, self.ssd_read_bandwidth, self.kv_store, self.eviction)
        if self.prefill_gpus is not None:
            try:
                gpus = tuple(spec.gpu for spec in parse_instances(self.prefill_gpus))
            except ValueError as e:
                raise ValueError(f"prefill_gpus: {e}") from None
            if len(gpus) != self.n_prefill:
                raise ValueError(f"prefill_gpus: expected one GPU per prefill instance ({self.n_prefill}), got "
                                 f"{len(gpus)}: {self.prefill_gpus!r}")
            object.__setattr__(self, "prefill_gpus", gpus)
        check_token_budget(self.prefill_token_budget)
        if self.prefill_token_budget and not self.prefill_cost.instance.realistic:
            raise ValueError("prefill_token_budget: batching needs a realistic prefill cost model "
                             "(CostModel.realistic), whose iterations it batches")
        if not isinstance(self.shared_nics, bool):
            raise ValueError(f"shared_nics: expected True or False, got {self.shared_nics!r}")
        if self.shared_nics and not self.prefill_token_budget:
            raise ValueError("shared_nics: the NICs are shared in the batching prefill's event loop; "
                             "set prefill_token_budget too")
        check_pipeline(self.pipeline_nodes, self.pipeline_min_tokens, self.prefill_token_budget)
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption: expected one of {PREEMPTION_MODES}, got {self.preemption!r}")
        if self.decode_model not in DECODE_MODELS:
            raise ValueError(f"decode_model: expected one of {DECODE_MODELS}, got {self.decode_model!r}")
        for name in ("n_prefill", "n_decode"):
            v = getattr(self, name)
            if not (isinstance(v, int) and 1 <= v <= 1024):
                raise ValueError(f"{name}: expected an integer in 1..1024, got {v!r}")
        if not (isinstance(self.cache_blocks, int) and 0 <= self.cache_blocks <= 10**8):
            raise ValueError(f"cache_blocks: expected an integer in 0..10**8, got {self.cache_blocks!r}")
        for name in ("ttft_slo_s", "tbt_slo_s", "tbt_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < 1e6):
                raise ValueError(f"{name}: expected a number of seconds in (0, 1e6), got {v!r}")
        most = self.max_running
        if most is not None and not (isinstance(most, int) and 1 <= most <= 10**6):
            raise ValueError(f"max_running: expected an integer in 1..10**6 or None, got {most!r}")
        cap = self.decode_capacity_tokens
        if cap is not None and not (isinstance(cap, int) and 1 <= cap <= 10**9):
            raise ValueError(f"decode_capacity_tokens: expected an integer in 1..10**9 or None, got {cap!r}")

    @property
    def max_running_cap(self) -> int:
        """``max_running`` as the decode instances take it (no cap: 2**30)."""
        return self.max_running if self.max_running is not None else 1 << 30

    @property
    def decode_capacity_per_instance(self) -> int:
        """KV tokens one decode instance holds: ``decode_capacity_tokens`` where set, else the decode
        cost model's ``kv_capacity_tokens``."""
        if self.decode_capacity_tokens is not None:
            return self.decode_capacity_tokens
        return self.decode_cost.kv_capacity_tokens

    capacity_tokens = renamed("capacity_tokens", "decode_capacity_per_instance")

    def fits(self, input_tokens, output_tokens):
        """Whether a request of ``input_tokens`` + ``output_tokens`` fits in one decode instance's KV
        (elementwise on arrays); the cluster refuses the others at arrival (``refused_too_long``)."""
        return input_tokens + output_tokens <= self.decode_capacity_per_instance

    def routing_config(self):
        """The prefill pool as the routing simulator's ``RoutingConfig`` (instances, caches, TTFT
        SLO; with ``prefill_gpus``, one ``InstanceSpec`` per instance)."""
        instances = None if self.prefill_gpus is None else tuple(
            replace(self.prefill_cost.instance, gpu=gpu) for gpu in self.prefill_gpus)
        return RoutingConfig(self.n_prefill, self.cache_blocks, self.ttft_slo_s, instances=instances,
                             ssd_cache_blocks=self.ssd_cache_blocks, ssd_read_bandwidth=self.ssd_read_bandwidth,
                             kv_store=self.kv_store, eviction=self.eviction)

    def prefill_batching(self) -> PrefillBatching | None:
        """How the prefill instances run their queues (None: one request at a time, FIFO)."""
        if not self.prefill_token_budget:
            return None
        return PrefillBatching(self.prefill_token_budget, self.pipeline_nodes, self.pipeline_min_tokens)

    def with_(self, **changes) -> "ClusterPreset":
        """A copy with some fields changed (``preset.with_(n_decode=4)``)."""
        return replace(self, **changes)


#: The realistic presets' cap on running requests per decode instance: vLLM's default
#: ``max_num_seqs`` (256; vLLM engine arguments).
REALISTIC_MAX_RUNNING = 256

PRESETS: dict[str, ClusterPreset] = {
    "lecture": ClusterPreset(
        "lecture",
        "the course lecture's toy: LLaMA2-70B on 8x A800 at 60 % MFU, pure compute; decode instances of "
        "60,000 KV tokens at a fixed 50 ms per token, input + output reserved up front",
        CostModel(), CostModel(), 8, 8, 3000, 30.0, 0.1, "reserve", 60_000, 0.05),
    # DRAM cache: about 1 TB per node holds about 3 M tokens of a 70B GQA model (mooncake.md,
    # FAST'25); 5,800 blocks of 512 tokens = 2.97 M tokens.
    "mooncake": ClusterPreset(
        "mooncake",
        "Mooncake's testbed (v3 §8): 8 + 8 nodes of 8x A800-SXM4-80GB serving LLaMA2-70B; chunked prefill "
        "with TP8 all-reduces; continuous-batching decode with KV growing per token; TTFT 30 s, TBT 100 ms",
        CostModel.realistic("llama2-70b", "A800"), CostModel.realistic("llama2-70b", "A800"),
        8, 8, 5800, 30.0, 0.1, "batching", max_running=REALISTIC_MAX_RUNNING, **ENGINE),
    # Under this cost model the 8 + 8 testbed is prefill-bound on Mooncake's and the synthetic
    # request mixes (long prompts, short outputs: the decode pool completes 6-17x what the prefill
    # pool does; ``cluster.saturation``). Mooncake §7's overload is a decode pool that saturates
    # first: 16 prefill nodes + 1 decode node does on the synthetic mix (24 vs 8.5 requests/s).
    "mooncake-overload": ClusterPreset(
        "mooncake-overload",
        "Mooncake's hardware and model with 16 prefill + 1 decode nodes, so that the decode pool saturates "
        "first (Mooncake §7's overload); otherwise as 'mooncake'",
        CostModel.realistic("llama2-70b", "A800"), CostModel.realistic("llama2-70b", "A800"),
        16, 1, 5800, 30.0, 0.1, "batching", max_running=REALISTIC_MAX_RUNNING, **ENGINE),
    # Both pools bind (issue 24 item 8): on Mooncake's public trace's request mix 8 prefill nodes
    # serve 9.63 requests/s and one decode node 9.14 (cluster.saturation, 2026-12-02), so both queues
    # build at a load near 1; on the synthetic mix (shorter prompts) decode binds first (19.2 vs 6.4).
    "mooncake-balanced": ClusterPreset(
        "mooncake-balanced",
        "Mooncake's hardware and model with 8 prefill + 1 decode nodes, sized so that on Mooncake's public "
        "trace both pools saturate at about the same rate; otherwise as 'mooncake'",
        CostModel.realistic("llama2-70b", "A800"), CostModel.realistic("llama2-70b", "A800"),
        8, 1, 5800, 30.0, 0.1, "batching", max_running=REALISTIC_MAX_RUNNING, **ENGINE),
    # the same cluster with a tight TTFT SLO (interactive chat; Mooncake's 30 s is for long documents):
    # prompts whose own prefill exceeds 8 s cannot be good at all (scenario admission-tight-slo)
    "mooncake-overload-tight": ClusterPreset(
        "mooncake-overload-tight",
        "'mooncake-overload' with a TTFT SLO of 8 s (an assumption: interactive chat)",
        CostModel.realistic("llama2-70b", "A800"), CostModel.realistic("llama2-70b", "A800"),
        16, 1, 5800, 8.0, 0.1, "batching", max_running=REALISTIC_MAX_RUNNING, **ENGINE),
    # two GPU generations in the prefill pool (as the routing-heterogeneous scenario's 4xH800+4xA800):
    # H800 nodes compute 3.2x as fast (989 vs 312 dense BF16 TFLOPS per GPU) and all-reduce at 215
    # against A800's 137 GB/s (costmodel.INTERCONNECT, interconnect.json); the decode pool is the testbed's
    "mooncake-hetero": ClusterPreset(
        "mooncake-hetero",
        "'mooncake' with a prefill pool of two GPU generations: 4 nodes of 8x H800 and 4 of 8x A800, all "
        "serving LLaMA2-70B with the same realistic model; decode as 'mooncake'",
        CostModel.realistic("llama2-70b", "A800"), CostModel.realistic("llama2-70b", "A800"),
        8, 8, 5800, 30.0, 0.1, "batching", prefill_gpus="4xH800+4xA800",
        max_running=REALISTIC_MAX_RUNNING, **ENGINE),
    "h100": ClusterPreset(
        "h100",
        "the same cluster of 8x H100-SXM5-80GB nodes serving LLaMA3-70B",
        CostModel.realistic("llama3-70b", "H100"), CostModel.realistic("llama3-70b", "H100"),
        8, 8, 5800, 30.0, 0.1, "batching", max_running=REALISTIC_MAX_RUNNING, **ENGINE),
}


def get_preset(name: str | ClusterPreset) -> ClusterPreset:
    """A preset by name (``PRESETS``), or the preset of a preset file ``PATH.toml``
    (:func:`load_preset_file`); a ClusterPreset passes through."""
    if isinstance(name, ClusterPreset):
        return name
    if isinstance(name, str) and name.endswith(".toml"):
        return load_preset_file(name)
    if name not in PRESETS:
        raise ValueError(f"preset: unknown {name!r}; expected one of {sorted(PRESETS)} or a preset file FILE.toml")
    return PRESETS[name]


# --------------------------------------------------------------------------------------------
# Preset files
# --------------------------------------------------------------------------------------------
# Preset files: GPUs, models and a cluster preset as data, in TOML (``--preset-file FILE.toml``).
#
# A preset file has up to three parts (``docs/presets.md`` is the reference, ``docs/examples/
# h200-preset.toml`` a worked example):
#
# - ``[gpus.NAME]``: a GPU kind: peak dense BF16 FLOP/s, HBM bytes and bandwidth, and the NVLink
#   all-reduce figures per tensor-parallel degree (``[gpus.NAME.allreduce]``, as
#   ``costmodel.INTERCONNECT``);
# - ``[models.NAME]``: a decoder-only transformer (layers, widths, heads, vocabulary), as
#   ``costmodel.ModelConfig``;
# - ``[preset]``: the cluster: a built-in preset it starts from (``base``, default ``mooncake``) and
#   the fields it replaces (pools, caches, SLOs, the engine's mechanisms), with ``[preset.cost]`` (both
#   pools' instances: model, GPU, TP degree, engine overhead and efficiencies) and
#   ``[preset.prefill_cost]`` / ``[preset.decode_cost]`` for one pool on top.
#
# :func:`load_preset_file` reads and checks the whole file before it changes anything, then adds its
# GPUs and models to the cost model's tables (``costmodel.GPU_PEAK_BF16_FLOPS``, ``GPU_HBM_BYTES``,
# ``GPU_HBM_BANDWIDTH``, ``INTERCONNECT`` and ``MODELS``) and its preset to ``presets.PRESETS``, where
# every name lookup finds them. A name already there is accepted only with the same figures: a file
# adds GPUs, models and presets, and never changes a built-in one (it extends one through ``base``).
#
# Every key is checked: an unknown key, a value of the wrong type, a number not finite or outside its
# range (``mooncake_gym.model.limits``) is a ``ValueError`` of one line naming the file, the key's
# dotted path and what was expected.

#: Largest preset file read, bytes, and most GPUs or models one file defines.
MAX_PRESET_FILE_BYTES = 1 << 20
MAX_ENTRIES = 256
#: Longest free text (a description, a source) and name.
MAX_TEXT = 2000
_GPU_NAME = re.compile(r"^[A-Z0-9]{1,32}$")  # as "4xH200+4xH100" spells them (upper case, no separators)
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Key:
    """One key of a table: its type (``int``, ``float``, ``bool``, ``str``), the range of
    ``mooncake_gym.model.limits`` it is checked against, its choices, and whether it must be given."""

    kind: str
    limit: str | None = None
    choices: tuple | None = None
    required: bool = False


GPU_KEYS = {
    "peak_bf16_flops": Key("float", "peak_flops", required=True),
    "hbm_bytes": Key("int", "hbm_bytes", required=True),
    "hbm_bandwidth": Key("float", "hbm_bandwidth", required=True),
    "source": Key("str"),
}
MODEL_KEYS = {
    "name": Key("str"),
    "n_layers": Key("int", "model_layers", required=True),
    "d_model": Key("int", "model_width", required=True),
    "n_heads": Key("int", "model_heads", required=True),
    "n_kv_heads": Key("int", "model_heads", required=True),
    "d_head": Key("int", "model_width", required=True),
    "d_ff": Key("int", "model_width", required=True),
    "vocab": Key("int", "vocab", required=True),
    "tied_embeddings": Key("bool"),
    "mlp_matrices": Key("int", "mlp_matrices"),
    "source": Key("str"),
}
#: ``[preset.cost]`` and the per-pool tables: the model, ``InstanceSpec``'s fields, ``engine`` (a
#: named engine of ``costmodel.ENGINE_OVERHEAD_S``: its iteration overhead and attention efficiency
#: unless given) and the KV transfers' fixed latency.
COST_KEYS = {
    "model": Key("str"),
    "gpu": Key("str"),
    "n_gpus": Key("int", "n_gpus"),
    "engine": Key("str", choices=tuple(costmodel.ENGINE_OVERHEAD_S)),
    "realistic": Key("bool"),
    "mfu": Key("float", "efficiency"),
    "prefill_overhead_s": Key("float", "overhead_s"),
    "chunk_tokens": Key("int", "chunk_tokens"),
    "iteration_overhead_s": Key("float", "overhead_s"),
    "memory_efficiency": Key("float", "efficiency"),
    "memory_reserve": Key("float", "memory_reserve"),
    "attention_efficiency": Key("float", "efficiency"),
    "kv_read_efficiency": Key("float", "efficiency"),
    "transfer_latency_s": Key("float", "overhead_s"),
}
PRESET_KEYS = {
    "name": Key("str", required=True),
    "description": Key("str"),
    "base": Key("str"),
    "n_prefill": Key("int", "n_prefill"),
    "n_decode": Key("int", "n_decode"),
    "cache_blocks": Key("int", "cache_blocks"),
    "ttft_slo_s": Key("float", "ttft_slo_s"),
    "tbt_slo_s": Key("float", "ttft_slo_s"),
    "decode_model": Key("str", choices=DECODE_MODELS),
    "decode_capacity_tokens": Key("int", "decode_capacity_tokens"),
    "tbt_s": Key("float", "tbt_s"),
    "prefill_gpus": Key("str"),
    "prefill_token_budget": Key("int", "prefill_token_budget"),
    "preemption": Key("str", choices=PREEMPTION_MODES),
    "shared_nics": Key("bool"),
    "pipeline_nodes": Key("int", "pipeline_nodes"),
    "pipeline_min_tokens": Key("int", "pipeline_min_tokens"),
    "max_running": Key("int", "max_running"),
}
_POOL_TABLES = ("cost", "prefill_cost", "decode_cost")
_ALLREDUCE = ("busbw", "latency_s")


class PresetFileError(ValueError):
    """A preset file that does not follow the format; the message names the file and the key."""


def load_preset_file(path: str | os.PathLike) -> ClusterPreset:
    """The preset of the TOML file at ``path``, its GPUs and models added to the cost model's
    tables and the preset to ``PRESETS`` (under its ``name``). ``PresetFileError`` (a ``ValueError``)
    naming the file and the key otherwise; nothing is added then."""
    check_input_file(path, "preset file")
    where = os.fspath(path)
    size = os.path.getsize(path)
    if size > MAX_PRESET_FILE_BYTES:
        raise PresetFileError(f"{where}: expected a preset file of at most {MAX_PRESET_FILE_BYTES:,} bytes, "
                              f"got {size:,}")
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise PresetFileError(f"{where}: not valid TOML: {e}") from None
    return PresetFile(where).load(raw)


class PresetFile:
    """The checks and the building of one file's contents (``where`` names it in errors)."""

    def __init__(self, where: str):
        self.where = where

    def error(self, key: str, message: str) -> PresetFileError:
        return PresetFileError(f"{self.where}: {key}: {message}")

    # -- the checks of one table ----------------------------------------------------------------
    def table(self, raw, keys: dict, key: str, subtables: tuple = ()) -> dict:
        """``raw`` checked against ``keys`` (the tables named in ``subtables`` passed through)."""
        if not isinstance(raw, dict):
            raise self.error(key, f"expected a table, got {_kind(raw)}")
        out = {}
        for name, value in raw.items():
            dotted = f"{key}.{name}" if key else name
            if name in subtables:
                out[name] = value
                continue
            spec = keys.get(name)
            if spec is None:
                accepted = ", ".join([*keys, *subtables])
                raise self.error(dotted, f"unknown key; expected one of {accepted}")
            out[name] = self.value(value, spec, dotted)
        missing = [name for name, spec in keys.items() if spec.required and name not in raw]
        if missing:
            raise self.error(f"{key}.{missing[0]}" if key else missing[0], "missing; it must be given")
        return out

    def value(self, value, spec: Key, key: str):
        if spec.kind == "bool":
            if not isinstance(value, bool):
                raise self.error(key, f"expected true or false, got {_kind(value)}")
            return value
        if spec.kind == "str":
            if not isinstance(value, str) or len(value) > MAX_TEXT:
                raise self.error(key, f"expected a string of at most {MAX_TEXT} characters, got {_kind(value)}")
            if spec.choices is not None and value not in spec.choices:
                raise self.error(key, f"expected one of {list(spec.choices)}, got {value!r}")
            return value
        integer = spec.kind == "int"
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
            raise self.error(key, f"expected {'an integer' if integer else 'a number'}, got {_kind(value)}")
        if not integer and not math.isfinite(value):
            raise self.error(key, f"expected a finite number, got {value!r}")
        if spec.limit is not None:
            try:
                check(spec.limit, value, "x")
            except ValueError as e:
                raise self.error(key, str(e).partition(": ")[2]) from None
        return float(value) if not integer else value

    def entries(self, raw, key: str) -> dict:
        if not isinstance(raw, dict):
            raise self.error(key, f"expected a table of named entries, got {_kind(raw)}")
        if len(raw) > MAX_ENTRIES:
            raise self.error(key, f"expected at most {MAX_ENTRIES} entries, got {len(raw)}")
        return raw

    # -- the parts ----------------------------------------------------------------------------
    def gpu(self, name: str, raw) -> tuple[float, int, float, dict]:
        key = f"gpus.{name}"
        if not _GPU_NAME.match(name):
            raise self.error(key, "expected a GPU name of upper-case letters and digits (as in '4xH200+4xH100')")
        fields = self.table(raw, GPU_KEYS, key, ("allreduce",))
        if "allreduce" not in fields:
            raise self.error(f"{key}.allreduce", "missing; it must be given (busbw and latency_s per TP degree)")
        ar = self.table(fields["allreduce"], {}, f"{key}.allreduce", _ALLREDUCE)
        figures = {}
        for part, limit in zip(_ALLREDUCE, ("busbw", "allreduce_latency_s")):
            where = f"{key}.allreduce.{part}"
            by_tp = ar.get(part)
            if by_tp is None:
                raise self.error(where, "missing; it must be given (a table of TP degree = value)")
            if not isinstance(by_tp, dict) or not by_tp:
                raise self.error(where, f"expected a table of TP degree = value, got {_kind(by_tp)}")
            table = {}
            for tp, v in by_tp.items():
                if not (tp.isdigit() and 1 <= int(tp) <= costmodel.GPUS_PER_NODE):
                    raise self.error(f"{where}.{tp}", f"expected a TP degree in 1..{costmodel.GPUS_PER_NODE} as key")
                table[int(tp)] = self.value(v, Key("float", limit), f"{where}.{tp}")
            figures[part] = table
        if set(figures["busbw"]) != set(figures["latency_s"]):
            raise self.error(f"{key}.allreduce", "expected busbw and latency_s for the same TP degrees")
        return fields["peak_bf16_flops"], fields["hbm_bytes"], fields["hbm_bandwidth"], figures

    def model(self, name: str, raw) -> costmodel.ModelConfig:
        key = f"models.{name}"
        if not _NAME.match(name):
            raise self.error(key, "expected a model name of lower-case letters, digits, '.', '_' and '-'")
        f = self.table(raw, MODEL_KEYS, key)
        if f["n_heads"] % f["n_kv_heads"]:
            raise self.error(f"{key}.n_kv_heads", f"expected a divisor of n_heads = {f['n_heads']}, got {f['n_kv_heads']}")
        return costmodel.ModelConfig(f.get("name", name), f["n_layers"], f["d_model"], f["n_heads"], f["n_kv_heads"],
                                     f["d_head"], f["d_ff"], f["vocab"], f.get("tied_embeddings", False),
                                     f.get("mlp_matrices", 3))

    def cost(self, base: costmodel.CostModel, fields: dict, key: str) -> costmodel.CostModel:
        """``base`` with the fields of a ``[preset.cost]`` table replaced."""
        fields = dict(fields)
        cost = base
        if "model" in fields:
            name = fields.pop("model")
            if name.lower() not in costmodel.MODELS:
                raise self.error(f"{key}.model", f"unknown {name!r}; expected one of {sorted(costmodel.MODELS)} "
                                                 f"or a [models.NAME] of this file")
            cost = replace(cost, model=costmodel.MODELS[name.lower()])
        if "transfer_latency_s" in fields:
            cost = replace(cost, transfer_latency_s=fields.pop("transfer_latency_s"))
        engine = fields.pop("engine", None)
        if engine is not None:
            fields.setdefault("iteration_overhead_s", costmodel.ENGINE_OVERHEAD_S[engine])
            fields.setdefault("attention_efficiency", costmodel.ENGINE_ATTENTION_EFFICIENCY[engine])
        if "gpu" in fields and fields["gpu"] not in costmodel.GPU_PEAK_BF16_FLOPS:
            raise self.error(f"{key}.gpu", f"unknown {fields['gpu']!r}; expected one of "
                                           f"{sorted(costmodel.GPU_PEAK_BF16_FLOPS)} or a [gpus.NAME] of this file")
        try:
            return replace(cost, instance=replace(cost.instance, **fields))
        except ValueError as e:
            raise self.error(key, str(e)) from None

    def preset(self, raw) -> ClusterPreset:
        fields = self.table(raw, PRESET_KEYS, "preset", _POOL_TABLES)
        name = fields.pop("name")
        if not _NAME.match(name):
            raise self.error("preset.name", "expected a name of lower-case letters, digits, '.', '_' and '-'")
        base_name = fields.pop("base", "mooncake")
        base = PRESETS.get(base_name) if base_name in _BUILT_IN_PRESETS else None
        if base is None:
            raise self.error("preset.base", f"expected a built-in preset, one of {sorted(_BUILT_IN_PRESETS)}, "
                                            f"got {base_name!r}")
        pools = {t: self.table(fields.pop(t, {}), COST_KEYS, f"preset.{t}") for t in _POOL_TABLES}
        prefill = self.cost(self.cost(base.prefill_cost, pools["cost"], "preset.cost"), pools["prefill_cost"],
                            "preset.prefill_cost")
        decode = self.cost(self.cost(base.decode_cost, pools["cost"], "preset.cost"), pools["decode_cost"],
                           "preset.decode_cost")
        description = fields.pop("description", f"{name} (from {os.path.basename(self.where)}; based on {base_name})")
        try:
            preset = base.with_(name=name, description=description, prefill_cost=prefill, decode_cost=decode, **fields)
            preset.decode_capacity_per_instance  # the weights must fit in a decode instance's memory
            prefill.kv_capacity_tokens
        except ValueError as e:
            raise self.error("preset", str(e)) from None
        return preset

    # -- the whole file --------------------------------------------------------------------------
    def load(self, raw: dict) -> ClusterPreset:
        self.table(raw, {}, "", ("gpus", "models", "preset"))
        if "preset" not in raw:
            raise self.error("preset", "missing; a preset file defines one [preset] table")
        gpus = {name: self.gpu(name, entry) for name, entry in self.entries(raw.get("gpus", {}), "gpus").items()}
        models = {name: self.model(name, entry) for name, entry in self.entries(raw.get("models", {}), "models").items()}
        for name, figures in gpus.items():
            known = _gpu_figures(name)
            if known is not None and known != figures:
                raise self.error(f"gpus.{name}", f"{name} is known with other figures; give yours another name")
        for name, model in models.items():
            known = costmodel.MODELS.get(name)
            if known is not None and known != model:
                raise self.error(f"models.{name}", f"{name} is known with other figures; give yours another name")
        added = _Additions()
        try:
            for name, figures in gpus.items():
                added.gpu(name, figures)
            for name, model in models.items():
                added.put(costmodel.MODELS, name, model)
            preset = self.preset(raw["preset"])
            known = PRESETS.get(preset.name)
            if known is not None and known != preset:
                which = "a built-in preset" if preset.name in _BUILT_IN_PRESETS else "known with other fields"
                raise self.error("preset.name", f"{preset.name!r} is {which}; give yours another name "
                                                f"(base = {preset.name!r} starts from it)")
            added.put(PRESETS, preset.name, preset)
        except BaseException:
            added.undo()
            raise
        return PRESETS[preset.name]


_BUILT_IN_PRESETS = frozenset(PRESETS)
_GPU_TABLES = (costmodel.GPU_PEAK_BF16_FLOPS, costmodel.GPU_HBM_BYTES, costmodel.GPU_HBM_BANDWIDTH)


def _gpu_figures(name: str):
    """A known GPU's figures as :meth:`PresetFile.gpu` returns them (None: not known)."""
    if name not in costmodel.GPU_PEAK_BF16_FLOPS:
        return None
    return (*(t.get(name) for t in _GPU_TABLES), costmodel.INTERCONNECT.get(name))


class _Additions:
    """The entries a file adds to the tables, undone if a later part of the file fails."""

    def __init__(self):
        self.done: list[tuple[dict, str]] = []

    def put(self, table: dict, name: str, value) -> None:
        if name not in table:
            table[name] = value
            self.done.append((table, name))

    def gpu(self, name: str, figures: tuple) -> None:
        flops, hbm, bandwidth, allreduce = figures
        for table, value in zip((*_GPU_TABLES, costmodel.INTERCONNECT), (flops, hbm, bandwidth, allreduce)):
            self.put(table, name, value)

    def undo(self) -> None:
        for table, name in reversed(self.done):
            del table[name]


def _kind(value) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})" if len(value) <= 40 else f"a string of {len(value):,} characters"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__} ({value})"

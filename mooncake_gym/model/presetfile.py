"""Preset files: GPUs, models and a cluster preset as data, in TOML (``--preset-file FILE.toml``).

A preset file has up to three parts (``docs/presets.md`` is the reference, ``docs/examples/
h200-preset.toml`` a worked example):

- ``[gpus.NAME]``: a GPU kind: peak dense BF16 FLOP/s, HBM bytes and bandwidth, and the NVLink
  all-reduce figures per tensor-parallel degree (``[gpus.NAME.allreduce]``, as
  ``costmodel.INTERCONNECT``);
- ``[models.NAME]``: a decoder-only transformer (layers, widths, heads, vocabulary), as
  ``costmodel.ModelConfig``;
- ``[preset]``: the cluster: a built-in preset it starts from (``base``, default ``mooncake``) and
  the fields it replaces (pools, caches, SLOs, the engine's mechanisms), with ``[preset.cost]`` (both
  pools' instances: model, GPU, TP degree, engine overhead and efficiencies) and
  ``[preset.prefill_cost]`` / ``[preset.decode_cost]`` for one pool on top.

:func:`load_preset_file` reads and checks the whole file before it changes anything, then adds its
GPUs and models to the cost model's tables (``costmodel.GPU_PEAK_BF16_FLOPS``, ``GPU_HBM_BYTES``,
``GPU_HBM_BANDWIDTH``, ``INTERCONNECT`` and ``MODELS``) and its preset to ``presets.PRESETS``, where
every name lookup finds them. A name already there is accepted only with the same figures: a file
adds GPUs, models and presets, and never changes a built-in one (it extends one through ``base``).

Every key is checked: an unknown key, a value of the wrong type, a number not finite or outside its
range (``mooncake_gym.model.limits``) is a ``ValueError`` of one line naming the file, the key's
dotted path and what was expected.
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from mooncake_gym._files import check_input_file
from mooncake_gym.model import costmodel
from mooncake_gym.model.limits import LIMITS, check
from mooncake_gym.model.presets import DECODE_MODELS, PREEMPTION_MODES, PRESETS, ClusterPreset

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, packaged (pyproject: tomli; python_version < "3.11")
    import tomli as tomllib

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
            preset.capacity_tokens  # the weights must fit in a decode instance's memory
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
